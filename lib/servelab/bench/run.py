"""``python -m servelab.bench``: the engine's benchmarks, on your GPU, with any model the loader accepts.

    python -m servelab.bench                       # Qwen2-0.5B shape in bf16: every row of bench.csv
    python -m servelab.bench --model ./my-model --num-requests 64 --quick
    python -m servelab.bench --smoke               # tiny config on the CPU, seconds (CI)

Rows of ``bench.csv`` (``data/results/<device>/engine/``), each measured on the engine's default configuration
(``EngineConfig()``: attention backend and ``torch.compile`` on "auto", async scheduling) beside its bound
measured in the same run (copy and matmul ceilings); other settings only as extra rows, labelled:

- ``decode_ms_b{B}_ctx{C}``: one decode step's forward (a CUDA-graph replay, input copies included) for B
  sequences with C cached tokens; bound: weights + KV bytes at the copy ceiling (``decode_rows.py``);
- ``offline_tok_s``, ``offline_tok_s_budget{N}`` and their ratio: output tokens/s on the offline workload
  (random prompts, prompt and output lengths uniform in [min, max], EOS ignored), by default and at a
  per-step token budget of N; bound: ``offline_floor_s`` (``offline_rows.py``); ``offline_tok_s_decode_steps8``
  (labelled, in the smoke too): the same with multi-step decoding; every run checks that the engine gave back
  every block-table row and KV block of its finished requests;
- ``hf_offline_tok_s``: HF ``generate`` with static batching on the same workload (a time-capped first
  batch; see ``hf_baseline.py`` for why that favours HF), and ``engine_speedup_vs_hf``;
- ``prefill_mfu_{T}``: model FLOPs of a T-token prefill of ``--mfu-model`` per second, over the measured
  matmul ceiling (``prefill_rows.py``);
- ``mixed_step_ms``: decodes plus a prefill chunk in one step, beside the sum of the two alone;
  ``e2e_ms_per_token_b1`` and ``e2e_over_forward_b1``: one request through ``Engine.generate`` beside the
  captured forward alone (``latency_rows.py``).

Also written: ``decode.csv`` (engine settings beside HF eager and HF in a CUDA graph), ``offline.csv``,
``latency.csv`` (the steps behind ``mixed_step_ms``), ``exactness.csv`` (greedy agreement and logit error
against HF, same weights).
"""

from __future__ import annotations

import sys
import time

import pandas as pd

from servelab.bench.cli_args import bench_parser
from servelab.bench.plan import BenchPlan, make_plan
from servelab.errors import ParameterError

__all__ = ["run_bench", "main", "parse_args", "BenchPlan", "make_plan"]


def run_bench(plan: BenchPlan, *, write: bool = True, progress: bool = True, log=print) -> dict[str, pd.DataFrame]:
    """Run every section the time budget allows; returns the tables (and writes them unless ``write=False``)."""
    from servelab.bench.decode_rows import decode_section
    from servelab.bench.exactness_rows import exactness_section
    from servelab.bench.latency_rows import e2e_section, mixed_section
    from servelab.bench.offline_rows import offline_section
    from servelab.bench.prefill_rows import prefill_section
    from servelab.bench.session import BenchSession

    session = BenchSession(plan, write=write, progress=progress, log=log)
    for section in (decode_section, offline_section, e2e_section, mixed_section, prefill_section, exactness_section):
        section(session)
    return session.close(wall_s=time.perf_counter() - session.clock.t0)


def parse_args(argv=None):
    p = bench_parser("python -m servelab.bench", __doc__)
    p.add_argument("--mfu-model", default="config:qwen2-1.5b", help="model for the prefill-MFU row")
    p.add_argument("--e2e-model", default=None, help="model for the e2e_ms_per_token_b1 row (default: --model)")
    p.add_argument("--mfu-tokens", type=int, default=4096)
    p.add_argument("--num-requests", type=int, default=None, help="offline workload size (default 256)")
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--hf-batch", type=int, default=64, help="HF static batch size for the baseline")
    p.add_argument("--time-budget", type=float, default=480.0, help="seconds; late sections are skipped past it")
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
