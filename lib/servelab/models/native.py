"""Build the project's own model (``LlamaModel`` or ``GPT2Model``) from any model the loader accepts."""

from __future__ import annotations

import torch

from servelab.models.gpt2 import GPT2Model
from servelab.models.llama import LlamaModel

FAMILIES = {"llama": LlamaModel, "qwen2": LlamaModel, "mistral": LlamaModel, "gpt2": GPT2Model}


def native_model_class(config):
    mt = getattr(config, "model_type", None)
    if mt not in FAMILIES:
        raise NotImplementedError(f"no native model code for model_type {mt!r}; implemented: {sorted(FAMILIES)}")
    if mt == "mistral" and getattr(config, "sliding_window", None):
        raise NotImplementedError("sliding-window attention (Mistral) is not implemented")
    return FAMILIES[mt]


def native_from_hf(
    hf_model, *, max_positions: int | None = None, attention_backend: str = "gather", dtype=None, device=None
):
    """Our model with ``hf_model``'s weights, in its dtype and on its device unless told otherwise."""
    cls = native_model_class(hf_model.config)
    p = next(hf_model.parameters())
    dtype = dtype or p.dtype
    device = torch.device(device) if device is not None else p.device
    with torch.device("meta"):
        model = cls(hf_model.config, max_positions=max_positions, attention_backend=attention_backend)
    model = model.to_empty(device=device)
    model.to(dtype)
    model.tie_weights()  # materialising from meta can untie shared parameters
    _reset_buffers(model, hf_model.config, device)
    model.load_hf_state_dict(hf_model.state_dict())
    return model.eval()


def _reset_buffers(model, config, device) -> None:
    """``to_empty`` leaves buffers uninitialised: recompute the RoPE tables (kept in float32)."""
    if hasattr(model, "rotary"):
        from servelab.models.layers.rotary import RotaryEmbedding

        fresh = RotaryEmbedding(config, model.max_positions)
        model.rotary.cos = fresh.cos.to(device)
        model.rotary.sin = fresh.sin.to(device)
