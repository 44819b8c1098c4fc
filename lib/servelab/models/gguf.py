"""A GGUF file as an HF model directory: dequantized once by ``transformers``, then cached.

``transformers`` reads a GGUF (``from_pretrained(dir, gguf_file=...)``, with the ``gguf`` and ``accelerate``
packages) and dequantizes every tensor to float32. That is slow: for SmolLM2-135M-Instruct's 98 MB Q4_1 file,
40-70 s on a busy 2-core machine (a third of it rebuilding the tokenizer from the GGUF's vocabulary), against
about 5 s to read the same model and tokenizer back from a saved directory. So the first load writes that directory
under the cache (``$SERVELAB_CACHE``, default ``~/.cache/servelab``), keyed by the file's path, size and
modification time and the ``transformers`` and ``gguf`` versions, and every later load reads it.

The cached weights stay float32: a Q4_1 value is an fp16 scale times a 4-bit integer plus an fp16 offset, which
neither fp16 nor bf16 holds exactly, so the cache keeps what ``transformers`` computed and the caller casts.

``transformers`` (5.x) builds the GGUF's tokenizer with the wrong EOS (it names the BOS token, ``<|im_start|>``
for SmolLM2); the GGUF's own ``tokenizer.ggml.eos_token_id`` and ``padding_token_id`` are written back before
the tokenizer is saved, so generation and chat stop where the model was trained to.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

CACHE_ENV = "SERVELAB_CACHE"
FORMAT = 1  # bump when what the cache directory holds changes, so old entries are not read


class GGUFError(RuntimeError):
    """A GGUF file could not be read or dequantized; the message says why."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "servelab").expanduser()


def _versions() -> str:
    try:
        import gguf
        import transformers
    except ImportError as e:
        raise GGUFError(
            f"reading a GGUF needs the packages 'gguf' and 'accelerate' ({e}); pip install gguf accelerate"
        ) from e
    return f"transformers={transformers.__version__} gguf={getattr(gguf, '__version__', '?')}"


def cache_dir(gguf_path: Path) -> Path:
    """The directory that holds (or will hold) the dequantized model of ``gguf_path``."""
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()} {st.st_size} {st.st_mtime_ns} {_versions()} format={FORMAT}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{gguf_path.stem}-{digest}"


def _special_ids(gguf_path: Path) -> dict[str, int]:
    """The GGUF's own special token ids (``eos``, ``padding``, ...), read from its metadata."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf_path)).fields
    out = {}
    for name in ("bos", "eos", "padding", "unknown"):
        field = fields.get(f"tokenizer.ggml.{name}_token_id")
        if field is not None:
            out[name] = int(field.contents())
    return out


def _fix_tokenizer(tok, ids: dict[str, int]) -> None:
    tokens = tok.convert_ids_to_tokens
    if "eos" in ids:
        tok.eos_token = tokens(ids["eos"])
    if "padding" in ids:
        tok.pad_token = tokens(ids["padding"])
    # a byte-level BPE tokenizer: the WordPiece clean-up would strip spaces before punctuation
    tok.clean_up_tokenization_spaces = False


def _dequantize_into(gguf_path: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    # transformers refuses save_pretrained on a model it loaded from a GGUF, although the weights are plain
    # float32 by now: write them (safetensors' save_model keeps the tied embedding once) and a config without
    # the GGUF quantization entry, so a reader of the directory does not look for the GGUF again
    save_model(model, str(out / "model.safetensors"), metadata={"format": "pt"})
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    _fix_tokenizer(tok, _special_ids(gguf_path))
    tok.save_pretrained(out)


def dequantized_dir(gguf_path) -> Path:
    """An HF model directory (float32 weights, config, tokenizer, chat template) for the GGUF at ``gguf_path``,
    built on the first call and cached; safe when several processes race to build it."""
    path = Path(gguf_path).expanduser()
    if not path.is_file():
        raise GGUFError(f"no GGUF file at {str(path)!r}")
    final = cache_dir(path)
    if (final / "config.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        _dequantize_into(path, tmp)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / "config.json").exists():  # not another process finishing first: a real failure
                raise
    except Exception as e:
        raise GGUFError(f"could not dequantize {str(path)!r}: {type(e).__name__}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
