"""Self-speculation: the target's own first k layers, its final norm and its head, as the draft.

No second model is trained or stored: the draft shares the target's parameters (no copy), so it costs k / L of
the target's layers plus the same embedding and head. It is an ordinary HF causal LM, so the engine's speculative
mode (through ``models.native.native_from_hf``), HF's ``assistant_model`` and the acceptance measurement take it as
they take a trained draft. Unlike LayerSkip-style self-speculation, it keeps its own KV cache for its k layers
instead of sharing the target's (the same compute; the target re-computes those layers when it verifies).
"""

from __future__ import annotations

import copy

from servelab.errors import ParameterError


def self_draft(target, layers: int):
    """An HF model of the target's class with its first ``layers`` decoder layers, sharing the target's weights.

    The target must keep its decoder layers in ``model.layers`` (Llama, Qwen2, Mistral …)."""
    inner = getattr(target, "model", None)
    blocks = getattr(inner, "layers", None)
    if blocks is None:
        raise ParameterError(f"{type(target).__name__} keeps no decoder layers in .model.layers")
    total = len(blocks)
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers < total:
        raise ParameterError(f"a self-draft takes 1 … {total - 1} of the target's {total} layers, got {layers!r}")
    import torch

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types[:layers])
    with torch.device("meta"):  # no weights are allocated: every module below is the target's own
        draft = type(target)(config)
    draft.model.embed_tokens = inner.embed_tokens
    draft.model.layers = torch.nn.ModuleList(blocks[:layers])
    draft.model.norm = inner.norm
    draft.model.rotary_emb = inner.rotary_emb
    draft.lm_head = target.lm_head
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()
