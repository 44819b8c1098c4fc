"""``python -m servelab.loadgen.compare A.json B.json``: two runs of one trace, side by side.

The question it answers is the one a serving change raises: on the same requests, what did it do to latency and
throughput? (Speculative decoding against plain decoding, one scheduling policy against another.) Each file is a
run's ``--summary-out``; the rows are ``format_report``'s, in vLLM's units, with each run's value and B's as a
multiple of A's.

Runs of different traces do not compare: two summaries whose request count or total prompt tokens differ are
refused (``--trace`` replays one trace; ``--save-trace`` writes it). Exit status 0, or 2 for files that do not
compare.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from servelab.errors import ParameterError
from servelab.loadgen.report import SECTIONS

ROWS = (
    [
        ("Successful requests", "completed", ""),
        ("Failed requests", "failed", ""),
        ("Benchmark duration (s)", "duration_s", ".2f"),
        ("Request throughput (req/s)", "request_throughput", ".2f"),
        ("Output token throughput (tok/s)", "throughput_tok_s", ".2f"),
        ("Total Token throughput (tok/s)", "total_token_throughput_tok_s", ".2f"),
    ]
    + [
        (f"{stat} {name} (ms)", f"{key}_{suffix}_ms", ".2f")
        for key, name, _ in SECTIONS
        for stat, suffix in (("Mean", "mean"), ("Median", "p50"), ("P99", "p99"))
    ]
    + [  # a speculating server's acceptance over the run (``loadgen.spec_acceptance``); nan for a plain one
        ("Acceptance rate", "spec_acceptance_rate", ".3f"),
        ("Acceptance length", "spec_acceptance_length", ".3f"),
    ]
)
SAME_TRACE = ("total_input_tokens",)  # with the request count: what two runs of one trace share


def check_same_trace(a: dict, b: dict) -> None:
    """Refuse two summaries that cannot come from one trace: other request counts or prompt tokens."""
    count_a, count_b = a["completed"] + a["failed"], b["completed"] + b["failed"]
    if count_a != count_b:
        raise ParameterError(f"not one trace: {count_a} requests against {count_b}")
    for key in SAME_TRACE:
        if a[key] != b[key]:
            raise ParameterError(f"not one trace: {key} {a[key]} against {b[key]}")


def flat(summary: dict) -> dict:
    """The summary with its speculative section's numbers as ``spec_<name>`` keys (missing ones NaN)."""
    spec = summary.get("spec_decode") or {}
    rates = {f"spec_{k}": math.nan if v is None else v for k, v in spec.items() if not isinstance(v, list)}
    return summary | rates


def format_comparison(a: dict, b: dict, labels: tuple[str, str] = ("A", "B")) -> str:
    """A table of every row in both runs, with B / A (``-`` where A is 0 or either is missing)."""
    check_same_trace(a, b)
    head = f"{'':<40} {labels[0]:>12} {labels[1]:>12} {'B / A':>8}"
    lines = [head, "-" * len(head)]
    a, b = flat(a), flat(b)
    for label, key, fmt in ROWS:
        va, vb = a.get(key, math.nan), b.get(key, math.nan)
        ratio = f"{vb / va:8.3f}" if isinstance(va, (int, float)) and va and not math.isnan(va) else f"{'-':>8}"
        lines.append(f"{label + ':':<40} {va:>12{fmt}} {vb:>12{fmt}} {ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m servelab.loadgen.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="the baseline run's summary JSON (--summary-out)")
    p.add_argument("b", help="the other run's summary JSON")
    p.add_argument("--labels", nargs=2, default=("A", "B"), metavar=("A", "B"), help="column names")
    args = p.parse_args(argv)
    try:
        runs = [json.loads(Path(path).read_text()) for path in (args.a, args.b)]
        print(format_comparison(*runs, labels=tuple(args.labels)))
    except (OSError, json.JSONDecodeError, KeyError, ParameterError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
