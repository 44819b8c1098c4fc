"""``python -m servelab.loadgen``: drive a completion server with a trace and report vLLM's metrics.

    python -m servelab.loadgen --base-url http://127.0.0.1:8000 --rate 4 --duration 30 \\
        --lengths sharegpt --vocab-size 32000 --slo-ttft-ms 500 --slo-tpot-ms 50 --out records.csv

    python -m servelab.loadgen --base-url http://127.0.0.1:8000 --trace my_trace.jsonl --out records.csv

Without ``--trace`` it synthesizes one (Poisson or gamma arrivals, fixed/uniform/ShareGPT-like lengths,
random prompt ids below ``--vocab-size``); ``--save-trace`` writes it as JSONL for the simulator. The
records go to ``--out`` (CSV, one row per request, token times as JSON lists); the summary is printed and,
with ``--summary-out``, written as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from servelab.errors import ParameterError
from servelab.loadgen.lengths import length_distribution
from servelab.loadgen.metrics import records_for_csv, summarize
from servelab.loadgen.run import run_load
from servelab.loadgen.workload import Trace


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m servelab.loadgen",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name to put in requests (the server's served name)")
    p.add_argument("--api-key", default=None)
    src = p.add_argument_group("workload")
    src.add_argument(
        "--trace", default=None, help="replay this JSONL trace (arrival_s, prompt_tokens/ids, output_tokens)"
    )
    src.add_argument("--rate", type=float, default=None, help="requests/s (inf: all at once)")
    src.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 = Poisson (vLLM's convention)")
    src.add_argument("--num-requests", type=int, default=None)
    src.add_argument("--duration", type=float, default=None, help="seconds of arrivals (instead of --num-requests)")
    src.add_argument("--lengths", choices=["fixed", "uniform", "sharegpt"], default="sharegpt")
    src.add_argument("--prompt-tokens", type=int, default=512, help="fixed: prompt tokens")
    src.add_argument("--output-tokens", type=int, default=128, help="fixed: output tokens")
    src.add_argument("--prompt-range", type=int, nargs=2, default=[128, 1024], metavar=("MIN", "MAX"))
    src.add_argument("--output-range", type=int, nargs=2, default=[32, 256], metavar=("MIN", "MAX"))
    src.add_argument("--prompt-scale", type=float, default=1.0, help="sharegpt: multiply its prompt lengths")
    src.add_argument("--output-scale", type=float, default=1.0, help="sharegpt: multiply its output lengths")
    src.add_argument("--max-prompt-tokens", type=int, default=8000, help="sharegpt: clip prompts")
    src.add_argument("--max-output-tokens", type=int, default=2048, help="sharegpt: clip outputs")
    src.add_argument(
        "--vocab-size",
        type=int,
        default=256,
        help="prompt ids are drawn below this (default 256: valid for every model)",
    )
    src.add_argument("--seed", type=int, default=0)
    src.add_argument("--save-trace", default=None, help="write the trace used as JSONL")
    out = p.add_argument_group("measurement")
    out.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput SLO on TTFT (ms)")
    out.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput SLO on TPOT (ms)")
    out.add_argument("--deadline", type=float, default=math.inf, help="cancel what is still running after this many s")
    out.add_argument("--out", default=None, help="records CSV")
    out.add_argument("--summary-out", default=None, help="summary JSON")
    out.add_argument("--no-progress", action="store_true")
    return p


def trace_from_args(a) -> Trace:
    if a.trace:
        trace = Trace.read_jsonl(a.trace)
    else:
        if a.rate is None:
            raise ParameterError("give --trace, or --rate with --num-requests or --duration")
        if a.lengths == "fixed":
            lengths = length_distribution("fixed", prompt=a.prompt_tokens, output=a.output_tokens)
        elif a.lengths == "uniform":
            lengths = length_distribution(
                "uniform",
                prompt_min=a.prompt_range[0],
                prompt_max=a.prompt_range[1],
                output_min=a.output_range[0],
                output_max=a.output_range[1],
            )
        else:
            lengths = length_distribution(
                "sharegpt",
                prompt_scale=a.prompt_scale,
                output_scale=a.output_scale,
                prompt_max=a.max_prompt_tokens,
                output_max=a.max_output_tokens,
            )
        trace = Trace.synthetic(
            rate=a.rate, lengths=lengths, n=a.num_requests, duration_s=a.duration, burstiness=a.burstiness, seed=a.seed
        )
    if not trace.has_prompt_ids and "prompt" not in trace.frame.columns:  # lengths only: random ids
        trace = trace.with_prompt_ids(a.vocab_size, seed=a.seed)
    return trace


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        trace = trace_from_args(a)
        if a.save_trace:
            trace.write_jsonl(a.save_trace)
        print(f"{trace}", file=sys.stderr)
        records = run_load(
            a.base_url, trace, model=a.model, api_key=a.api_key, deadline_s=a.deadline, progress=not a.no_progress
        )
        summary = summarize(records, slo_ttft_ms=a.slo_ttft_ms, slo_tpot_ms=a.slo_tpot_ms)
    except ParameterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.out:
        records_for_csv(records).to_csv(a.out, index=False)
    if a.summary_out:
        with open(a.summary_out, "w") as f:
            json.dump(summary, f, indent=2)
    width = max(map(len, summary))
    for k, v in summary.items():
        print(f"{k:<{width}}  {v:,.3f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    errors = records.loc[~records["ok"], "error"].value_counts()
    for err, n in errors.items():
        print(f"failed x{n}: {err}", file=sys.stderr)
    return 0 if summary["completed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
