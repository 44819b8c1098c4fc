"""Simulated servers with known step costs, for the tests of the fits that read their step logs: a Poisson trace,
the simulator's run of it with a step log, and that log's features."""

import numpy as np
import pandas as pd

from servelab.sim import simulate
from servelab.sim.calibration import step_features


def poisson_trace(rng: np.random.Generator, rate: float, prompt_tokens, output_tokens, n: int = 150) -> pd.DataFrame:
    """``n`` requests arriving at ``rate`` a second; prompt and output lengths uniform over the half-open ranges
    ``prompt_tokens`` and ``output_tokens`` (lo, hi). Drawn from ``rng`` in that order: arrivals, prompts, outputs."""
    return pd.DataFrame(
        {
            "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
            "prompt_tokens": rng.integers(*prompt_tokens, n),
            "output_tokens": rng.integers(*output_tokens, n),
        }
    )


def logged_run(trace: pd.DataFrame, cost, max_num_batched_tokens: int, **kw):
    """The simulator's run of ``trace`` with its step log: 32 sequences at most, every step simulated (no fast
    forward); ``kw``: further ``simulate`` arguments (``scheduler``, ``step_buckets``)."""
    return simulate(
        trace,
        cost=cost,
        max_num_seqs=32,
        max_num_batched_tokens=max_num_batched_tokens,
        step_log=True,
        fast_forward=False,
        **kw,
    )


def run_features(run, **kw) -> pd.DataFrame:
    """``step_features`` of a run's step log and records; ``kw``: its options (``step_buckets``)."""
    return step_features(run.steps, run.records.drop(columns="replica"), **kw)
