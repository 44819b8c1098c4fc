"""Speculative decoding behind the engine's interface, so the server can run it (``--draft-model``, or
``--draft-model prompt-lookup`` / vLLM's ``--speculative-config``: see ``servelab.speculative.config``).

``SpeculativeEngine`` answers what the server asks of an ``Engine`` (``add_request``, ``step``, ``abort``,
``has_unfinished``, ``stats``, ``on_step``, the queues and block manager for its gauges) and serves requests
one at a time, first come first served: each ``step()`` is one speculative round of the running request
(its first step is the prefill), and hands out every token that round produced. Speculation trades batch
width for fewer target steps, so this is the latency-optimised mode for a lightly loaded server; it does
not batch requests together.
"""

from __future__ import annotations

import time
from collections import deque

from servelab.engine.engine import Engine, StepRecord
from servelab.engine.scheduler import TokenEvent
from servelab.engine.sequence import FinishReason, SamplingParams, Sequence, SequenceStatus
from servelab.errors import ParameterError
from servelab.spec.decoder import Generation, SpeculativeDecoder
from servelab.spec.gamma import gamma_policy
from servelab.spec.paged_lm import PagedLM, spec_engine_config
from servelab.spec.prompt_lookup import PromptLookupProposer


class RequestQueues:
    """The two lists the server's gauges read: requests waiting, and the one running."""

    def __init__(self):
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []


class SpeculativeEngine:
    """``SpeculativeEngine(target, draft, gamma)``: ``draft`` is the draft model's engine, or a
    ``PromptLookupProposer`` (no draft model: ``draft_engine`` is None)."""

    def __init__(self, target: Engine, draft: Engine | PromptLookupProposer, gamma=4):
        lookup = isinstance(draft, PromptLookupProposer)
        self.target_engine, self.draft_engine = target, None if lookup else draft
        self.method = "ngram" if lookup else "draft_model"
        self.model, self.config, self.device = target.model, target.config, target.device
        self.num_blocks, self.block_manager = target.num_blocks, target.block_manager
        self.target, self.draft = PagedLM(target, "target"), draft if lookup else PagedLM(draft, "draft")
        self.decoder = SpeculativeDecoder(self.target, self.draft, gamma=gamma)  # checks vocabularies and rows
        self.lookahead = gamma_policy(gamma).max_gamma + 1
        lengths = [target.max_model_len] + ([] if lookup else [draft.max_model_len])
        self.max_model_len = min(lengths) - self.lookahead
        if self.max_model_len < 2:
            raise ParameterError(f"max_model_len too small for {self.lookahead - 1} speculative tokens")
        self.scheduler = RequestQueues()
        self.on_step = None
        self.steps = 0
        self.accepted = self.proposed = 0
        self._current: tuple[Sequence, Generation] | None = None

    # ---- requests ---------------------------------------------------------------------------------
    def add_request(
        self, prompt_token_ids, params: SamplingParams | None = None, *, arrival_s: float | None = None
    ) -> Sequence:
        params = params or SamplingParams()
        if not params.plain:  # the speculative decoder samples with temperature, top-p and a seed only
            raise ParameterError(
                "with speculative decoding a request may set temperature, top_p and seed only (no penalties, "
                "top_k, min_p, logit_bias, min_tokens or logprobs)"
            )
        seq = Sequence(
            list(prompt_token_ids), params, arrival_s=time.perf_counter() if arrival_s is None else arrival_s
        )
        if max(seq.prompt_token_ids) >= self.model.shape.vocab:
            raise ParameterError(f"prompt token ids must be < vocab size {self.model.shape.vocab}")
        if seq.max_total_tokens > self.max_model_len:
            raise ParameterError(
                f"prompt ({len(seq.prompt_token_ids)}) + max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len={self.max_model_len} (speculation keeps {self.lookahead} slots)"
            )
        self.scheduler.waiting.append(seq)
        return seq

    def has_unfinished(self) -> bool:
        return self._current is not None or bool(self.scheduler.waiting)

    def abort(self, seq: Sequence) -> bool:
        if seq.is_finished:
            return False
        if self._current is not None and self._current[0] is seq:
            self._end(FinishReason.ABORT)
        else:
            self.scheduler.waiting.remove(seq)
            seq.status, seq.finish_reason = SequenceStatus.FINISHED, FinishReason.ABORT
        return True

    # ---- running ----------------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        """Prefill the next waiting request, or run one speculative round of the running one."""
        t0 = time.perf_counter()
        if self._current is None:
            if not self.scheduler.waiting:
                return []
            seq = self.scheduler.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.scheduler.running = [seq]
            state = self.decoder.start(seq.prompt_token_ids, seq.params)
            self._current = (seq, state)
            new, prefill = list(state.tokens), len(seq.prompt_token_ids)
        else:
            seq, state = self._current
            new, prefill = self.decoder.round(state), 0
            last = state.rounds[-1]
            self.accepted += last.accepted
            self.proposed += last.proposed
        seq.output_token_ids += new
        seq.num_computed_tokens = self.target.num_cached
        self.steps += 1
        events = [TokenEvent(seq.seq_id, t, False, None) for t in new]
        if state.finish_reason:
            reason = FinishReason(state.finish_reason)
            events[-1] = TokenEvent(seq.seq_id, new[-1], True, reason)
            self._end(reason)
        if self.on_step is not None:
            self.on_step(
                StepRecord(
                    t0,
                    time.perf_counter(),
                    prefill,
                    len(new) if not prefill else 0,
                    1,
                    len(self.scheduler.waiting),
                    0,
                    1,
                )
            )
        return events

    def _end(self, reason: FinishReason) -> None:
        seq, _ = self._current
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
        self.decoder.release()
        self.scheduler.running = []
        self._current = None

    def stream(self):
        while self.has_unfinished():
            yield from self.step()

    def generate(self, prompts: list[list[int]], params=None, *, progress: bool = False) -> list[list[int]]:
        plist = params if isinstance(params, list) else [params] * len(prompts)
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        for _ in self.stream():
            pass
        return [s.output_token_ids for s in seqs]

    def stats(self) -> dict:
        return self.target_engine.stats() | {
            "speculative": "on",
            "speculative_method": self.method,
            "speculative_gamma": str(self.decoder.gamma_spec),
            "spec_rounds": self.steps,
            "spec_accepted_tokens": self.accepted,
            "spec_proposed_tokens": self.proposed,
            "spec_acceptance_rate": self.accepted / self.proposed if self.proposed else None,
        }


def draft_engine(
    spec: str, *, dtype: str, device: str, max_model_len: int | None, block_size: int, cuda_graphs: bool, seed: int = 0
) -> Engine:
    """The draft's engine: a small KV pool for one sequence, decode graphs of 1 and 2 rows. Build it before the
    target's, whose pool then sizes itself from the memory left."""
    from servelab.engine.engine import _max_positions
    from servelab.models import load_model

    hf = load_model(spec, dtype=dtype, device=device, seed=seed, load_tokenizer=False).model
    length = min(max_model_len or 4096, _max_positions(hf.config))
    engine = Engine.from_hf(hf, spec_engine_config(length, 2, block_size=block_size, cuda_graphs=cuda_graphs))
    del hf
    return engine
