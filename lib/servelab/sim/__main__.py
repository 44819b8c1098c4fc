"""Command line: simulate a trace (or synthetic traffic) on N replicas; print the summary as the load generator does.

    python -m servelab.sim --trace T.jsonl --scheduler chunked_prefill --replicas 4 \\
        --cost-model data/results/nvidia-h200/08_simulator/sim_cost_model_config_qwen2-0.5b.json --out sim.csv

    # notebook 08's simulated hour: 100 req/s over 8 replicas, Study 1's server and lengths (docs-snippets/sim.md)
    python -m servelab.sim --rate 100 --duration 3600 --replicas 8 --router least_outstanding \\
        --lengths sharegpt --output-scale 0.25 --max-prompt-tokens 6000 --max-output-tokens 512 \\
        --max-num-seqs 64 --num-blocks 32768 --step-graphs --no-token-times \\
        --cost-model data/results/nvidia-h200/08_simulator/sim_cost_model_config_qwen2-0.5b.json --out sim.csv

Synthetic traffic takes the load generator's workload flags (``--rate``, ``--burstiness``, ``--duration`` or
``--num-requests``, ``--lengths`` and its parameters), so the two tools describe one workload the same way.
The summary is printed in the load generator's layout (vLLM's ``benchmark_serving``), then the simulator's own
numbers; ``--summary-out`` writes it as JSON. The CSV (``--out``) holds the load generator's record schema (token
times as JSON lists, empty with ``--no-token-times``) plus ``replica``.
"""

from __future__ import annotations

import argparse
import json
import sys

from servelab.engine.policies import POLICIES
from servelab.engine.step_graphs import step_graph_sizes
from servelab.errors import ParameterError
from servelab.loadgen.lengths import add_length_arguments, lengths_from_args
from servelab.loadgen.metrics import records_for_csv
from servelab.loadgen.report import format_report
from servelab.loadgen.workload import Trace
from servelab.sim.cost_model import StepCostModel
from servelab.sim.routers import ROUTERS
from servelab.sim.simulator import DEFAULT_NUM_BLOCKS, SimRun, simulate


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m servelab.sim",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_argument_group("traffic: a trace file, or synthetic arrivals (the load generator's flags)")
    src.add_argument("--trace", help="JSONL trace (servelab.loadgen.workload format)")
    src.add_argument("--rate", "--request-rate", type=float, help="synthetic: requests per second")
    src.add_argument("--burstiness", type=float, default=1.0, help="synthetic: gamma shape; 1 = Poisson")
    src.add_argument("--duration", type=float, help="synthetic: seconds of arrivals")
    src.add_argument("--num-requests", "--num-prompts", type=int, help="synthetic: requests (instead of --duration)")
    add_length_arguments(src)
    src.add_argument("--seed", type=int, default=0, help="synthetic: random seed")
    srv = p.add_argument_group("the simulated servers")
    srv.add_argument("--cost-model", required=True, help="Study 2 CostModel JSON, or a saved StepCostModel JSON")
    srv.add_argument("--scheduler", choices=sorted(POLICIES), default="chunked_prefill")
    srv.add_argument("--replicas", type=int, default=1)
    srv.add_argument("--router", choices=ROUTERS, default="least_outstanding")
    srv.add_argument("--max-num-seqs", type=int, default=256, help="running sequences per replica")
    srv.add_argument("--max-num-batched-tokens", type=int, default=8192, help="tokens per step")
    srv.add_argument("--num-blocks", type=int, default=DEFAULT_NUM_BLOCKS, help="KV blocks per replica")
    srv.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    srv.add_argument(
        "--step-graphs",
        action="store_true",
        help="the server replays captured step graphs (the engine's default on CUDA): price each prefill "
        "step's padding to its bucket of the ladder below --max-num-batched-tokens",
    )
    srv.add_argument(
        "--prefix-caching",
        action="store_true",
        help="give every replica the engine's prefix cache (the trace must carry prompt_ids)",
    )
    out = p.add_argument_group("measurement")
    out.add_argument("--slo-ttft-ms", type=float, help="goodput SLO on TTFT (ms)")
    out.add_argument("--slo-tpot-ms", type=float, help="goodput SLO on TPOT (ms)")
    out.add_argument(
        "--no-token-times",
        action="store_true",
        help="keep only first token, finish and largest gap per request (long runs: faster, far less memory; "
        "no ITL percentiles)",
    )
    out.add_argument("--out", help="CSV of per-request records")
    out.add_argument("--summary-out", help="summary JSON")
    out.add_argument("--no-progress", action="store_true")
    return p


def trace_from_args(a) -> Trace:
    """The trace file, or the synthetic traffic the flags describe."""
    if (a.trace is None) == (a.rate is None):
        raise ParameterError("give either --trace FILE or --rate R with --duration S or --num-requests N")
    if a.trace:
        return Trace.read_jsonl(a.trace)
    if (a.duration is None) == (a.num_requests is None):
        raise ParameterError("--rate needs --duration (seconds of arrivals) or --num-requests")
    return Trace.synthetic(
        rate=a.rate,
        lengths=lengths_from_args(a),
        n=a.num_requests,
        duration_s=a.duration,
        burstiness=a.burstiness,
        seed=a.seed,
        max_requests=10_000_000,
    )


def run_from_args(a, trace: Trace) -> SimRun:
    return simulate(
        trace,
        cost=StepCostModel.load(a.cost_model),
        scheduler=a.scheduler,
        replicas=a.replicas,
        router=a.router,
        max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens,
        num_blocks=a.num_blocks,
        block_size=a.block_size,
        token_times=not a.no_token_times,
        prefix_caching=a.prefix_caching,
        progress=not a.no_progress,
        step_buckets=step_graph_sizes(a.max_num_batched_tokens) if a.step_graphs else None,
    )


def sim_lines(run: SimRun, summary: dict) -> list[str]:
    """The simulator's own numbers, in the report's layout."""
    rows = [
        ("Simulation wall time (s):", f"{summary['sim_wall_s']:<10.2f}"),
        ("Simulated requests per wall second:", f"{summary['sim_requests_per_s']:<10.0f}"),
        ("Simulated steps:", f"{run.num_steps:<10}"),
    ]
    if run.params.get("prefix_caching"):
        rows.append(("Prefix cache hit rate:", f"{run.prefix_hit_rate:<10.3f}"))
    return [f"{label:<40} {value}" for label, value in rows]


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    try:
        trace = trace_from_args(a)
        run = run_from_args(a, trace)
        summary = run.benchmark_summary(slo_ttft_ms=a.slo_ttft_ms, slo_tpot_ms=a.slo_tpot_ms)
    except ParameterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{trace}", file=sys.stderr)
    summary |= {
        "sim_wall_s": run.wall_s,
        "sim_requests_per_s": len(run.records) / max(run.wall_s, 1e-9),
        "sim_steps": run.num_steps,
        "prefix_hit_rate": run.prefix_hit_rate,
    }
    if a.out:
        records_for_csv(run.records).to_csv(a.out, index=False)
    if a.summary_out:
        with open(a.summary_out, "w") as f:
            json.dump(summary, f, indent=2)
    goodput = a.slo_ttft_ms is not None or a.slo_tpot_ms is not None
    print(format_report(summary, goodput=goodput, title="Simulated Serving Result"))
    print("\n".join(sim_lines(run, summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
