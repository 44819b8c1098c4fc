"""Where the full profile's rates and ITL SLO come from, as the page says it.

The full profile fixes each model's capacity and ITL SLO (``params.LEGACY_CAPACITY_REQ_S``, ``LEGACY_SLO_ITL_MS``) at
the legacy H200 run's probe, so every part and repeat offers the same rates; each part's own probe is recorded beside
them and places nothing. The lines here read the fixed values from the runs' parameters and the legacy probe from
its committed ``probes.csv``, so the ratio of SLO to decode iteration is computed, never typed.
"""

from __future__ import annotations

import pandas as pd

from servelab.studies.common.page import takeaway_list
from servelab.studies.common.runs import RunSet
from servelab.studies.common.tested_on import model_name

LEGACY_PROBES = "01_scheduling/runs/legacy/all/r0/probes.csv"  # under the device folder


def legacy_probes(runs: RunSet) -> pd.DataFrame:
    """The legacy run's probe, one row per model (empty where it is not committed)."""
    folder = runs.device_folder
    path = folder / LEGACY_PROBES if folder else None
    return pd.read_csv(path) if path is not None and path.exists() else pd.DataFrame()


def _step_ms(probes: pd.DataFrame, model: str) -> float | None:
    row = probes[probes["model"] == model] if not probes.empty else probes
    return float(row["decode_step_s"].iloc[0]) * 1e3 if len(row) else None


def _legacy_source(model: str, capacity: float, legacy: pd.DataFrame) -> str:
    """Which probe the fixed capacity is, where the legacy probe's estimate rounds to it."""
    row = legacy[legacy["model"] == model] if not legacy.empty else legacy
    if len(row) and round(float(row["capacity_req_s"].iloc[0]), 2) == round(capacity, 2):
        return "the legacy H200 run's probe estimate"
    return "fixed by the run's parameters"


def fixed_rates_lines(params: dict, probes: pd.DataFrame, legacy: pd.DataFrame) -> str:
    """Per model: the fixed capacity and the rates it places, the ITL SLO as a multiple of the legacy probe's and of
    this run's decode iteration (``probes``: this run's); "" where the profile fixes neither."""
    caps, slos = params.get("capacities") or {}, params.get("slo_itl_ms") or {}
    if not isinstance(caps, dict) or not isinstance(slos, dict) or not caps:
        return ""
    fractions = sorted(params.get("rate_fractions") or [])
    lines = []
    for model, cap in caps.items():
        rates = ", ".join(f"{f * cap:.2f}" for f in fractions)
        source = _legacy_source(model, cap, legacy)
        said = f"{model_name(model)}: capacity {cap:.2f} req/s ({source}), so rates {rates} req/s"
        slo = slos.get(model)
        if slo is not None:
            said += f"; ITL SLO {slo:.2f} ms"
            then, now = _step_ms(legacy, model), _step_ms(probes, model)
            if then:
                said += f", {slo / then:.1f}× the legacy probe's decode iteration ({then:.2f} ms)"
            if now:
                said += f" and {slo / now:.1f}× the first repeat's ({now:.2f} ms)"
        lines.append(said + ".")
    head = (
        f"In the full profile each model's capacity and ITL SLO are fixed, and the rates are "
        f"{', '.join(f'{f:g}' for f in fractions)} × the capacity:"
    )
    tail = "Each part's own probe, the first repeat's below, is recorded, not used to place the rates or the SLO."
    return f"{head}\n\n{takeaway_list(lines).rstrip()}\n\n{tail}"
