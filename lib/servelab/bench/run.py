"""``python -m servelab.bench``: the engine's benchmarks, on your GPU, with any model the loader accepts.

    python -m servelab.bench                       # Qwen2-0.5B shape in bf16: every row of bench.csv
    python -m servelab.bench --model ./my-model --num-requests 64 --quick
    python -m servelab.bench --smoke               # tiny config on the CPU, seconds (CI)

Rows of ``bench.csv`` (``data/results/<device>/engine/``), each beside its roofline bound measured in
the same run (copy and matmul ceilings):

- ``decode_ms_b{B}_ctx{C}``: one decode step's forward (a CUDA-graph replay, input copies included)
  for B sequences with C cached tokens; bound: weights + KV bytes at the copy ceiling;
- ``offline_tok_s``: output tokens/s on the offline workload (random prompts, prompt and output
  lengths uniform in [min, max], EOS ignored); bound: ``offline_floor_s``;
- ``hf_offline_tok_s``: HF ``generate`` with static batching on the same workload (a time-capped
  first batch; see ``hf_baseline.py`` for why that favours HF), and ``engine_speedup_vs_hf``;
- ``prefill_mfu_{T}``: model FLOPs of a T-token prefill of ``--mfu-model`` per second, over the
  measured matmul ceiling.

Also written: ``decode.csv`` (engine backends beside HF eager and HF in a CUDA graph), ``offline.csv``,
``exactness.csv`` (greedy agreement and logit error against HF, same weights).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback
from dataclasses import dataclass

import pandas as pd

from servelab.errors import ParameterError


@dataclass(frozen=True)
class BenchPlan:
    model: str
    mfu_model: str
    dtype: str
    device: str
    decode_points: tuple[tuple[int, int], ...]  # (batch, context)
    mfu_tokens: int
    num_requests: int
    min_len: int
    max_len: int
    hf_batch: int
    hf_budget_s: float
    exactness_models: tuple[str, ...]
    exactness_prompts: int
    exactness_steps: int
    repeats: int
    time_budget_s: float
    seed: int
    try_compile: bool = True  # also measure the engine with torch.compile'd blocks (slow to compile on a CPU)
    decode_steps: tuple[int, ...] = (1, 8)  # multi-step decoding settings tried in the offline run


GOALS = {
    "decode_ms_b1_ctx128": ("<=", 0.6),
    "decode_ms_b64_ctx512": ("<=", 0.8),
    "offline_tok_s": (">=", 40000),
    "engine_speedup_vs_hf": (">=", 20),
    "prefill_mfu_4096": (">=", 0.5),
}


def make_plan(args) -> BenchPlan:
    import torch

    if args.smoke:
        return BenchPlan(
            "config:tiny-qwen2",
            "config:tiny-llama",
            "float32",
            "cpu",
            ((1, 16), (4, 32)),
            128,
            args.num_requests or 8,
            8,
            24,
            8,
            2.0,
            ("config:tiny-gpt2",),
            2,
            8,
            3,
            args.time_budget,
            args.seed,
            try_compile=False,
            decode_steps=(1, 4),
        )
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    quick = args.quick
    return BenchPlan(
        args.model,
        args.mfu_model,
        args.dtype,
        device,
        ((1, 128), (64, 512)),
        args.mfu_tokens,
        args.num_requests or 256,
        args.min_len,
        args.max_len,
        args.hf_batch,
        10.0 if quick else 20.0,
        () if quick else ("config:gpt2",),
        4,
        32,
        10 if quick else 30,
        args.time_budget,
        args.seed,
    )


class Clock:
    def __init__(self, budget_s: float):
        self.t0, self.budget = time.perf_counter(), budget_s

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)


def _free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _row(metric, value, unit, bound=None, note=""):
    """A bench row; ``pct_of_roofline`` is 100 at the roofline (floor/measured for times, measured/bound for rates)."""
    if bound is None or value is None or value != value:
        pct = float("nan")
    elif unit in ("ms",):
        pct = 100.0 * bound / value
    else:
        pct = 100.0 * value / bound
    op, goal = GOALS.get(metric, (None, float("nan")))
    meets = None if op is None or value != value else (value <= goal if op == "<=" else value >= goal)
    return {
        "metric": metric,
        "value": value,
        "unit": unit,
        "roofline_bound": bound,
        "pct_of_roofline": pct,
        "goal": f"{op} {goal:g}" if op else "",
        "meets_goal": meets,
        "note": note,
    }


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


def run_bench(plan: BenchPlan, *, write: bool = True, progress: bool = True, log=print) -> dict[str, pd.DataFrame]:
    """Run every section the time budget allows; returns the tables (and writes them unless ``write=False``)."""
    import torch

    from servelab.bench.exactness import greedy_agreement
    from servelab.bench.hf_baseline import hf_static_throughput
    from servelab.bench.offline import offline_floor_s, run_offline
    from servelab.bench.step import engine_step
    from servelab.bench.workload import offline_workload
    from servelab.engine import Engine, EngineConfig
    from servelab.kernels.decode import DECODE_BACKENDS
    from servelab.measure import Roofline, device_record, measure_ceilings, time_fn
    from servelab.measure.results import StudyResults
    from servelab.models import ModelShape, load_model

    clock = Clock(plan.time_budget_s)
    dev = device_record(plan.device)
    cuda = dev.kind == "cuda"
    log(dev.summary())
    ceil = measure_ceilings(plan.device)
    roof = Roofline.from_ceilings(ceil)
    log(f"ceilings: copy {ceil.copy_gb_s:,.0f} GB/s, matmul {ceil.matmul_tflop_s:,.1f} TFLOP/s ({ceil.matmul_dtype})")
    rows, decode_rows, offline_rows, exact = [], [], [], []
    results = StudyResults("engine", dev, dict(plan.__dict__), ceil) if write else None

    def flush() -> dict[str, pd.DataFrame]:
        """Write what is measured so far: a run cut short by an outer time limit still leaves its tables."""
        tables = {
            "bench": pd.DataFrame(rows),
            "decode": pd.DataFrame(decode_rows),
            "offline": pd.DataFrame(offline_rows),
            "exactness": pd.concat(exact, ignore_index=True) if exact else pd.DataFrame(),
        }
        if results is not None:
            for name, df in tables.items():
                if len(df):
                    results.write(name, df)
        return tables

    dtype_bytes = torch.empty(0, dtype=getattr(torch, plan.dtype)).element_size()
    lm = load_model(plan.model, dtype=plan.dtype, device=plan.device, seed=plan.seed, load_tokenizer=False)
    hf = lm.model
    shape = ModelShape.from_config(hf.config)
    backends = ["triton", "gather"] if cuda and "triton" in DECODE_BACKENDS else ["gather"]

    # ---- decode steps: engine backends, HF eager, HF in a CUDA graph, the floor -----------------------------
    variants = [(f"engine_{b}", b, False) for b in backends]
    if plan.try_compile:
        variants.append((f"engine_{backends[0]}_compiled", backends[0], True))
    best_variant, best_at_largest = variants[0], float("inf")
    for batch, ctx in plan.decode_points:
        flops, nbytes = shape.decode_flops(batch, ctx), shape.decode_bytes(batch, ctx, dtype_bytes)
        floor = float(roof.floor_ms(flops, nbytes))
        impls = variants + [("hf_eager", None, False)] + ([("hf_cuda_graph", None, False)] if cuda else [])
        best = float("nan")
        for impl, backend, compiled in impls:
            status, t, note, prof = "ok", None, "", {}
            if clock.left() < (150 if compiled else 120):  # keep time for the sections that follow
                decode_rows.append(
                    {
                        "impl": impl,
                        "batch": batch,
                        "context": ctx,
                        "median_ms": float("nan"),
                        "p25_ms": float("nan"),
                        "p75_ms": float("nan"),
                        "floor_ms": floor,
                        "pct_of_floor": float("nan"),
                        "status": "skipped",
                        "note": "time budget",
                    }
                )
                log(f"decode b={batch} ctx={ctx} {impl}: skipped (time budget)")
                continue
            try:
                if backend is not None:
                    fn, before = engine_step(
                        hf, batch, 1, ctx, seed=plan.seed, attention_backend=backend, compile=compiled
                    )
                    st = fn.engine.stats()
                    note = f"graphs={st['cuda_graphs']}, compile {st['compile']}"
                    if backend == "triton":
                        note += f", kernel {st['triton_tuning']}"
                elif impl == "hf_eager":
                    from servelab.bench.hf_modes import eager_step

                    fn, before = eager_step(hf, batch, 1, ctx, seed=plan.seed)
                else:
                    from servelab.bench.hf_modes import cuda_graph_step

                    fn, before = cuda_graph_step(hf, batch, 1, ctx, seed=plan.seed)
                repeats = plan.repeats if backend is not None or impl == "hf_cuda_graph" else max(3, plan.repeats // 3)
                t = time_fn(fn, warmup=3, repeats=repeats, device=plan.device, before_each=before)
                if cuda and (backend is not None or impl == "hf_cuda_graph"):
                    try:  # where the time goes: kernels per step, GPU-busy share; optional, never fatal
                        prof = profile_step(fn, before)
                    except Exception as e:
                        prof = {"top_kernels": f"profile failed: {type(e).__name__}: {e}"[:200]}
            except Exception as e:  # record and go on: one failing variant must not end the run
                status, note = (
                    ("oom" if "out of memory" in str(e).lower() else "error"),
                    f"{type(e).__name__}: {e}"[:300],
                )
            finally:
                fn = before = None
                _free(plan.device)
            ms = t.median_ms if t else float("nan")
            decode_rows.append(
                {
                    "impl": impl,
                    "batch": batch,
                    "context": ctx,
                    "median_ms": ms,
                    "p25_ms": t.p25_ms if t else float("nan"),
                    "p75_ms": t.p75_ms if t else float("nan"),
                    "floor_ms": floor,
                    "pct_of_floor": 100 * floor / ms if t else float("nan"),
                    "status": status,
                    "note": note,
                    **prof,
                }
            )
            if backend is not None and t and not ms >= best:
                best = ms
                if (batch, ctx) == plan.decode_points[-1] and ms < best_at_largest:
                    best_variant, best_at_largest = (impl, backend, compiled), ms
            log(f"decode b={batch} ctx={ctx} {impl}: {ms:.3f} ms (floor {floor:.3f}) {status} {note[:80]}")
        fastest = min(
            (
                r
                for r in decode_rows
                if r["batch"] == batch
                and r["context"] == ctx
                and r["impl"].startswith("engine")
                and r["status"] == "ok"
            ),
            key=lambda r: r["median_ms"],
            default=None,
        )
        note = "failed"
        if fastest:
            note = (
                f"engine forward ({fastest['impl']}), CUDA-graph replay incl. input copies; median of {plan.repeats}"
                if cuda
                else "eager forward (no CUDA)"
            )
            if "kernels" in fastest:
                note += (
                    f"; profile: {fastest['kernels']} kernels/step, GPU busy {fastest['gpu_busy_pct']:.0f}%, "
                    f"{fastest['gpu_busy_ms'] * 1e3 / max(fastest['kernels'], 1):.1f} µs of kernel time per kernel; "
                    f"largest: {fastest['top_kernels']}"
                )
        rows.append(_row(f"decode_ms_b{batch}_ctx{ctx}", best, "ms", floor, note))

    flush()

    # ---- offline throughput ---------------------------------------------------------------------------------
    work = offline_workload(plan.num_requests, plan.min_len, plan.max_len, vocab=shape.vocab, seed=plan.seed)
    floor_s = offline_floor_s(shape, work, roof, dtype_bytes)
    bound_tok_s = work.output_tokens / floor_s
    engine_tok_s = float("nan")
    _, best_backend, best_compile = best_variant
    log(f"offline engine: {best_variant[0]} (fastest decode at the largest point)")
    try:
        cfg = EngineConfig(
            max_model_len=-(-work.max_total_len // 256) * 256,
            max_num_seqs=min(256, plan.num_requests),
            max_num_batched_tokens=16384,
            attention_backend=best_backend,
            compile=best_compile,
        )
        t0 = time.perf_counter()
        engine = Engine.from_hf(hf, cfg)
        build_s = time.perf_counter() - t0
        warm = offline_workload(min(16, plan.num_requests), 8, 32, vocab=shape.vocab, seed=plan.seed + 1)
        notes = []
        for k in plan.decode_steps:
            if k > 1 and clock.left() < 90:
                notes.append(f"decode_steps={k}: skipped (time budget)")
                continue
            engine.config = dataclasses.replace(engine.config, decode_steps=k)
            run_offline(engine, warm)  # first-use costs (Triton compiles, allocator growth) outside the timing
            st0 = engine.stats()
            res = run_offline(engine, work, progress=progress)
            st = engine.stats()
            offline_rows.append(
                {
                    "impl": "engine",
                    "decode_steps": k,
                    **res,
                    "build_s": build_s,
                    **{
                        key: st[key]
                        for key in (
                            "num_blocks",
                            "kv_pool_gib",
                            "attention_backend",
                            "varlen_prefill",
                            "compile",
                            "cuda_graphs",
                            "graph_capture_s",
                        )
                    },
                    "graph_steps": st["graph_steps"] - st0["graph_steps"],
                    "eager_steps": st["eager_steps"] - st0["eager_steps"],
                }
            )
            notes.append(
                f"decode_steps={k}: {res['tok_s']:,.0f} tok/s ({res['output_tokens']} tokens in "
                f"{res['elapsed_s']:.2f} s, {st['graph_steps'] - st0['graph_steps']} graph / "
                f"{st['eager_steps'] - st0['eager_steps']} eager steps, {res['preemptions']} preemptions)"
            )
            engine_tok_s = res["tok_s"] if not res["tok_s"] <= engine_tok_s else engine_tok_s
        note = (
            f"{work.num_requests} requests, lengths U[{plan.min_len}, {plan.max_len}], temperature 0.6, EOS ignored; "
            f"backend {st['attention_backend']}, varlen prefill {st['varlen_prefill']}, compile {st['compile']}, "
            f"{st['num_blocks']} KV blocks; the value is the best of: " + "; ".join(notes)
        )
        log(f"offline: {engine_tok_s:,.0f} tok/s ({note})")
    except Exception as e:
        note = f"failed: {type(e).__name__}: {e}"[:300]
        log(note)
        traceback.print_exc()
    finally:
        engine = None
        _free(plan.device)
    rows.append(_row("offline_tok_s", engine_tok_s, "tok/s", bound_tok_s, note))

    hf_tok_s = float("nan")
    budget = min(plan.hf_budget_s, max(0.0, clock.left() - 60))
    if budget >= 1:
        try:
            res = hf_static_throughput(hf, work, batch_size=plan.hf_batch, time_budget_s=budget)
            hf_tok_s = res["tok_s"]
            offline_rows.append({"impl": "hf_generate_static", **res})
            note = (
                f"HF generate, static batch of {res['batch_size']} (the workload's first requests), "
                f"{res['generated_steps']} steps in {res['elapsed_s']:.1f} s"
                + ("" if res["complete"] else " (time-capped: an upper bound on HF's full-workload rate)")
            )
        except Exception as e:
            note = f"failed: {type(e).__name__}: {e}"[:300]
        finally:
            _free(plan.device)
    else:
        note = "skipped: time budget"
    log(f"hf offline: {hf_tok_s:,.0f} tok/s ({note})")
    rows.append(_row("hf_offline_tok_s", hf_tok_s, "tok/s", bound_tok_s, note))
    rows.append(
        _row(
            "engine_speedup_vs_hf",
            engine_tok_s / hf_tok_s if hf_tok_s == hf_tok_s else float("nan"),
            "x",
            None,
            "offline_tok_s / hf_offline_tok_s",
        )
    )

    flush()

    # ---- prefill MFU -----------------------------------------------------------------------------------------
    mfu, notes, big = float("nan"), [], None
    for compiled in [False, True] if plan.try_compile else [False]:
        if clock.left() < 20:
            notes.append(f"compile={compiled}: skipped (time budget)")
            continue
        fn = None
        try:
            if big is None:
                big = load_model(
                    plan.mfu_model, dtype=plan.dtype, device=plan.device, seed=plan.seed, load_tokenizer=False
                ).model
                bshape = ModelShape.from_config(big.config)
            fn, _ = engine_step(big, 1, plan.mfu_tokens, 0, seed=plan.seed, compile=compiled)
            status = fn.engine.stats()["compile"]
            t = time_fn(fn, warmup=3, repeats=max(5, plan.repeats // 3), device=plan.device)
            flops = bshape.prefill_flops(plan.mfu_tokens)
            this = float(roof.achieved_tflop_s(t.median_ms, flops)) / ceil.matmul_tflop_s
            notes.append(
                f"compile {status}: {t.median_ms:.2f} ms (p25 {t.p25_ms:.2f}, p75 {t.p75_ms:.2f}) = {this:.3f}"
            )
            mfu = this if not this <= mfu else mfu
        except Exception as e:
            notes.append(f"compile={compiled} failed: {type(e).__name__}: {e}"[:200])
        finally:
            fn = None
            _free(plan.device)
    big = None
    _free(plan.device)
    note = (
        f"{plan.mfu_model}, one {plan.mfu_tokens}-token prompt, {bshape.prefill_flops(plan.mfu_tokens) / 1e12:.2f} "
        f"TFLOP against the {ceil.matmul_tflop_s:.0f} TFLOP/s ceiling ({ceil.matmul_dtype} {ceil.matmul_n}^3); "
        if notes and "bshape" in locals()
        else ""
    ) + "; ".join(notes)
    log(f"prefill MFU: {mfu:.3f} ({note})")
    rows.append(_row(f"prefill_mfu_{plan.mfu_tokens}", mfu, "fraction of matmul ceiling", 1.0, note))

    flush()

    # ---- exactness against HF in this dtype ------------------------------------------------------------------
    for spec in (plan.model,) + plan.exactness_models:
        for compiled in sorted({False, best_compile}):
            if clock.left() < 30:
                log(f"exactness {spec} compile={compiled}: skipped (time budget)")
                continue
            eng = other = None
            try:
                other = (
                    hf
                    if spec == plan.model
                    else load_model(
                        spec, dtype=plan.dtype, device=plan.device, seed=plan.seed, load_tokenizer=False
                    ).model
                )
                vocab = other.config.vocab_size
                g = torch.Generator().manual_seed(plan.seed)
                prompts = [
                    torch.randint(0, vocab, (n,), generator=g).tolist()
                    for n in (7, 33, 120, 300)[: plan.exactness_prompts]
                ]
                eng = Engine.from_hf(
                    other,
                    EngineConfig(
                        max_num_seqs=8,
                        max_num_batched_tokens=1024,
                        max_model_len=512,
                        num_blocks=256,
                        attention_backend=best_backend,
                        compile=compiled,
                        graph_batch_sizes=(1, 2, 4),
                    ),
                )
                df = greedy_agreement(other, eng, prompts, plan.exactness_steps)
                df.insert(0, "model", spec)
                df.insert(1, "dtype", plan.dtype)
                df.insert(
                    2,
                    "engine",
                    f"{eng.backend}, compile {eng.compile_status}, {'CUDA graphs' if eng.num_graphs else 'eager'}",
                )
                exact.append(df)
                log(
                    f"exactness {spec} compile={compiled}: tokens agree for {df['tokens_agree'].tolist()} of "
                    f"{plan.exactness_steps} steps; max |logit err| {df['logit_max_abs_err'].max():.3g}; teacher-forced "
                    f"argmax agreement {df['tf_argmax_agree_frac'].mean():.3f}"
                )
            except Exception as e:
                log(f"exactness {spec}: failed: {type(e).__name__}: {e}")
            finally:
                eng = other = None
                _free(plan.device)
    lm = hf = None
    _free(plan.device)

    tables = flush()
    if results is not None:
        results.finish(wall_s=time.perf_counter() - clock.t0)
        log(f"wrote {', '.join(results.files)} under {results.dir}")
    return tables


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m servelab.bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="config:qwen2-0.5b", help="any spec the model loader accepts")
    p.add_argument("--mfu-model", default="config:qwen2-1.5b", help="model for the prefill-MFU row")
    p.add_argument("--mfu-tokens", type=int, default=4096)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    p.add_argument("--num-requests", type=int, default=None, help="offline workload size (default 256)")
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--hf-batch", type=int, default=64, help="HF static batch size for the baseline")
    p.add_argument("--time-budget", type=float, default=230.0, help="seconds; late sections are skipped past it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="fewer repeats, shorter HF baseline, no GPT-2 exactness")
    p.add_argument("--smoke", action="store_true", help="tiny config on the CPU in seconds (CI)")
    p.add_argument("--no-write", action="store_true", help="print only; write no results")
    args = p.parse_args(argv)
    for name in ("mfu_tokens", "min_len", "max_len", "hf_batch"):
        if getattr(args, name) < 1:
            raise ParameterError(f"--{name.replace('_', '-')} must be >= 1")
    if args.num_requests is not None and args.num_requests < 1:
        raise ParameterError("--num-requests must be >= 1")
    if args.max_len < args.min_len:
        raise ParameterError("--max-len must be >= --min-len")
    return args


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except ParameterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plan = make_plan(args)
    tables = run_bench(plan, write=not args.no_write, progress=not args.smoke)
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(
            "\n"
            + tables["bench"][
                ["metric", "value", "unit", "roofline_bound", "pct_of_roofline", "goal", "meets_goal"]
            ].to_string(index=False, float_format=lambda v: f"{v:,.4g}")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
