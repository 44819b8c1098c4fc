"""Text ↔ token ids for the server: the model's own HF tokenizer, or a byte-level fallback.

``config:`` models (random weights of a real architecture) ship no tokenizer, yet text prompts must
work with every model. ``ByteTokenizer`` maps each UTF-8 byte to one id in a window of 256 ids that
holds none of the model's special ids (BOS/EOS/PAD) and fits in its vocabulary; decoding ignores ids
outside the window. The text a random model produces is noise either way; what matters for serving
measurements is that prompts have a known token count (one per byte) and ids below the vocabulary.

Decoding is incremental (``new_decoder()``): a token may end in the middle of a UTF-8 character or a
merged word piece, so a decoder holds text back until it is complete, the way vLLM's detokenizer does.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Protocol

from servelab.errors import ParameterError

BYTES = 256
CONTEXT_TOKENS = 5  # prompt tokens an HF decoder starts from, so the first output token gets its leading space right


class NoChatTemplate(ParameterError):
    """Chat was asked of a tokenizer without a chat template."""


class IncrementalDecoder(Protocol):
    def push(self, token_id: int) -> str: ...
    def flush(self) -> str: ...


class TextCodec(Protocol):
    name: str
    has_chat_template: bool

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids) -> str: ...
    def new_decoder(self, prompt_ids: list[int]) -> IncrementalDecoder: ...
    def chat_prompt(self, messages: list[dict]) -> list[int]: ...


def byte_window(vocab_size: int, special_ids) -> int:
    """The first id of 256 consecutive ids below ``vocab_size`` that contain no special id."""
    if vocab_size < BYTES:
        raise ParameterError(f"a byte-level tokenizer needs a vocabulary of at least {BYTES} ids, got {vocab_size}")
    specials = sorted({int(s) for s in special_ids if s is not None and 0 <= int(s) < vocab_size})
    for start in [0] + [s + 1 for s in specials]:
        if start + BYTES <= vocab_size and not any(start <= s < start + BYTES for s in specials):
            return start
    raise ParameterError(f"no window of {BYTES} ids free of special ids {specials} in a vocabulary of {vocab_size}")


class ByteDecoder:
    def __init__(self, offset: int):
        self.offset = offset
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        b = token_id - self.offset
        return self.utf8.decode(bytes([b])) if 0 <= b < BYTES else ""

    def flush(self) -> str:
        return self.utf8.decode(b"", final=True)


def chat_template_text(value: str) -> str:
    """``--chat-template``: a file's contents, or the value itself when it names no file (as vLLM takes it)."""
    path = Path(value).expanduser()
    try:
        if path.is_file():
            return path.read_text()
    except OSError:
        pass
    return value


def render_chat(template: str, messages: list[dict]) -> str:
    """A Jinja chat template rendered as ``transformers`` does (sandboxed, with a generation prompt)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True, bos_token="", eos_token="")


class ByteTokenizer:
    """One id per UTF-8 byte: id = byte + ``offset``; a chat template only if given (``--chat-template``)."""

    def __init__(self, vocab_size: int, special_ids=(), chat_template: str | None = None):
        self.offset = byte_window(vocab_size, special_ids)
        self.name = f"bytes+{self.offset}"
        self.chat_template = chat_template
        self.has_chat_template = chat_template is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """One id per byte (there are no special tokens to add)."""
        return [b + self.offset for b in text.encode("utf-8")]

    def new_decoder(self, prompt_ids: list[int]) -> ByteDecoder:
        return ByteDecoder(self.offset)

    def decode(self, ids) -> str:
        return bytes(i - self.offset for i in ids if 0 <= i - self.offset < BYTES).decode("utf-8", errors="replace")

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        if self.chat_template is None:
            raise NoChatTemplate(
                "this model has no chat template (its tokenizer is the byte-level fallback); use /v1/completions "
                "or start the server with --chat-template"
            )
        return self.encode(render_chat(self.chat_template, messages))


class HFDecoder:
    """vLLM's scheme: decode a short window of ids and emit only the text past what was already emitted,
    holding back while the text ends in an incomplete character (U+FFFD)."""

    def __init__(self, tokenizer, prompt_ids: list[int]):
        self.tok = tokenizer
        self.ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix) :] if len(text) > len(prefix) else ""


class HFTokenizer:
    """A ``transformers`` tokenizer (the model's own)."""

    def __init__(self, tokenizer, name: str = "hf"):
        self.tok = tokenizer
        self.name = name
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens))

    def new_decoder(self, prompt_ids: list[int]) -> HFDecoder:
        return HFDecoder(self.tok, prompt_ids)

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        if not self.has_chat_template:
            raise NoChatTemplate("this model's tokenizer has no chat template; use /v1/completions")
        # render then encode: apply_chat_template's tokenized return type differs across transformers versions
        text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.tok.encode(text, add_special_tokens=False))


def special_ids(model_config) -> list[int]:
    out = []
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(model_config, key, None)
        out += list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(v) for v in out if v is not None]


def tokenizer_source(spec: str) -> str | None:
    """Where the tokenizer of ``spec`` loads from: the local HF directory the loader made or was given (a GGUF
    spec such as SmolLM2's: its dequantized cache, with the GGUF's tokenizer and chat template), else the
    spec itself (a hub id); None for ``config:`` models and paths without tokenizer files."""
    if spec.startswith("config:"):
        return None
    from servelab.models.loader import ModelLoadError, model_directory

    try:
        directory = model_directory(spec)
    except ModelLoadError:
        directory = None
    path = directory or Path(spec).expanduser()
    has_files = path.is_dir() and any(
        (path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    )
    if has_files:
        return str(path)
    return None if path.exists() else spec


def load_codec(
    spec: str, special: list[int], vocab_size: int, chat_template: str | None = None
) -> tuple[TextCodec, str]:
    """The model's tokenizer when ``spec`` (a directory, a GGUF spec, or a hub id) has one, else the byte
    fallback (avoiding the ``special`` ids); and a one-line note saying which was chosen and why.
    ``chat_template`` (``--chat-template``: a file or the template) replaces the tokenizer's."""
    template = None if chat_template is None else chat_template_text(chat_template)
    source = tokenizer_source(spec)
    if source is not None:
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(source)
            if template is not None:
                tok.chat_template = template
            return HFTokenizer(tok, name=type(tok).__name__), f"tokenizer: {type(tok).__name__} from {source}"
        except (OSError, ValueError) as e:
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            codec = ByteTokenizer(vocab_size, special, template)
            return codec, f"tokenizer: byte-level fallback ({why})"
    codec = ByteTokenizer(vocab_size, special, template)
    return (
        codec,
        f"tokenizer: byte-level fallback (ids {codec.offset}..{codec.offset + BYTES - 1}; the model ships none)",
    )
