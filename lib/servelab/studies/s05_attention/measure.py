"""Study 5's measuring path: the machine's record and ceilings, which SDPA backend the default dispatch picks, and
causal prefill, decode and masked prefill for every variant. It writes raw tables only (``dispatch``, ``prefill``,
``decode``, ``masks``); the roofline columns, spreads, memory growth, recommendations and verdicts are the reporting
path's (``report.py``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servelab.measure import device_record, measure_ceilings
from servelab.measure.results import StudyResults
from servelab.studies.common.quiet import quiet_run
from servelab.studies.s05_attention.backends import dispatch_table, priority_order
from servelab.studies.s05_attention.params import SEED_COMPARISON_LENGTH
from servelab.studies.s05_attention.point import TimingPolicy
from servelab.studies.s05_attention.shapes import Architecture, AttentionShape
from servelab.studies.s05_attention.sweep import decode_sweep, mask_factories, mask_sweep, prefill_sweep

STUDY = "05_attention"
PARTS = {"all": 3.5}  # one part; minutes on the H200 (the legacy run took 116 s) before a run records its own


def _dispatch(P: dict, dtype, device) -> pd.DataFrame:
    """Which backend SDPA's default picks, at the seed's prefill length and at the largest decode batch."""
    native = [Architecture.from_model(m) for m in P["models"]]
    kv, batch = P["decode_kv_lens"][min(1, len(P["decode_kv_lens"]) - 1)], P["decode_batches"][-1]
    probe = [(f"prefill {SEED_COMPARISON_LENGTH:,}", AttentionShape.prefill(a, SEED_COMPARISON_LENGTH)) for a in native]
    probe += [(f"decode B={batch}, KV {kv:,}", AttentionShape.decode(a, kv, batch)) for a in native]
    return dispatch_table(probe, dtype, device)


def _sweeps(P: dict, dtype, device) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Causal prefill (every model at every head dim), decode (each model at its own), masks; raw rows."""
    archs = [Architecture.from_model(m, d) for m in P["models"] for d in P["head_dims"]]
    native = [Architecture.from_model(m) for m in P["models"]]
    kw = dict(
        dtype=dtype,
        device=device,
        policy=TimingPolicy(target_ms=P["target_ms"], max_repeats=P["max_repeats"], warmup=P["warmup"]),
        max_call_ms=P["max_call_ms"],
        progress=False,
        seed=P["seed"],
    )
    prefill = prefill_sweep(archs, P["prefill_lengths"], P["variants"], **kw)
    decode = decode_sweep(
        native, P["decode_kv_lens"], P["decode_batches"], P["variants"], max_kv_bytes=int(P["max_kv_gib"] * 2**30), **kw
    )
    factories = mask_factories(P["window"], P["document_tokens"], P["seed"])
    masks = mask_sweep(Architecture.from_model(P["mask_model"]), P["mask_lengths"], factories, P["mask_variants"], **kw)
    return prefill, decode, masks


def measure(P: dict) -> Path:
    """Measure the machine, the dispatch table and every sweep; the run's folder."""
    with quiet_run():
        import torch

        torch.manual_seed(P["seed"])  # anything drawn from torch's global generator; the inputs have their own
        priority_order()  # first: one SDPA call settles the order, so the device record holds the real one
        dev = device_record()
        ceil = measure_ceilings()
        res = StudyResults(STUDY, dev, P, ceil, measuring=__name__)
        dtype, device = getattr(torch, P["dtype"]), ("cuda" if dev.kind == "cuda" else "cpu")
        res.write("dispatch", _dispatch(P, dtype, device))
        prefill, decode, masks = _sweeps(P, dtype, device)
        res.write("prefill", prefill)
        res.write("decode", decode)
        res.write("masks", masks)
        res.finish()
        return res.dir
