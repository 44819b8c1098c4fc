"""A request as the engine sees it: its tokens, sampling parameters, and how much of it is cached.

A sequence's state is one number, ``num_computed_tokens``: how many of its tokens have K/V in the cache.
Every step the scheduler gives it some of the rest to compute (a prefill chunk, or the one token
sampled last step); when all its tokens are computed the step samples the next one. Preemption by
recompute sets ``num_computed_tokens`` back to 0; prompt and outputs are then recomputed together.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, field

from servelab.errors import ParameterError

# temperatures below this are greedy: vLLM's _SAMPLING_EPS; logits / 1e-5 still fit float32 comfortably
SAMPLING_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How a request picks its tokens and when it stops.

    ``temperature`` below ``SAMPLING_EPS`` is greedy (vLLM's rule: a softmax that cold is one-hot anyway,
    or NaN once the division overflows). ``top_p`` keeps the smallest set of tokens whose probability sums
    to at least ``top_p``. ``seed`` gives the request its own random generator, so its tokens do not depend
    on what else is in the batch. ``ignore_eos`` keeps generating past EOS (benchmarks).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ParameterError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if (
            not isinstance(self.temperature, (int, float))
            or not math.isfinite(self.temperature)
            or self.temperature < 0
        ):
            raise ParameterError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ParameterError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ParameterError(f"seed must be an integer or None, got {self.seed!r}")
        stops = tuple(self.stop_token_ids)
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in stops):
            raise ParameterError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", stops)

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    LENGTH = "length"  # max_tokens reached
    EOS = "eos"
    STOP = "stop"  # one of stop_token_ids
    ABORT = "abort"  # the client went away or the request was cancelled


_ids = itertools.count()

# an output token sampled on the device whose value the host has not read yet (async scheduling); never a
# valid token id, so a step that forgot to take the value from the device fails loudly (embedding index -1)
PENDING_TOKEN = -1


@dataclass(eq=False)
class Sequence:
    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    seq_id: int = field(default_factory=lambda: next(_ids))
    arrival_s: float = 0.0  # when it arrived (clock of whoever drives the scheduler)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    generator: object = None  # torch.Generator for seeded sampling (set by the engine)
    kv_slots: list[int] = field(default_factory=list)  # pool slots reserved for positions 0, 1, … (to a block end)

    def __post_init__(self):
        ids = list(self.prompt_token_ids)
        if not ids:
            raise ParameterError("a prompt needs at least one token")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
            raise ParameterError("prompt token ids must be non-negative integers")
        self.prompt_token_ids = ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose K/V are not cached yet: the rest of the prompt, or the last sampled token."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def max_total_tokens(self) -> int:
        """Tokens the sequence can ever hold: prompt + max_tokens (what admission checks against capacity)."""
        return len(self.prompt_token_ids) + self.params.max_tokens

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens at positions [start, end) of prompt + outputs (no copy of the whole sequence)."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    def token_at(self, i: int) -> int:
        p = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < p else self.output_token_ids[i - p]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, {self.status.value}, prompt={len(self.prompt_token_ids)}, "
            f"out={len(self.output_token_ids)}, computed={self.num_computed_tokens})"
        )
