"""The float64 reference every variant is checked against, its relative error, and tolerances by dtype.

The reference is computed for a subset of query rows (all of them for short sequences): its cost is
rows × keys, so checking a 32k-token prefill costs a few hundred rows' worth, not a 32k × 32k matrix.
Which rows are checked is random but always includes the first and last query (the mask's extremes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.studies.s05_attention.masks import Mask

# Relative (Frobenius) error allowed per output dtype. Half-precision kernels round the scores, the
# probabilities and the output to 8 (bf16) or 11 (fp16) mantissa bits; 2e-2 is a few ulps of bf16.
TOLERANCES = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-4, "float64": 1e-10}


def tolerance(dtype) -> float:
    """Relative-error tolerance for outputs of ``dtype``."""
    name = str(dtype).replace("torch.", "")
    if name not in TOLERANCES:
        raise ValueError(f"no tolerance for dtype {name!r}; known: {sorted(TOLERANCES)}")
    return TOLERANCES[name]


def check_rows(q_len: int, max_rows: int = 256, seed: int = 0):
    """Query rows to check: all if ``q_len <= max_rows``, else a random sorted subset with both ends."""
    import torch

    if q_len <= max_rows:
        return torch.arange(q_len)
    g = torch.Generator().manual_seed(seed)
    middle = torch.randperm(q_len - 2, generator=g)[: max_rows - 2] + 1
    return torch.cat([torch.tensor([0, q_len - 1]), middle]).sort().values


def reference_attention(q, k, v, mask: Mask, rows=None, *, chunk_rows: int = 64):
    """softmax(Q Kᵀ/√D + mask) V in float64 for query ``rows`` (all when None); GQA by K/V head groups.

    Returns (B, H, len(rows), D) float64. Work goes one K/V head and one chunk of rows at a time, so the
    float64 copies stay small (one head's K and V, and a chunk × keys score block per query head).
    """
    import torch

    b, h, lq, d = q.shape
    hk, lk = k.shape[1], k.shape[2]
    if h % hk:
        raise ValueError(f"query heads {h} not a multiple of key heads {hk}")
    g = h // hk
    rows = torch.arange(lq) if rows is None else torch.as_tensor(rows).cpu()
    rows = rows.to(q.device)
    keys = torch.arange(lk, device=q.device)[None, :]
    mod = mask.mask_mod(q.device) if mask.kind != "none" else None
    out = torch.empty(b, h, len(rows), d, dtype=torch.float64, device=q.device)
    for j in range(hk):
        k64 = k[:, j : j + 1].double()  # (B, 1, Lk, D): broadcast over the group's query heads
        v64 = v[:, j : j + 1].double()
        for start in range(0, len(rows), chunk_rows):
            r = rows[start : start + chunk_rows]
            s = q[:, j * g : (j + 1) * g, r].double() @ k64.transpose(-1, -2) / math.sqrt(d)
            if mod is not None:
                s = s.masked_fill(~mod(None, None, r[:, None], keys), float("-inf"))
            out[:, j * g : (j + 1) * g, start : start + len(r)] = torch.softmax(s, dim=-1) @ v64
    return out


def relative_error(out, ref) -> float:
    """‖out − ref‖_F / ‖ref‖_F in float64 (NaN or inf anywhere in ``out`` gives inf)."""
    import torch

    diff = out.double() - ref
    if not torch.isfinite(diff).all():
        return math.inf
    return float(torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref))


@dataclass(frozen=True)
class Correctness:
    rel_error: float
    tolerance: float
    rows_checked: int

    @property
    def ok(self) -> bool:
        return self.rel_error <= self.tolerance


def check_output(out, q, k, v, mask: Mask, reference=None, rows=None) -> Correctness:
    """Compare a variant's output with the float64 reference on ``rows`` (pass a precomputed ``reference``
    for those rows, possibly of the first few sequences only, to share it between variants)."""
    rows = check_rows(q.shape[2]) if rows is None else rows
    ref = reference if reference is not None else reference_attention(q, k, v, mask, rows)
    got = out[: ref.shape[0], :, rows.to(out.device)]
    return Correctness(relative_error(got, ref), tolerance(out.dtype), int(len(rows)))
