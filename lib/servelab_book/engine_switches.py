"""The engine page's switches: each row the benchmark times with one setting off its default, against the default's
row at the same point, and whether both ran compiled.

Issue 29 asks that "the default is the fastest" be a fact in the CSV: the benchmark writes a switch's row beside
the default's (``decode_ms_b1_ctx128_unfused_rope_kv`` beside ``decode_ms_b1_ctx128``). This reads those pairs. A
switch row's note names its setting ("not the default: fused_rope_kv_write=False, ..." or "decode_steps=8 (not the
default)"); its default is the longest metric name its own begins with. Where the compile check turned compilation
off for the switch but not for the default, the two rows time an eager step against a compiled one, and the
sentence says so with the check's reason: that, not the switch, may be what the ratio measures. Where both rows
carry their spread (``low``, ``high``: a decode step's quartiles, the offline runs' range) and the two spreads
overlap, the switch is neither better nor worse on this run: the bullet says it lies within the spread.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from servelab.studies.common.markdown import format_value, md_text
from servelab_book.engine_prose import bench_rows, code, num

INCLUDE = "engine_switches.md"
HIGHER_IS_BETTER = ("tok/s", "x", "fraction of matmul ceiling")  # units of rates; any other (ms) is a time
SETTING = (re.compile(r"not the default: (\w+=[^,\s)]+)"), re.compile(r"(\w+=[^,\s)]+) \(not the default\)"))
COMPILE_OFF = re.compile(r"compile off: (.*?)(?: \(scale [^)]*\))?(?:,|\)|$)")
# Why the compile check refused a switch, where that is known to be the check's doing, not the switch's: a reader
# would otherwise take the refusal for a fault of the switch's kernel.
CHECK_FAULT = {
    "fused_rope_kv_write": (
        "The compile check's refusal of `fused_rope_kv_write` is the check's own fault: its two test sequences write "
        "their K/V to the same scratch slots. The default path never reads a prefill's K/V back from the pool, so "
        "the clash is harmless there; the fused path does read them back, so each sequence attends to keys the "
        "other overwrote, and eager and compiled runs disagree for that reason alone. A check that gives each "
        "sequence its own slots (`engine/compilation.py` since issue 29, on the first two blocks) "
        "keeps the fused engine compiled: on an H100 it passed in each fresh process where the whole-model check "
        "refused every time (`data/dev/nvidia-h100/2026-12-06/fused_compile_probe_170ee25.txt`)."
    ),
}


def setting_of(note: str) -> str | None:
    """The setting a switch row changes, as its note names it; None for a row at the default."""
    for pattern in SETTING:
        m = pattern.search(note)
        if m:
            return m.group(1)
    return None


def default_of(metric: str, metrics: list[str]) -> str | None:
    """The default's row for a switch row: the longest other metric name that ``metric`` begins with, plus "_"."""
    bases = [m for m in metrics if m != metric and metric.startswith(m + "_")]
    return max(bases, key=len) if bases else None


def compile_off(note: str) -> str | None:
    """Why a row ran uncompiled (its compile check's words), None where it ran compiled or does not say."""
    if "compile on" in note:
        return None
    m = COMPILE_OFF.search(note)
    return m.group(1).strip() if m else None


def spreads_overlap(r: pd.Series, d: pd.Series) -> bool | None:
    """Whether the switch row's spread and the default's overlap; None where either row has none."""
    ends = [num(row, col) for row in (r, d) for col in ("low", "high")]
    if any(v is None or v != v for v in ends):
        return None
    r_low, r_high, d_low, d_high = ends
    return r_low <= d_high and d_low <= r_high


def switch_pairs(rows: dict[str, pd.Series]) -> list[tuple[str, pd.Series, pd.Series]]:
    """(setting, switch row, default row) for each switch row with a value and a default row with one."""
    pairs = []
    for metric, r in rows.items():
        setting = setting_of(str(r.get("note", "")))
        base = default_of(metric, list(rows)) if setting else None
        if base is None or num(r) is None or num(rows[base]) is None:
            continue
        pairs.append((setting, r, rows[base]))
    return pairs


def render_switches(bench_csv: Path | None) -> str:
    """A bullet per switch row: its value against the default's, faster or slower, and an eager-against-compiled
    warning where the compile check split them ("" where the benchmark timed no switch)."""
    pairs = switch_pairs(bench_rows(bench_csv))
    if not pairs:
        return ""
    lines, faults = [], []
    for setting, r, d in pairs:
        value, base, unit = num(r), num(d), str(r["unit"])
        better = value > base if unit in HIGHER_IS_BETTER else value < base
        reading = "better" if better else "worse"
        if spreads_overlap(r, d):
            reading = (
                f"within the spread, {format_value(r['low'])}–{format_value(r['high'])} against the default's "
                f"{format_value(d['low'])}–{format_value(d['high'])}"
            )
        line = (
            f"- {code(setting)} at {code(d['metric'])}: {format_value(r['value'])} {md_text(unit)} against the "
            f"default's {format_value(d['value'])} ({value / base:.2f}× the default: {reading})"
        )
        off, default_off = compile_off(str(r["note"])), compile_off(str(d["note"]))
        if off is not None and default_off is None:
            line += (
                f"; it ran uncompiled (its compile check: {md_text(off)}) where the default ran compiled, so the "
                "ratio is an eager step's against a compiled one"
            )
            name = setting.split("=")[0]
            if name in CHECK_FAULT and CHECK_FAULT[name] not in faults:
                faults.append(CHECK_FAULT[name])
        lines.append(line + ".")
    worse = sum("worse)" in line for line in lines)
    tied = sum(": within the spread," in line for line in lines)
    head = (
        f"The benchmark times {len(lines)} switch row{'s' if len(lines) != 1 else ''} beside the default's; "
        f"{worse} measure{'s' if worse == 1 else ''} worse than the default"
        + (f", and {tied} within the spread of the default's own timings" if tied else "")
        + ":\n\n"
    )
    return head + "\n".join(lines) + "\n" + "".join(f"\n{why}\n" for why in faults)
