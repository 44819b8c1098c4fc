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
MAX_LOGPROBS = 20  # most likely tokens a request may ask logprobs for (OpenAI's top_logprobs limit, vLLM's default)


@dataclass(frozen=True)
class SamplingParams:
    """How a request picks its tokens and when it stops.

    ``temperature`` below ``SAMPLING_EPS`` is greedy (vLLM's rule: a softmax that cold is one-hot anyway,
    or NaN once the division overflows). ``top_p`` keeps the smallest set of tokens whose probability sums
    to at least ``top_p``. ``seed`` gives the request its own random generator, so its tokens do not depend
    on what else is in the batch. ``ignore_eos`` keeps generating past EOS (benchmarks).

    vLLM's logits processors, each applied to the whole batch at once (``logits_processing.py``):
    ``presence_penalty`` and ``frequency_penalty`` (OpenAI's, over the output tokens), ``repetition_penalty``
    (over prompt and output tokens; 1 is off), ``logit_bias`` ((token id, bias) pairs added to the logits),
    ``min_tokens`` (EOS and the stop ids cannot be sampled before that many tokens), then ``top_k`` (0 or -1:
    off) and ``min_p`` (keep tokens with at least ``min_p`` times the top token's probability) beside ``top_p``.

    ``logprobs``: return the log-probability of each sampled token and of the ``logprobs`` most likely ones
    (0: the sampled token's alone); ``prompt_logprobs`` the same for every prompt token after the first
    (``logprobs.py`` says which distribution: the model's raw one).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None

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
        self._check_processors()

    def _check_processors(self) -> None:
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ParameterError(f"top_k must be an integer >= -1 (0 or -1: off), got {self.top_k!r}")
        if not _number(self.min_p) or not 0 <= self.min_p <= 1:
            raise ParameterError(f"min_p must be in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _number(v) or not -2 <= v <= 2:
                raise ParameterError(f"{name} must be in [-2, 2], got {v!r}")
        if not _number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ParameterError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}")
        bias = tuple((t, float(b)) for t, b in self.logit_bias)
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 or not -100 <= b <= 100 for t, b in bias):
            raise ParameterError(f"logit_bias needs token ids >= 0 and biases in [-100, 100], got {self.logit_bias!r}")
        object.__setattr__(self, "logit_bias", bias)
        # read for every row of every step (the sampler's fast-path test): computed once
        penalized = bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)
        processed = penalized or bool(bias or self.min_tokens or self.min_p) or self.top_k > 0
        object.__setattr__(self, "_penalized", penalized)
        object.__setattr__(self, "_processed", processed or self.logprobs is not None)
        m = self.min_tokens
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m <= self.max_tokens:
            raise ParameterError(f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], got {m!r}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_LOGPROBS):
                raise ParameterError(f"{name} must be an integer in [0, {MAX_LOGPROBS}] or None, got {v!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def penalized(self) -> bool:
        """Whether a penalty reads the tokens so far (the sampler then needs them on the host)."""
        return self._penalized

    @property
    def processed(self) -> bool:
        """Whether any logits processor or logprobs applies: False keeps the sampler's plain fast path."""
        return self._processed

    @property
    def plain(self) -> bool:
        """Nothing beyond temperature, top-p and a seed: what every engine path (speculative included) runs."""
        return not self.processed and self.prompt_logprobs is None

    @property
    def draftable(self) -> bool:
        """What the speculative mode drafts for: a plain request, or one whose only processor is ``min_tokens`` (its
        verify step and its draft hold the stops back at each position, as the sampler would at that output)."""
        return (
            self.logprobs is None
            and self.prompt_logprobs is None
            and not (self._penalized or self.logit_bias or self.min_p or self.top_k > 0)
        )


def _number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


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
    # prompt logprobs (params.prompt_logprobs): entry p is token p's ``TokenLogprob`` (None for token 0), filled
    # as the prefill chunks that compute them land; complete once it holds every prompt token
    prompt_logprobs: list = field(default_factory=list)
    prompt_logprobs_asked: int = 0  # prompt positions whose logits a launched step computes for them
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
    def needs_prompt_logprobs(self) -> bool:
        """Prompt logprobs asked for, and some prompt position's logits not computed yet (position p's logits
        give token p + 1's logprob; a cached prefix would skip them, so such a sequence takes none)."""
        return self.params.prompt_logprobs is not None and self.prompt_logprobs_asked < len(self.prompt_token_ids) - 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, {self.status.value}, prompt={len(self.prompt_token_ids)}, "
            f"out={len(self.output_token_ids)}, computed={self.num_computed_tokens})"
        )
