"""The real runs the simulator is checked against, and everything needed to replay them faithfully.

- ``load_study1``: Study 1's ``requests.csv``, ``steps.csv`` and its parameters (``run.json``), from the
  results root (H200 slug preferred);
- ``engine_runs``: when there are none (CI, the smoke profile), stand-in "real" runs: the engine itself,
  in-process on the CPU, driven by Poisson traces on the wall clock (``engine_replay``), in the same format;
- ``server_limits``: the limits the real server ran with, as ``simulate`` keyword arguments;
- ``requested_outputs``: the output lengths a run *asked* for (the records only hold what arrived before the
  run's deadline), regenerated from the run's seed and checked against the records.

Study 2's cost models are fitted from its runs where the page reads them (``sources.gpu_cost_model``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.engine.step_graphs import step_graph_sizes
from servelab.errors import ParameterError
from servelab.loadgen.workload import Trace
from servelab.measure.results import results_root
from servelab.sim.simulator import DEFAULT_NUM_BLOCKS

STUDY1 = "01_scheduling"


def _study_dir(study: str, root: Path | None = None) -> Path | None:
    root = Path(root or results_root())
    found = sorted(p.parent for p in root.glob(f"*/{study}/run.json"))
    if not found:
        return None
    return next((d for d in found if "h200" in d.parent.name), found[0])


def load_study1(root: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame, dict, str] | None:
    """``(requests, steps, params, slug)`` of Study 1's latest run, or None when it has not run here."""
    d = _study_dir(STUDY1, root)
    if d is None or not (d / "requests.csv").exists() or not (d / "steps.csv").exists():
        return None
    requests = pd.read_csv(d / "requests.csv", keep_default_na=False, na_values=[""])
    requests["error"] = requests["error"].fillna("")
    steps = pd.read_csv(d / "steps.csv")
    run = json.loads((d / "run.json").read_text())
    params = run.get("params", {})
    # the server replays captured step graphs on CUDA unless told otherwise (``serve --step-graphs``, default on)
    params.setdefault("step_graphs", run.get("device", {}).get("kind") == "cuda")
    return requests, steps, params, d.parent.name


def engine_runs(
    model: str,
    policies: list[tuple[str, int | None]],
    rates: list[float],
    *,
    requests: int,
    lengths,
    limits: dict,
    seed: int = 0,
    progress: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stand-in real runs: ``engine_replay.replay_on_engine`` on the CPU (wall clock), one engine per policy,
    ``requests`` Poisson arrivals per rate. Frames tagged ``model, scheduler, budget, rate`` like Study 1's."""
    import torch

    from servelab.engine import Engine, EngineConfig
    from servelab.sim.engine_replay import replay_on_engine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, and the clock is not shared with the pool
    reqs, steps = [], []
    base = Engine.from_spec(model, dtype="float32", device="cpu", config=EngineConfig(num_blocks=64, cuda_graphs=False))
    bar = None
    if progress:
        from tqdm import tqdm  # not tqdm.auto: it warns (TqdmWarning) on import where ipywidgets is missing

        bar = tqdm(total=len(policies) * len(rates), desc="engine runs (CPU stand-in)", unit="run")
    try:
        for name, budget in policies:
            for i, rate in enumerate(rates):
                cfg = EngineConfig(
                    scheduler=name,
                    cuda_graphs=False,
                    max_num_seqs=limits["max_num_seqs"],
                    max_num_batched_tokens=budget or limits["max_num_batched_tokens"],
                    num_blocks=limits["num_blocks"],
                    block_size=limits["block_size"],
                )
                engine = Engine(base.model, cfg)
                trace = Trace.synthetic(rate=rate, lengths=lengths, n=requests, seed=seed * 1000 + i)
                replay_on_engine(engine, trace.head(2), clock="wall")  # warm-up: first calls are slow
                rec, st = replay_on_engine(engine, trace, clock="wall", seed=seed)
                tag = {"model": model, "scheduler": name, "budget": budget, "rate": rate}
                reqs.append(rec.assign(**tag))
                steps.append(st.assign(**tag))
                if bar is not None:
                    bar.update(1)
    finally:
        torch.set_num_threads(threads)
        if bar is not None:
            bar.close()
    return pd.concat(reqs, ignore_index=True), pd.concat(steps, ignore_index=True)


STAND_IN_MODEL = "config:tiny-llama"
STAND_IN_POLICIES = [("fcfs", None), ("eager_cont_batch", None), ("chunked_prefill", 32)]
STAND_IN_PARAMS = {"max_num_seqs": 8, "max_num_batched_tokens": 256, "num_blocks": 256, "block_size": 16}


def stand_in_lengths():
    from servelab.loadgen.lengths import UniformLengths

    return UniformLengths(8, 96, 4, 24)


def stand_in_runs(
    rates: list[float], requests: int, seed: int = 0, progress: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """``engine_runs`` with the smoke settings: tiny Llama, three policies, ``rates``; ``(requests, steps, params)``."""
    req, st = engine_runs(
        STAND_IN_MODEL,
        STAND_IN_POLICIES,
        rates,
        requests=requests,
        lengths=stand_in_lengths(),
        limits=STAND_IN_PARAMS,
        seed=seed,
        progress=progress,
    )
    return req, st, dict(STAND_IN_PARAMS)


def server_limits(params: dict) -> dict:
    """``simulate`` keywords for the server Study 1 started (its ``run.json`` parameters, its defaults
    otherwise): ``max_num_seqs``, ``num_blocks``, ``block_size``, the default token budget, and whether its
    prefill steps replayed captured graphs (``step_graphs``: their padding is priced)."""
    seqs = int(params.get("max_num_seqs", 256))
    budget = int(params.get("max_num_batched_tokens", 8192))
    bs = int(params.get("block_size", 16))
    blocks = params.get("num_blocks")
    if not blocks and params.get("max_model_len"):
        blocks = seqs * -(-int(params["max_model_len"]) // bs)  # how Study 1 sizes its pool
    return {
        "max_num_seqs": seqs,
        "max_num_batched_tokens": budget,
        "num_blocks": int(blocks or DEFAULT_NUM_BLOCKS),
        "block_size": bs,
        "step_graphs": bool(params.get("step_graphs", False)),
    }


def sim_kwargs_for(limits: dict):
    """A function of a run key (``scheduler``, ``budget``) giving ``simulate``'s keywords for that run."""

    def kw(key: dict) -> dict:
        b = key.get("budget")
        budget = limits["max_num_batched_tokens"] if b is None or (isinstance(b, float) and np.isnan(b)) else int(b)
        return {
            "scheduler": key["scheduler"],
            "max_num_seqs": limits["max_num_seqs"],
            "max_num_batched_tokens": budget,
            "num_blocks": limits["num_blocks"],
            "block_size": limits["block_size"],
            "step_buckets": step_graph_sizes(budget) if limits.get("step_graphs") else None,
        }

    return kw


def requested_outputs(
    records: pd.DataFrame, params: dict, rate: float, rate_fraction: float | None
) -> np.ndarray | None:
    """Output lengths the run requested, from Study 1's trace generator (``servelab.studies.s01_scheduling.sweep``: seed
    ``seed·1000 + index of the rate fraction``, ``window_s`` of arrivals); None when the regenerated trace does
    not match the records (arrival times and prompt lengths), so that a mismatch is never used silently."""
    try:
        from servelab.studies.s01_scheduling.sweep import workload_lengths

        fractions = list(params["rate_fractions"])
        i = fractions.index(rate_fraction)
        trace = Trace.synthetic(
            rate=rate, lengths=workload_lengths(params), duration_s=params["window_s"], seed=params["seed"] * 1000 + i
        )
    except (KeyError, ValueError, TypeError, ImportError, ParameterError):
        return None
    f = trace.frame.set_index("request_id")
    ids = records["request_id"].to_numpy()
    if not np.isin(ids, f.index).all():
        return None
    f = f.loc[ids]
    if not (
        np.allclose(f["arrival_s"].to_numpy(), records["arrival_s"].to_numpy(float), atol=1e-6)
        and (f["prompt_tokens"].to_numpy() == records["prompt_tokens"].to_numpy()).all()
    ):
        return None
    return f["output_tokens"].to_numpy()


def requested_outputs_for(params: dict):
    """``outputs_for(run_key, records)`` for ``validation_table``: the records' ``target_output_tokens`` column
    (Study 1 writes it), else ``requested_outputs`` from the run's seed, else None (tokens received)."""

    def outputs_for(key: dict, records: pd.DataFrame):
        if "target_output_tokens" in records.columns and records["target_output_tokens"].notna().all():
            return records["target_output_tokens"].to_numpy(int)
        if "rate_fraction" in records.columns:
            return requested_outputs(records, params, key["rate"], records["rate_fraction"].iat[0])
        return None

    return outputs_for
