"""Command line: simulate a trace (or synthetic traffic) on N replicas and write the per-request records.

    python -m servelab.sim --trace T.jsonl --scheduler chunked_prefill --replicas 4 \\
        --cost-model data/results/nvidia-h200/02_gpu_costs/cost_model_config_qwen2-0.5b_hf_cuda_graph.json \\
        --out sim.csv
    python -m servelab.sim --rate 50 --duration 600 --lengths sharegpt --replicas 8 --cost-model ... --out sim.csv

The CSV holds the load generator's record schema (token times as JSON lists) plus ``replica``; the summary
(``servelab.loadgen.metrics.summarize``'s keys) is printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

from servelab.engine.policies import POLICIES
from servelab.engine.step_graphs import step_graph_sizes
from servelab.errors import ParameterError
from servelab.loadgen.lengths import ShareGPTLike, UniformLengths
from servelab.loadgen.metrics import records_for_csv
from servelab.loadgen.workload import Trace
from servelab.sim.cost_model import StepCostModel
from servelab.sim.routers import ROUTERS
from servelab.sim.simulator import DEFAULT_NUM_BLOCKS, simulate

LENGTHS = {"sharegpt": ShareGPTLike, "uniform": lambda: UniformLengths(64, 1024, 16, 256)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m servelab.sim", description=__doc__.split("\n\n")[0])
    src = p.add_argument_group("traffic: a trace file, or a synthetic Poisson trace")
    src.add_argument("--trace", help="JSONL trace (servelab.loadgen.workload format)")
    src.add_argument("--rate", type=float, help="synthetic: requests per second")
    src.add_argument("--duration", type=float, help="synthetic: seconds of arrivals")
    src.add_argument("--lengths", choices=sorted(LENGTHS), default="sharegpt", help="synthetic: length distribution")
    src.add_argument("--seed", type=int, default=0, help="synthetic: random seed")
    p.add_argument("--cost-model", required=True, help="Study 2 CostModel JSON, or a saved StepCostModel JSON")
    p.add_argument("--scheduler", choices=sorted(POLICIES), default="chunked_prefill")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--router", choices=ROUTERS, default="least_outstanding")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--num-blocks", type=int, default=DEFAULT_NUM_BLOCKS, help="KV blocks per replica")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument(
        "--step-graphs",
        action="store_true",
        help="the server replays captured step graphs (the engine's default on CUDA): price each prefill "
        "step's padding to its bucket of the ladder below --max-num-batched-tokens",
    )
    p.add_argument(
        "--prefix-caching",
        action="store_true",
        help="give every replica the engine's prefix cache (the trace must carry prompt_ids)",
    )
    p.add_argument("--slo-ttft-ms", type=float, help="goodput SLO on TTFT (ms)")
    p.add_argument("--slo-tpot-ms", type=float, help="goodput SLO on TPOT (ms)")
    p.add_argument("--no-token-times", action="store_true", help="keep only first/last token per request (long runs)")
    p.add_argument("--out", required=True, help="CSV of per-request records")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        if (args.trace is None) == (args.rate is None):
            raise ParameterError("give either --trace FILE or --rate R --duration S")
        if args.trace:
            trace = Trace.read_jsonl(args.trace)
        else:
            if args.duration is None:
                raise ParameterError("--rate needs --duration (seconds of arrivals)")
            trace = Trace.synthetic(
                rate=args.rate,
                lengths=LENGTHS[args.lengths](),
                duration_s=args.duration,
                seed=args.seed,
                max_requests=10_000_000,
            )
        cost = StepCostModel.load(args.cost_model)
        run = simulate(
            trace,
            cost=cost,
            scheduler=args.scheduler,
            replicas=args.replicas,
            router=args.router,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            num_blocks=args.num_blocks,
            block_size=args.block_size,
            token_times=not args.no_token_times,
            prefix_caching=args.prefix_caching,
            progress=not args.no_progress,
            step_buckets=step_graph_sizes(args.max_num_batched_tokens) if args.step_graphs else None,
        )
        summary = run.summary(slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms)
    except ParameterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    records_for_csv(run.records).to_csv(args.out, index=False)
    print(
        json.dumps(
            {
                "requests": len(run.records),
                "wall_s": round(run.wall_s, 3),
                "prefix_hit_rate": run.prefix_hit_rate,
                "sim_requests_per_s": round(len(run.records) / max(run.wall_s, 1e-9), 1),
                **summary,
            },
            indent=1,
            default=float,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
