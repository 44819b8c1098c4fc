"""``prefill_mfu_{T}``: model FLOPs of one T-token prefill of ``--mfu-model`` per second, over the matmul ceiling.

The row is the default configuration's (``torch.compile`` on "auto"); with ``extra_settings`` the eager
blocks are timed too and named in the note.
"""

from __future__ import annotations

from servelab.bench.session import BenchSession


def prefill_section(s: BenchSession) -> None:
    from servelab.bench.step import engine_step
    from servelab.measure import time_fn
    from servelab.models import ModelShape

    p = s.plan
    mfu, notes, big, shape = float("nan"), [], None, None
    for compile_ in ["auto", False] if p.extra_settings else ["auto"]:
        if s.clock.left() < 20:
            notes.append(f"compile={compile_}: skipped (time budget)")
            continue
        fn = None
        try:
            if big is None:
                big = s.load(p.mfu_model)
                shape = ModelShape.from_config(big.config)
            fn, _ = engine_step(big, 1, p.mfu_tokens, 0, seed=p.seed, compile=compile_)
            status = fn.engine.stats()["compile"]
            t = time_fn(fn, warmup=3, repeats=max(5, p.repeats // 3), device=p.device)
            this = (
                float(s.roof.achieved_tflop_s(t.median_ms, shape.prefill_flops(p.mfu_tokens))) / s.ceil.matmul_tflop_s
            )
            label = "default" if compile_ == "auto" else "eager blocks (not the default)"
            notes.append(
                f"{label}, compile {status}: {t.median_ms:.2f} ms (p25 {t.p25_ms:.2f}, p75 {t.p75_ms:.2f}) = {this:.3f}"
            )
            if compile_ == "auto":
                mfu = this
        except Exception as e:
            notes.append(f"compile={compile_} failed: {type(e).__name__}: {e}"[:200])
        finally:
            fn = None
            s.free()
    big = None
    s.free()
    head = ""
    if shape is not None:
        head = (
            f"{p.mfu_model}, one {p.mfu_tokens}-token prompt, {shape.prefill_flops(p.mfu_tokens) / 1e12:.2f} TFLOP "
            f"against the {s.ceil.matmul_tflop_s:.0f} TFLOP/s ceiling ({s.ceil.matmul_dtype} {s.ceil.matmul_n}^3); "
        )
    note = head + "; ".join(notes)
    s.log(f"prefill MFU: {mfu:.3f} ({note})")
    s.add(f"prefill_mfu_{p.mfu_tokens}", mfu, "fraction of matmul ceiling", 1.0, note)
    s.flush()
