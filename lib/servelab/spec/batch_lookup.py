"""Greedy speculative decoding of a batch with prompt lookup proposing: no draft model, no draft KV cache.

A round, for the b sequences still running (``batch_decoder.BatchLoop``'s skeleton):

1. the host searches each sequence's committed tokens (all on the host since the last round's read) for up to
   γ_i = min(γ, tokens still to produce) proposals (``PromptLookupProposer``); a sequence with no match proposes
   nothing, and its verify is one row, a plain target step;
2. the verify rows (sequence i: its pending token, then its m_i proposals, at positions T_i … T_i + m_i), the
   index of each (i, j) among them and the proposals, padded to γ with −1, travel in ONE host-to-device copy;
3. the target verifies all Σ(m_i + 1) rows in one captured step (the rows are ragged: nothing is verified twice
   or padded inside a sequence); acceptance (longest prefix where a proposal is the target's argmax) runs on the
   device, where a −1 can never equal an argmax: the padding is rejected by construction and never counted as a
   proposal (``BatchRound.proposals`` holds the m_i);
4. ONE device-to-host copy reads each sequence's kept count and next token;
5. rollback: the target's cache alone is truncated to its accepted prefix (block-manager bookkeeping).

Proposals cost host time only (``BatchRound.propose_ms``), inside the timed decode phase.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from servelab.errors import ParameterError
from servelab.spec.batch_decoder import BatchLoop, BatchRound, PhaseClock, RoundPlan, _check_gamma, _State, pack
from servelab.spec.batch_lm import PagedBatch
from servelab.spec.prompt_lookup import PromptLookupProposer

_NEVER = -1  # the padding proposal: an argmax is in [0, vocab), so it is never kept


@dataclass
class _LookupPlan(RoundPlan):
    drafts: list[list[int]] = field(default_factory=list)  # each active sequence's proposals (m_i of them)


class BatchLookup(BatchLoop):
    """``BatchLookup(target, lookup, gamma)``: ``generate(prompts, max_new_tokens)``, ``start``/``round``/``finish``
    as ``BatchSpeculation``'s, with proposals from ``lookup`` (a ``PromptLookupProposer``) instead of a draft."""

    def __init__(self, target: PagedBatch, lookup: PromptLookupProposer, gamma: int):
        if not isinstance(lookup, PromptLookupProposer):
            raise ParameterError(f"lookup must be a PromptLookupProposer, got {type(lookup).__name__}")
        _check_gamma(gamma)
        self.target, self.lookup, self.gamma = target, lookup, gamma
        self.clock = PhaseClock(target.device)

    def _prefill(self, prompts, controlled) -> list[int]:
        if controlled is not None:  # its acceptance is the search's own: nothing to override
            raise ParameterError("prompt lookup takes no controlled acceptance")
        self.target.reset()
        return self.target.prefill(prompts).argmax(-1).tolist()

    def _plan(self, state: _State) -> RoundPlan:
        t, g, act = self.target, self.gamma, state.active
        t0 = time.perf_counter()
        asked = [min(g, state.max_new - len(state.out[i])) for i in act]  # never propose past the end
        props = [self.lookup.lookup(state.context(i), a) for i, a in zip(act, asked, strict=True)]
        propose_ms = 1e3 * (time.perf_counter() - t0)
        T = [t.lengths[i] for i in act]
        slots = [t.extend(i, len(p) + 1) for i, p in zip(act, props, strict=True)]
        rows = t.table_rows(act, T, [x + len(p) for x, p in zip(T, props, strict=True)])
        verify, index = [], []
        for n, i in enumerate(act):
            start = len(verify)
            ids = [state.pending[i], *props[n]]
            verify += [t.column(tok, T[n] + j, slots[n][j], rows[n]) for j, tok in enumerate(ids)]
            index.append([start + min(j, len(props[n])) for j in range(g + 1)])  # past m_i: compared with −1
        vkey = t.bucket(len(verify), max(x + len(p) for x, p in zip(T, props, strict=True)))
        padded = [p + [_NEVER] * (g - len(p)) for p in props]
        host, splits = pack([t.padded(verify, vkey[0]), index, padded])
        return _LookupPlan(host, splits, T, vkey, asked, [len(p) for p in props], propose_ms=propose_ms, drafts=props)

    def _run(self, plan: _LookupPlan, staged: torch.Tensor, b: int):
        """The verify step and the acceptance; ``([b, 2]`` (k, next token), phase marks): no draft phase."""
        g = self.gamma
        v_in, index, props = staged.split(plan.splits)
        m0 = self.clock.mark()
        best = self.target.replay(plan.verify_key, v_in.view(5, plan.verify_key[0])).argmax(-1)
        best = best[index.view(b, g + 1)]  # [b, γ + 1]: row (i, j) of the ragged verify, clamped at m_i
        k = (best[:, :g] == props.view(b, g)).long().cumprod(1).sum(1)
        packed = torch.cat([k[:, None], best.gather(1, k[:, None])], 1)
        return packed, (m0, m0, self.clock.mark())

    def _outcome(self, state: _State, rnd: BatchRound, plan: _LookupPlan, idx: int, row: list[int]):
        k, nxt = row
        rnd.agreed += 1  # the device's acceptance is the one applied
        return k, plan.drafts[idx][:k] + [nxt]
