"""Study 3's generation sweep: every draft × γ × temperature point generating the same held-out prompts, through the
engine.

Every point generates the same held-out prompts, speculatively (the engine's speculative mode,
``engine.speculative_engine``) and plainly (the plain engine on the same target model: the baseline), timing each
generation ``repeats`` times after a warm-up (CUDA events around the whole generation, which reads the device every
step anyway). A point that fails (OOM, an error) or that the time budget leaves out is a row with its status, not a
dead notebook.

Engines (``SweepEngines``), built once per target or pair and kept for every prompt: the plain engine, the plain
engine with ``chain_steps`` decode steps a scheduling round (multi-step decoding), and per pair the speculative mode
as wide as the largest γ, set per point (``SpeculativeEngine.set_gamma``, adaptive γ included). Each holds one
sequence, with its own KV pool and graphs, and no prefix cache (a prompt run again would skip its prefill).

A speculative row's phases, for the last timed generation: ``draft_ms`` the draft's rounds (CUDA events around
``DraftModel.propose``), every one of them: the draft follows the prompt inside the target's prefill step
(``DraftModel.follow``), so a first round catches up one token, as any round does; ``verify_ms`` the verify steps;
``rollback_ms`` the host time of giving rejected drafts' blocks back (``SpeculativeEngine.rollback_s``);
``draft_steps`` the draft steps of the same timed rounds (each round runs as many as its largest k), so that
``draft_ms / draft_steps`` is one draft step's time; ``rounds`` verify steps; ``catch_up_rounds`` verify steps that
kept every draft, after which the draft catches up two tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import pandas as pd
import torch

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.engine.speculative_engine import SpeculativeEngine
from servelab.measure import time_fn
from servelab.measure.call_timer import CallTimer
from servelab.speculative.config import SpeculativeConfig

BLOCK = 16
# a plain generation's speculative columns: no step drafted
_PLAIN_ZEROS = (
    "rounds",
    "accepted",
    "proposed",
    "rejections",
    "draft_steps",
    "draft_ms",
    "verify_ms",
    "rollback_ms",
    "catch_up_rounds",
)


def sweep_config(max_model_len: int) -> EngineConfig:
    """One sequence of up to ``max_model_len`` tokens (whole blocks), its prompt prefilled in one step."""
    length = -(-max_model_len // BLOCK) * BLOCK
    return EngineConfig(
        block_size=BLOCK,
        num_blocks=length // BLOCK + 2,
        max_num_seqs=1,
        max_model_len=length,
        max_num_batched_tokens=length,
        prefix_caching=False,
    )


@dataclass
class SweepEngines:
    """The engines of a sweep over ``models`` (name → the project's model code), built on first use."""

    models: dict
    config: EngineConfig
    max_gamma: int
    chain_steps: int | None = None
    _built: dict = field(default_factory=dict, repr=False)

    def plain(self, target: str) -> Engine:
        return self._get(("plain", target), lambda: Engine(self.models[target], self.config))

    def chained(self, target: str) -> Engine:
        cfg = replace(self.config, decode_steps=self.chain_steps)
        return self._get(("chained", target), lambda: Engine(self.models[target], cfg))

    def speculative(self, draft: str, target: str) -> SpeculativeEngine:
        def build():
            cfg = SpeculativeConfig("draft_model", self.max_gamma, model=draft)
            return SpeculativeEngine(self.models[target], self.config, speculative=cfg, draft=self.models[draft])

        return self._get(("speculative", draft, target), build)

    def _get(self, key, build):
        if key not in self._built:
            self._built[key] = build()
        return self._built[key]

    def close(self) -> None:
        self._built.clear()


def _timed(fn, device, warmup: int, repeats: int):
    """``(Timing, last result)`` of ``fn()``."""
    box = {}

    def run():
        box["r"] = fn()

    t = time_fn(run, warmup=warmup, repeats=repeats, device=device)
    return t, box["r"]


def _status(e: BaseException) -> str:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
        return "oom"
    msg = str(e).splitlines()[0][:160] if str(e) else ""
    return f"error: {type(e).__name__}: {msg}"


def round_steps(seqs, ks) -> int:
    """A draft round (``DraftModel.propose(seqs, ks)``) runs as many draft steps as its largest k."""
    return max(ks)


def _speculative_fields(spec: SpeculativeEngine, run) -> tuple:
    """``run()`` timed by ``time_fn`` through a wrapper that records, for each generation, the speculative mode's
    counters and phases; returns (the wrapper, a function giving the last generation's fields)."""
    last = {}

    def counted():
        s = spec.spec_stats
        before = (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.num_rejections, spec.rollback_s)
        drafts = CallTimer(spec.draft, "propose", spec.device, note=round_steps)
        verifies = CallTimer(spec, "_verify_step", spec.device)
        try:
            out = run()
        finally:
            drafts.remove()
            verifies.remove()
        last.update(before=before, drafts=drafts, verifies=verifies)
        return out

    def fields() -> dict:
        s, b = spec.spec_stats, last["before"]
        draft_ms, verify_ms = last["drafts"].ms(), last["verifies"].ms()
        seq_rounds, rejections = s.num_drafts - b[0], s.num_rejections - b[3]
        return dict(
            rounds=len(verify_ms),
            accepted=s.num_accepted_tokens - b[2],
            proposed=s.num_draft_tokens - b[1],
            rejections=rejections,
            draft_steps=sum(last["drafts"].notes),
            draft_ms=sum(draft_ms),
            verify_ms=sum(verify_ms),
            rollback_ms=1e3 * (spec.rollback_s - b[4]),
            catch_up_rounds=seq_rounds - rejections,
        )

    return counted, fields


def generation_sweep(
    models: dict,
    pairs: list[tuple[str, str]],
    prompts: list[list[int]],
    gammas: list,
    temperatures: list[float],
    max_new_tokens: int,
    *,
    max_model_len: int,
    warmup: int = 1,
    repeats: int = 2,
    seed: int = 0,
    time_budget_s: float | None = None,
    chain_steps: int | None = 8,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per (method, target, draft, γ, temperature, prompt): ms per generation (median, p25, p75), tokens,
    the speculative steps' acceptance counts and phase times. ``models``: name → the project's model code
    (``pair.native_models``). ``method`` is "autoregressive" (each target alone on the plain engine, a host round
    trip per token), "autoregressive_chained" (``chain_steps`` decode steps per round trip, the engine's multi-step
    decoding: the stronger baseline; None leaves it out) or "speculative" (each (draft, target) pair of ``pairs``,
    names of ``models``).

    ``warmup`` untimed generations run once per point (on its first prompt): a point's state (its engine, the graphs
    it replays) is the same for every prompt."""
    from tqdm.auto import tqdm

    from servelab.speculative.gamma import gamma_policy

    engines = SweepEngines(
        models, sweep_config(max_model_len), max(gamma_policy(g).max_gamma for g in gammas), chain_steps
    )
    targets = list(dict.fromkeys(t for _, t in pairs))
    points = [(T, None, t, None) for T in temperatures for t in targets]
    if chain_steps:
        points += [(T, None, t, "chained") for T in temperatures for t in targets]
    points += [(T, d, t, g) for T in temperatures for d, t in pairs for g in gammas]
    rows, t_start = [], time.perf_counter()
    bar = tqdm(total=len(points) * len(prompts), desc="speculative sweep", disable=not progress)
    # prompt-major: if the time budget runs out, every point keeps the prompts done so far
    for i, prompt in enumerate(prompts):
        for T, dname, tname, gamma in points:
            bar.update(1)
            method = "speculative" if dname else "autoregressive_chained" if gamma == "chained" else "autoregressive"
            base = dict(
                method=method,
                target=tname,
                draft=dname or "",
                gamma=str(gamma) if dname else "",
                temperature=float(T),
                prompt=i,
            )
            if time_budget_s is not None and time.perf_counter() - t_start > time_budget_s:
                rows.append(base | dict(status="skipped: time budget"))
                continue
            sp = SamplingParams(max_tokens=max_new_tokens, temperature=float(T), seed=seed + i, ignore_eos=True)
            wu = warmup if i == 0 else 0
            fields = None
            try:
                if method == "autoregressive":
                    engine = engines.plain(tname)
                elif method == "autoregressive_chained":
                    engine = engines.chained(tname)
                else:
                    engine = engines.speculative(dname, tname)
                    engine.set_gamma(gamma)

                def run(engine=engine, prompt=prompt, sp=sp):
                    return engine.generate([list(prompt)], sp)[0]

                if method == "speculative":
                    run, fields = _speculative_fields(engine, run)
                t, tokens = _timed(run, engine.device, wu, repeats)
            except Exception as e:  # noqa: BLE001
                rows.append(base | dict(status=_status(e)))
                continue
            counts = fields() if fields is not None else dict.fromkeys(_PLAIN_ZEROS, 0)
            rows.append(
                base
                | dict(
                    status="ok",
                    tokens=len(tokens),
                    ms=t.median_ms,
                    ms_p25=t.p25_ms,
                    ms_p75=t.p75_ms,
                    ms_per_token=t.median_ms / len(tokens),
                    **counts,
                    output=" ".join(map(str, tokens)),
                )
            )
    bar.close()
    engines.close()
    return pd.DataFrame(rows)
