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
        return sum(r.gamma * r.active for r in self.rounds)

    @property
    def rejections(self) -> int:
        return sum(k < r.gamma for r in self.rounds for k in r.accepted)

    @property
    def draft_steps(self) -> int:
        return sum(r.gamma for r in self.rounds)

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
class _Plan:
    """A round's host-side inputs: keys of its steps, the packed host tensor and where each part starts."""

    draft_keys: list[tuple[int, int]]
    verify_key: tuple[int, int]
    host: torch.Tensor
    splits: list[int]
    before: list[int]  # each active sequence's target length before the round


class BatchSpeculation:
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
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
            raise ParameterError(f"gamma must be a positive integer, got {gamma!r}")
        self.target, self.draft, self.gamma = target, draft, gamma
        self.clock = PhaseClock(target.device)

    # ---- the loop -----------------------------------------------------------------------------------
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
        """Prefill both models (untimed; the target chooses each prompt's first token); the loop's state."""
        _check(prompts, max_new_tokens)
        for lm in (self.target, self.draft):
            lm.reset()
        first = self.target.prefill(prompts).argmax(-1).tolist()
        self.draft.prefill(prompts)
        _sync(self.target.device)
        return _State(max_new_tokens, controlled, first, list(first), [None] * len(prompts))

    @torch.inference_mode()
    def round(self, state: _State) -> BatchRound:
        """One round of every running sequence (see the module docstring)."""
        act, g = state.active, self.gamma
        draws = [state.controlled.draw(i, len(state.out[i]), g) for i in act] if state.controlled else None
        plan = self._plan(state, draws)
        staged = plan.host.to(self.target.device, non_blocking=True)
        packed, marks = self._run(plan, staged, len(act))
        host = packed.tolist()  # the round's one device-to-host copy (and so its one sync)
        rnd = BatchRound(g, len(act), [], 0, 0, marks)
        for idx, i in enumerate(act):
            self._apply(state, rnd, i, plan.before[idx], host[idx], draws[idx] if draws else None)
        state.active = [i for i in act if len(state.out[i]) < state.max_new]
        state.rounds.append(rnd)
        return rnd

    def finish(self, state: _State) -> BatchGeneration:
        seconds = time.perf_counter() - state.t0
        for r in state.rounds:  # events are read after the run: reading one earlier would sync
            r.draft_ms, r.verify_ms = self.clock.ms(r.marks[0], r.marks[1]), self.clock.ms(r.marks[1], r.marks[2])
        return BatchGeneration([o[: state.max_new] for o in state.out], state.first, seconds, state.rounds)

    # ---- a round's parts ----------------------------------------------------------------------------
    def _plan(self, state: _State, draws) -> _Plan:
        t, d, g, act = self.target, self.draft, self.gamma, state.active
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
        flat = [list(itertools.chain.from_iterable(p)) for p in parts]
        host = torch.tensor(list(itertools.chain.from_iterable(flat)), dtype=torch.long)
        return _Plan(keys, vkey, host, [len(f) for f in flat], T)

    def _run(self, plan: _Plan, staged: torch.Tensor, b: int):
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

    def _apply(self, state: _State, rnd: BatchRound, i: int, before: int, row: list[int], draw) -> None:
        """Commit sequence i's round: its kept drafts and next token, both caches truncated to them."""
        g, emitted = self.gamma, len(state.out[i])
        k_dev, next_dev, props = row[0], row[1], row[2:]
        if draw is None:
            k, new = k_dev, props[:k_dev] + [next_dev]
        else:
            k = draw[1]
            new = state.controlled.next_tokens(i, emitted, k)
        rnd.agreed += int(k_dev == k and next_dev == new[-1])
        self.target.truncate(i, before + k + 1)
        self.draft.truncate(i, min(before + k + 1, before + g))  # the draft never ran its last proposal
        state.catch_up[i] = new[-2] if k == g else None
        state.pending[i] = new[-1]
        rnd.accepted.append(k)
        rnd.emitted += min(len(new), state.max_new - emitted)
        state.out[i] += new


class _State:
    """A batch between rounds: outputs, pending tokens, the draft's catch-up tokens, the running sequences."""

    def __init__(self, max_new: int, controlled, first: list[int], pending: list[int], catch_up: list):
        self.max_new, self.controlled, self.first = max_new, controlled, first
        self.pending, self.catch_up = pending, catch_up
        self.out: list[list[int]] = [[] for _ in first]
        self.active = list(range(len(first)))
        self.rounds: list[BatchRound] = []
        self.t0 = time.perf_counter()
