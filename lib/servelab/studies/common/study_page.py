"""What every study's page record holds, whatever else its report computes: the runs it read and the verdicts on
the study's claims. Each study's ``report`` subclasses it with the tables, figures and numbers its page shows."""

from __future__ import annotations

from dataclasses import dataclass

from servelab.studies.common.findings import Finding
from servelab.studies.common.runs import RunSet


@dataclass
class StudyPage:
    runs: RunSet
    findings: list[Finding]

    @property
    def device(self) -> str:
        """The GPU the runs measured on, as the page names it."""
        return self.runs.device_name
