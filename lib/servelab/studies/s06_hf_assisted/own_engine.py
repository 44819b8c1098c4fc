"""The project's own speculative decoding on Study 6's pairs, as runs: the engine's speculative mode
(``engine.speculative_engine.SpeculativeEngine``), giving ``GenerationRun``s as the HF methods do, so the sweep and
its analysis take both.

Per target, its weights converted once (``models.native.native_from_hf``) serve a plain engine, the target-alone
baseline (``own_plain``), and per pair the speculative mode with the draft converted the same way. Each engine has
its own KV pool and graphs, sized for one sequence of the study's longest prompt and output, and a step budget that
prefills the whole prompt in one step.

A run's marks: (tokens so far, ms since the request was added) after each engine step, on the HF runs' clock
(``clock.TokenClock``: CUDA events on a GPU); the first is the first token (the target's prefill). The engine has
no separate draft prefill: the draft catches up on the prompt inside the first speculative step, as serving pays
it. Each speculative step reads its tokens once before it returns, so an event recorded after a step follows its
work. Extras as ``own.py``'s: draft tokens ``accepted`` and ``proposed``, and ``rounds`` (verify steps), from the
engine's ``spec_stats``; ``rollback_ms`` the host time of giving rejected drafts' blocks back inside the steps
(``SpeculativeEngine.rollback_s``; the separate driver this replaced timed its truncations the same way, on the
host).
"""

from __future__ import annotations

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.engine.speculative_engine import SpeculativeEngine
from servelab.models.native import native_from_hf
from servelab.speculative.config import SpeculativeConfig
from servelab.studies.s06_hf_assisted.clock import TokenClock
from servelab.studies.s06_hf_assisted.runs import GenerationRun, hf_eos_ids

BLOCK = 16


class OwnEngineSpeculative:
    """``runner(draft_or_None, target, prompt, n) -> GenerationRun`` over the engine's speculative mode for ``pairs``
    (``runs.Pair``); with no draft, the target alone on its plain engine."""

    def __init__(self, models: dict, pairs, max_model_len: int, gamma: int = 4):
        self.models = models
        self.pairs = list(pairs)
        self.max_model_len = max_model_len
        self.gamma = gamma
        self._native: dict[str, object] = {}
        self._plain: dict[str, Engine] = {}
        self._spec: dict[tuple[str, str], SpeculativeEngine] = {}

    @classmethod
    def sized(
        cls, models: dict, pairs, prompt_tokens: int, max_new_tokens: int, gamma: int = 4
    ) -> OwnEngineSpeculative:
        """Engines that hold a prompt, its output and one step's lookahead (γ + 1), in whole KV blocks."""
        need = prompt_tokens + max_new_tokens + gamma + 2
        return cls(models, pairs, max_model_len=-(-need // BLOCK) * BLOCK, gamma=gamma)

    @property
    def config(self) -> EngineConfig:
        """One sequence: its blocks and a spare, the whole prompt in one step, no prefix cache (a prompt run again
        would skip its prefill)."""
        return EngineConfig(
            block_size=BLOCK,
            num_blocks=self.max_model_len // BLOCK + 2,
            max_num_seqs=1,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_model_len,
            prefix_caching=False,
        )

    def _model(self, name: str):
        if name not in self._native:
            self._native[name] = native_from_hf(self.models[name], max_positions=self.max_model_len)
        return self._native[name]

    def plain(self, target: str) -> Engine:
        if not any(p.target == target for p in self.pairs):
            raise ValueError(f"no planned pair has target {target!r}")
        if target not in self._plain:
            self._plain[target] = Engine(
                self._model(target), self.config, eos_token_ids=hf_eos_ids(self.models[target])
            )
        return self._plain[target]

    def speculative(self, draft: str, target: str) -> SpeculativeEngine:
        key = (draft, target)
        if key not in self._spec:
            cfg = SpeculativeConfig("draft_model", self.gamma, model=draft)
            self._spec[key] = SpeculativeEngine(
                self._model(target),
                self.config,
                speculative=cfg,
                draft=self._model(draft),
                eos_token_ids=hf_eos_ids(self.models[target]),
            )
        return self._spec[key]

    def __call__(self, draft: str | None, target: str, prompt: list[int], n: int) -> GenerationRun:
        # exactly n tokens with EOS held back until then, as HF's min_new_tokens = max_new_tokens runs (runs.py): an
        # engine that ignored EOS emitted it and went on, and left HF's tokens at the first natural end
        params = SamplingParams(max_tokens=n, min_tokens=n)
        if draft is None:
            engine = self.plain(target)
            clock = TokenClock(cuda=engine.device.type == "cuda")
            clock.start()
            (tokens,) = engine.generate([list(prompt)], params)
            clock.mark(len(tokens))
            counts, ms = clock.marks()
            return GenerationRun(list(tokens), counts, ms, dense=False)
        spec = self.speculative(draft, target)
        stats = spec.spec_stats
        before = (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)
        rollback_s = spec.rollback_s
        clock = TokenClock(cuda=spec.device.type == "cuda")
        clock.start()
        seq = spec.add_request(list(prompt), params)
        made = 0
        while spec.has_unfinished():
            spec.step()  # reads its tokens before it returns: the event below follows the step's work
            clock.mark(len(seq.output_token_ids) - made)
            made = len(seq.output_token_ids)
        counts, ms = clock.marks()
        now = (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)
        rounds, proposed, accepted = (a - b for a, b in zip(now, before, strict=True))
        rollback_ms = (spec.rollback_s - rollback_s) * 1e3
        extra = dict(accepted=accepted, proposed=proposed, rounds=rounds, rollback_ms=rollback_ms)
        return GenerationRun(list(seq.output_token_ids), counts, ms, extra)

    def close(self) -> None:
        self._spec.clear()
        self._plain.clear()
        self._native.clear()
