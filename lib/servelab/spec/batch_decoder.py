"""Greedy speculative decoding of a batch of sequences, and the plain batched decoding it is measured against.

A round, for the b sequences still running (each its own acceptance, so caches grow raggedly):

1. the host plans the round: slots for every row (block-manager appends), table rows, and every input the host
   knows, packed into ONE host-to-device copy;
2. the draft runs γ decode steps back to back, each one captured graph over one row per sequence (plus a
   catch-up row for a sequence whose last draft was kept), each step's input the token the step before chose,
   on the device (or, with ``ControlledAcceptance``, the proposal that overrides it);
3. the target verifies all b·(γ + 1) rows in one captured step; acceptance (longest prefix where the draft's
   token is the target's argmax, then the target's token) is computed on the device;
4. ONE device-to-host copy reads the accepted counts, the next tokens and the proposals: the round's only sync;
5. rollback: each cache is truncated to its accepted prefix, block-manager bookkeeping, no copies.

The baseline ``greedy_decode`` runs the target alone, every step a captured graph fed the token the step before
chose on the device, and reads the tokens once at the end: plain decoding without a host round trip per token.
Both time the decode phase only: after both models prefilled the prompts, until the last token is on the host.

``BatchLoop`` is the round's skeleton (plan on the host, one copy in, the device's steps, one read back, commit)
that ``BatchSpeculation`` (a draft model proposes) and ``batch_lookup.BatchLookup`` (prompt lookup proposes on the
host) share; each supplies its prefill, plan, device steps and per-sequence outcome.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from servelab.errors import ParameterError
from servelab.spec.batch_lm import PagedBatch
from servelab.spec.controlled import ControlledAcceptance


class PhaseClock:
    """Marks on the device's stream (CUDA events, read once after the run) or host time on a CPU (ms)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else 1e3 * (b - a)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class BatchRound:
    gamma: int
    active: int  # sequences in the round
    accepted: list[int]  # drafts kept, per active sequence
    emitted: int  # tokens the round added to the outputs (after clipping at max_new_tokens)
    agreed: int  # sequences whose device-side acceptance equalled the one applied (controlled mode checks it)
    marks: tuple = field(default=(), repr=False)  # (start, draft done, verify done) of the device phases
    draft_ms: float = 0.0  # the γ draft steps, device time
    verify_ms: float = 0.0  # the verify step and the acceptance, device time
    asked: list[int] = field(default_factory=list)  # drafts asked per active sequence (γ; lookup: fewer at the end)
    proposals: list[int] = field(default_factory=list)  # drafts proposed per active sequence (lookup: 0 … asked)
    draft_steps: int = 0  # draft-model decode steps the round ran on the device (γ; prompt lookup: 0)
    propose_ms: float = 0.0  # proposals searched on the host (prompt lookup), host time


@dataclass
class BatchGeneration:
    tokens: list[list[int]]  # decode tokens per sequence, after the one the prompt's prefill chose
    first: list[int]  # the token each prompt's prefill chose
    seconds: float  # decode phase, host wall time
    rounds: list[BatchRound] = field(default_factory=list)
    steps: int = 0  # plain decoding: decode steps run

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds

    @property
    def accepted(self) -> int:
        return sum(sum(r.accepted) for r in self.rounds)

    @property
    def proposed(self) -> int:
        return sum(sum(r.proposals) for r in self.rounds)

    @property
    def rejections(self) -> int:
        """Sequence-rounds that kept fewer drafts than were asked: one was rejected (or, for prompt lookup, the
        search ran out: the miss ``real_acceptance.rounds`` counts too)."""
        return sum(k < a for r in self.rounds for k, a in zip(r.accepted, r.asked, strict=True))

    @property
    def draft_steps(self) -> int:
        return sum(r.draft_steps for r in self.rounds)

    @property
    def propose_ms(self) -> float:
        return sum(r.propose_ms for r in self.rounds)

    @property
    def draft_ms(self) -> float:
        return sum(r.draft_ms for r in self.rounds)

    @property
    def verify_ms(self) -> float:
        return sum(r.verify_ms for r in self.rounds)


def _check(prompts, max_new_tokens: int) -> None:
    if not prompts:
        raise ParameterError("give at least one prompt")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ParameterError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")


@torch.inference_mode()
def greedy_decode(lm: PagedBatch, prompts: list[list[int]], max_new_tokens: int) -> BatchGeneration:
    """Plain greedy decoding of ``prompts`` as one batch: ``max_new_tokens`` steps after the prefill's token."""
    _check(prompts, max_new_tokens)
    lm.reset()
    first = lm.prefill(prompts).argmax(-1)
    b, n = len(prompts), max_new_tokens
    _sync(lm.device)
    t0 = time.perf_counter()
    starts = list(lm.lengths)
    slots = [lm.extend(i, n) for i in range(b)]
    rows = lm.table_rows(list(range(b)), starts, [s + n - 1 for s in starts])
    key = lm.bucket(b, max(starts) + n - 1)
    host = [lm.padded([lm.column(0, starts[i] + j, slots[i][j], rows[i]) for i in range(b)], key[0]) for j in range(n)]
    staged = torch.tensor(host, dtype=torch.long).to(lm.device, non_blocking=True)  # [n, 5, rows]
    tok = first
    out = []
    for j in range(n):
        tok = lm.replay(key, staged[j], tok)[:b].argmax(-1)
        out.append(tok)
    tokens = torch.stack(out, 1).tolist()  # the only device-to-host copy of the decode phase
    return BatchGeneration(tokens, first.tolist(), time.perf_counter() - t0, steps=n)


@dataclass
class RoundPlan:
    """A round's host-side inputs, packed for its ONE host-to-device copy: ``host`` (its parts' lengths
    ``splits``), each active sequence's target length before the round (``before``), drafts asked and proposed
    per sequence as far as the host knows them, and the verify step's captured bucket."""

    host: torch.Tensor
    splits: list[int]
    before: list[int]
    verify_key: tuple[int, int]
    asked: list[int]
    proposals: list[int]
    draft_steps: int = 0  # draft-model steps the round runs on the device
    propose_ms: float = 0.0  # host time of proposals searched on the host (prompt lookup)


@dataclass
class _DraftPlan(RoundPlan):
    draft_keys: list[tuple[int, int]] = field(default_factory=list)
    draws: list | None = None  # controlled acceptance: (proposals, k) per active sequence


class BatchLoop:
    """The round both batched loops share (``generate``, ``start``/``round``/``finish``); a subclass gives
    ``target``, ``gamma``, ``clock`` and the parts: ``_prefill`` (the prompts' first tokens), ``_plan`` (a
    ``RoundPlan``), ``_run`` (the device side: ``([b, ≥ 2]`` rows of (k, next token, …), phase marks)``) and
    ``_outcome`` (sequence i's kept drafts and new tokens, from its row of the one read)."""

    target: PagedBatch
    gamma: int
    clock: PhaseClock

    @torch.inference_mode()
    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, controlled: ControlledAcceptance | None = None
    ) -> BatchGeneration:
        state = self.start(prompts, max_new_tokens, controlled)
        while state.active:
            self.round(state)
        return self.finish(state)

    @torch.inference_mode()
    def start(self, prompts, max_new_tokens: int, controlled: ControlledAcceptance | None = None) -> _State:
        """Prefill (untimed; the target chooses each prompt's first token); the loop's state."""
        _check(prompts, max_new_tokens)
        first = self._prefill(prompts, controlled)
        _sync(self.target.device)
        return _State(max_new_tokens, controlled, prompts, first)

    @torch.inference_mode()
    def round(self, state: _State) -> BatchRound:
        """One round of every running sequence (see the module docstring)."""
        act = state.active
        plan = self._plan(state)
        staged = plan.host.to(self.target.device, non_blocking=True)
        packed, marks = self._run(plan, staged, len(act))
        host = packed.tolist()  # the round's one device-to-host copy (and so its one sync)
        rnd = BatchRound(self.gamma, len(act), [], 0, 0, marks, asked=plan.asked, proposals=plan.proposals)
        rnd.draft_steps, rnd.propose_ms = plan.draft_steps, plan.propose_ms
        for idx, i in enumerate(act):
            k, new = self._outcome(state, rnd, plan, idx, host[idx])
            self.target.truncate(i, plan.before[idx] + k + 1)
            state.pending[i] = new[-1]
            rnd.accepted.append(k)
            rnd.emitted += min(len(new), state.max_new - len(state.out[i]))
            state.out[i] += new
        state.active = [i for i in act if len(state.out[i]) < state.max_new]
        state.rounds.append(rnd)
        return rnd

    def finish(self, state: _State) -> BatchGeneration:
        seconds = time.perf_counter() - state.t0
        for r in state.rounds:  # events are read after the run: reading one earlier would sync
            r.draft_ms, r.verify_ms = self.clock.ms(r.marks[0], r.marks[1]), self.clock.ms(r.marks[1], r.marks[2])
        return BatchGeneration([o[: state.max_new] for o in state.out], state.first, seconds, state.rounds)

    # ---- the parts a loop supplies ------------------------------------------------------------------
    def _prefill(self, prompts, controlled) -> list[int]:
        raise NotImplementedError

    def _plan(self, state: _State) -> RoundPlan:
        raise NotImplementedError

    def _run(self, plan: RoundPlan, staged: torch.Tensor, b: int):
        raise NotImplementedError

    def _outcome(self, state: _State, rnd: BatchRound, plan: RoundPlan, idx: int, row: list[int]):
        raise NotImplementedError


class BatchSpeculation(BatchLoop):
    """``BatchSpeculation(target, draft, gamma)``: ``generate(prompts, max_new_tokens, controlled=None)``.

    With ``controlled`` (a ``ControlledAcceptance`` over the target's reference continuations), every proposal
    is overridden after the draft computed it and the acceptance applied is the controlled one; the
    device still computes the target's own acceptance, and ``BatchRound.agreed`` counts where they agree (all,
    in exact arithmetic: a check of the loop)."""

    def __init__(self, target: PagedBatch, draft: PagedBatch, gamma: int):
        if target.vocab != draft.vocab:
            raise ParameterError(
                f"target and draft vocabularies differ ({target.vocab} vs {draft.vocab}): "
                "speculative decoding needs one tokenizer"
            )
        _check_gamma(gamma)
        self.target, self.draft, self.gamma = target, draft, gamma
        self.clock = PhaseClock(target.device)

    # ---- a round's parts ----------------------------------------------------------------------------
    def _prefill(self, prompts, controlled) -> list[int]:
        """Both models prefill; the target chooses each prompt's first token."""
        for lm in (self.target, self.draft):
            lm.reset()
        first = self.target.prefill(prompts).argmax(-1).tolist()
        self.draft.prefill(prompts)
        return first

    def _plan(self, state: _State) -> _DraftPlan:
        t, d, g, act = self.target, self.draft, self.gamma, state.active
        draws = [state.controlled.draw(i, len(state.out[i]), g) for i in act] if state.controlled else None
        T = [t.lengths[i] for i in act]
        lag = [t.lengths[i] - d.lengths[i] for i in act]
        ts = [t.extend(i, g + 1) for i in act]
        ds = [d.extend(i, lag_i + g) for i, lag_i in zip(act, lag, strict=True)]
        trows = t.table_rows(act, T, [x + g for x in T])
        drows = d.table_rows(act, [x - lg for x, lg in zip(T, lag, strict=True)], [x + g - 1 for x in T])
        steps = []
        for j in range(g):  # draft step j: row i at position T_i + j; step 0 also catches up the lagging ones
            cols = [
                d.column(state.pending[i] if j == 0 else 0, T[n] + j, ds[n][lag[n] + j], drows[n])
                for n, i in enumerate(act)
            ]
            if j == 0:
                cols += [d.column(state.catch_up[i], T[n] - 1, ds[n][0], drows[n]) for n, i in enumerate(act) if lag[n]]
            steps.append(cols)
        keys = [d.bucket(len(c), max(T) + j) for j, c in enumerate(steps)]
        verify = [
            t.column(state.pending[i] if j == 0 else 0, T[n] + j, ts[n][j], trows[n])
            for n, i in enumerate(act)
            for j in range(g + 1)
        ]
        vkey = t.bucket(len(verify), max(T) + g)
        props = [p for p, _ in draws] if draws else [[0] * g for _ in act]
        mask = [[int(draws is not None)] * g for _ in act]
        parts = [d.padded(c, k[0]) for c, k in zip(steps, keys, strict=True)] + [t.padded(verify, vkey[0])]
        parts += [list(zip(*props, strict=True)), list(zip(*mask, strict=True))]  # [γ, b] each
        host, splits = pack(parts)
        return _DraftPlan(host, splits, T, vkey, [g] * len(act), [g] * len(act), g, draft_keys=keys, draws=draws)

    def _run(self, plan: _DraftPlan, staged: torch.Tensor, b: int):
        """The device side of a round; ``([b, γ + 2]`` packed (k, next token, proposals), phase marks)."""
        g = self.gamma
        parts = list(staged.split(plan.splits))
        props, mask = parts[-2].view(g, b), parts[-1].view(g, b).bool()
        m0 = self.clock.mark()
        chosen = []
        for j, key in enumerate(plan.draft_keys):
            logits = self.draft.replay(key, parts[j].view(5, key[0]), chosen[-1] if j else None)[:b]
            chosen.append(torch.where(mask[j], props[j], logits.argmax(-1)))
        m1 = self.clock.mark()
        P = torch.stack(chosen, 1)  # [b, γ]
        v_in = parts[g].view(5, plan.verify_key[0])
        ids = torch.cat([v_in[0, : b * (g + 1)].view(b, g + 1)[:, :1], P], 1).reshape(-1)
        best = self.target.replay(plan.verify_key, v_in, ids)[: b * (g + 1)].argmax(-1).view(b, g + 1)
        k = (best[:, :g] == P).long().cumprod(1).sum(1)
        packed = torch.cat([k[:, None], best.gather(1, k[:, None]), P], 1)
        return packed, (m0, m1, self.clock.mark())

    def _outcome(self, state: _State, rnd: BatchRound, plan: _DraftPlan, idx: int, row: list[int]):
        """Sequence i's kept drafts and new tokens (the controlled ones, or the device's); the draft rolled back."""
        g, i = self.gamma, state.active[idx]
        k_dev, next_dev, props = row[0], row[1], row[2:]
        if plan.draws is None:
            k, new = k_dev, props[:k_dev] + [next_dev]
        else:
            k = plan.draws[idx][1]
            new = state.controlled.next_tokens(i, len(state.out[i]), k)
        rnd.agreed += int(k_dev == k and next_dev == new[-1])
        before = plan.before[idx]
        self.draft.truncate(i, min(before + k + 1, before + g))  # the draft never ran its last proposal
        state.catch_up[i] = new[-2] if k == g else None
        return k, new


def _check_gamma(gamma) -> None:
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ParameterError(f"gamma must be a positive integer, got {gamma!r}")


def pack(parts: list[list[list[int]]]) -> tuple[torch.Tensor, list[int]]:
    """The round's host inputs as one flat host tensor (one copy to the device) and each part's length."""
    flat = [list(itertools.chain.from_iterable(p)) for p in parts]
    return torch.tensor(list(itertools.chain.from_iterable(flat)), dtype=torch.long), [len(f) for f in flat]


class _State:
    """A batch between rounds: prompts, outputs, pending tokens, the draft's catch-up tokens, the running ones."""

    def __init__(self, max_new: int, controlled, prompts: list[list[int]], first: list[int]):
        self.max_new, self.controlled, self.prompts, self.first = max_new, controlled, prompts, first
        self.pending: list[int] = list(first)  # each sequence's last token, which no cache holds yet
        self.catch_up: list = [None] * len(first)
        self.out: list[list[int]] = [[] for _ in first]
        self.active = list(range(len(first)))
        self.rounds: list[BatchRound] = []
        self.t0 = time.perf_counter()

    def context(self, i: int) -> list[int]:
        """Sequence i's committed tokens: its prompt, the prefill's token and its decode tokens so far."""
        return self.prompts[i] + [self.first[i]] + self.out[i]
