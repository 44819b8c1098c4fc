"""The floor of each kernel class in one step: its fewest HBM bytes at the measured copy ceiling, or its FLOPs at the
measured matmul ceiling, whichever is longer (``Roofline.floor_ms``).

A step is its items, ``(context, new_tokens)`` per sequence (a decode is ``(c, 1)``), and the rows that sample
(their logits go through the LM head and the sampler). With T new tokens, S sampled rows, L layers, b bytes per
element of the model's dtype, and the model's shape (``ModelShape``: hidden h, q_dim, kv_dim, intermediate I,
vocab V):

- **GEMM**: FLOPs 2·T·(block matmul weights) + 2·S·h·V; bytes: every matmul weight and the LM head read once, and
  each matmul's input and output activations once (A + B + C, the least any tiling moves). The matmuls are counted
  as the engine runs them, fused (one QKV, one gate-up);
- **attention**: FLOPs ``ModelShape.attention_flops`` per item (QKᵀ and PV, causal over the new tokens); bytes:
  each item's cached and new K/V read once, its queries read and outputs written once;
- **norm and elementwise**: bytes only (their FLOPs are a rounding error): per layer and token, the two
  residual-add-and-norm stages (read two vectors of h, write two), RoPE on Q and K (read and write), and SiLU·up
  (read 2I, write I) for Llama-style blocks, GELU (read and write I) for GPT-2's; and the final norm of the S rows;
- **sampling**: the S rows of logits read once (``logits_bytes`` per element, as the forward returns them);
- **copies**: the new K/V written into the pool and the embedding rows gathered (each read once, written once).
  The step's inputs (host to device) and its sampled tokens (device to host) cross PCIe, not HBM, and are a few
  bytes per token: left out;
- **other**: no floor (0).

Each floor assumes its class's work is done by kernels that reach a ceiling; the sum over classes is the floor of a
step whose classes run one after another, as one stream runs them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Work:
    flops: float
    nbytes: float


def linear_dims(shape) -> list[tuple[int, int]]:
    """(in, out) features of one block's matmuls as the engine runs them: QKV fused, and gate-up fused."""
    h, i = shape.hidden, shape.intermediate
    up = i if shape.family == "gpt2" else 2 * i  # Llama-style blocks compute gate and up in one matmul
    return [(h, shape.q_dim + 2 * shape.kv_dim), (shape.q_dim, h), (h, up), (i, h)]


def elementwise_elems_per_token(shape) -> int:
    """Elements one token's elementwise work reads and writes in one block (see the module docstring)."""
    h, i = shape.hidden, shape.intermediate
    norms = 2 * 4 * h  # twice: read the residual and the sub-layer's output, write the sum and its norm
    if shape.family == "gpt2":
        return norms + 2 * i  # GELU
    return norms + 2 * (shape.q_dim + shape.kv_dim) + 3 * i  # RoPE on Q and K; SiLU(gate)·up


def class_work(
    shape, items: Iterable[tuple[int, int]], sampled_rows: int, dtype_bytes: int, logits_bytes: int
) -> dict[str, Work]:
    """FLOPs and HBM bytes of each class of a step's kernels, keyed as ``kernel_classes.CLASSES``, in its order."""
    items = list(items)
    tokens = sum(n for _, n in items)
    s, b, h, v, layers = sampled_rows, dtype_bytes, shape.hidden, shape.vocab, shape.layers
    dims = linear_dims(shape)
    kv_token = shape.kv_bytes_per_token(dtype_bytes)
    gemm = Work(
        flops=2.0 * tokens * shape.matmul_params + 2.0 * s * h * v,
        nbytes=b * (shape.matmul_params + v * h) + b * (tokens * layers * sum(i + o for i, o in dims) + s * (h + v)),
    )
    attention = Work(
        flops=sum(shape.attention_flops(n, c) for c, n in items),
        nbytes=sum(kv_token * (c + n) for c, n in items) + b * layers * tokens * 2 * shape.q_dim,
    )
    return {
        "gemm": gemm,
        "attention": attention,
        "norm_elementwise": Work(0.0, b * (layers * tokens * elementwise_elems_per_token(shape) + s * 2 * h)),
        "sampling": Work(0.0, float(s * v * logits_bytes)),
        "copies": Work(0.0, 2.0 * tokens * kv_token + 2.0 * b * tokens * h),
        "other": Work(0.0, 0.0),
    }


def class_floors(work: dict[str, Work], roof) -> dict[str, tuple[float, str]]:
    """Each class's floor in ms and what sets it (``"compute"``, ``"memory"``; ``""`` for no work)."""
    out = {}
    for cls, w in work.items():
        if not w.flops and not w.nbytes:
            out[cls] = (0.0, "")
            continue
        out[cls] = (float(roof.floor_ms(w.flops, w.nbytes)), str(roof.bound(w.flops, w.nbytes)))
    return out
