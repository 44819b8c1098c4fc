"""One finding: a verdict on one of the seed's claims, as every study's ``verdicts`` module returns it.

A ``Finding`` is built with named fields only, so two swapped arguments cannot pass unnoticed, and its verdict is
checked when it is made. ``findings.csv`` (``measure.results.StudyResults.write_findings``) is a list of them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from servelab.measure.results import VERDICTS


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
    repeats: int = 1  # independent runs (fresh processes, new seeds) the verdict rests on
    repeat_verdicts: str = ""  # the verdict of each repeat, ";"-joined: "holds;holds;changes"
    spread: str = ""  # the interval of measured_value over the repeats, "low–high" (studies.common.repeats)

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"{self.id}: verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"{self.id}: repeats must be a positive int, got {self.repeats!r}")
        object.__setattr__(self, "measured_value", str(self.measured_value).strip())

    def row(self) -> dict:
        return asdict(self)
