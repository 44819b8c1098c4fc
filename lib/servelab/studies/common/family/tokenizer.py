"""The family's tokenizer: a byte-level BPE trained on the corpus's train split, and batched encoding.

Saved as a ``PreTrainedTokenizerFast`` so that ``AutoTokenizer.from_pretrained(dir)`` works; ``EOS`` separates files
in the token stream (and serves as BOS), ``PAD`` pads.
"""

from __future__ import annotations

import contextlib
import math
import os

import numpy as np

from servelab.errors import ParameterError

EOS = "<|endoftext|>"  # separates files in the token stream; also BOS
PAD = "<|pad|>"


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE (GPT-2's pre-tokenisation) on ``texts``; returns a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise ParameterError(f"vocab_size must be at least 300 (256 bytes + specials + merges), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with tokenizers_parallel():
        tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )


def encode_files(tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Token ids of each text (batched and parallel in the Rust tokenizer), as int32 arrays."""
    backend = tokenizer.backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # no offsets: faster
    with tokenizers_parallel():
        return [np.asarray(e.ids, dtype=np.int32) for e in encode(texts, add_special_tokens=False)]


@contextlib.contextmanager
def tokenizers_parallel():
    """Let the Rust tokenizer use every core here, even where ``TOKENIZERS_PARALLELISM=false`` is set for the
    process (run scripts set it to silence the fork warning): on one core, encoding the full corpus would take
    a good part of the training budget. The Rust side reads the variable at each call; the old value returns."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def sample_for_tokenizer(texts: list[str], max_bytes: int) -> list[str]:
    """Every k-th file, so the tokenizer sees all packages, not the first few, within ``max_bytes``."""
    total = sum(len(t) for t in texts)
    step = max(1, math.ceil(total / max_bytes))
    return texts[::step]
