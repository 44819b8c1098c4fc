"""Which part of a step a kernel does, read from its name: GEMM, attention, norm and elementwise, sampling, copies.

``classify(name, phase)`` takes a CUDA kernel's name as the profiler reports it (``nvjet_sm90_tst_…``,
``void at::native::reduce_kernel<…ArgMaxOps…>``, ``triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0``, ``Memcpy
HtoD (Pageable -> Device)``) or, on a CPU, an aten operator's (``aten::linear``, ``aten::argmax``). The first rule that
matches wins, so the order carries meaning:

1. **sampling** before everything: an Inductor kernel that fuses the sampler's softmax and argmax names both, and
   torch's top-k kernel is called ``gatherTopK``;
2. **attention** before GEMM: ``fmha_cutlassF_…`` is attention built from CUTLASS, and a bare softmax kernel
   is attention (SDPA's math path) unless the sampler launched it (``phase``, below);
3. **GEMM**: cuBLAS/cuBLASLt (``nvjet``, ``xmma``, ``gemv``, ``splitKreduce``), CUTLASS, Inductor's ``mm`` templates;
4. Inductor's fused kernels (``triton_poi/red/per_fused_…``, named after every aten op they fuse): **copies** when
   they write through an index (the KV-cache write), else **norm and elementwise**, though RoPE's ``cat`` or a
   cast's ``_to_copy`` may be in the name;
5. **copies**: memcpy/memset, gathers and scatters (the embedding, the KV-cache write), concatenation, dtype casts
   that torch runs as ``direct_copy_kernel``; before the elementwise rule, because torch wraps those copies in
   ``elementwise_kernel``;
6. **norm and elementwise**: torch's elementwise and reduce kernels, norms, activations, RoPE, fills.

``phase="sampling"`` marks a kernel launched while the engine's sampler ran (``step_timeline`` reads it from the
profiler's annotations): everything the sampler launches is sampling, whatever its name (its logits cast is a copy
kernel, an uncompiled sampler's softmax a softmax kernel). Names alone cannot tell those apart from the forward's.
"""

from __future__ import annotations

import re

CLASSES = ("gemm", "attention", "norm_elementwise", "sampling", "copies", "other")
LABELS = {
    "gemm": "GEMM",
    "attention": "attention",
    "norm_elementwise": "norm & elementwise",
    "sampling": "sampling",
    "copies": "copies",
    "other": "other",
}
SAMPLING_PHASE = "sampling"

_ELEMENTWISE_OPS = (
    "add|sub|mul|div|pow|mean|sum|neg|exp|rsqrt|sqrt|silu|gelu|sigmoid|tanh|where|masked_fill|fill|zero|clamp|"
    "cos|sin|lt|le|gt|ge|eq|ne|maximum|minimum|abs|rms_norm|layer_norm|group_norm|relu"
)
_RULES = tuple(
    (cls, re.compile(pattern, re.IGNORECASE))
    for cls, pattern in (
        ("sampling", r"argmax|argmin|arg_max|topk|top_k|multinomial|exponential|sampl|cumsum|sort"),
        (
            "attention",
            r"attention|attn|flash|fmha|sdpa|_mha|paged_decode|merge_splits|ragged|split_kv|long_tile|softmax",
        ),
        ("gemm", r"gemm|gemv|nvjet|xmma|cutlass|cublas|splitkreduce|(?<![a-z])(add|b|baddb)?mm(?![a-z])|linear|matmul"),
        # Inductor names a fused kernel after every aten op in it: one that writes through an index is the KV-cache
        # write (a copy); any other is pointwise or reduction work, even where RoPE's ``cat`` or a cast's
        # ``_to_copy`` is in its name
        ("copies", r"triton_(poi|red|per)_\w*(index_copy|index_put|scatter)"),
        ("norm_elementwise", r"triton_(poi|red|per)_"),
        (
            "copies",
            r"^memcpy|^memset|catarray|(?<![a-z])cat(?![a-z])|stack|repeat|index_copy|index_put|indexselect|index_select|"
            r"index_kernel|index_elementwise|(?<![a-z])index(?![a-z])|embedding|gather|scatter|direct_copy|copy_kernel|"
            r"aten::copy_|aten::_?to(_copy)?$|aten::type_as|aten::clone|aten::contiguous",
        ),
        (
            "norm_elementwise",
            rf"elementwise|reduce_kernel|norm|rsqrt|silu|gelu|act_and_mul|rope|rotary|fill|"
            rf"aten::({_ELEMENTWISE_OPS})_?$",
        ),
    )
)


def classify(name: str, phase: str = "") -> str:
    """The class of a kernel (or, on a CPU, an operator) named ``name``; ``"other"`` when no rule matches."""
    if phase == SAMPLING_PHASE:
        return "sampling"
    for cls, rule in _RULES:
        if rule.search(name):
            return cls
    return "other"
