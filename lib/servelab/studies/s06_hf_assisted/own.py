"""The project's own speculative decoding (``servelab.spec``, Study 3) on the same pairs, as runs.

Built lazily per pair: ``SpeculativePair.from_hf`` converts the HF weights to the engine's model code and,
on CUDA, captures its decode graphs. Its decoder synchronises with the device at the end of each phase
and records host wall times per round, so a run's marks are (tokens so far, ms) after every round; the
first mark is the first token (the target's prefill, and the draft's). The target-alone baseline
(``own_plain``) reports only its total, at the last token.
"""

from __future__ import annotations

import numpy as np

from servelab.studies.s06_hf_assisted.runs import GenerationRun


def own_available() -> tuple[bool, str]:
    """Whether ``servelab.studies.s03_speculative.pair.SpeculativePair`` can be imported (and why not)."""
    try:
        from servelab.studies.s03_speculative.pair import SpeculativePair  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means "not available", with the reason
        return False, f"{type(e).__name__}: {e}"
    return True, ""


class OwnSpeculative:
    """``runner(draft_or_None, target, prompt, n) -> GenerationRun`` over the project's engine, for ``pairs``
    (``servelab.studies.s06_hf_assisted.runs.Pair``); with no draft, the target alone on the engine of its first
    pair."""

    def __init__(self, models: dict, pairs, max_model_len: int, gamma=4):
        self.models = models
        self.pairs = list(pairs)
        self.max_model_len = max_model_len
        self.gamma = gamma
        self._pairs: dict[tuple[str, str], object] = {}

    @classmethod
    def sized(
        cls, models: dict, pairs, prompt_tokens: int, max_new_tokens: int, gamma: int = 4, block_size: int = 16
    ) -> OwnSpeculative:
        """Engines that hold a prompt, its output and one round's lookahead (γ + 1), in whole KV blocks."""
        need = prompt_tokens + max_new_tokens + gamma + 2
        return cls(models, pairs, max_model_len=-(-need // block_size) * block_size, gamma=gamma)

    def pair(self, draft: str, target: str):
        from servelab.studies.s03_speculative.pair import SpeculativePair

        key = (draft, target)
        if key not in self._pairs:
            self._pairs[key] = SpeculativePair.from_hf(
                self.models[target], self.models[draft], max_model_len=self.max_model_len, gamma=self.gamma
            )
        return self._pairs[key]

    def _any_pair(self, target: str):
        """The engine of ``target`` from the first planned pair that has it (its draft is built alongside)."""
        p = next((p for p in self.pairs if p.target == target), None)
        if p is None:
            raise ValueError(f"no planned pair has target {target!r}")
        return self.pair(p.draft, p.target)

    def __call__(self, draft: str | None, target: str, prompt: list[int], n: int) -> GenerationRun:
        from servelab.engine import SamplingParams

        params = SamplingParams(max_tokens=n, ignore_eos=True)
        if draft is None:
            gen = self._any_pair(target).autoregressive(list(prompt), params)
            return GenerationRun(
                list(gen.tokens), np.array([len(gen.tokens)]), np.array([gen.seconds * 1e3]), dense=False
            )
        gen = self.pair(draft, target).generate(list(prompt), params)
        round_s = np.array([r.draft_s + r.verify_s + r.rollback_s for r in gen.rounds])
        first_s = gen.seconds - round_s.sum()
        counts = np.concatenate([[1], 1 + np.cumsum([r.emitted for r in gen.rounds])]).astype(np.int64)
        ms = np.concatenate([[first_s], first_s + np.cumsum(round_s)]) * 1e3
        extra = dict(
            accepted=gen.accepted,
            proposed=gen.proposed,
            rounds=len(gen.rounds),
            rollback_ms=float(sum(r.rollback_s for r in gen.rounds) * 1e3),
        )
        return GenerationRun(list(gen.tokens), counts, ms, extra)

    def close(self) -> None:
        self._pairs.clear()
