"""Every attention variant behind one call signature: ``attn = VARIANTS[name].build(shape, device)``,
then ``out = attn(q, k, v)``.

q is (B, H, Lq, D); k and v are (B, H_kv, Lkv, D) with H a multiple of H_kv (GQA when H_kv < H); the
output is (B, H, Lq, D). ``build`` does the untimed set-up a real server also does once (mask
construction, compilation); the returned function is what gets timed. A variant that cannot run a
shape on a device raises ``Unavailable`` from ``build`` (or ``RuntimeError`` from the call, when only the
kernel knows: an SDPA backend that refuses its inputs).

Variants:
- ``naive``: the textbook: materialise the scores, mask, softmax, multiply by V (K/V heads repeated);
- ``sdpa_default``: ``F.scaled_dot_product_attention`` left to pick its backend;
- ``sdpa_flash`` / ``sdpa_efficient`` / ``sdpa_cudnn`` / ``sdpa_math``: the same, one backend forced;
- ``sdpa_repeat_kv``: the default dispatch, GQA done by repeating K/V heads (what a model without
  ``enable_gqa`` does) instead of ``enable_gqa=True``;
- ``flex``: FlexAttention with a block mask built from the same mask rule (compiled on CUDA; on the CPU
  its unfused eager path, which checks correctness but whose time means nothing).

SDPA variants take causal masks as ``is_causal=True`` and other masks as a dense boolean ``attn_mask``
(the "sliding window as a dense mask" comparison); FlexAttention takes every mask as a block mask.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from servelab.studies.s05_attention.backends import forced
from servelab.studies.s05_attention.shapes import AttentionShape

AttentionFn = Callable[..., object]  # (q, k, v) -> out
COMPILE_BLOCK_MASK_ABOVE = 2**32  # (query, key) pairs: 4 GiB of booleans, beyond 64k tokens


class Unavailable(Exception):
    """This variant cannot run this shape on this device; the message says why."""


@dataclass(frozen=True)
class Variant:
    name: str
    family: str  # "naive", "sdpa" or "flex"
    backend: str | None  # the SDPA backend forced, if any
    description: str
    builder: Callable[[AttentionShape, object], AttentionFn]

    def build(self, shape: AttentionShape, device) -> AttentionFn:
        import torch

        return self.builder(shape, torch.device(device))

    def implementation(self, device) -> str:
        """'compiled' for FlexAttention on CUDA, 'eager' for its CPU fallback, else 'kernel'."""
        import torch

        if self.family != "flex":
            return "kernel"
        return "compiled" if torch.device(device).type == "cuda" else "eager"


def _repeat_kv(k, v, group: int):
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def _build_naive(shape: AttentionShape, device) -> AttentionFn:
    import torch

    # the mask is built once (a server would cache it); masked_fill wants True where attention is *blocked*
    blocked = None if shape.mask.kind == "none" else ~shape.mask.dense(shape.q_len, shape.kv_len, device)
    group, scale = shape.arch.group, 1.0 / math.sqrt(shape.arch.head_dim)

    def naive(q, k, v):
        k, v = _repeat_kv(k, v, group)
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        if blocked is not None:
            scores = scores.masked_fill(blocked, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    naive.gqa = "repeat_kv" if group > 1 else "mha"
    return naive


class SdpaCall:
    """One SDPA call with a fixed mask and backend; ``gqa`` says how grouped K/V heads were handled.

    ``native``: ``enable_gqa=True``; ``repeat_kv``: K/V heads repeated before the call, either by design
    (the ``sdpa_repeat_kv`` variant) or because a forced backend refused ``enable_gqa`` on the first call
    (then ``gqa`` says so, and every later call repeats too); ``mha``: nothing to group.
    """

    def __init__(self, shape: AttentionShape, device, backend: str | None, repeat_kv: bool):
        kind = shape.mask.kind
        self.backend = backend
        self.is_causal = kind == "causal"
        self.attn_mask = None if kind in ("none", "causal") else shape.mask.dense(shape.q_len, shape.kv_len, device)
        self.group = shape.arch.group
        self.gqa = "mha" if self.group == 1 else ("repeat_kv" if repeat_kv else "native")
        self._calls = 0
        self._held = False

    @contextlib.contextmanager
    def held(self):
        """Hold the forced backend across many calls. Entering ``sdpa_kernel`` costs tens of µs of host
        time; per call, that would land in the timing of µs-scale decode kernels and make a forced
        backend look slower than the same backend chosen by the default dispatch."""
        with forced(self.backend):
            self._held = True
            try:
                yield
            finally:
                self._held = False

    def _sdpa(self, q, k, v):
        import torch.nn.functional as F

        if self.gqa.startswith("repeat_kv"):
            k, v = _repeat_kv(k, v, self.group)
        with contextlib.nullcontext() if self._held or self.backend is None else forced(self.backend):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=self.attn_mask, is_causal=self.is_causal, enable_gqa=self.gqa == "native"
            )

    def __call__(self, q, k, v):
        import torch

        self._calls += 1
        if self._calls > 1 or self.gqa != "native" or self.backend is None:
            return self._sdpa(q, k, v)
        try:
            return self._sdpa(q, k, v)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError:
            # the forced backend may refuse grouped heads but take repeated ones: measure it that way
            self.gqa = "repeat_kv (backend refused enable_gqa)"
            return self._sdpa(q, k, v)


def _sdpa_builder(backend: str | None, repeat_kv: bool = False):
    def build(shape: AttentionShape, device) -> AttentionFn:
        if backend in ("efficient", "cudnn") and device.type != "cuda":
            raise Unavailable(f"SDPA's {backend} backend exists only on CUDA")
        return SdpaCall(shape, device, backend, repeat_kv)

    return build


@functools.cache
def compiled_flex():
    """``torch.compile(flex_attention, dynamic=False)``, made once per process.

    Every (mask, shape) pair is its own compiled kernel; a sweep makes more than dynamo's default
    recompile limit (8), past which it would silently fall back to the slow eager path. Raise it.
    """
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    cfg = torch._dynamo.config
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, knob):
            setattr(cfg, knob, max(getattr(cfg, knob), 512))
    return torch.compile(flex_attention, dynamic=False)


def _build_flex(shape: AttentionShape, device) -> AttentionFn:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cuda = device.type == "cuda"
    # Built eagerly, the block mask materialises q_len × kv_len booleans (1 GiB at 32k tokens, nothing on
    # a 141 GB GPU); compiled, it works block by block but costs a compile per length (and some lengths
    # hit pathological compile times, pytorch#182060). Compile only where the booleans would be large.
    big = shape.q_len * shape.kv_len > COMPILE_BLOCK_MASK_ABOVE
    block_mask = create_block_mask(
        shape.mask.mask_mod(device), None, None, shape.q_len, shape.kv_len, device=device, _compile=cuda and big
    )
    gqa = shape.arch.group > 1
    if cuda:
        fn = compiled_flex()

        def flex(q, k, v):
            return fn(q, k, v, block_mask=block_mask, enable_gqa=gqa)
    else:

        def flex(q, k, v):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "flex_attention called without torch.compile": we know
                return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)

    flex.gqa = "native" if gqa else "mha"
    return flex


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in [
        Variant("naive", "naive", None, "materialised scores, mask, softmax, matmul", _build_naive),
        Variant("sdpa_default", "sdpa", None, "SDPA, backend left to the dispatcher", _sdpa_builder(None)),
        Variant("sdpa_flash", "sdpa", "flash", "SDPA forced to FlashAttention", _sdpa_builder("flash")),
        Variant(
            "sdpa_efficient",
            "sdpa",
            "efficient",
            "SDPA forced to memory-efficient attention",
            _sdpa_builder("efficient"),
        ),
        Variant("sdpa_cudnn", "sdpa", "cudnn", "SDPA forced to cuDNN attention", _sdpa_builder("cudnn")),
        Variant("sdpa_math", "sdpa", "math", "SDPA forced to its math (unfused) backend", _sdpa_builder("math")),
        Variant(
            "sdpa_repeat_kv",
            "sdpa",
            None,
            "SDPA default, K/V heads repeated instead of enable_gqa",
            _sdpa_builder(None, repeat_kv=True),
        ),
        Variant("flex", "flex", None, "FlexAttention with a block mask", _build_flex),
    ]
}


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown attention variant {name!r}; have {tuple(VARIANTS)}")
    return VARIANTS[name]
