"""The summary as vLLM's ``benchmarks/benchmark_serving.py`` prints it, so that a vLLM user reads (and parses)
it as theirs: the same title bar, labels, column widths and sections.

    ============ Serving Benchmark Result ============
    Successful requests:                     200
    Benchmark duration (s):                  31.02
    ...
    ---------------Time to First Token----------------
    Mean TTFT (ms):                          41.27
    Median TTFT (ms):                        38.90
    P99 TTFT (ms):                           95.13
    ...

vLLM prints the mean, median and the requested percentiles (P99 by default) of TTFT, TPOT and ITL, and of
E2EL when asked; this prints all four. ``Failed requests`` follows ``Successful requests``, as in vLLM's later
``vllm bench serve``; ``Request goodput`` appears when an SLO was given. A statistic without data prints nan.
A run against a speculating server adds ``vllm bench serve``'s speculative section (``summary["spec_decode"]``,
from the server's counters: ``loadgen.spec_acceptance``).
"""

from __future__ import annotations

WIDTH = 50
SECTIONS = (
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2e", "E2EL", "End-to-end Latency"),
)


def _line(label: str, value, fmt: str = "") -> str:
    return f"{label:<40} {value:<10{fmt}}"


def format_report(summary: dict, *, goodput: bool = False, title: str = "Serving Benchmark Result") -> str:
    """``summary`` (``servelab.loadgen.metrics.BENCHMARK_KEYS``) in vLLM's layout; ``goodput``: include the
    request goodput line (an SLO was given)."""
    s = summary
    lines = [
        f"{' ' + title + ' ':=^{WIDTH}}",
        _line("Successful requests:", s["completed"]),
        _line("Failed requests:", s["failed"]),
        _line("Benchmark duration (s):", s["duration_s"], ".2f"),
        _line("Total input tokens:", s["total_input_tokens"]),
        _line("Total generated tokens:", s["total_output_tokens"]),
        _line("Request throughput (req/s):", s["request_throughput"], ".2f"),
    ]
    if goodput:
        lines.append(_line("Request goodput (req/s):", s["goodput_req_s"], ".2f"))
    lines += [
        _line("Output token throughput (tok/s):", s["throughput_tok_s"], ".2f"),
        _line("Total Token throughput (tok/s):", s["total_token_throughput_tok_s"], ".2f"),
    ]
    for key, name, header in SECTIONS:
        lines += [
            f"{header:-^{WIDTH}}",
            _line(f"Mean {name} (ms):", s[f"{key}_mean_ms"], ".2f"),
            _line(f"Median {name} (ms):", s[f"{key}_p50_ms"], ".2f"),
            _line(f"P99 {name} (ms):", s[f"{key}_p99_ms"], ".2f"),
        ]
    if s.get("spec_decode"):
        lines += spec_lines(s["spec_decode"])
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def spec_lines(spec: dict) -> list[str]:
    """The speculative section: acceptance rate and length, the counts, and the acceptance at each position."""
    pct = lambda x: float("nan") if x is None else 100 * x  # noqa: E731
    length = float("nan") if spec["acceptance_length"] is None else spec["acceptance_length"]
    lines = [
        f"{'Speculative Decoding':-^{WIDTH}}",
        _line("Acceptance rate (%):", pct(spec["acceptance_rate"]), ".2f"),
        _line("Acceptance length:", length, ".2f"),
        _line("Drafts:", spec["drafts"]),
        _line("Draft tokens:", spec["draft_tokens"]),
        _line("Accepted tokens:", spec["accepted_tokens"]),
        "Per-position acceptance (%):",
    ]
    return lines + [_line(f"  Position {j}:", pct(r), ".2f") for j, r in enumerate(spec["per_position"])]


def parse_report(text: str) -> dict[str, float]:
    """The ``label: number`` rows of a report in this layout (this module's, or vLLM's own output), as
    ``{"Successful requests:": 200.0, "Mean TTFT (ms):": 41.27, ...}``: to compare a vLLM run with a simulated one."""
    rows = {}
    for line in text.splitlines():
        label, _, value = line.partition(":")
        try:
            rows[label.strip() + ":"] = float(value)
        except ValueError:
            continue
    return rows
