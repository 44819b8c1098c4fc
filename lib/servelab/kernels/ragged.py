"""One attention call for a whole ragged step: decodes, prefill chunks and chunks after cached context alike.

Once a step's K/V are in the paged pool, every query token is the same problem: token ``i`` of a
sequence at position ``p`` attends to that sequence's keys ``0 … p``, read through its block table.
A decode is a one-token run, a fresh prefill a run from position 0, a later chunk or a prefix-cache
hit a run from position ``c > 0``. So the step's tokens are cut into *tiles* of at most
``tile_tokens`` consecutive tokens of one sequence, each tile described by four integers::

    tiles[:, j] = (block-table row, flat index of its first token, tokens in it, position of its first token)

and one kernel runs every tile (``triton_ragged.py``; ``ragged_reference`` here is the same arithmetic
in PyTorch, for the CPU and for tests). Short runs (decodes, small chunks) go into *packed* tiles, whose
rows are tokens × the query heads sharing a KV head, 16 rows a tile (``ragged_tile_tokens``); runs of at
least ``long_tile_tokens`` tokens go into *long* tiles of that many tokens of one query head each, as a
flash-attention kernel lays out a prompt: many query rows per K/V tile read. The tile table has a fixed width,
padded with empty tiles, and nothing about the step's mix changes any tensor's shape, so a whole step, whatever
its mix of decodes and chunks, can be captured in one CUDA graph per token count (``engine/step_graphs.py``).

Split-KV for long contexts: one program walking a 16K-token context holds up the whole step while the rest
of the GPU idles. ``plan_splits`` moves the packed tiles that read the most keys (at least ``2 × min_keys``)
out of the packed table into *split columns*, one per program::

    split_tiles[:, c] = (row, start, tokens, position, split s, splits S of this tile)

Program ``s`` of a tile walks the ``s``-th of ``S`` chunks of its keys and the last of them to finish merges
the partials by log-sum-exp (``split_kv.merge_partials``' arithmetic). ``S`` is chosen per tile as
``split_kv.decode_splits`` chooses it, from the tile's keys and the number of long tiles, within a budget of
columns fixed per captured graph (``split_budget``); a step of short contexts leaves every column empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from servelab.kernels.split_kv import MIN_SPLIT_KEYS, decode_splits

ROW, Q_START, Q_LEN, POS0, SPLIT, SPLITS = range(6)  # SPLIT and SPLITS: rows of the split columns only


@dataclass
class RaggedTiles:
    """The tiles of one step (``tiles [4, max_tiles]``, empty tiles have 0 tokens) and the block tables they index."""

    tiles: torch.Tensor  # LongTensor [4, max_tiles] (rows ROW, Q_START, Q_LEN, POS0): packed tiles
    block_tables: torch.Tensor  # LongTensor [rows, max_blocks]: pool block of each sequence's j-th block
    tile_tokens: int
    long_tiles: torch.Tensor | None = None  # LongTensor [4, max_long_tiles]: one query head per program
    long_tile_tokens: int = 0
    split_tiles: torch.Tensor | None = None  # LongTensor [6, budget]: one split program per column
    # IntTensor [budget × KV heads], zeros: how many of a tile's split programs have finished; the merging
    # program puts its count back to 0, so one buffer serves every layer and every replay (None: per call)
    split_counters: torch.Tensor | None = None


def ragged_tile_tokens(heads: int, kv_heads: int) -> int:
    """Tokens per packed tile: a tile's query rows are (token, query head of one KV head) pairs, 16 of them (the
    fewest a ``tl.dot`` takes), or one token where the padded group alone is wider.

    A packed tile holds the short runs, decodes above all, and a decode fills one token's rows whatever the tile's
    size: the rest are padding its program computes with. Until 2026-12-07 a tile held about 128 rows (64 for heads
    over 64 wide), 16 tokens at both Qwen2-0.5B's and Llama-3-8B's shapes. With 16-row tiles, one layer's attention
    of a mixed step took 27.5 against 44.5 µs on an H100 (Qwen2-0.5B: 63 decodes at 512 keys and a 512-token chunk),
    61.8 against 120.5 (3 decodes at 2,432 and the chunk), 53.0 against 95.2 (a 100-token chunk after 2,048 and 31
    decodes), 99.0 against 125.0 at Llama-3-8B's shape (3 decodes at 2,432): less or the same in every case timed
    (``data/dev/nvidia-h100/2026-12-07/ragged_tiles_f55c138.csv``). The 128-row launch also spilled 416 bytes a
    thread at Qwen2-0.5B's shape compiled for sm90 (``data/dev/cpu/2026-12-07/ragged_registers.csv``). The bench's
    offline workload under a 512-token budget ran at 41.4k against 37.6k tok/s, and at 51.0k against 51.1k under the
    default budget (``offline_tiles_f55c138.csv``). The head's width no longer enters."""
    groups = 1 << (heads // kv_heads - 1).bit_length()
    return max(1, 16 // groups)


def ragged_long_tile_tokens(head_dim: int) -> int:
    """Tokens per long tile: 128 query rows of one head, as flash-attention kernels use for head_dim <= 128."""
    return 128 if head_dim <= 128 else 64


def max_long_tiles(num_tokens: int, long_tile_tokens: int) -> int:
    """A run of n >= L tokens takes ceil(n / L) <= 2n / L long tiles, so a step never needs more than 2T / L."""
    return 2 * num_tokens // long_tile_tokens if long_tile_tokens else 0


def max_tiles(num_tokens: int, max_seqs: int, tile_tokens: int) -> int:
    """Enough tiles for any step of ``num_tokens`` tokens over at most ``max_seqs`` sequences: each run of
    tokens wastes at most one partly filled tile."""
    return -(-num_tokens // tile_tokens) + min(num_tokens, max_seqs)


def plan_tiles(runs, tile_tokens: int, long_tile_tokens: int = 0) -> tuple[list, list]:
    """``runs``: ``(row, flat start, tokens, first position)`` per sequence in the step -> (packed tiles, long
    tiles), each ``(row, start, tokens, position)``; runs of at least ``long_tile_tokens`` (0: none) are long."""
    packed, long = [], []
    for row, start, n, pos in runs:
        size, out = (long_tile_tokens, long) if long_tile_tokens and n >= long_tile_tokens else (tile_tokens, packed)
        for off in range(0, n, size):
            out.append((row, start + off, min(size, n - off), pos + off))
    return packed, long


def split_budget(kv_heads: int, max_context: int, sms: int | None = None, *, min_keys: int = MIN_SPLIT_KEYS) -> int:
    """Split columns of a step whose contexts reach ``max_context`` keys: as many splits as one decode of that
    length gets (``decode_splits`` at batch 1); 0 when such a decode would not split, so a graph over short
    contexts launches no split program at all."""
    splits = decode_splits(1, kv_heads, max_context, sms, min_keys=min_keys)
    return splits if splits > 1 else 0


def plan_splits(
    packed: list, budget: int, kv_heads: int, sms: int | None = None, *, min_keys: int = MIN_SPLIT_KEYS
) -> tuple[list, list]:
    """Packed tiles ``(row, start, tokens, position)`` -> (the packed tiles left, split columns ``(row, start,
    tokens, position, s, S)``): the tiles reading the most keys (at least ``2 × min_keys``) each get ``S``
    programs, ``decode_splits`` over the long tiles, as long as ``budget`` columns last. The long tiles are the
    step's critical path; the short ones finish within the first of their chunks."""
    keys = [t[POS0] + t[Q_LEN] for t in packed]
    long = sorted((i for i, k in enumerate(keys) if k >= 2 * min_keys), key=lambda i: -keys[i])
    columns, moved = [], set()
    for i in long:
        splits = min(decode_splits(len(long), kv_heads, keys[i], sms, min_keys=min_keys), budget - len(columns))
        if splits < 2:
            break  # tiles come longest first and the budget only shrinks: no later tile splits either
        columns += [(*packed[i], s, splits) for s in range(splits)]
        moved.add(i)
    return [t for i, t in enumerate(packed) if i not in moved], columns


def ragged_reference(q, k_pool, v_pool, rt: RaggedTiles, scale: float) -> torch.Tensor:
    """q [T, H, D], pools [blocks, block_size, H_kv, D] -> [T, H, D]; rows of no tile are 0."""
    heads = q.shape[1]
    block_size, kv_heads = k_pool.shape[1], k_pool.shape[2]
    out = torch.zeros_like(q)
    tables = rt.block_tables
    tiles = rt.tiles.t().tolist() + (rt.long_tiles.t().tolist() if rt.long_tiles is not None else [])
    if rt.split_tiles is not None:  # a split tile's attention is its whole tile's: one column (its first) stands for it
        tiles += [col[:4] for col in rt.split_tiles.t().tolist() if col[SPLIT] == 0]
    for row, start, n, pos in tiles:
        if n == 0:
            continue
        keys = pos + n
        blocks = tables[row, : -(-keys // block_size)]
        k = k_pool[blocks].flatten(0, 1)[:keys].transpose(0, 1)  # [H_kv, L, D]
        v = v_pool[blocks].flatten(0, 1)[:keys].transpose(0, 1)
        if heads != kv_heads:
            k = k.repeat_interleave(heads // kv_heads, dim=0)
            v = v.repeat_interleave(heads // kv_heads, dim=0)
        visible = torch.arange(keys, device=q.device)[None, :] <= (pos + torch.arange(n, device=q.device))[:, None]
        o = F.scaled_dot_product_attention(q[start : start + n].transpose(0, 1), k, v, attn_mask=visible, scale=scale)
        out[start : start + n] = o.transpose(0, 1)
    return out
