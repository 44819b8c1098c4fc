"""Study 6's parameters: profile defaults, papermill overrides, validation, and the pairs they imply."""

from __future__ import annotations

from servelab.studies.common.params import (
    ParameterError,
    check_choice,
    check_int_range,
    check_positive_ints,
    resolve,
)
from servelab.studies.s06_hf_assisted.attention_backend import HF_SDPA_CHOICES
from servelab.studies.s06_hf_assisted.runs import Pair

# full: 9 held-out prompts, timed in three parts of 3 (measure.PROMPT_PARTS), each part's timed work (sweep; in p0
# also α and the seed's shapes' costs) in wall_budget_s of H200 wall time. The drafts' distillation has a budget of
# its own (studies.common.drafts.distill: ~1 min of generations and 60 s per draft when not cached), spent inside
# the part before its clock starts. Every prompt runs every method to max_new_tokens (short_new_tokens =
# max_new_tokens), so each output length has all 9 prompts unless the budget cut a run (the page lists what did not
# run); a verdict needs 8 (verdicts.MIN_PROMPTS). HF generate runs without cuDNN attention (hf_sdpa, see
# attention_backend.py). The budget: on the H200 (2026-12-04, p0 r0) a prompt's every method to 512 tokens took 54-63
# s of generation, and 200 s let p0 time 2 of its 3 prompts (its α and seed costs took ~57 s), so that three parts
# would have given 6 prompts, under the 8 a verdict needs. 280 s held three prompts in a part, with one prompt of margin
# over the 8: in the campaign's third repeat a slower process lost two prompts to it (p1 and p2 stopped at 280.7 and
# 281.0 s), and F6.2 read inconclusive (data/dev/analysis/f62_thin_repeat.md). 350 s is 1.5x the 2026-12-04 figure,
# so a process at the slow end of that drift still times all three; JOB_LIMIT_S keeps the whole part under 9 minutes
# where the drafts' distillation runs first (p0's 241 s in the campaign's first repeat).
DEFAULTS = {
    "full": dict(
        target=None,
        drafts=None,
        self_layers=[2, 6],  # self-drafts (the target's first k layers), for α beside the distilled drafts
        dtype="bfloat16",
        n_prompts=9,
        prompt_tokens=128,
        alpha_prompts=48,
        alpha_tokens=128,
        max_new_tokens=512,
        short_new_tokens=512,
        lengths=[32, 64, 128, 256, 512],
        cost_tokens=64,
        seed_cost_pairs=["distilgpt2>gpt2-medium", "gpt2>gpt2-medium", "qwen2-0.5b>qwen2-1.5b"],
        prompt_lookup_num_tokens=10,
        wall_budget_s=350,
        budget_s=None,
        own=True,
        own_gamma=4,
        hf_sdpa="no_cudnn",
        seed=0,
    ),
    "smoke": dict(
        target=None,
        drafts=None,
        self_layers=[1],
        dtype="float32",
        n_prompts=2,
        prompt_tokens=32,
        alpha_prompts=3,
        alpha_tokens=8,
        max_new_tokens=8,
        short_new_tokens=8,
        lengths=[4, 8],
        cost_tokens=4,
        seed_cost_pairs=["tiny-gpt2>tiny-qwen2"],
        prompt_lookup_num_tokens=3,
        wall_budget_s=150,
        budget_s=None,
        own=True,
        own_gamma=3,
        hf_sdpa="no_cudnn",
        seed=0,
    ),
}
# a part's process from its measure() call to its end, under a 9-minute GPU run with ~30 s for the start and the pack
JOB_LIMIT_S = 510.0
REPORT_RESERVE_S = 10.0  # s kept after the sweep for α, the tables, the figures and the findings
INT_PARAMS = (
    "n_prompts",
    "prompt_tokens",
    "alpha_prompts",
    "alpha_tokens",
    "max_new_tokens",
    "short_new_tokens",
    "cost_tokens",
    "prompt_lookup_num_tokens",
    "own_gamma",
)


def study_params(profile: str = "auto", **overrides) -> dict:
    """Resolve the profile, apply non-None overrides, validate everything (ParameterError says what is wrong)."""
    p = resolve(DEFAULTS, profile, overrides)
    _check_models(p)
    check_choice("dtype", p["dtype"], ("bfloat16", "float16", "float32"))
    check_choice("hf_sdpa", p["hf_sdpa"], HF_SDPA_CHOICES)
    for k in INT_PARAMS:
        check_int_range(k, p[k], 1, 1 << 16)
    check_int_range("seed", p["seed"], 0, 2**31 - 1)
    p["self_layers"] = check_positive_ints("self_layers", p["self_layers"]) if p["self_layers"] else []
    _check_lengths(p)
    p["seed_cost_pairs"] = [_cost_pair(s) for s in p["seed_cost_pairs"] or []]
    _check_seconds(p)
    if not isinstance(p["own"], bool):
        raise ParameterError(f"own must be True or False, got {p['own']!r}")
    return p


def _check_models(p: dict) -> None:
    if p["drafts"] is not None and p["target"] is None:
        raise ParameterError("drafts need a target: give target too (None: SmolLM2 with its distilled drafts)")
    if p["target"] is None:
        return
    if not isinstance(p["target"], str) or not p["target"].strip():
        raise ParameterError(f"target must be a model spec string, got {p['target']!r}")
    if isinstance(p["drafts"], str):
        p["drafts"] = [p["drafts"]]
    drafts = p["drafts"]
    if not isinstance(drafts, list) or not drafts or not all(isinstance(d, str) and d for d in drafts):
        raise ParameterError(f"drafts must be a non-empty list of model specs, got {drafts!r}")
    if p["target"] in drafts:
        raise ParameterError("the target cannot also be one of its drafts")


def _check_lengths(p: dict) -> None:
    p["lengths"] = check_positive_ints("lengths", p["lengths"], maximum=p["max_new_tokens"])
    if p["max_new_tokens"] not in p["lengths"]:
        p["lengths"].append(p["max_new_tokens"])
    if p["short_new_tokens"] > p["max_new_tokens"]:
        raise ParameterError(
            f"short_new_tokens ({p['short_new_tokens']}) must not exceed max_new_tokens ({p['max_new_tokens']})"
        )
    if p["cost_tokens"] > p["short_new_tokens"]:
        raise ParameterError(
            f"cost_tokens ({p['cost_tokens']}) must not exceed short_new_tokens "
            f"({p['short_new_tokens']}): the drafts' cost runs belong to the short passes"
        )


def _check_seconds(p: dict) -> None:
    for k, optional in (("wall_budget_s", False), ("budget_s", True)):
        v = p[k]
        if optional and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ParameterError(f"{k} must be a positive number of seconds{' or None' if optional else ''}, got {v!r}")


def _cost_pair(spec) -> tuple[str, str]:
    """ "draft>target" (shipped config names) -> ("config:draft", "config:target")."""
    from servelab.models.loader import shipped_configs

    parts = spec.split(">") if isinstance(spec, str) else []
    if len(parts) != 2 or not all(parts):
        raise ParameterError(f"seed_cost_pairs entries are 'draft>target' config names, got {spec!r}")
    known = shipped_configs()
    for name in parts:
        if name.strip() not in known:
            raise ParameterError(f"no shipped config {name!r}; known: {known}")
    return tuple(f"config:{n.strip()}" for n in parts)


def pairs_for(target: str, drafts: list[str]) -> list[Pair]:
    """Every draft → the target, then the smallest draft → the largest (a draft as a middle-sized target).

    ``drafts`` must be ordered smallest first.
    """
    if not drafts:
        raise ParameterError("need at least one draft")
    pairs = [Pair(d, target) for d in drafts]
    if len(drafts) >= 2:
        pairs.append(Pair(drafts[0], drafts[-1]))
    return pairs


def model_name(spec: str) -> str:
    """A short name for a loader spec: the last path or hub component."""
    return spec.rstrip("/").split("/")[-1].removeprefix("config:")
