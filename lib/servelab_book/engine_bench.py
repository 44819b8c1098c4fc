"""The engine page's benchmark table, from ``data/results/<h200 slug>/engine/bench.csv``.

The engine's benchmark writes rows ``metric, value, unit`` (and optional further columns such as a bound, a goal or
a note); this renders them with values formatted for reading, each metric named in words (``metric_words``) beside
its identifier, and each bound labelled with what it is (``bound_kind``). The CSV's column ``roofline_bound`` holds
a roofline floor only for some rows: for the mixed step it is the sum of two measured parts, for one request end to
end the measured forward alone, so the table never calls it a roofline.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from servelab.measure.results import results_root
from servelab.studies.common.markdown import format_value, list_table, md_text
from servelab_book.findings import BOOK_DEVICE

REQUIRED = ["metric", "value", "unit"]
SPREAD = ["low", "high"]  # a row's spread, where it has one (``servelab.bench.rows.bench_row``)


def find_bench(root: Path | None = None, device: str = BOOK_DEVICE) -> Path | None:
    """The engine's bench.csv on the book's device (the last slug in name order if several)."""
    found = sorted(Path(root or results_root()).glob(f"*{device}*/engine/bench.csv"))
    return found[-1] if found else None


# the benchmark's metric names in words, by pattern (``servelab.bench.run`` documents the rows); a name matching
# none is shown as its identifier alone
_METRIC_WORDS = [
    (r"decode_ms_b(\d+)_ctx(\d+)", "One decode step, batch {0}, {1} tokens of context"),
    (r"offline_tok_s", "Offline throughput"),
    (r"offline_tok_s_budget(\d+)", "Offline throughput, token budget per step of {0} tokens"),
    (r"offline_budget(\d+)_ratio", "Offline throughput at a token budget per step of {0} tokens, over the default's"),
    (r"offline_tok_s_decode_steps(\d+)", "Offline throughput, {0} decode steps per scheduling round, not the default"),
    (r"hf_offline_tok_s", "HF generate's offline throughput (static batch)"),
    (r"engine_speedup_vs_hf", "The engine's offline throughput over HF generate's"),
    (r"e2e_ms_per_token_b(\d+)", "One request end to end, per output token (batch {0})"),
    (r"e2e_ms_per_token_b(\d+)_sync", "One request end to end, per output token (batch {0}), async scheduling off"),
    (r"e2e_over_forward_b(\d+)", "One request end to end per token, over the captured forward alone (batch {0})"),
    (r"mixed_step_ms", "One mixed step: decodes and a prefill chunk together"),
    (r"prefill_mfu_(\d+)", "Prefill of {0} tokens: model FLOP/s over the matmul ceiling"),
]
# a setting's suffix on a decode row: the fused kernel was a labelled row until issue 29 made it the default, and
# the path it replaced is one since (runs of either time are on the engine page)
_VARIANTS = {
    "fused_rope_kv": "fused RoPE + KV write, not the default",
    "unfused_rope_kv": "RoPE and the KV write apart, not the default",
    "no_small_batch": "the model's own blocks at one row, not the default",
    "no_pdl": "launches without programmatic dependent launch, not the default",
}


def metric_words(metric: str) -> str:
    """A bench metric in words, its identifier after it in code: "One decode step, batch 1, 128 tokens of context
    (`decode_ms_b1_ctx128`)". A decode row with a setting after its shape names it ("..., fused RoPE + KV write, not
    the default"). An unknown metric is its identifier alone."""
    name = str(metric)
    for pattern, words in _METRIC_WORDS:
        m = re.fullmatch(pattern + r"(?:_(\w+))?" if pattern.startswith("decode") else pattern, name)
        if m:
            numbers = [f"{int(g):,}" for g in m.groups()[: words.count("{")]]
            said = words.format(*numbers)
            extra = m.groups()[words.count("{") :] if pattern.startswith("decode") else ()
            if extra and extra[0]:
                said += ", " + _VARIANTS.get(extra[0], extra[0].replace("_", " "))
            return f"{md_text(said)} (`{name}`)"
    return f"`{name}`"


# what the value in ``roofline_bound`` is, by the metric's pattern: (short label, what it counts)
BOUND_KINDS = [
    (
        r"decode_ms_.*",
        "roofline floor",
        "the step's FLOPs at the matmul ceiling or its bytes (the weights and the batch's KV cache, each read once) at "
        "the copy ceiling, whichever takes longer, both ceilings measured in the same run",
    ),
    (
        r"(?:hf_)?offline_tok_s.*",
        "roofline ceiling",
        "the workload's output tokens over its roofline time: every prompt prefilled at the matmul ceiling, then each "
        "decode step at its roofline floor for the requests still running; no schedule can run faster on this GPU",
    ),
    (r"prefill_mfu_.*", "matmul ceiling", "all of the matmul rate measured in the same run (1)"),
    (
        r"mixed_step_ms",
        "its parts, measured",
        "the step's decodes alone plus its chunk alone, each as measured (not a roofline), so above 100% the mixed "
        "step costs less than its two parts run one after the other; its roofline floor is in the note",
    ),
    (
        r"e2e_ms_per_token.*",
        "the forward, measured",
        "the captured forward alone at batch 1, as measured (not a roofline), so the gap to 100% is what the host's "
        "work around each step adds",
    ),
]


def bound_kind(metric: str) -> tuple[str, str]:
    """What a row's bound is: ("roofline floor", what it counts), ("its parts, measured", ...); ("bound", "as the
    row's note says") for a metric none of ``BOUND_KINDS`` names."""
    for pattern, label, what in BOUND_KINDS:
        if re.fullmatch(pattern, str(metric)):
            return label, what
    return "bound", "as the row's note says"


_HEADERS = {
    "value": "Value",
    "low": "Spread, low",
    "high": "Spread, high",
    "unit": "Unit",
    "roofline_bound": "Bound",
    "pct_of_roofline": "Value against its bound (%)",
    "goal": "Goal",
    "meets_goal": "Goal met",
    "note": "Note",
}


def _cell(column: str, value: str) -> str:
    if column == "meets_goal":
        return {"true": "met", "false": "missed"}.get(value.strip().lower(), md_text(value))
    if column == "unit":
        return md_text({"x": "×"}.get(value, value))
    if column == "goal":  # as the goals table writes it: "≤ 0.6", "≥ 60,000"
        return md_text(format_value(value.replace("<=", "≤").replace(">=", "≥")))
    return md_text(format_value(value))


def render_engine_bench(path: Path | None) -> str:
    """A MyST table of the benchmark, or a sentence saying it has not run on the H200 yet. Each row names its metric
    in words, and where it has a bound, what kind of bound (a roofline floor or ceiling, the matmul ceiling, or
    measured parts); the kinds present are defined under the table."""
    if path is None:
        return "The engine has not been benchmarked on the H200 yet.\n"
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}; expected at least {REQUIRED}")
    spread = [c for c in SPREAD if c in df.columns]  # beside the value they bound (bench.csv writes them last)
    cols = REQUIRED[:2] + spread + REQUIRED[2:] + [c for c in df.columns if c not in REQUIRED + spread]
    bounded = "roofline_bound" in cols
    header, rows, kinds = ["What is measured"], [], {}
    for c in cols[1:]:
        header.append(_HEADERS.get(c, md_text(c)))
        if c == "roofline_bound":
            header.append("Kind of bound")
    for _, r in df.iterrows():
        row = [metric_words(r["metric"])]
        for c in cols[1:]:
            row.append(_cell(c, r[c]) or "—")
            if c == "roofline_bound":
                label, what = bound_kind(r["metric"]) if r[c].strip() else ("—", "")
                row.append(md_text(label))
                if what:
                    kinds.setdefault(label, what)
        rows.append(row)
    table = list_table(header, rows, css="servelab-engine-bench")
    legend = _legend(kinds if bounded else {}, spread and (df[spread] != "").any().any())
    return f"From `{md_text(path.parent.parent.name)}`{_provenance(path)}:\n\n" + table + legend


def _legend(kinds: dict[str, str], spread: bool) -> str:
    """What the table's kinds of bound mean, and its spread columns where any row has one."""
    legend = ""
    if kinds:
        legend = (
            "\n*Value against its bound* is 100% where the value reaches its bound: the bound over the value for a "
            "time, the value over the bound for a rate. The kinds of bound:\n\n"
            + "\n".join(f"- **{md_text(label)}**: {md_text(what)}." for label, what in kinds.items())
            + "\n"
        )
    if spread:
        legend += (
            "\nThe *spread* is the step time's quartiles over a decode row's timed steps, and the range of an "
            "offline row's timed runs (the median run's rate is the value).\n"
        )
    return legend


@dataclass(frozen=True)
class BenchProvenance:
    """Where the benchmark's numbers come from, as its ``run.json`` sidecar records it."""

    commit: str  # the measured tree's commit, first 12 hex digits ("" if unrecorded)
    when: str  # written_utc (else started_utc) of the run, "" if unrecorded
    fingerprint: str = ""  # its measuring path's (servelab.bench.jobs.stamp); "" for runs before it was recorded
    fingerprint_files: dict | None = None
    params: dict | None = None  # the run's parameters (its model, the MFU rows' model, ...)


def bench_provenance(bench_csv: Path | None) -> BenchProvenance | None:
    """The provenance of ``bench.csv`` from the ``run.json`` beside it; None if there is none or it is not JSON.

    The one reader of the benchmark's sidecar for the book (this table's caption and the engine page's
    code-status line)."""
    side = None if bench_csv is None else bench_csv.parent / "run.json"
    if side is None or not side.exists():
        return None
    try:
        run = json.loads(side.read_text())
    except ValueError:
        return None
    return BenchProvenance(
        commit=str(run.get("git_commit") or "")[:12],
        when=str(run.get("written_utc") or run.get("started_utc") or ""),
        fingerprint=str(run.get("fingerprint") or ""),
        fingerprint_files=run.get("fingerprint_files") if isinstance(run.get("fingerprint_files"), dict) else None,
        params=run.get("params") if isinstance(run.get("params"), dict) else None,
    )


def _provenance(path: Path) -> str:
    """', run at commit X on DATE' from the run's sidecar, so a reader can tell which engine code was measured."""
    prov = bench_provenance(path)
    if prov is None:
        return ""
    return f", run at commit `{md_text(prov.commit or 'unknown')}` on {md_text(prov.when or 'an unrecorded time')}"
