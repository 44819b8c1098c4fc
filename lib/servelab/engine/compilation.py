"""Compiling the model's blocks, kept only where the compiled forward runs and agrees with the eager one."""

from __future__ import annotations

import torch

from servelab.kernels.attention import AttentionMetadata
from servelab.kernels.prefill import PrefillSegment


@torch.inference_mode()
def compile_with_check(model, pool, scratch_block: int) -> str:
    """``model.compile_blocks()``, kept only if a compiled forward runs and agrees with the eager one.

    The check runs a two-sequence prefill whose K/V go to the scratch block; it also pays the first
    compilation, so the first real step does not.
    """
    eager_fns = model.block_fns
    eager_final = getattr(model, "final_norm", None)
    n = min(pool.block_size, 8)
    dev = pool.device
    ids = torch.randint(0, model.shape.vocab, (2 * n,), generator=torch.Generator().manual_seed(0)).to(dev)
    pos = torch.arange(n, device=dev).repeat(2)
    meta = AttentionMetadata(
        slot_mapping=scratch_block * pool.block_size + pos,
        prefills=[PrefillSegment(0, n, 0, None), PrefillSegment(n, n, 0, None)],
    )
    ref = model(ids, pos, meta, pool).float()
    try:
        model.compile_blocks()
        got = model(ids, pos, meta, pool).float()
    except Exception as e:  # a compiler failure must not take the engine down: run eagerly, say why
        model.block_fns = eager_fns
        if eager_final is not None:
            model.final_norm = eager_final
        return f"off: compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    err = (got - ref).abs().max().item()
    scale = ref.abs().max().item()
    if not err <= 0.05 * scale + 1e-4:
        model.block_fns = eager_fns
        if eager_final is not None:
            model.final_norm = eager_final
        return f"off: compiled logits differ from eager by {err:.3g} (scale {scale:.3g})"
    return f"on (max |logit diff| vs eager {err:.2g})"
