"""One finding: a verdict on one of the seed's claims, as every study's ``verdicts`` module returns it.

A ``Finding`` is built with named fields only, so two swapped arguments cannot pass unnoticed, and its verdict is
checked when it is made. ``findings.csv`` (``measure.results.StudyResults.write_findings``) is a list of them.

``measured_value`` is what the reader sees, often text naming several numbers ("qwen2-0.5b: 150.8 → 24.7 ms; ...");
``headline`` is the one number the verdict is decided on (F1.1's median stall cut, F5.1's speedup), in
``headline_unit``: the number ``studies.common.repeats.combine_repeats`` takes the median and interval of over
repeats. A claim that measured nothing has none (None; an empty cell in findings.csv).

A claim judged on each model on its own, then over the models (Study 1's), also gives each model's number in
``headline_parts``: its headline is their median, which decides nothing, so the interval the reader needs is each
model's over the repeats (``combine_repeats``).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from servelab.measure.results import VERDICTS

NOT_MEASURED = "not measured"  # measured_value of a claim with no data
# a combined finding's worded value that is one repeat's text begins with this label (``runs.combine``)
_REPEAT_LABEL = re.compile(r"^\[repeat \d+ of \d+\] ")


def repeat_name(k: int, n: int) -> str:
    """How a page names repeat ``k`` (0-based: its place in run order) of ``n``: "repeat 2 of 3". The data keep
    the 0-based ids (the ``repeat`` column, the ``r<k>`` folders); a reader saw "repeat 3 of 3" in a label and
    "repeat 2" for the same run in a list beside it."""
    return f"repeat {k + 1} of {n}"


def repeats_name(ks: Sequence[int], n: int) -> str:
    """Several repeats (0-based places, in order) of ``n`` as ``repeat_name`` names one: "repeats 1 and 3 of 3"."""
    if len(ks) == 1:
        return repeat_name(ks[0], n)
    said = [str(k + 1) for k in ks]
    return f"repeats {', '.join(said[:-1])} and {said[-1]} of {n}"


def repeat_label(k: int, n: int) -> str:
    """The label of a value that is repeat ``k``'s (0-based) of ``n``: "[repeat 2 of 3] "."""
    return f"[{repeat_name(k, n)}] "


def split_repeat_label(value: str) -> tuple[str, str]:
    """``(label, rest)`` of a measured value: a unit goes after the rest ("[repeat 2 of 3] 0.75 ×"), not after the
    label, so whether the value is a bare number is the rest's question."""
    m = _REPEAT_LABEL.match(value)
    return (m.group(0), value[m.end() :]) if m else ("", value)


def _headline(fid: str, value) -> float | None:
    """The headline as a float: None, "" (an empty findings.csv cell) and NaN (nothing measured) are None; text that
    is not a number and an infinite value are refused."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ValueError(f"{fid}: headline must be a number, got {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{fid}: headline must be a number, got {value!r}") from None
    if math.isnan(x):
        return None
    if not math.isfinite(x):
        raise ValueError(f"{fid}: headline must be finite, got {value!r}")
    return x


@dataclass(frozen=True, kw_only=True)
class Finding:
    id: str  # the seed's claim id, F1.1 ... F7.4
    claim: str  # the seed's claim, in the seed's words
    seed_value: str  # what the RTX 2070 measured
    measured_value: str  # what this run measured (the median over repeats, where there are repeats)
    unit: str
    verdict: str  # holds / changes / fails, or inconclusive where repeats disagree
    note: str  # why: the rule applied to the numbers
    tested_on: str = ""  # the models (shapes, random or trained weights) the verdict was measured on
    repeats: int = 1  # independent runs (fresh processes, new seeds) the verdict rests on; 0: not measured
    repeat_verdicts: str = ""  # the verdict of each repeat, ";"-joined: "holds;holds;changes"
    spread: str = ""  # the interval of the headline (else measured_value) over the repeats, "low–high"
    headline: float | None = None  # the one number the verdict is decided on, in headline_unit; None: not measured
    headline_unit: str = ""  # e.g. "% cut in the p99 stall, median over rates and models"
    # (model, its number) where each model is judged on its own number, in headline_unit; not a findings.csv column
    headline_parts: tuple[tuple[str, float], ...] = ()
    # which of the combined repeats' text (note, and measured_value where it is text) stands, 0-based in the order
    # they were combined; None for one run. Not a findings.csv column: ``runs.combine`` names that repeat
    text_repeat: int | None = None

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"{self.id}: verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if not isinstance(self.repeats, int) or self.repeats < (0 if self.measured_value == NOT_MEASURED else 1):
            raise ValueError(f"{self.id}: repeats must be a positive int (0: not measured), got {self.repeats!r}")
        object.__setattr__(self, "measured_value", str(self.measured_value).strip())
        object.__setattr__(self, "headline", _headline(self.id, self.headline))
        if self.headline is not None and not str(self.headline_unit).strip():
            raise ValueError(f"{self.id}: a headline needs its unit (headline_unit)")

    def row(self) -> dict:
        row = asdict(self)
        del row["headline_parts"]  # the combined finding's spread names each model's interval
        del row["text_repeat"]  # the note already names that repeat
        return row


@functools.cache
def _seed_claims():
    import pandas as pd

    from servelab.paths import DATA_DIR

    return pd.read_csv(DATA_DIR / "seed" / "claims.csv", dtype=str, keep_default_na=False).set_index("id")


def seed_value(claim: str) -> str:
    """The RTX 2070's value of seed claim ``claim`` ("7.64×"), as ``data/seed/claims.csv`` states it: prose that
    quotes the seed reads it here, never types it."""
    return str(_seed_claims().loc[claim, "rtx2070_value"])


def not_measured(study: str, why: str = "no run of this study on the book's device") -> list[Finding]:
    """Every seed claim of ``study`` as **inconclusive**, "not measured", with ``why``: what a page shows when its
    data is missing, instead of a crash or a verdict. Claims and seed values come from ``data/seed/claims.csv``."""
    import pandas as pd

    from servelab.paths import DATA_DIR

    seed = pd.read_csv(DATA_DIR / "seed" / "claims.csv", dtype=str, keep_default_na=False)
    return [
        Finding(
            id=r.id,
            claim=r.claim,
            seed_value=r.rtx2070_value,
            measured_value=NOT_MEASURED,
            unit="",
            verdict="inconclusive",
            note=f"Not measured: {why}",
            repeats=0,
        )
        for r in seed[seed["study"] == study].itertuples()
    ]
