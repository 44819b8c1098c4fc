"""The cost ratio c = T_draft / T_target of one decode step, in three execution modes, and what a round costs.

The seed measured target/draft = 1/c = 1.18 for Qwen2-1.5B over Qwen2-0.5B, where parameter counts suggest
3.1. A decode step at batch 1 should cost what its weight bytes cost to read; in eager PyTorch it costs
mostly kernel launches, which a small model issues nearly as many of as a large one. So c is measured per
execution mode (``servelab.bench.hf_modes.MODES``): HF eager, HF in a CUDA graph, and the engine.

``verify_cost`` times what the analytical model assumes free: the target stepping γ + 1 rows instead of one.
``rollback_cost`` times the KV sync of the paged cache.
"""

from __future__ import annotations

import functools
import gc
import time

import pandas as pd
import torch

from servelab.bench.hf_modes import MODES
from servelab.measure import summarize, time_fn
from servelab.models.shape import ModelShape


def _free():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def step_costs(
    models: dict, modes, *, context: int, roofline=None, warmup: int = 3, repeats: int = 20, progress: bool = True
) -> pd.DataFrame:
    """One decode step (batch 1, one new token after ``context`` cached) of every model in every mode.

    ``models``: name → HF model. One row per (model, mode): ms (median, p25, p75, CI), params, weight bytes,
    the roofline floor (ms) and the step's % of it where a ``Roofline`` is given, status ("ok" or the error).
    """
    from tqdm.auto import tqdm

    bar = tqdm(total=len(models) * len(modes), desc="decode step costs", disable=not progress)
    rows = []
    for name, model in models.items():
        shape = ModelShape.from_config(model.config)
        nbytes = shape.decode_bytes(1, context, model.dtype.itemsize)
        flops = shape.decode_flops(1, context)
        base = dict(
            model=name,
            params=shape.params,
            weight_bytes=shape.weight_bytes(model.dtype.itemsize),
            context=context,
            dtype=str(model.dtype).replace("torch.", ""),
            step_bytes=nbytes,
            step_flops=flops,
        )
        if roofline is not None:
            base["floor_ms"] = float(roofline.floor_ms(flops, nbytes))
        for mode in modes:
            bar.update(1)
            try:
                fn, before = MODES[mode](model, 1, 1, context)
                t = time_fn(fn, warmup=warmup, repeats=repeats, device=model.device, before_each=before)
                row = base | dict(mode=mode, status="ok", **t.as_row())
                if roofline is not None:
                    row["pct_of_floor"] = float(roofline.pct_of_floor(t.median_ms, flops, nbytes))
                rows.append(row)
                del fn, before
            except torch.cuda.OutOfMemoryError as e:
                rows.append(base | dict(mode=mode, status=f"oom: {str(e).splitlines()[0][:120]}"))
            except Exception as e:  # noqa: BLE001 — a failed point is a row, not a dead notebook
                rows.append(
                    base
                    | dict(
                        mode=mode,
                        status=f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
                        if str(e)
                        else f"error: {type(e).__name__}",
                    )
                )
            _free()
    bar.close()
    return pd.DataFrame(rows)


def verify_cost(lm, context: int, rows_list, *, warmup: int = 3, repeats: int = 20, seed: int = 0) -> pd.DataFrame:
    """Time ``lm`` (a ``PagedLM``) stepping n rows after ``context`` cached tokens, for n in ``rows_list``:
    the target's verify of γ = n − 1 drafts. Each repeat rolls the cache back first (untimed)."""
    g = torch.Generator().manual_seed(seed)
    lm.reset()
    lm.forward(torch.randint(0, lm.vocab, (context,), generator=g).tolist(), last_only=True)
    out = []
    for n in rows_list:
        toks = torch.randint(0, lm.vocab, (n,), generator=g).tolist()
        try:
            t = time_fn(
                functools.partial(lm.forward, toks),
                warmup=warmup,
                repeats=repeats,
                device=lm.device,
                before_each=lambda: lm.truncate(context),
            )
            out.append(dict(model=lm.name, context=context, rows=n, status="ok", **t.as_row()))
        except Exception as e:  # noqa: BLE001
            out.append(dict(model=lm.name, context=context, rows=n, status=f"error: {type(e).__name__}: {e}"[:200]))
        lm.truncate(context)
    lm.reset()
    return pd.DataFrame(out)


def rollback_cost(lm, context: int, drops, *, repeats: int = 200, seed: int = 0) -> pd.DataFrame:
    """Host time (µs) of rolling ``lm``'s cache back by d tokens, for d in ``drops``: the paged cache's KV sync.

    Each sample re-extends the sequence (block-manager bookkeeping only, no forward) and then truncates it,
    timing only the truncation."""
    g = torch.Generator().manual_seed(seed)
    lm.reset()
    lm.forward(torch.randint(0, lm.vocab, (context,), generator=g).tolist(), last_only=True)
    rows = []
    for d in drops:
        samples = []
        for _ in range(repeats):
            lm.slots += lm.bm.append(lm.seq_id, d)  # as if d tokens had been computed
            lm.tokens += [0] * d
            t0 = time.perf_counter()
            lm.truncate(context)
            samples.append((time.perf_counter() - t0) * 1e6)
        s = summarize(samples, clock="perf_counter")
        rows.append(
            dict(
                model=lm.name,
                context=context,
                dropped=d,
                median_us=s.median_ms,
                p25_us=s.p25_ms,
                p75_us=s.p75_ms,
                repeats=s.repeats,
            )
        )
    lm.reset()
    return pd.DataFrame(rows)


def hf_crop_cost(model, context: int, drops, *, repeats: int = 50, seed: int = 0) -> pd.DataFrame:
    """For comparison: cropping HF's ``DynamicCache`` (what ``generate(assistant_model=…)`` does to roll back),
    in ms per crop (CUDA events; the crop slices every layer's K and V)."""
    from transformers import DynamicCache

    from servelab.bench.hf_modes.inputs import random_kv

    gen = torch.Generator(device=model.device).manual_seed(seed)
    rows = []
    for d in drops:
        try:
            t = _crop_timing(model, random_kv(model, 1, context + d, gen), d, repeats, DynamicCache)
            rows.append(dict(context=context, dropped=d, status="ok", **t.as_row()))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(context=context, dropped=d, status=f"error: {type(e).__name__}: {e}"[:200]))
    _free()
    return pd.DataFrame(rows)


def _crop_timing(model, kv, d: int, repeats: int, cache_cls):
    """Time ``crop(-d)`` of a cache refilled with ``kv`` before each sample (the refill untimed)."""
    state = {}

    def fill():
        cache = cache_cls(config=model.config)
        for i, (k, v) in enumerate(kv):
            cache.update(k, v, i)
        state["c"] = cache

    return time_fn(lambda: state["c"].crop(-d), warmup=2, repeats=repeats, device=model.device, before_each=fill)
