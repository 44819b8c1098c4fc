"""``decode_ms_b{B}_ctx{C}``: one decode step's forward on the default configuration, beside its floor.

``decode.csv`` holds every implementation timed at each point: the engine's default configuration
(``engine_default``: attention backend and ``torch.compile`` on "auto"), labelled other settings of the engine
(``engine_<backend>_eager``: blocks not compiled; ``engine_unfused_rope_kv``: the default with
``fused_rope_kv_write=False``, which also leaves ``small_batch`` off; ``engine_no_small_batch``: the default with
``small_batch=False``; ``engine_no_pdl``: the default with ``pdl=False``), HF eager and HF in a CUDA graph. The
row is the default's; at the plan's ``fused_rope_kv_points`` the path the default replaced (RoPE in the compiled
blocks, then the pool write) gets a labelled row of its own beside it, ``decode_ms_b{B}_ctx{C}_unfused_rope_kv``,
at its one-row points the model's own blocks in place of the small ones, ``decode_ms_b1_ctx{C}_no_small_batch``
(where the fused kernel runs, so that the default is the fused one: CUDA with Triton), and where programmatic
dependent launch runs (a Hopper GPU) the default's launches without it, ``decode_ms_b{B}_ctx{C}_no_pdl``. Until
issue 29 the default was unfused and the labelled row ``_fused_rope_kv`` the fused one; older bench runs hold that
row.
"""

from __future__ import annotations

from typing import NamedTuple

from servelab.bench.plan import BenchPlan
from servelab.bench.session import BenchSession

NAN = float("nan")
UNFUSED_ROPE_KV = "engine_unfused_rope_kv"
NO_SMALL_BATCH = "engine_no_small_batch"
NO_PDL = "engine_no_pdl"
# a labelled row's implementation -> (its metric's suffix, the setting it changes: a sentence's words)
SWITCH_ROWS = {
    UNFUSED_ROPE_KV: ("unfused_rope_kv", "fused_rope_kv_write=False"),
    NO_SMALL_BATCH: ("no_small_batch", "small_batch=False"),
    NO_PDL: ("no_pdl", "pdl=False"),
}


class Variant(NamedTuple):
    impl: str
    backend: str | None  # attention backend; None: HF's own model
    compile: object  # EngineConfig.compile
    fused_rope_kv_write: bool | str = "auto"  # EngineConfig.fused_rope_kv_write
    small_batch: bool | str = "auto"  # EngineConfig.small_batch
    pdl: bool | str = "auto"  # EngineConfig.pdl


def fused_rope_kv_runs(cuda: bool) -> bool:
    """Whether the fused RoPE + KV-write kernel can be timed here: the engine's own "auto" answer on CUDA."""
    import torch

    from servelab.engine.engine import fused_rope_kv_runs as engine_takes_it

    return cuda and engine_takes_it(torch.device("cuda"))


def pdl_runs(cuda: bool) -> bool:
    """Whether programmatic dependent launch can be timed here: the engine's own "auto" answer on CUDA."""
    if not cuda:
        return False
    import torch

    from servelab.kernels import pdl

    return pdl.supported(torch.device("cuda"))


def variants(plan: BenchPlan, cuda: bool, batch: int, ctx: int) -> list[Variant]:
    """Each implementation timed at one decode point; the first is the default configuration (the row's)."""
    from servelab.kernels.decode import DECODE_BACKENDS

    out = [Variant("engine_default", "auto", "auto")]
    if (batch, ctx) in plan.fused_rope_kv_points and fused_rope_kv_runs(cuda):
        out.append(Variant(UNFUSED_ROPE_KV, "auto", "auto", False))
        if batch <= 1:  # small_batch takes one-row steps only (models.small_batch.PAYS_UP_TO)
            out.append(Variant(NO_SMALL_BATCH, "auto", "auto", "auto", False))
        if pdl_runs(cuda):
            out.append(Variant(NO_PDL, "auto", "auto", pdl=False))
    if plan.extra_settings:
        backends = ["triton", "gather"] if cuda and "triton" in DECODE_BACKENDS else ["gather"]
        out += [Variant(f"engine_{b}_eager", b, False) for b in backends]
    out.append(Variant("hf_eager", None, False))
    if cuda:
        out.append(Variant("hf_cuda_graph", None, False))
    return out


def labelled_rows(plan: BenchPlan, cuda: bool) -> dict[str, str]:
    """``bench.csv`` metric -> the ``decode.csv`` implementation it reports, for every decode point: the default's
    row, and the labelled extra rows of other settings."""
    rows = {}
    for batch, ctx in plan.decode_points:
        impls = [v.impl for v in variants(plan, cuda, batch, ctx)]
        rows[f"decode_ms_b{batch}_ctx{ctx}"] = "engine_default"
        for impl, (suffix, _) in SWITCH_ROWS.items():
            if impl in impls:
                rows[f"decode_ms_b{batch}_ctx{ctx}_{suffix}"] = impl
    return rows


def profile_step(fn, before=None) -> dict:
    """Kernel count, GPU-busy share and the largest kernels of one call of ``fn`` (torch.profiler)."""
    from servelab.measure.kernel_profile import profile_call

    def call():
        if before is not None:
            before()
        fn()

    p = profile_call(call, calls=3, warmup=1, top=3)
    return {
        "kernels": p.kernels,
        "gpu_busy_ms": p.gpu_busy_ms,
        "gpu_busy_pct": p.gpu_busy_pct,
        "top_kernels": "; ".join(f"{name[:40]} ×{n} {us:.0f} µs" for name, n, us in p.top_kernels),
    }


def step_callable(s: BenchSession, v: Variant, batch: int, ctx: int):
    """``(fn, before_each, note)`` for one implementation's decode step."""
    if v.backend is not None:
        from servelab.bench.step import engine_step

        fn, before = engine_step(
            s.hf,
            batch,
            1,
            ctx,
            seed=s.plan.seed,
            attention_backend=v.backend,
            compile=v.compile,
            fused_rope_kv_write=v.fused_rope_kv_write,
            small_batch=v.small_batch,
            pdl=v.pdl,
        )
        st = fn.engine.stats()
        note = f"backend {st['attention_backend']}, graphs={st['cuda_graphs']}, compile {st['compile']}"
        if st["fused_rope_kv_write"]:
            note += ", fused RoPE + KV write"
        if st["small_batch"]:
            note += ", small-batch blocks"
        if st["pdl"]:
            note += ", PDL"
        if st["attention_backend"] == "triton":
            note += f", kernel {st['triton_tuning']}"
        return fn, before, note
    from servelab.bench.hf_modes import cuda_graph_step, eager_step

    make = eager_step if v.impl == "hf_eager" else cuda_graph_step
    fn, before = make(s.hf, batch, 1, ctx, seed=s.plan.seed)
    return fn, before, ""


def time_variant(s: BenchSession, v: Variant, batch: int, ctx: int, floor: float) -> dict:
    """One ``decode.csv`` row: the median step time, or why there is none."""
    from servelab.measure import time_fn

    impl, backend, compile_ = v.impl, v.backend, v.compile
    row = {"impl": impl, "batch": batch, "context": ctx, "floor_ms": floor, "status": "ok", "note": ""}
    t, fn = None, None
    if s.clock.left() < (150 if compile_ else 120):  # keep time for the sections that follow
        s.log(f"decode b={batch} ctx={ctx} {impl}: skipped (time budget)")
        skipped = {"median_ms": NAN, "p25_ms": NAN, "p75_ms": NAN, "pct_of_floor": NAN}
        return {**row, **skipped, "status": "skipped", "note": "time budget"}
    try:
        fn, before, row["note"] = step_callable(s, v, batch, ctx)
        fast = backend is not None or impl == "hf_cuda_graph"
        repeats = s.plan.repeats if fast else max(3, s.plan.repeats // 3)
        t = time_fn(fn, warmup=3, repeats=repeats, device=s.plan.device, before_each=before)
        if s.cuda and fast:
            try:  # where the time goes: kernels per step, GPU-busy share; optional, never fatal
                row.update(profile_step(fn, before))
            except Exception as e:
                row["top_kernels"] = f"profile failed: {type(e).__name__}: {e}"[:200]
    except Exception as e:  # record and go on: one failing variant must not end the run
        row["status"] = "oom" if "out of memory" in str(e).lower() else "error"
        row["note"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        fn = None
        s.free()
    ms = t.median_ms if t else NAN
    s.log(f"decode b={batch} ctx={ctx} {impl}: {ms:.3f} ms (floor {floor:.3f}) {row['status']} {row['note'][:80]}")
    quartiles = {"p25_ms": t.p25_ms, "p75_ms": t.p75_ms} if t else {"p25_ms": NAN, "p75_ms": NAN}
    return {**row, "median_ms": ms, **quartiles, "pct_of_floor": 100 * floor / ms if t else NAN}


def decode_note(s: BenchSession, default: dict, others: list[dict], what: str = "engine default configuration") -> str:
    if default["status"] != "ok":
        return f"failed: {default['note']}"
    how = "CUDA-graph replay incl. input copies" if s.cuda else "eager forward (no CUDA)"
    note = f"{what} ({default['note']}), {how}; median of {s.plan.repeats}"
    if "kernels" in default and default["kernels"] == default["kernels"]:
        note += (
            f"; profile: {default['kernels']} kernels/step, GPU busy {default['gpu_busy_pct']:.0f}%, "
            f"{default['gpu_busy_ms'] * 1e3 / max(default['kernels'], 1):.1f} µs of kernel time per kernel; "
            f"largest: {default['top_kernels']}"
        )
    timed = [f"{r['impl']} {r['median_ms']:.3f} ms" for r in others if r["status"] == "ok"]
    return note + ("; others: " + ", ".join(timed) if timed else "")


def decode_section(s: BenchSession) -> None:
    """Every decode point: each implementation in ``decode.csv``; in ``bench.csv`` the default configuration's row,
    and the labelled rows of other settings (``labelled_rows``)."""
    metrics = labelled_rows(s.plan, s.cuda)
    for batch, ctx in s.plan.decode_points:
        floor = float(
            s.roof.floor_ms(s.shape.decode_flops(batch, ctx), s.shape.decode_bytes(batch, ctx, s.dtype_bytes))
        )
        timed = [time_variant(s, v, batch, ctx, floor) for v in variants(s.plan, s.cuda, batch, ctx)]
        s.decode_rows += timed
        default = timed[0]
        note = decode_note(s, default, timed[1:])
        s.add(f"decode_ms_b{batch}_ctx{ctx}", default["median_ms"], "ms", floor, note, *quartiles(default))
        for impl, (suffix, setting) in SWITCH_ROWS.items():
            name = f"decode_ms_b{batch}_ctx{ctx}_{suffix}"
            if name in metrics:
                row = next(r for r in timed if r["impl"] == impl)
                note = decode_note(s, row, [default], f"not the default: {setting}, otherwise the default")
                s.add(name, row["median_ms"], "ms", floor, note, *quartiles(row))
    s.flush()


def quartiles(row: dict) -> tuple[float, float]:
    """A decode row's step-time quartiles (ms), NaN where it did not run."""
    return row.get("p25_ms", NAN), row.get("p75_ms", NAN)
