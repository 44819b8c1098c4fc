"""The steps Study 2 times: what each one computes, and its FLOPs and bytes for the roofline.

A ``StepPoint`` is one forward step of a kind a server runs:

- ``decode``: ``batch`` sequences of ``context`` cached tokens compute one token each;
- ``prefill``: ``batch`` sequences compute ``new_tokens`` each after ``context`` cached ones (0: a fresh prompt;
  more: a chunk of chunked prefill, or a prompt after a prefix-cache hit);
- ``mixed``: ``decodes`` sequences at ``decode_context`` cached tokens decode one token each while one prompt
  computes a chunk of ``new_tokens`` after ``context`` cached tokens, all in one step (chunked prefill's step).
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.bench.hf_modes import MIXED_MODES
from servelab.errors import ParameterError
from servelab.models.shape import ModelShape

PHASES = ("prefill", "decode", "mixed")


@dataclass(frozen=True)
class StepPoint:
    phase: str  # "prefill", "decode" or "mixed"
    batch: int  # sequences computing new_tokens each (a mixed step's prefill chunks: 1)
    new_tokens: int  # new tokens per sequence (1 for decode)
    context: int  # cached tokens per sequence before the step
    decodes: int = 0  # a mixed step's decoding sequences
    decode_context: int = 0  # cached tokens of each of those

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ParameterError(f"phase must be one of {PHASES}, got {self.phase!r}")
        for name, low in (("batch", 1), ("new_tokens", 1), ("context", 0), ("decodes", 0), ("decode_context", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ParameterError(f"StepPoint.{name} must be an integer >= {low}, got {v!r}")
        if self.phase == "decode" and (self.new_tokens != 1 or self.context < 1):
            raise ParameterError(
                "a decode step computes 1 token after context >= 1, got "
                f"new_tokens={self.new_tokens}, context={self.context}"
            )
        if self.phase == "mixed":
            if self.batch != 1 or self.decodes < 1 or self.decode_context < 1:
                raise ParameterError(
                    "a mixed step is one prefill chunk (batch=1) beside decodes >= 1 at "
                    f"decode_context >= 1, got batch={self.batch}, decodes={self.decodes}, "
                    f"decode_context={self.decode_context}"
                )
        elif self.decodes or self.decode_context:
            raise ParameterError(f"only a mixed step has decodes and decode_context, not a {self.phase} step")

    @property
    def tokens(self) -> int:
        """Tokens the step computes."""
        return self.batch * self.new_tokens + self.decodes

    def work(self, shape: ModelShape, dtype_bytes: int) -> tuple[float, float]:
        """``(FLOPs, bytes)`` of the step: a mixed step's are its decodes' and its chunk's, weights read once."""
        if self.phase == "decode":
            return shape.decode_flops(self.batch, self.context), shape.decode_bytes(
                self.batch, self.context, dtype_bytes
            )
        flops = shape.prefill_flops(self.new_tokens, self.context, self.batch)
        nbytes = shape.prefill_bytes(self.new_tokens, self.context, self.batch, dtype_bytes)
        if self.phase == "mixed":  # one forward: the weights stream through once for both parts
            flops += shape.decode_flops(self.decodes, self.decode_context)
            nbytes += shape.decode_bytes(self.decodes, self.decode_context, dtype_bytes) - shape.weight_bytes(
                dtype_bytes
            )
        return flops, nbytes


def prefill_points(lengths, batches, max_batch_tokens: int) -> list[StepPoint]:
    """Prefill of ``length`` tokens for ``batch`` sequences, skipping steps over ``max_batch_tokens``."""
    return [StepPoint("prefill", b, n, 0) for b in batches for n in lengths if b * n <= max_batch_tokens]


def decode_points(batches, contexts, max_kv_tokens: int) -> list[StepPoint]:
    """One decode step for ``batch`` sequences of ``context`` cached tokens, up to ``max_kv_tokens`` cached."""
    return [StepPoint("decode", b, 1, c) for b in batches for c in contexts if b * c <= max_kv_tokens]


def context_prefill_points(chunk_tokens, contexts, batch: int = 1) -> list[StepPoint]:
    """A prefill chunk of ``n`` tokens after ``c`` cached ones, for every pair (chunked prefill's later chunks)."""
    return [StepPoint("prefill", batch, n, c) for n in chunk_tokens for c in contexts]


def mixed_points(decodes, decode_context: int, chunk_tokens: int, chunk_contexts) -> list[StepPoint]:
    """``d`` decodes at ``decode_context`` beside one chunk of ``chunk_tokens`` after ``c`` cached, every d and c."""
    return [StepPoint("mixed", 1, chunk_tokens, c, d, decode_context) for d in decodes for c in chunk_contexts]


def study_plan(params: dict, kv_bytes_per_token: int) -> list[tuple[str, StepPoint]]:
    """The ``(mode, point)`` pairs Study 2 times for one model (``params`` from ``costs.params.study_params``).

    Isolated prefills and decodes in every mode; prefill chunks after cached context in the engine modes; mixed
    steps in every mode, so that an HF mode's row says it has none. Decode points whose KV cache would exceed
    ``max_kv_gib`` are left out.
    """
    p = params
    isolated = prefill_points(p["prefill_lengths"], p["prefill_batches"], p["max_batch_tokens"]) + decode_points(
        p["decode_batches"], p["decode_contexts"], p["max_kv_gib"] * 2**30 // kv_bytes_per_token
    )
    chunks = context_prefill_points(p["chunk_tokens"], p["chunk_contexts"])
    mixed = mixed_points(
        p["mixed_decodes"], p["mixed_decode_context"], p["mixed_chunk_tokens"], p["mixed_chunk_contexts"]
    )
    engine_modes = [m for m in p["modes"] if m in MIXED_MODES]
    return (
        [(m, pt) for m in p["modes"] for pt in isolated]
        + [(m, pt) for m in engine_modes for pt in chunks]
        + [(m, pt) for m in p["modes"] for pt in mixed]
    )
