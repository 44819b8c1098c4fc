"""Sweeps over shapes: prefill (causal, by length), decode (one query against a KV cache) and masks.

Each shape gets one set of random inputs and one float64 reference, shared by every variant; each
variant then goes through ``measure_point``. A variant that ran out of memory at one length is not
tried at longer ones (it would only fail again, slowly), nor is one whose last call exceeded
``max_call_ms`` (its cost grows as L², so the next point would blow the time budget): both are
recorded as ``skipped`` with the reason.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterable

import pandas as pd
from tqdm import tqdm  # not tqdm.auto: it warns (TqdmWarning) on import where ipywidgets is missing

from servelab.studies.s05_attention.masks import Mask, ragged_documents
from servelab.studies.s05_attention.point import TimingPolicy, measure_point
from servelab.studies.s05_attention.reference import check_rows, reference_attention
from servelab.studies.s05_attention.shapes import Architecture, AttentionShape
from servelab.studies.s05_attention.variants import get_variant

REFERENCE_BATCHES = 2  # sequences of a batch compared with the reference (the kernels treat all alike)
MAX_ROTATION = 4096  # input sets cycled at most (tiny decode shapes stay launch-bound anyway)
# the rotation sets' generator seed is the run's seed plus this: above any run seed (params: < 2**31), so one
# repeat's rotation sets are never the next repeat's inputs (seed + 1 would be)
ROTATION_SEED_OFFSET = 2**32


def l2_cache_bytes(device) -> int:
    """The device's L2 cache in bytes (0 on the CPU)."""
    import torch

    if torch.device(device).type != "cuda":
        return 0
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20))


def rotation_sets(shape: AttentionShape, total_bytes: int, dtype, device, seed: int) -> list[tuple]:
    """Extra random (q, k, v) sets, together at least ``total_bytes``, as views of three big tensors
    (three allocations however many sets); none when one set is already that large."""
    import torch

    itemsize = torch.empty((), dtype=dtype).element_size()
    n = min(MAX_ROTATION, math.ceil(total_bytes / shape.input_bytes(itemsize))) - 1
    if n < 1:
        return []
    gen = torch.Generator(device=device).manual_seed(seed)
    a = shape.arch
    qs = torch.randn(n, shape.batch, a.heads, shape.q_len, a.head_dim, generator=gen, device=device, dtype=dtype)
    ks = torch.randn(n, shape.batch, a.kv_heads, shape.kv_len, a.head_dim, generator=gen, device=device, dtype=dtype)
    vs = torch.randn(n, shape.batch, a.kv_heads, shape.kv_len, a.head_dim, generator=gen, device=device, dtype=dtype)
    return [(qs[i], ks[i], vs[i]) for i in range(n)]


def _skip_row(variant: str, shape: AttentionShape, dtype, reason: str) -> dict:
    import torch

    itemsize = torch.empty((), dtype=dtype).element_size()
    return dict(
        variant=variant,
        family=get_variant(variant).family,
        **shape.describe(),
        dtype=str(dtype).replace("torch.", ""),
        status="skipped",
        reason=reason,
        flops=shape.flops,
        min_bytes=shape.min_bytes(itemsize),
        kv_bytes=shape.kv_bytes(itemsize),
        input_bytes=shape.input_bytes(itemsize),
    )


def measure_shape(
    shape: AttentionShape,
    variants: Iterable[str],
    *,
    dtype,
    device,
    policy: TimingPolicy,
    seed: int = 0,
    skip: dict | None = None,
    rotate_below_bytes: int = 0,
) -> list[dict]:
    """All ``variants`` at one shape on shared random inputs; ``skip`` maps variant → reason not to run.

    With ``rotate_below_bytes`` > 0, shapes whose inputs are smaller get extra input copies, cycled
    between timed calls, until the copies together exceed it (defeats the L2 cache for small decodes).
    """
    import torch

    skip = skip or {}
    variants = list(variants)
    rows = [_skip_row(v, shape, dtype, skip[v]) for v in variants if v in skip]
    todo = [v for v in variants if v not in skip]
    if not todo:
        return rows
    try:
        inputs = shape.random_inputs(dtype, device, seed)
        nb = min(shape.batch, REFERENCE_BATCHES)
        idx = check_rows(shape.q_len)
        ref = reference_attention(*(t[:nb] for t in inputs), shape.mask, idx)
        rotation = rotation_sets(shape, rotate_below_bytes, dtype, device, seed + ROTATION_SEED_OFFSET)
    except torch.OutOfMemoryError:
        gc.collect()
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        return rows + [_skip_row(v, shape, dtype, "inputs or reference did not fit in memory") for v in todo]
    for v in todo:
        rows.append(
            measure_point(
                get_variant(v), shape, inputs, ref, idx, dtype=dtype, device=device, policy=policy, rotation=rotation
            )
        )
    del inputs, ref, rotation
    return rows


def _length_sweep(
    shapes: Iterable[tuple[tuple, AttentionShape]],
    variants,
    *,
    dtype,
    device,
    policy,
    max_call_ms: float,
    desc: str,
    rotate_below_bytes: int = 0,
    progress: bool = True,
    seed: int = 0,
) -> list[dict]:
    """Shapes grouped by a key (one growing series per key), skipping after OOM or an over-long call; every shape's
    random inputs drawn from ``seed``."""
    rows, blocked = [], {}  # (key, variant) → reason
    shapes = list(shapes)
    for key, shape in tqdm(shapes, desc=desc, disable=not progress, leave=False):
        skip = {v: blocked[(key, v)] for v in variants if (key, v) in blocked}
        new = measure_shape(
            shape,
            variants,
            dtype=dtype,
            device=device,
            policy=policy,
            seed=seed,
            skip=skip,
            rotate_below_bytes=rotate_below_bytes,
        )
        for r in new:
            where = f"q_len={shape.q_len}, kv_len={shape.kv_len}, batch={shape.batch}"
            if r["status"] == "oom":
                blocked[(key, r["variant"])] = f"out of memory at the shorter {where}"
            elif r["status"] == "ok" and r.get("median_ms", 0) > max_call_ms:
                blocked[(key, r["variant"])] = (
                    f"{r['median_ms']:.0f} ms per call at {where} (> {max_call_ms:.0f} ms budget)"
                )
        rows += new
    return rows


def prefill_sweep(
    archs: list[Architecture],
    lengths: list[int],
    variants: list[str],
    *,
    dtype,
    device,
    policy: TimingPolicy,
    max_call_ms: float = 2000.0,
    progress: bool = True,
    seed: int = 0,
) -> pd.DataFrame:
    """Causal prefill, batch 1, every architecture × length × variant (rows in ms, bytes, FLOPs)."""
    shapes = [((a,), AttentionShape.prefill(a, L)) for a in archs for L in sorted(lengths)]
    return pd.DataFrame(
        _length_sweep(
            shapes,
            variants,
            dtype=dtype,
            device=device,
            policy=policy,
            max_call_ms=max_call_ms,
            desc="prefill",
            progress=progress,
            seed=seed,
        )
    )


def decode_sweep(
    archs: list[Architecture],
    kv_lens: list[int],
    batches: list[int],
    variants: list[str],
    *,
    dtype,
    device,
    policy: TimingPolicy,
    max_kv_bytes: int,
    max_call_ms: float = 2000.0,
    progress: bool = True,
    seed: int = 0,
) -> pd.DataFrame:
    """One query token per sequence against ``kv_len`` cached keys, for every batch; shapes whose K+V
    exceed ``max_kv_bytes`` are recorded as skipped. Small shapes rotate inputs to read from HBM."""
    import torch

    itemsize = torch.empty((), dtype=dtype).element_size()
    rows, shapes = [], []
    for a in archs:
        for b in sorted(batches):
            for L in sorted(kv_lens):
                s = AttentionShape.decode(a, L, b)
                if s.kv_bytes(itemsize) > max_kv_bytes:
                    rows += [
                        _skip_row(
                            v,
                            s,
                            dtype,
                            f"K+V {s.kv_bytes(itemsize) / 2**30:.1f} GiB > the {max_kv_bytes / 2**30:.1f} GiB budget",
                        )
                        for v in variants
                    ]
                else:
                    shapes.append(((a, b), s))
    rows += _length_sweep(
        shapes,
        variants,
        dtype=dtype,
        device=device,
        policy=policy,
        max_call_ms=max_call_ms,
        desc="decode",
        rotate_below_bytes=4 * l2_cache_bytes(device),
        progress=progress,
        seed=seed,
    )
    return pd.DataFrame(rows)


def mask_factories(window: int, document_tokens: int, seed: int = 0) -> dict[str, Callable[[int], Mask]]:
    """Length → mask, for each masked kind the mask sweep compares (documents of ~``document_tokens``)."""
    return {
        "causal": lambda L: Mask("causal"),
        "sliding_window": lambda L: Mask("sliding_window", window=window),
        "document": lambda L: Mask("document", doc_lengths=ragged_documents(L, max(2, L // document_tokens), seed)),
    }


def mask_sweep(
    arch: Architecture,
    lengths: list[int],
    masks: dict[str, Callable[[int], Mask]],
    variants: list[str],
    *,
    dtype,
    device,
    policy: TimingPolicy,
    max_call_ms: float = 2000.0,
    progress: bool = True,
    seed: int = 0,
) -> pd.DataFrame:
    """Masked prefill: each mask kind × length × variant (SDPA gets a dense mask, Flex a block mask)."""
    shapes = [
        ((kind,), AttentionShape.prefill(arch, L, mask=make(L)))
        for kind, make in masks.items()
        for L in sorted(lengths)
    ]
    return pd.DataFrame(
        _length_sweep(
            shapes,
            variants,
            dtype=dtype,
            device=device,
            policy=policy,
            max_call_ms=max_call_ms,
            desc="masks",
            progress=progress,
            seed=seed,
        )
    )
