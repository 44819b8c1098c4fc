"""The real replicas' run that the simulator's replica-capacity prediction is set beside (the "Beyond one GPU" page;
issue 31), with the prediction's own model, SLO, lengths, shared prompt prefixes, scheduler settings, requests per
replica and starting rate.

    python -m servelab.studies.s08_simulator.cluster_run PART --repeat R

The prediction (``replica_capacity``, made by this study's report on the calibrated cost model) searches 1, 2 and 4
replicas behind each router; measured, that is hours of traffic, so the run comes in parts that each fit a GPU run
of 9 minutes: ``n1`` (one replica, where routing cannot matter) and ``n<N>-<router>`` for N = 2, 4. Each part is
one ``servelab.cluster.capacity_run`` over that N and router, written to its own folder
(``data/results/<device>-x<GPUs>/09_beyond_one_gpu/runs/<fingerprint>/<part>/r<repeat>/``); the page joins a
repeat's parts. The arguments are read from this study's report over its committed runs on the book's device, the
report that the page renders, so a run measures what was predicted.
"""

from __future__ import annotations

import argparse
import sys

from servelab.errors import ParameterError
from servelab.sim.routers import ROUTERS
from servelab.studies.s08_simulator.replica_capacity import REPLICAS

STUDY = "08_simulator"
PARTS = {"n1": (1, ROUTERS[0])} | {f"n{n}-{r}": (n, r) for n in REPLICAS if n > 1 for r in ROUTERS}
GUESS_MIN = 6.0  # a part: the replicas' start (graph capture), then ~6 points of 400 requests a replica


def gpus_needed(part: str) -> int:
    return PARTS[part][0]


def lengths_argv(lengths) -> list[str]:
    """``loadgen.lengths.add_length_arguments``' flags for a length distribution (its three kinds)."""
    kind = type(lengths).__name__
    if kind == "FixedLengths":
        return ["--lengths", "fixed", "--prompt-tokens", str(lengths.prompt), "--output-tokens", str(lengths.output)]
    if kind == "UniformLengths":
        return ["--lengths", "uniform", "--prompt-range", str(lengths.prompt_min), str(lengths.prompt_max),
                "--output-range", str(lengths.output_min), str(lengths.output_max)]  # fmt: skip
    return ["--lengths", "sharegpt", "--prompt-scale", f"{lengths.prompt_scale:g}", "--output-scale",
            f"{lengths.output_scale:g}", "--max-prompt-tokens", str(lengths.prompt_max), "--max-output-tokens",
            str(lengths.output_max)]  # fmt: skip


def serve_argv(sched: dict, max_model_len: int | None) -> list[str]:
    """The replicas' server flags for the simulator's scheduler settings (ChunkedPrefill, no prefix cache) and the
    context of the Study 1 server they were calibrated on (its prompts reach 6,000 tokens; the server's default
    context, 4,096, would refuse them)."""
    flags = {"max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
             "block_size": "--block-size", "num_blocks": "--num-blocks"}  # fmt: skip
    out = ["--scheduler", sched.get("scheduler", "chunked_prefill"), "--no-prefix-caching"]
    for key, flag in flags.items():
        if sched.get(key) is not None:
            out += [flag, str(int(sched[key]))]
    return out + (["--max-model-len", str(int(max_model_len))] if max_model_len else [])


def replicas_argv(page, part: str, repeat: int) -> list[str]:
    """``servelab.cluster.capacity_run``'s arguments for ``part`` of repeat ``repeat``, from the page record of this
    study's report (``page.cap``: the prediction's cost model, lengths, SLO, one replica's rate, settings)."""
    if part not in PARTS:
        raise ParameterError(f"no part {part!r}; the parts: {', '.join(PARTS)}")
    if not getattr(page, "cap", None):
        raise ParameterError("the simulator's report made no replica prediction: nothing to measure it against")
    n, router = PARTS[part]
    c, P = page.cap, page.P
    return [
        str(c["cost"].gpu.model), "--replicas", str(n), "--routers", router, "--part", part,
        "--slo-ttft-ms", f"{c['slo'][0]:.6g}", "--slo-tpot-ms", f"{c['slo'][1]:.6g}", "--start", f"{c['one']:.6g}",
        "--requests-per-replica", str(P["replica_requests"]), "--refine", str(P["replica_refine"]),
        "--prefix-groups", str(P["prefix_groups"]), "--prefix-tokens", str(P["prefix_tokens"]),
        "--repeat", str(repeat), *lengths_argv(c["lengths"]), "--",
        *serve_argv(c["sched"], (getattr(page, "s1_params", None) or {}).get("max_model_len")),
    ]  # fmt: skip


def prediction(root=None):
    """This study's page record over its committed runs on the book's device (the report cache's, where a render
    computed it)."""
    from servelab.studies.common.report_cache import cached
    from servelab.studies.common.runs import study_runs
    from servelab.studies.common.study import door

    runs = study_runs(STUDY, root)
    report = door(STUDY, "report")
    return cached(STUDY, runs, lambda: report.report(runs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m servelab.studies.s08_simulator.cluster_run", description=__doc__)
    ap.add_argument("part", choices=list(PARTS))
    ap.add_argument("--repeat", type=int, default=0)
    ap.add_argument("--print", action="store_true", help="print the capacity run's command, run nothing")
    a = ap.parse_args(argv)
    from servelab.cluster import capacity_run

    try:
        args = replicas_argv(prediction(), a.part, a.repeat)
    except ParameterError as e:
        print(f"cluster_run: {e}", file=sys.stderr)
        return 2
    if a.print:
        print(" ".join(["python -m servelab.cluster.capacity_run", *args]))
        return 0
    return capacity_run.main(args)


if __name__ == "__main__":
    sys.exit(main())
