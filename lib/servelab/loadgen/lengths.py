"""Prompt and output length distributions (tokens) for synthetic traces.

- ``FixedLengths``: every request the same;
- ``UniformLengths``: independent integers, uniform on closed ranges;
- ``ShareGPTLike``: independent lognormals, clipped, shaped like chat traffic.

Every distribution has ``sample(n, rng) -> (prompt_tokens, output_tokens)`` (two int arrays, each ≥ 1),
``means() -> (mean prompt, mean output)`` and a ``source`` string that names it and its parameters (for figure
captions and result sidecars).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.errors import ParameterError

# Z of the 90th percentile of a standard normal: sigma = ln(p90 / median) / Z90 for a lognormal
Z90 = 1.2815515655446004


def _check_int(name: str, v, lo: int = 1) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ParameterError(f"{name} must be an integer >= {lo}, got {v!r}")


def _check_n(n) -> None:
    _check_int("n", n, 0)


@dataclass(frozen=True)
class FixedLengths:
    """Every request has ``prompt`` prompt tokens and ``output`` output tokens."""

    prompt: int
    output: int

    def __post_init__(self):
        _check_int("prompt", self.prompt)
        _check_int("output", self.output)

    @property
    def source(self) -> str:
        return f"fixed: {self.prompt} prompt + {self.output} output tokens"

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        _check_n(n)
        return np.full(n, self.prompt, dtype=int), np.full(n, self.output, dtype=int)

    def means(self) -> tuple[float, float]:
        """Mean prompt and output tokens."""
        return float(self.prompt), float(self.output)


@dataclass(frozen=True)
class UniformLengths:
    """Prompt tokens uniform on ``[prompt_min, prompt_max]``, output tokens uniform on
    ``[output_min, output_max]`` (integers, both ends included), independent."""

    prompt_min: int
    prompt_max: int
    output_min: int
    output_max: int

    def __post_init__(self):
        for k in ("prompt_min", "prompt_max", "output_min", "output_max"):
            _check_int(k, getattr(self, k))
        if self.prompt_min > self.prompt_max or self.output_min > self.output_max:
            raise ParameterError(
                f"uniform lengths need min <= max, got prompt [{self.prompt_min}, "
                f"{self.prompt_max}], output [{self.output_min}, {self.output_max}]"
            )

    @property
    def source(self) -> str:
        return (
            f"uniform: prompt U[{self.prompt_min}, {self.prompt_max}], "
            f"output U[{self.output_min}, {self.output_max}] tokens"
        )

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        _check_n(n)
        return (
            rng.integers(self.prompt_min, self.prompt_max + 1, n),
            rng.integers(self.output_min, self.output_max + 1, n),
        )

    def means(self) -> tuple[float, float]:
        """Mean prompt and output tokens."""
        return (self.prompt_min + self.prompt_max) / 2, (self.output_min + self.output_max) / 2


@dataclass(frozen=True)
class ShareGPTLike:
    """Chat-like lengths: independent lognormals for prompt and output, each given by its median and 90th
    percentile (tokens), clipped to ``[1, prompt_max]`` and ``[1, output_max]``; ``prompt_scale`` and
    ``output_scale`` multiply the prompt's and the output's median and percentile (to shorten outputs so a
    run fits a time budget, or to shrink everything for a smoke run).

    Default parameters: the medians and 90th percentiles that the Sarathi-Serve paper (Agrawal et al.,
    "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", OSDI 2024, its table of
    datasets) reports for its ``openchat_sharegpt4`` trace: prompts median 1,730 / p90 5,696 tokens, outputs
    median 415 / p90 834 tokens. They are taken from the paper as published (as this project read it), not
    re-fitted here, and not checked against the dataset; a lognormal through two quantiles is this
    project's assumption about the shape between and beyond them.
    """

    prompt_median: float = 1730.0
    prompt_p90: float = 5696.0
    output_median: float = 415.0
    output_p90: float = 834.0
    prompt_max: int = 8000
    output_max: int = 2048
    prompt_scale: float = 1.0
    output_scale: float = 1.0
    origin: str = "Sarathi-Serve's openchat_sharegpt4 statistics (median, p90), not re-fitted here"

    def __post_init__(self):
        for k in ("prompt_median", "prompt_p90", "output_median", "output_p90", "prompt_scale", "output_scale"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ParameterError(f"{k} must be a positive number, got {v!r}")
        if self.prompt_p90 <= self.prompt_median or self.output_p90 <= self.output_median:
            raise ParameterError("the 90th percentile must exceed the median (a lognormal needs spread)")
        _check_int("prompt_max", self.prompt_max)
        _check_int("output_max", self.output_max)

    @property
    def prompt_sigma(self) -> float:
        return float(np.log(self.prompt_p90 / self.prompt_median) / Z90)

    @property
    def output_sigma(self) -> float:
        return float(np.log(self.output_p90 / self.output_median) / Z90)

    @property
    def source(self) -> str:
        ps = f" × {self.prompt_scale:g}" if self.prompt_scale != 1 else ""
        os_ = f" × {self.output_scale:g}" if self.output_scale != 1 else ""
        return (
            f"ShareGPT-like lognormal ({self.origin}): prompt median {self.prompt_median:g} / p90 "
            f"{self.prompt_p90:g}{ps} (≤ {self.prompt_max:,}), output median {self.output_median:g} / p90 "
            f"{self.output_p90:g}{os_} (≤ {self.output_max:,}) tokens"
        )

    def means(self, n: int = 200_000, seed: int = 12345) -> tuple[float, float]:
        """Mean prompt and output tokens after clipping (Monte Carlo, deterministic)."""
        p, o = self.sample(n, np.random.default_rng(seed))
        return float(p.mean()), float(o.mean())

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        _check_n(n)
        p = rng.lognormal(np.log(self.prompt_median * self.prompt_scale), self.prompt_sigma, n)
        o = rng.lognormal(np.log(self.output_median * self.output_scale), self.output_sigma, n)
        return (
            np.clip(np.rint(p), 1, self.prompt_max).astype(int),
            np.clip(np.rint(o), 1, self.output_max).astype(int),
        )


LENGTHS = {"fixed": FixedLengths, "uniform": UniformLengths, "sharegpt": ShareGPTLike}


def length_distribution(kind: str, **params):
    """Build a length distribution by name (``fixed``, ``uniform``, ``sharegpt``) with its parameters."""
    if kind not in LENGTHS:
        raise ParameterError(f"unknown length distribution {kind!r}; known: {', '.join(LENGTHS)}")
    try:
        return LENGTHS[kind](**params)
    except TypeError as e:
        raise ParameterError(f"bad parameters for {kind!r} lengths: {e}") from None


def add_length_arguments(group) -> None:
    """The length-distribution flags of ``python -m servelab.loadgen`` and ``python -m servelab.sim`` (one
    spelling for both), added to an argparse parser or group; ``lengths_from_args`` reads them."""
    group.add_argument("--lengths", choices=sorted(LENGTHS), default="sharegpt", help="length distribution")
    group.add_argument("--prompt-tokens", type=int, default=512, help="fixed: prompt tokens")
    group.add_argument("--output-tokens", type=int, default=128, help="fixed: output tokens")
    group.add_argument("--prompt-range", type=int, nargs=2, default=[128, 1024], metavar=("MIN", "MAX"))
    group.add_argument("--output-range", type=int, nargs=2, default=[32, 256], metavar=("MIN", "MAX"))
    group.add_argument("--prompt-scale", type=float, default=1.0, help="sharegpt: multiply its prompt lengths")
    group.add_argument("--output-scale", type=float, default=1.0, help="sharegpt: multiply its output lengths")
    group.add_argument("--max-prompt-tokens", type=int, default=8000, help="sharegpt: clip prompts")
    group.add_argument("--max-output-tokens", type=int, default=2048, help="sharegpt: clip outputs")


def lengths_from_args(a):
    """The length distribution the flags of ``add_length_arguments`` describe."""
    if a.lengths == "fixed":
        return length_distribution("fixed", prompt=a.prompt_tokens, output=a.output_tokens)
    if a.lengths == "uniform":
        (pmin, pmax), (omin, omax) = a.prompt_range, a.output_range
        return length_distribution("uniform", prompt_min=pmin, prompt_max=pmax, output_min=omin, output_max=omax)
    return length_distribution(
        "sharegpt",
        prompt_scale=a.prompt_scale,
        output_scale=a.output_scale,
        prompt_max=a.max_prompt_tokens,
        output_max=a.max_output_tokens,
    )
