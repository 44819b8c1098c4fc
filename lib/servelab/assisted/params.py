"""Study 6's parameters: profile defaults, papermill overrides, validation, and the pairs they imply."""

from __future__ import annotations

from servelab.assisted.runs import Pair
from servelab.profiles import ParameterError, check_choice, check_int_range, check_positive_ints, resolve_profile

# full: sized for ≈180 s of H200 wall time after the family is trained; one generate per method on the first prompt
# gives every output length (see clock.py), later prompts run fewer tokens, so the budget holds several prompts for
# the spread. HF's eager generate on the H200 machine measured ~46 ms per token of the 124M target (its host
# launches kernels slowly), so 512-token runs of every method do not fit: the lengths stop at 128 by default;
# pass max_new_tokens=512 and lengths=[32, …, 512] (and a larger budget_s) for the full range.
DEFAULTS = {
    "full": dict(target=None, drafts=None, dtype="bfloat16", n_prompts=3, prompt_tokens=128, max_new_tokens=128,
                 followup_new_tokens=64, lengths=[32, 64, 128], cost_tokens=64, prompt_lookup_num_tokens=10,
                 budget_s=160, own=True, own_gamma=4, seed=0),
    "smoke": dict(target=None, drafts=None, dtype="float32", n_prompts=3, prompt_tokens=32, max_new_tokens=16,
                  followup_new_tokens=8, lengths=[4, 8, 16], cost_tokens=8, prompt_lookup_num_tokens=3, budget_s=40,
                  own=True, own_gamma=3, seed=0),
}


def study_params(profile: str = "auto", **overrides) -> dict:
    """Resolve the profile, apply non-None overrides, validate everything (ParameterError says what is wrong)."""
    prof = resolve_profile(profile)
    p = dict(DEFAULTS[prof])
    unknown = set(overrides) - set(p)
    if unknown:
        raise ParameterError(f"unknown parameters {sorted(unknown)}; known: {sorted(p)}")
    p.update({k: v for k, v in overrides.items() if v is not None})
    p["profile"] = prof
    if (p["target"] is None) != (p["drafts"] is None):
        raise ParameterError("give both target and drafts (model specs / hub ids), or neither (the trained family)")
    if p["target"] is not None:
        if not isinstance(p["target"], str) or not p["target"].strip():
            raise ParameterError(f"target must be a model spec string, got {p['target']!r}")
        if isinstance(p["drafts"], str):
            p["drafts"] = [p["drafts"]]
        if not isinstance(p["drafts"], list) or not p["drafts"] or not all(isinstance(d, str) and d for d in p["drafts"]):
            raise ParameterError(f"drafts must be a non-empty list of model specs, got {p['drafts']!r}")
        if p["target"] in p["drafts"]:
            raise ParameterError("the target cannot also be one of its drafts")
    check_choice("dtype", p["dtype"], ("bfloat16", "float16", "float32"))
    for k in ("n_prompts", "prompt_tokens", "max_new_tokens", "followup_new_tokens", "cost_tokens",
              "prompt_lookup_num_tokens", "own_gamma"):
        check_int_range(k, p[k], 1, 1 << 16)
    check_int_range("seed", p["seed"], 0, 2**31 - 1)
    p["lengths"] = check_positive_ints("lengths", p["lengths"], maximum=p["max_new_tokens"])
    if p["max_new_tokens"] not in p["lengths"]:
        p["lengths"].append(p["max_new_tokens"])
    if p["followup_new_tokens"] > p["max_new_tokens"]:
        raise ParameterError(f"followup_new_tokens ({p['followup_new_tokens']}) must not exceed max_new_tokens "
                             f"({p['max_new_tokens']})")
    if p["cost_tokens"] > p["max_new_tokens"]:
        raise ParameterError(f"cost_tokens ({p['cost_tokens']}) must not exceed max_new_tokens ({p['max_new_tokens']})")
    if isinstance(p["budget_s"], bool) or not isinstance(p["budget_s"], (int, float)) or p["budget_s"] <= 0:
        raise ParameterError(f"budget_s must be a positive number of seconds, got {p['budget_s']!r}")
    if not isinstance(p["own"], bool):
        raise ParameterError(f"own must be True or False, got {p['own']!r}")
    return p


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
