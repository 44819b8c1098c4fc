"""The cost ratio c = T_draft / T_target of one decode step, in three execution modes, and what a round costs.

The seed measured target/draft = 1/c = 1.18 for Qwen2-1.5B over Qwen2-0.5B, where parameter counts suggest
3.1. A decode step at batch 1 should cost what its weight bytes cost to read; in eager PyTorch it costs
mostly kernel launches, which a small model issues nearly as many of as a large one. So c is measured per
execution mode (``servelab.bench.hf_modes.MODES``): HF eager, HF in a CUDA graph, and the engine.

``verify_cost`` times what the analytical model assumes free: the target stepping γ + 1 rows instead of one, as the
engine's speculative mode runs it. ``rollback_cost`` times the mode's KV rollback (blocks given back).
"""

from __future__ import annotations

import gc
import time

import numpy as np
import pandas as pd
import torch

from servelab.bench.hf_modes import MODES
from servelab.measure import summarize, time_fn
from servelab.models.shape import ModelShape


def mode_step(mode: str, model, context: int, engine_compile: bool | str = False):
    """``MODES[mode]``'s batch-1 decode step after ``context`` cached tokens; the ``engine`` mode compiled as
    ``engine_compile`` says (``EngineConfig.compile``: "auto" is the engine's default, as Study 3's speculative
    engines run it), the others as they are."""
    if mode == "engine":
        return MODES[mode](model, 1, 1, context, compile=engine_compile)
    return MODES[mode](model, 1, 1, context)


def compile_of(fn) -> str:
    """How the timed step's engine compiled its blocks, as its stats say ("" for an HF mode)."""
    engine = getattr(fn, "engine", None)
    return str(engine.stats().get("compile", "")) if engine is not None else ""


def _free():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _base_row(name: str, model, context: int, roofline=None) -> dict:
    """What a decode step of ``model`` (batch 1, ``context`` cached) is, before it is timed: its shape's bytes, FLOPs
    and, with a ``Roofline``, its floor."""
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
    return base


def step_costs(
    models: dict,
    modes,
    *,
    context: int,
    roofline=None,
    warmup: int = 3,
    repeats: int = 20,
    progress: bool = True,
    engine_compile: bool | str = False,
) -> pd.DataFrame:
    """One decode step (batch 1, one new token after ``context`` cached) of every model in every mode (the engine's
    compiled as ``engine_compile`` says, its ``compile`` column how it ran).

    ``models``: name → HF model. One row per (model, mode): ms (median, p25, p75, CI), params, weight bytes,
    the roofline floor (ms) and the step's % of it where a ``Roofline`` is given, status ("ok" or the error).
    """
    from tqdm.auto import tqdm

    bar = tqdm(total=len(models) * len(modes), desc="decode step costs", disable=not progress)
    rows = []
    for name, model in models.items():
        base = _base_row(name, model, context, roofline)
        flops, nbytes = base["step_flops"], base["step_bytes"]
        for mode in modes:
            bar.update(1)
            try:
                fn, before = mode_step(mode, model, context, engine_compile)
                t = time_fn(fn, warmup=warmup, repeats=repeats, device=model.device, before_each=before)
                row = base | dict(mode=mode, status="ok", compile=compile_of(fn), **t.as_row())
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


def _one_step_ms(fn, before, cuda: bool) -> float:
    """One timed call of ``fn`` (``before`` untimed first): CUDA events on a GPU, else the host's clock."""
    if before is not None:
        before()
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def paired_step_costs(
    draft: tuple[str, object],
    target: tuple[str, object],
    modes,
    *,
    context: int,
    roofline=None,
    warmup: int = 3,
    repeats: int = 20,
    engine_compile: bool | str = False,
) -> pd.DataFrame:
    """``step_costs`` of a (draft, target) pair with both models loaded and their steps alternated, draft then target,
    ``repeats`` times per mode: each target step is timed right after its draft step, so a drift of the host
    between the two moves both. Timed one model after the other, Study 3's HF eager ratio of Qwen2-1.5B over 0.5B
    read 1.220, 0.666 and 1.373 in three repeats while the engine's read 1.43–1.45 in each
    (data/dev/analysis/f33_eager_ratio.md).

    ``draft``, ``target``: (name, HF model). Rows as ``step_costs``'s (each model's own median over its samples),
    plus ``paired_with`` (the other model) and ``c_paired``: the median over the pairs of draft step / target step,
    the same on both rows of a mode; ``tables.cost_ratios`` takes c from it."""
    from servelab.measure import summarize

    rows = []
    for mode in modes:
        bases = {name: _base_row(name, model, context, roofline) | dict(mode=mode) for name, model in (draft, target)}
        try:
            steps = [(name, *mode_step(mode, model, context, engine_compile)) for name, model in (draft, target)]
            compiled = {name: compile_of(fn) for name, fn, _ in steps}
            cuda = torch.device(target[1].device).type == "cuda"
            for _ in range(warmup):
                for _, fn, before in steps:
                    _one_step_ms(fn, before, cuda)
            samples = {name: [] for name, _, _ in steps}
            for _ in range(repeats):
                for name, fn, before in steps:
                    samples[name].append(_one_step_ms(fn, before, cuda))
            d_ms, t_ms = np.asarray(samples[draft[0]]), np.asarray(samples[target[0]])
            c_paired = float(np.median(d_ms / t_ms))
            clock = "cuda_event" if cuda else "perf_counter"
            for (name, _), other in ((draft, target[0]), (target, draft[0])):
                t = summarize(samples[name], clock=clock)
                row = bases[name] | dict(
                    status="ok", paired_with=other, c_paired=c_paired, compile=compiled[name], **t.as_row()
                )
                if roofline is not None:
                    row["pct_of_floor"] = float(
                        roofline.pct_of_floor(t.median_ms, row["step_flops"], row["step_bytes"])
                    )
                rows.append(row)
            del steps
        except Exception as e:  # noqa: BLE001 — a failed mode is a row per model, not a dead run
            status = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__
            if isinstance(e, torch.cuda.OutOfMemoryError):
                status = f"oom: {str(e).splitlines()[0][:120]}"
            rows += [b | dict(status=status) for b in bases.values()]
        _free()
    return pd.DataFrame(rows)


class _FixedDrafts:
    """An override (``SpeculativeEngine.override``) that proposes ``count`` random tokens a step, whatever the proposer
    found, and lets the target's own verification decide what is kept: a verify step of ``count + 1`` rows."""

    def __init__(self, count: int, vocab: int, seed: int = 0):
        self.count, self.vocab = count, vocab
        self.g = torch.Generator().manual_seed(seed)

    def __call__(self, seqs, drafts):
        return [torch.randint(0, self.vocab, (self.count,), generator=self.g).tolist() for _ in seqs]

    def emitted(self, seq, target: list[int]) -> list[int]:
        return target


def verify_config(context: int, rows_list, *, warmup: int = 3, repeats: int = 20):
    """The engine shape ``verify_cost`` and ``rollback_cost`` need: one sequence, long enough for a ``context``-token
    prompt and the tokens every timed step adds (at most the widest verify's), its prompt in one step."""
    from servelab.engine import EngineConfig

    block = 16
    need = context + (warmup + repeats + 1) * max(rows_list) + 2 * block
    length = -(-need // block) * block
    return EngineConfig(
        block_size=block,
        max_num_seqs=1,
        max_model_len=length,
        max_num_batched_tokens=length,
        num_blocks=length // block + 2,
        prefix_caching=False,
    )


def verify_engine(model, config, rows_list):
    """A speculative engine over ``model`` (the project's model code) as wide as the widest verify of ``rows_list``,
    with prompt lookup as its proposer (``verify_cost`` overrides its drafts)."""
    from servelab.engine.speculative_engine import SpeculativeEngine
    from servelab.speculative.config import SpeculativeConfig

    return SpeculativeEngine(model, config, speculative=SpeculativeConfig("ngram", max(1, max(rows_list) - 1)))


def _context_request(engine, context: int, seed: int):
    """A request of ``context`` random prompt tokens, prefilled (one step), that may run long past it."""
    from servelab.engine import SamplingParams

    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, engine.model.shape.vocab, (context,), generator=g).tolist()
    room = engine.max_model_len - context - 1
    seq = engine.add_request(prompt, SamplingParams(max_tokens=room, ignore_eos=True))
    engine.step()
    return seq


def verify_cost(
    engine, name: str, context: int, rows_list, *, warmup: int = 3, repeats: int = 20, seed: int = 0
) -> pd.DataFrame:
    """Time one engine step that verifies n rows after ``context`` cached tokens, for n in ``rows_list``: the target's
    verify of γ = n − 1 drafts (random ones, which it rejects), the verification and the step's one read included; n
    = 1 is a plain decode step. ``engine``: ``verify_engine``'s. Each timed step adds the tokens it kept, so the
    context grows by about one token a step from ``context`` (≈ 20 over a point), where the separate driver rolled
    it back before each repeat."""
    out = []
    for n in rows_list:
        seq = None
        try:
            engine.set_gamma(max(1, n - 1))
            engine.override = _FixedDrafts(n - 1, engine.model.shape.vocab, seed + n)
            seq = _context_request(engine, context, seed)
            t = time_fn(engine.step, warmup=warmup, repeats=repeats, device=engine.device)
            out.append(dict(model=name, context=context, rows=n, status="ok", **t.as_row()))
        except Exception as e:  # noqa: BLE001
            out.append(dict(model=name, context=context, rows=n, status=f"error: {type(e).__name__}: {e}"[:200]))
        finally:
            engine.override = None
            if seq is not None:
                engine.abort(seq)
    return pd.DataFrame(out)


def rollback_cost(engine, name: str, context: int, drops, *, repeats: int = 200, seed: int = 0) -> pd.DataFrame:
    """Host time (µs) of the engine's rollback of d rejected drafts after ``context`` tokens, for d in ``drops``:
    each sample reserves d slots past the computed tokens (untimed) and gives them back
    (``engine.rollback.timed_give_back``: whole blocks past the last kept position return to the block manager)."""
    from servelab.engine.rollback import timed_give_back

    seq = _context_request(engine, context, seed)
    rows = []
    try:
        for d in drops:
            samples = [timed_give_back(engine, seq, d) * 1e6 for _ in range(repeats)]
            s = summarize(samples, clock="perf_counter")
            rows.append(
                dict(
                    model=name,
                    context=context,
                    dropped=d,
                    median_us=s.median_ms,
                    p25_us=s.p25_ms,
                    p75_us=s.p75_ms,
                    repeats=s.repeats,
                )
            )
    finally:
        engine.abort(seq)
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
