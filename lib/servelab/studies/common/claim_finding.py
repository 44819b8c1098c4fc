"""The finding on one of a study's claims: its words come from the study's own table of them (``verdicts.CLAIMS``,
id -> the seed's claim), so a rule names only the claim's id and what it measured. The rest is passed by name, as
``Finding`` takes it, so that two swapped values cannot pass unnoticed."""

from __future__ import annotations

from collections.abc import Mapping

from servelab.studies.common.findings import Finding


def claim_finding(claims: Mapping[str, str], fid: str, **fields) -> Finding:
    """The ``Finding`` on claim ``fid`` of ``claims``, with ``fields`` (seed_value, measured_value, unit, verdict,
    note, ...) for the rest."""
    return Finding(id=fid, claim=claims[fid], **fields)


def failed_to_run(claims: Mapping[str, str], fid: str, *, measured_value: str = "no data", **fields) -> Finding:
    """A claim whose part produced no point to judge: it fails, with no headline; ``fields``: its seed_value, unit,
    note and, where known, tested_on."""
    return claim_finding(claims, fid, measured_value=measured_value, verdict="fails", **fields)
