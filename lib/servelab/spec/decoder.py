"""The speculative decoding loop, and the plain autoregressive loop it is measured against.

A round: the proposer proposes up to γ tokens (``proposer``: a draft model, or prompt lookup); the target
scores them and the position after them in one forward (``verifier``); the acceptance rule keeps k drafts and
adds one target token (``acceptance``); both caches roll back to the accepted prefix (``rollback``); the γ
policy sees (k, γ) (``gamma``). Each round emits k + 1 tokens for one target forward.

The first token after the prompt comes from the target's prefill, as in plain decoding; a draft model prefills
the same prompt (prompt lookup keeps no cache: it searches the committed tokens every round). Both loops drive
the engine's model code on one sequence (``PagedLM``) and sync with the host once per model step (the engine's
decode steps do too), so their times compare like for like.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from servelab.engine.sampling import sample
from servelab.engine.sequence import SamplingParams
from servelab.errors import ParameterError
from servelab.spec.acceptance import greedy_accept, probabilities, rejection_accept
from servelab.spec.gamma import gamma_policy
from servelab.spec.paged_lm import PagedLM
from servelab.spec.proposer import Proposal, Proposer, as_proposer
from servelab.spec.rollback import rollback
from servelab.spec.verifier import TargetVerifier


@dataclass
class Round:
    """One speculative round (host wall times in seconds; each phase ends synchronised with the device)."""

    gamma: int  # drafts asked for
    accepted: int
    emitted: int  # tokens this round added to the output (k + 1, fewer at the end)
    draft_s: float
    verify_s: float  # target forward + acceptance
    rollback_s: float
    draft_rows_first: int  # 1, or 2 when the draft caught up on the previous round's last draft (0: no draft model)
    target_dropped: int
    draft_dropped: int
    proposed: int  # drafts proposed: γ for a draft model, 0 … γ for prompt lookup


@dataclass
class Generation:
    tokens: list[int]
    finish_reason: str  # "length", "eos" or "stop"
    rounds: list[Round] = field(default_factory=list)
    seconds: float = 0.0
    # the request's state between rounds (SpeculativeDecoder.start / round)
    params: SamplingParams | None = field(default=None, repr=False)
    policy: object = field(default=None, repr=False)
    generator: object = field(default=None, repr=False)
    committed: list[int] = field(default_factory=list, repr=False)  # prompt + tokens, the last one pending
    started_s: float = field(default=0.0, repr=False)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def proposed(self) -> int:
        return sum(r.proposed for r in self.rounds)

    @property
    def rejections(self) -> int:
        """Rounds that kept fewer than γ drafts: one was rejected, or fewer than γ were proposed."""
        return sum(r.accepted < r.gamma for r in self.rounds)


def _finish(params: SamplingParams, eos: tuple[int, ...], out: list[int], new: list[int]) -> str | None:
    """Append ``new`` to ``out`` up to the first stop; the finish reason, or None to go on."""
    for t in new:
        out.append(t)
        if t in params.stop_token_ids:
            return "stop"
        if not params.ignore_eos and t in eos:
            return "eos"
        if len(out) >= params.max_tokens:
            return "length"
    return None


def _first_token(target: PagedLM, prompt: list[int], params: SamplingParams, generator) -> int:
    target.reset()
    logits = target.forward(list(prompt), last_only=True)
    return int(sample(logits, [params], [generator])[0])


def _check_prompt(lm: PagedLM, prompt, params: SamplingParams, extra: int = 0) -> None:
    if not prompt:
        raise ParameterError("a prompt needs at least one token")
    if len(prompt) + params.max_tokens + extra > lm.max_len:
        raise ParameterError(
            f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}) + lookahead ({extra}) "
            f"exceeds {lm.name}'s max_model_len={lm.max_len}"
        )


def _generator(params: SamplingParams, device) -> torch.Generator | None:
    if params.greedy:
        return None
    return torch.Generator(device=device).manual_seed(params.seed if params.seed is not None else 0)


class SpeculativeDecoder:
    """``SpeculativeDecoder(target, draft, gamma=4)``; ``generate(prompt_ids, SamplingParams(...)) -> Generation``.

    ``draft``: a draft model (``PagedLM``) or a proposer without one (``PromptLookupProposer``). ``gamma``: an
    int (fixed), ``"adaptive"`` or a policy object (``servelab.spec.gamma``). Target and draft model must share
    the tokenizer (vocabulary); the target's engine needs decode graphs of up to γ_max + 1 rows.
    """

    def __init__(
        self, target: PagedLM, draft: PagedLM | Proposer, gamma=4, eos_token_ids: tuple[int, ...] | None = None
    ):
        self.proposer = as_proposer(draft)
        self.draft = self.proposer.lm  # the draft model's cache, or None
        if self.draft is not None and target.vocab != self.draft.vocab:
            raise ParameterError(
                f"target and draft vocabularies differ ({target.vocab} vs {self.draft.vocab}): "
                "speculative decoding needs one tokenizer"
            )
        self.target = target
        self.gamma_spec = gamma
        g = gamma_policy(gamma)
        if g.max_gamma + 1 > target.max_rows:
            raise ParameterError(
                f"gamma up to {g.max_gamma} needs a target stepping {g.max_gamma + 1} rows; "
                f"its engine takes {target.max_rows}"
            )
        self.verifier = TargetVerifier(target)
        if eos_token_ids is None:
            from servelab.engine.engine import eos_ids

            eos_token_ids = eos_ids(target.model.config)
        self.eos = tuple(eos_token_ids)

    def start(self, prompt: list[int], params: SamplingParams | None = None) -> Generation:
        """Prefill both models with ``prompt``; the target picks the first token. Returns the request's state:
        a ``Generation`` whose ``finish_reason`` stays "" until ``round`` ends it."""
        params = params or SamplingParams()
        policy = gamma_policy(self.gamma_spec).fresh()  # an adaptive γ starts over for every request
        for lm in (self.target, self.draft):
            if lm is not None:
                _check_prompt(lm, prompt, params, policy.max_gamma + 1)
        t_start = time.perf_counter()
        state = Generation(
            [], "", params=params, policy=policy, generator=_generator(params, self.target.device), started_s=t_start
        )
        first = _first_token(self.target, prompt, params, state.generator)
        if self.draft is not None:
            self.draft.reset()
            self.draft.forward(list(prompt), last_only=True)  # its logits are not needed: the target chose the token
        state.committed = list(prompt) + [first]
        state.finish_reason = _finish(params, self.eos, state.tokens, [first]) or ""
        state.seconds = time.perf_counter() - t_start
        return state

    def round(self, state: Generation) -> list[int]:
        """One speculative round of an unfinished request; the tokens it added to ``state.tokens``."""
        params, policy, gen, committed, out = state.params, state.policy, state.generator, state.committed, state.tokens
        gamma = max(1, min(policy.gamma, params.max_tokens - len(out)))  # never draft past the end
        t0 = time.perf_counter()
        rows_first = 0 if self.draft is None else len(committed) - self.draft.num_cached
        proposal = self.proposer.propose(committed, gamma, params, gen)
        t1 = time.perf_counter()
        logits = self.verifier.score(committed[-1], proposal.tokens)
        acc = _accept(logits, proposal, params, gen)
        t2 = time.perf_counter()
        sync = rollback(self.target, self.draft, len(committed), acc.accepted, len(proposal.tokens))
        new = proposal.tokens[: acc.accepted] + [acc.next_token]
        committed += new
        n_before = len(out)
        state.finish_reason = _finish(params, self.eos, out, new) or ""
        policy.update(acc.accepted, gamma)
        state.rounds.append(
            Round(
                gamma=gamma,
                accepted=acc.accepted,
                emitted=len(out) - n_before,
                draft_s=t1 - t0,
                verify_s=t2 - t1,
                rollback_s=sync.seconds,
                draft_rows_first=rows_first,
                target_dropped=sync.target_dropped,
                draft_dropped=sync.draft_dropped,
                proposed=len(proposal.tokens),
            )
        )
        state.seconds = time.perf_counter() - state.started_s
        return out[n_before:]

    def generate(self, prompt: list[int], params: SamplingParams | None = None) -> Generation:
        state = self.start(prompt, params)
        while not state.finish_reason:
            self.round(state)
        return state

    def release(self) -> None:
        self.target.reset()
        if self.draft is not None:
            self.draft.reset()


def _accept(logits: torch.Tensor, proposal: Proposal, params: SamplingParams, generator):
    """The acceptance rule on the target's ``logits`` [m + 1, vocab] for the m proposed tokens."""
    if params.greedy:  # the drafts stay on the host: the match runs there, after one copy of the argmaxes
        return greedy_accept(logits, torch.tensor(proposal.tokens, dtype=torch.long))
    drafts = torch.tensor(proposal.tokens, dtype=torch.long, device=logits.device)
    q = proposal.probs
    if q is None:  # a proposer without a distribution (prompt lookup) drew each token with certainty: q is one-hot
        q = torch.nn.functional.one_hot(drafts, logits.shape[-1]).float()
    return rejection_accept(probabilities(logits, params.temperature, params.top_p), q, drafts, generator)


def _device_sampler(params: SamplingParams, generator):
    """``logits [1, vocab] -> LongTensor [1]`` on the device, as ``sample`` picks for one request."""

    def pick(logits):
        if params.greedy:
            return logits.argmax(dim=-1)
        return torch.multinomial(probabilities(logits, params.temperature, params.top_p), 1, generator=generator)[:, 0]

    return pick


def autoregressive_chained(
    lm: PagedLM,
    prompt: list[int],
    params: SamplingParams | None = None,
    chain: int = 8,
    eos_token_ids: tuple[int, ...] | None = None,
) -> Generation:
    """The stronger baseline: the target alone, ``chain`` decode steps back to back on the device between host
    checks (the engine's multi-step decoding, ``decode_steps``); tokens past a stop are dropped."""
    params = params or SamplingParams()
    _check_prompt(lm, prompt, params, chain)
    if eos_token_ids is None:
        from servelab.engine.engine import eos_ids

        eos_token_ids = eos_ids(lm.model.config)
    t_start = time.perf_counter()
    gen = _generator(params, lm.device)
    out: list[int] = []
    tok = _first_token(lm, prompt, params, gen)
    reason = _finish(params, tuple(eos_token_ids), out, [tok])
    pick = _device_sampler(params, gen)
    while reason is None:
        k = min(chain, params.max_tokens - len(out))
        new = lm.decode_chain(out[-1], k, pick)
        if new is None:  # no graph bucket: one step
            new = [int(sample(lm.forward([out[-1]]), [params], [gen])[0])]
        reason = _finish(params, tuple(eos_token_ids), out, new)
    return Generation(out, reason, seconds=time.perf_counter() - t_start)


def autoregressive(
    lm: PagedLM, prompt: list[int], params: SamplingParams | None = None, eos_token_ids: tuple[int, ...] | None = None
) -> Generation:
    """The baseline: the same model, one token per forward (a one-row CUDA-graph decode step on the GPU)."""
    params = params or SamplingParams()
    _check_prompt(lm, prompt, params)
    if eos_token_ids is None:
        from servelab.engine.engine import eos_ids

        eos_token_ids = eos_ids(lm.model.config)
    t_start = time.perf_counter()
    gen = _generator(params, lm.device)
    out: list[int] = []
    tok = _first_token(lm, prompt, params, gen)
    reason = _finish(params, tuple(eos_token_ids), out, [tok])
    while reason is None:
        tok = int(sample(lm.forward([tok]), [params], [gen])[0])
        reason = _finish(params, tuple(eos_token_ids), out, [tok])
    return Generation(out, reason, seconds=time.perf_counter() - t_start)
