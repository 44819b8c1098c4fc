"""F4.3: how fast compaction moves KV blocks, against block size, pool size and the fraction of blocks moved.

A pool is filled with random K/V; a ``BlockManager`` is put in a fragmented state in which exactly the requested
fraction of the live blocks sits beyond the live prefix; ``plan_compaction`` then plans exactly those moves.
Each mover copies them (the block tables are not rewritten, so the same plan can be timed repeatedly).

Bandwidth is counted as a copy's: bytes read + bytes written of the useful data, ``2 × blocks moved × bytes per
block`` per second, so it compares directly with the measured copy ceiling. The gather/scatter movers physically
move twice that (through their temporary); ``block_loop`` issues one kernel per block and is bound by launches when
blocks are small.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm import tqdm  # not tqdm.auto: in a notebook without ipywidgets it warns

from servelab.kv.block_manager import BlockManager
from servelab.kv.compaction import (
    MOVERS,
    block_index,
    move_block_loop,
    move_gather_scatter,
    move_gather_scatter_wide,
    plan_compaction,
)
from servelab.measure.timing import time_fn


def fragmented_manager(
    num_blocks: int, block_size: int, live_fraction: float, move_fraction: float, rng: np.random.Generator
) -> BlockManager:
    """A manager whose live blocks need exactly ``round(live × move_fraction)`` moves to become a prefix.

    Live blocks are one-block sequences: ``live - moved`` of them at random inside the prefix ``[0, live)``,
    ``moved`` at random beyond it.
    """
    if not 0 < live_fraction < 1:
        raise ValueError(f"live_fraction must be in (0, 1), got {live_fraction}")
    if not 0 <= move_fraction <= 1:
        raise ValueError(f"move_fraction must be in [0, 1], got {move_fraction}")
    live = max(1, round(num_blocks * live_fraction))
    moved = round(live * move_fraction)
    if moved > num_blocks - live:
        raise ValueError(
            f"cannot move {moved} of {live} live blocks with only {num_blocks - live} blocks free; "
            "lower move_fraction or live_fraction"
        )
    keep = set(rng.choice(live, size=live - moved, replace=False).tolist())
    keep |= set((live + rng.choice(num_blocks - live, size=moved, replace=False)).tolist())
    bm = BlockManager(num_blocks, block_size)
    for b in range(num_blocks):  # lowest-first allocation: sequence b gets block b
        bm.allocate(b, block_size)
    for b in range(num_blocks):
        if b not in keep:
            bm.free(b)
    return bm


def _mover(method: str, pool, plan, src_idx, dst_idx):
    """The call that moves ``plan``'s blocks in ``pool`` with ``method``, its arguments bound now."""
    if method == "gather_scatter":
        return lambda: move_gather_scatter(pool, src_idx, dst_idx)
    if method == "gather_scatter_wide":
        return lambda: move_gather_scatter_wide(pool, src_idx, dst_idx)
    return lambda: move_block_loop(pool, plan.src, plan.dst)


def _time_movers(pool, plan, methods, row: dict, per_block: int, timing: dict) -> list[dict]:
    """One row per mover: the plan's moves timed (``time_fn``), or ``status="oom"``."""
    import torch

    src_idx, dst_idx = block_index(pool, plan.src), block_index(pool, plan.dst)
    rows = []
    for method in methods:
        r = dict(
            row,
            method=method,
            blocks_moved=plan.moved,
            live_blocks=plan.live,
            bytes_moved=plan.moved * per_block,
            kernel_launches=plan.moved if method == "block_loop" else 2,
        )
        try:
            t = time_fn(_mover(method, pool, plan, src_idx, dst_idx), **timing)
            r.update(status="ok", **t.as_row())
        except torch.OutOfMemoryError:
            r.update(status="oom")
            torch.cuda.empty_cache()
        rows.append(r)
    return rows


def _pool_rows(base: dict, shape: tuple, dtype, device, gen, rng, move_fractions, methods, timing: dict) -> list[dict]:
    """Every (fraction moved, mover) of one pool; a pool that cannot be made gives status rows instead."""
    import torch

    from servelab.kv.pool import KVPool

    layers, kv_heads, head_dim = shape
    mib, bs, num_blocks, per_block = base["pool_mib"], base["block_size"], base["num_blocks"], base["bytes_per_block"]
    rows = []
    pool = None
    try:
        if num_blocks < 4:
            raise ValueError(f"a {mib} MiB pool holds only {num_blocks} blocks of {per_block} bytes")
        pool = KVPool(layers, num_blocks, bs, kv_heads, head_dim, dtype, device).fill_random(gen)
        for frac in move_fractions:
            plan = plan_compaction(fragmented_manager(num_blocks, bs, base["live_fraction"], frac, rng))
            row = dict(base, move_fraction=frac)
            if plan.moved == 0:
                rows += [
                    dict(row, method=m, blocks_moved=0, live_blocks=plan.live, status="skipped: no block to move")
                    for m in methods
                ]
                continue
            rows += _time_movers(pool, plan, methods, row, per_block, timing)
    except torch.OutOfMemoryError:
        rows.append(dict(base, status="oom"))
    except ValueError as e:
        rows.append(dict(base, status=f"skipped: {e}"))
    finally:
        del pool
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def compaction_sweep(
    layers: int,
    kv_heads: int,
    head_dim: int,
    dtype,
    device,
    *,
    block_sizes,
    pool_mib,
    move_fractions,
    methods=MOVERS,
    live_fraction: float = 0.5,
    copy_gb_s: float | None = None,
    warmup: int = 2,
    repeats: int = 10,
    seed: int = 0,
    progress: bool = False,
) -> pd.DataFrame:
    """Time each mover for every (pool size MiB, block size, fraction moved); failures become status rows.

    ``progress``: a tqdm bar over the pools (off by default: a notebook page shows no bar).
    """
    import torch

    for m in methods:
        if m not in MOVERS:
            raise ValueError(f"unknown method {m!r}; choose from {MOVERS}")
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    timing = dict(warmup=warmup, repeats=repeats, device=device)
    rows = []
    combos = [(mib, bs) for mib in pool_mib for bs in block_sizes]
    for mib, bs in tqdm(combos, desc="compaction", leave=False, disable=not progress):
        per_block = 2 * layers * bs * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
        base = dict(
            pool_mib=mib,
            block_size=bs,
            num_blocks=mib * 2**20 // per_block,
            bytes_per_block=per_block,
            chunk_bytes=per_block // (2 * layers),
            live_fraction=live_fraction,
        )
        rows += _pool_rows(base, (layers, kv_heads, head_dim), dtype, device, gen, rng, move_fractions, methods, timing)
    df = pd.DataFrame(rows)
    ok = df["status"] == "ok"
    if ok.any():
        df.loc[ok, "gb_s"] = 2 * df.loc[ok, "bytes_moved"] / (df.loc[ok, "median_ms"] * 1e-3) / 1e9
        df.loc[ok, "gb_s_p25"] = 2 * df.loc[ok, "bytes_moved"] / (df.loc[ok, "p75_ms"] * 1e-3) / 1e9
        df.loc[ok, "gb_s_p75"] = 2 * df.loc[ok, "bytes_moved"] / (df.loc[ok, "p25_ms"] * 1e-3) / 1e9
        df.loc[ok, "us_per_block"] = df.loc[ok, "median_ms"] * 1e3 / df.loc[ok, "blocks_moved"]
        if copy_gb_s:
            df.loc[ok, "pct_of_copy_ceiling"] = 100.0 * df.loc[ok, "gb_s"] / copy_gb_s
    return df
