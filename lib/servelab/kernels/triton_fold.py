"""The inner step both Triton attention kernels share: fold one tile of paged keys into an online softmax.

``fold_keys`` reads keys ``[start, start + KEYS)`` of one sequence through its block table (key ``p`` sits in
pool block ``block_table[p // BLOCK_SIZE]`` at offset ``p % BLOCK_SIZE``), scores them against the program's
query rows and updates each row's running maximum, sum and weighted-value accumulator. Keys at or past ``end``
are masked; with ``CAUSAL`` a key is also masked for a row whose position ``qpos`` is before it (the ragged
kernel's chunks; a decode row sees its whole context). The head axis is padded to ``HEAD_PAD`` lanes, masked
past ``HEAD_DIM`` (padded lanes load as 0 and add nothing to a dot product).

``triton_decode.py`` and ``triton_ragged.py`` import it; ``IEEE`` keeps float32 dot products exact.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fold_keys(
    q,
    K,
    V,
    BT,
    start,
    end,
    qpos,
    row,
    kvh,
    m,
    l_sum,
    acc,
    scale,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_btb,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    KEYS: tl.constexpr,
    IEEE: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """Fold keys [start, min(start + KEYS, end)) of block-table row ``row`` into every query row's running
    (max, sum, accumulator); with ``CAUSAL``, row ``i`` sees only keys at positions <= ``qpos[i]``."""
    offs_d = tl.arange(0, HEAD_PAD)
    pos = start + tl.arange(0, KEYS)
    ok = pos < end
    blk = tl.load(BT + row * stride_btb + pos // BLOCK_SIZE, mask=ok, other=0)
    base = blk.to(tl.int64) * stride_kb + (pos % BLOCK_SIZE) * stride_ks + kvh * stride_kh
    # no padded lanes at a power-of-two head: its mask (and code) as before the padding
    kv_mask = ok[:, None] if HEAD_DIM == HEAD_PAD else ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(K + base[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") if IEEE else tl.dot(q, tl.trans(k))
    visible = ok[None, :] & (pos[None, :] <= qpos[:, None]) if CAUSAL else ok[None, :]
    s = tl.where(visible, s * scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l_sum = l_sum * alpha + tl.sum(p, 1)
    v = tl.load(V + base[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    pv = tl.dot(p.to(v.dtype), v, input_precision="ieee") if IEEE else tl.dot(p.to(v.dtype), v)
    return m_new, l_sum, acc * alpha[:, None] + pv
