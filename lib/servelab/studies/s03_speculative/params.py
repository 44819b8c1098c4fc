"""Study 3's parameters: profile defaults, overrides from papermill, and validation."""

from __future__ import annotations

from servelab.models.loader import CONFIG_PREFIX, shipped_configs
from servelab.speculative.gamma import gamma_policy
from servelab.studies.common.params import (
    ParameterError,
    check_choice,
    check_int_range,
    check_positive_ints,
    resolve,
)
from servelab.studies.common.quiet import quiet_run

with quiet_run():  # the notebook's first transformers import (through bench.hf_modes) happens here
    from servelab.bench.hf_modes import MODES

DTYPES = ("float32", "bfloat16", "float16")

DEFAULTS = {
    # H200, part "real": SmolLM2's drafts distilled in ≈ 3 min, then the sweep, which stops itself at time_budget_s
    # (prompt-major: every point keeps the prompts done so far)
    "full": dict(
        target=None,
        drafts=None,
        draft_layers=None,  # the distillation recipe's own (2 and 6 layers)
        dtype="bfloat16",
        gammas=[2, 4, "adaptive"],
        temperatures=[0.0, 1.0],
        num_prompts=32,
        prompt_len=128,
        max_new_tokens=64,
        warmup=1,
        repeats=1,
        time_budget_s=150,
        shape_pairs=[["config:qwen2-0.5b", "config:qwen2-1.5b"]],
        cost_modes=["hf_eager", "hf_cuda_graph", "engine"],
        # the engine mode's step compiled as the speculative engines of the sweep are (EngineConfig's default), so
        # that F3.2's prediction reads c of the steps whose speed-up it predicts; bench.step's own default is off
        cost_engine_compile="auto",
        cost_context=128,
        cost_repeats=15,
        verify_rows=[1, 2, 3, 4, 5, 6, 7, 8, 9],
        middle_target=False,
        chain_steps=8,
        seed=0,
        # controlled acceptance at the seed's shapes (controlled.py), one pair per part (measure.CONTROLLED_PARTS);
        # the budget stops new points, and new pairs, after controlled_budget_s
        controlled_pairs=[
            ["config:qwen2-0.5b", "config:qwen2-1.5b"],
            ["config:qwen2-0.5b-vocab128k", "config:llama-3-8b"],  # the draft takes Llama 3's vocabulary
            ["config:distilgpt2", "config:gpt2-medium"],
        ],
        alphas=[0.5, 0.6, 0.7, 0.8, 0.9],
        controlled_gammas=[1, 2, 3, 4, 6, 8],
        batches=[1, 8, 32],
        controlled_prompt_len=128,
        controlled_new_tokens=96,
        controlled_repeats=3,
        controlled_budget_s=300,
    ),
    # two CPU cores, about a minute: SmolLM2 with one 1-layer draft distilled for seconds, two prompts of a few
    # tokens, greedy only, tiny shapes, a few controlled points
    "smoke": dict(
        target=None,
        drafts=None,
        draft_layers=[1],
        dtype="float32",
        gammas=[2, "adaptive"],
        temperatures=[0.0],
        num_prompts=2,
        prompt_len=16,
        max_new_tokens=6,
        warmup=0,
        repeats=1,
        time_budget_s=None,
        shape_pairs=[["config:tiny-llama", "config:tiny-qwen2"]],
        cost_modes=["hf_eager", "engine"],
        cost_engine_compile="auto",
        cost_context=16,
        cost_repeats=2,
        verify_rows=[1, 3],
        middle_target=False,
        chain_steps=2,
        seed=0,
        controlled_pairs=[["config:tiny-llama", "config:tiny-qwen2"]],  # one vocabulary (512)
        alphas=[0.5, 0.9],
        controlled_gammas=[1, 3],
        batches=[1, 3],
        controlled_prompt_len=8,
        controlled_new_tokens=12,
        controlled_repeats=2,
        controlled_budget_s=None,
    ),
}


def _check_spec(name: str, spec) -> None:
    if not isinstance(spec, str) or not spec:
        raise ParameterError(f"{name} must be a model spec string, got {spec!r}")
    if spec.startswith(CONFIG_PREFIX) and spec[len(CONFIG_PREFIX) :] not in shipped_configs():
        raise ParameterError(f"{name}: unknown config {spec!r}; shipped: {', '.join(shipped_configs())}")


def _check_pairs(name: str, pairs) -> list[list[str]]:
    if not isinstance(pairs, list):
        raise ParameterError(f"{name} must be a list of [draft spec, target spec], got {pairs!r}")
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ParameterError(f"each {name} entry must be [draft spec, target spec], got {pair!r}")
        for s in pair:
            _check_spec(name, s)
    return [list(x) for x in pairs]


def _check_models(p: dict) -> None:
    """target/drafts None: SmolLM2-135M-Instruct with drafts distilled from it; else model specs."""
    if (p["target"] is None) != (p["drafts"] is None):
        raise ParameterError("give both target and drafts (model specs), or neither (SmolLM2 with distilled drafts)")
    if p["target"] is None:
        return
    _check_spec("target", p["target"])
    if isinstance(p["drafts"], str):
        p["drafts"] = [p["drafts"]]
    if not isinstance(p["drafts"], list) or not p["drafts"]:
        raise ParameterError(f"drafts must be a non-empty list of model specs, got {p['drafts']!r}")
    for d in p["drafts"]:
        _check_spec("drafts", d)


def _check_draft_layers(p: dict) -> None:
    """draft_layers: the decoder layers of each draft distilled from SmolLM2 (None: the recipe's)."""
    if p["draft_layers"] is not None:
        p["draft_layers"] = check_positive_ints("draft_layers", p["draft_layers"], maximum=29)


def _check_generation(p: dict) -> None:
    check_choice("dtype", p["dtype"], DTYPES)
    gammas = p["gammas"]
    if not isinstance(gammas, list) or not gammas:
        raise ParameterError(f"gammas must be a non-empty list of positive ints or 'adaptive', got {gammas!r}")
    for g in gammas:
        gamma_policy(g)  # ParameterError on anything else
    temps = p["temperatures"]
    if not isinstance(temps, list) or not temps:
        raise ParameterError(f"temperatures must be a non-empty list, got {temps!r}")
    for t in temps:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 10:
            raise ParameterError(f"temperatures must be numbers in [0, 10] (0 = greedy), got {t!r}")
    p["temperatures"] = sorted({float(t) for t in temps})
    check_int_range("num_prompts", p["num_prompts"], 1, 1000)
    check_int_range("prompt_len", p["prompt_len"], 1, 8192)
    check_int_range("max_new_tokens", p["max_new_tokens"], 1, 8192)
    check_int_range("warmup", p["warmup"], 0, 100)
    check_int_range("repeats", p["repeats"], 1, 1000)
    _check_seconds("time_budget_s", p["time_budget_s"])
    if not isinstance(p["middle_target"], bool):
        raise ParameterError(f"middle_target must be True or False, got {p['middle_target']!r}")
    check_int_range("chain_steps", p["chain_steps"], 0, 64)  # 0: no multi-step baseline
    check_int_range("seed", p["seed"], 0, 2**31 - 1)


def _check_seconds(name: str, v) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
        raise ParameterError(f"{name} must be a positive number of seconds or None, got {v!r}")


def _check_costs(p: dict) -> None:
    p["shape_pairs"] = _check_pairs("shape_pairs", p["shape_pairs"])
    if isinstance(p["cost_modes"], str):
        p["cost_modes"] = [p["cost_modes"]]
    if not p["cost_modes"]:
        raise ParameterError("cost_modes must not be empty")
    for m in p["cost_modes"]:
        check_choice("cost_modes", m, MODES)
    import torch

    if "hf_cuda_graph" in p["cost_modes"] and not torch.cuda.is_available():
        raise ParameterError("cost mode 'hf_cuda_graph' needs a CUDA device; drop it from cost_modes on the CPU")
    if p["cost_engine_compile"] not in (True, False, "auto"):
        raise ParameterError(f"cost_engine_compile must be True, False or 'auto', got {p['cost_engine_compile']!r}")
    check_int_range("cost_context", p["cost_context"], 1, 1 << 16)
    check_int_range("cost_repeats", p["cost_repeats"], 1, 1000)
    p["verify_rows"] = check_positive_ints("verify_rows", p["verify_rows"], maximum=64)


def _check_controlled(p: dict) -> None:
    """The controlled-acceptance sweep: pairs with one vocabulary, α in [0, 1), γ and batch sizes."""
    p["controlled_pairs"] = _check_pairs("controlled_pairs", p["controlled_pairs"])
    alphas = p["alphas"]
    if not isinstance(alphas, list) or not alphas:
        raise ParameterError(f"alphas must be a non-empty list of numbers in [0, 1), got {alphas!r}")
    for a in alphas:
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a < 1:
            raise ParameterError(f"alphas must hold numbers in [0, 1), got {a!r}")
    p["alphas"] = sorted({float(a) for a in alphas})
    p["controlled_gammas"] = check_positive_ints("controlled_gammas", p["controlled_gammas"], maximum=16)
    p["batches"] = check_positive_ints("batches", p["batches"], maximum=256)
    check_int_range("controlled_prompt_len", p["controlled_prompt_len"], 1, 8192)
    check_int_range("controlled_new_tokens", p["controlled_new_tokens"], 1, 8192)
    check_int_range("controlled_repeats", p["controlled_repeats"], 1, 100)
    _check_seconds("controlled_budget_s", p["controlled_budget_s"])


def study_params(profile: str = "auto", **overrides) -> dict:
    """The profile's defaults with the non-None overrides (``resolve``), validated (``ParameterError`` on bad input)."""
    p = resolve(DEFAULTS, profile, overrides)
    _check_models(p)
    _check_draft_layers(p)
    _check_generation(p)
    _check_costs(p)
    _check_controlled(p)
    return p


def max_gamma(gammas) -> int:
    return max(gamma_policy(g).max_gamma for g in gammas)
