"""``python -m servelab.loadgen``: drive a completion server with a trace and report vLLM's metrics.

    python -m servelab.loadgen --base-url http://127.0.0.1:8000 --rate 4 --duration 30 \\
        --lengths sharegpt --vocab-size 32000 --slo-ttft-ms 500 --slo-tpot-ms 50 --out records.csv

    python -m servelab.loadgen --base-url http://127.0.0.1:8000 --dataset prompts.jsonl --rate 8

    python -m servelab.loadgen --base-url http://127.0.0.1:8000 --trace my_trace.jsonl --out records.csv

Without ``--trace`` or ``--dataset`` it synthesizes a trace (Poisson or gamma arrivals, fixed/uniform/ShareGPT-like
lengths, random prompt ids below ``--vocab-size``); ``--dataset`` takes prompts and output lengths from a JSONL
file (``servelab.loadgen.dataset``); ``--save-trace`` writes the trace used as JSONL for the simulator.

Before the run the workload is fitted to the server's context: ``max_model_len`` from ``/v1/models`` (as vLLM
reports it), else ``--max-model-len``; prompts that do not fit are clipped and their number printed
(``Trace.fit_context``). The summary is printed as vLLM's ``benchmark_serving`` prints it and, with
``--summary-out``, written as JSON; the records go to ``--out`` (CSV, one row per request, token times as JSON
lists). Against a speculating server (vLLM's ``spec_decode`` counters in ``/metrics``, scraped before and after the
run) it adds the run's acceptance rate, acceptance length and acceptance per position (``spec_acceptance``).
Exit status: 0; 1 when more than ``--max-failure-rate`` of the requests failed (or none completed); 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from servelab.errors import ParameterError
from servelab.loadgen.dataset import dataset_trace, read_dataset, with_token_counts
from servelab.loadgen.lengths import add_length_arguments, lengths_from_args
from servelab.loadgen.metrics import benchmark_summary, records_for_csv
from servelab.loadgen.report import format_report
from servelab.loadgen.run import run_load
from servelab.loadgen.server_info import card_max_model_len, count_tokens, model_card
from servelab.loadgen.spec_acceptance import acceptance, scrape
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
    src.add_argument(
        "--dataset", default=None, help="JSONL of prompts with output lengths (see servelab.loadgen.dataset)"
    )
    src.add_argument("--rate", "--request-rate", type=float, default=None, help="requests/s (inf: all at once)")
    src.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 = Poisson (vLLM's convention)")
    src.add_argument("--num-requests", "--num-prompts", type=int, default=None)
    src.add_argument("--duration", type=float, default=None, help="seconds of arrivals (instead of --num-requests)")
    add_length_arguments(src)
    src.add_argument(
        "--vocab-size",
        type=int,
        default=256,
        help="prompt ids are drawn below this (default 256: valid for every model)",
    )
    src.add_argument("--seed", type=int, default=0)
    src.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context (prompt + output tokens) to fit the workload to when the server's /v1/models does not say; "
        "below the server's, it caps further",
    )
    src.add_argument("--save-trace", default=None, help="write the trace used as JSONL")
    out = p.add_argument_group("measurement")
    out.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput SLO on TTFT (ms)")
    out.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput SLO on TPOT (ms)")
    out.add_argument("--deadline", type=float, default=math.inf, help="cancel what is still running after this many s")
    out.add_argument(
        "--max-failure-rate",
        type=float,
        default=0.01,
        help="exit 1 when more than this fraction of the requests fail (default 0.01)",
    )
    out.add_argument("--out", default=None, help="records CSV")
    out.add_argument("--summary-out", default=None, help="summary JSON")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def trace_from_args(a) -> Trace:
    """The trace the flags ask for: replayed (``--trace``), from a dataset, or synthetic."""
    if a.trace and a.dataset:
        raise ParameterError("give --trace or --dataset, not both")
    if a.trace:
        return Trace.read_jsonl(a.trace)
    if a.rate is None:
        raise ParameterError("give --trace, or --rate (with --dataset, --num-requests or --duration)")
    if a.dataset:
        rows = with_token_counts(
            read_dataset(a.dataset), lambda texts: count_tokens(a.base_url, texts, a.model, a.api_key)
        )
        return dataset_trace(
            rows,
            rate=a.rate,
            n=a.num_requests,
            duration_s=a.duration,
            burstiness=a.burstiness,
            seed=a.seed,
            source=a.dataset,
        )
    return Trace.synthetic(
        rate=a.rate,
        lengths=lengths_from_args(a),
        n=a.num_requests,
        duration_s=a.duration,
        burstiness=a.burstiness,
        seed=a.seed,
    )


def context_limit(a, log) -> int | None:
    """The context to fit the workload to: the server's ``max_model_len`` (``/v1/models``), capped by
    ``--max-model-len``; the flag alone when the server does not report one; None (no fitting) without either."""
    served = card_max_model_len(model_card(a.base_url, a.model, a.api_key))
    flag = a.max_model_len
    if flag is not None and flag < 2:
        raise ParameterError(f"--max-model-len must be at least 2 tokens, got {flag}")
    if served is None and flag is None:
        log("no max_model_len from the server's /v1/models and no --max-model-len: prompts not fitted")
        return None
    if served is None:
        log(f"no max_model_len from the server's /v1/models: fitting to --max-model-len {flag:,}")
        return flag
    if flag is not None and flag < served:
        log(f"server's max_model_len {served:,}; fitting to --max-model-len {flag:,}")
        return flag
    log(f"server's max_model_len (from /v1/models): {served:,}")
    return served


def fit_to_server(trace: Trace, a, log) -> Trace:
    """``trace`` fitted to the server's context (``context_limit``), saying how many prompts were clipped."""
    limit = context_limit(a, log)
    if limit is None:
        return trace
    fitted, clipped, dropped = trace.fit_context(limit)
    log(
        f"{clipped} of {len(trace)} prompts clipped to fit {limit:,} tokens (prompt + output)"
        + (f"; {dropped} text prompts longer than that dropped (text cannot be cut)" if dropped else "")
    )
    if not len(fitted):
        raise ParameterError(f"no request of the workload fits a context of {limit:,} tokens")
    return fitted


def failure_verdict(summary: dict, max_failure_rate: float) -> tuple[int, str]:
    """Exit status and its reason: 1 when no request completed or more than ``max_failure_rate`` failed."""
    total = summary["completed"] + summary["failed"]
    rate = summary["failed"] / total if total else 1.0
    if summary["completed"] == 0:
        return 1, f"no request completed ({summary['failed']} failed)"
    if rate > max_failure_rate:
        why = f"{summary['failed']} of {total} requests failed ({rate:.1%})"
        return 1, f"{why}, over --max-failure-rate {max_failure_rate:g}"
    return 0, ""


def prepare(a, log) -> Trace:
    """The trace to send: built, fitted to the server's context, given prompt ids if it has none, saved."""
    if not 0 <= a.max_failure_rate <= 1:
        raise ParameterError(f"--max-failure-rate must be a fraction in [0, 1], got {a.max_failure_rate}")
    trace = fit_to_server(trace_from_args(a), a, log)
    if not trace.has_prompt_ids and "prompt" not in trace.frame.columns:  # lengths only: random ids
        trace = trace.with_prompt_ids(a.vocab_size, seed=a.seed)
    if a.save_trace:
        trace.write_jsonl(a.save_trace)
    log(f"{trace}")
    return trace


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr)

    try:
        trace = prepare(a, log)
        before = scrape(a.base_url, a.api_key)  # a speculating server's counters, to report the run's acceptance
        records = run_load(
            a.base_url, trace, model=a.model, api_key=a.api_key, deadline_s=a.deadline, progress=not a.no_progress
        )
        summary = benchmark_summary(records, slo_ttft_ms=a.slo_ttft_ms, slo_tpot_ms=a.slo_tpot_ms)
        spec = acceptance(before, scrape(a.base_url, a.api_key))
        if spec is not None:
            summary["spec_decode"] = spec
    except ParameterError as e:
        log(f"error: {e}")
        return 2
    if a.out:
        records_for_csv(records).to_csv(a.out, index=False)
    if a.summary_out:
        with open(a.summary_out, "w") as f:
            json.dump(summary, f, indent=2)
    print(format_report(summary, goodput=a.slo_ttft_ms is not None or a.slo_tpot_ms is not None))
    for err, n in records.loc[~records["ok"], "error"].value_counts().items():
        log(f"failed x{n}: {err}")
    status, why = failure_verdict(summary, a.max_failure_rate)
    if status:
        log(f"error: {why}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
