"""How much traffic N real replicas serve within an SLO behind each router: the measurement that the "Beyond one
GPU" page sets beside the simulator's prediction (``studies.s08_simulator.replica_capacity``; issue 31).

    python -m servelab.cluster.capacity_run config:qwen2-0.5b --replicas 1 2 4 \\
        --routers round_robin least_outstanding prefix_affinity --slo-ttft-ms 2000 --slo-tpot-ms 40 \\
        --start 30 --requests-per-replica 200 --lengths sharegpt --output-scale 0.25 --vocab-size 32000

For each N (one router at N = 1, where routing cannot matter) it starts ``servelab serve MODEL
--data-parallel-size N --router R`` (replica i on GPU i), then searches the rate as the simulator does
(``sim.capacity.bracket_search``: doubling or halving from N x ``--start``, then bisecting in log space), each
point one open-loop Poisson trace of N x ``--requests-per-replica`` requests, sent by the load generator. A point
meets the SLO when every request completed and p99 TTFT and p99 TPOT are within it (``sim.capacity.meets_slo``,
the simulator's test). It writes, under ``--out`` (default: the book's layout,
``data/results/<device>/09_beyond_one_gpu/runs/<fingerprint>/<--part: replicas>/r<repeat>/``): ``points.csv`` (every
point, with the load generator's summary of it), ``capacity.csv`` (the bracket per router and N), ``requests.csv``
(every request, without its tokens' times: ``compact``), and ``run.json``.
Flags after ``--`` go to every ``servelab serve``. On CPUs (``--device cpu``) it runs for a test; its times mean
nothing there.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from servelab.cluster.run_record import machine_record, run_folder, write_run
from servelab.errors import ParameterError
from servelab.loadgen.lengths import add_length_arguments, lengths_from_args
from servelab.loadgen.metrics import records_for_csv, summarize
from servelab.loadgen.run import run_load
from servelab.loadgen.workload import Trace
from servelab.measure.fingerprint import fingerprint
from servelab.server.launch import LIB_DIR, free_port, wait_healthy
from servelab.sim.capacity import bracket_search, meets_slo
from servelab.sim.prefix_workload import with_shared_prefixes
from servelab.sim.routers import ROUTERS

PART = "replicas"
SINGLE = "(one replica)"  # the router column at N = 1, as the prediction's table names it
STARTUP_S = 1800.0  # N replicas load in parallel; an 8B model with graph capture takes minutes on one GPU


class DataParallelServer:
    """``servelab serve MODEL --data-parallel-size N --router R`` in a process of its own, healthy on entry and
    stopped (SIGINT: the router drains every replica) on exit."""

    def __init__(self, model: str, replicas: int, router: str, serve_args: list[str], log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "servelab.server", model, "--data-parallel-size", str(replicas),
                    "--router", router, "--port", str(self.port), *serve_args]  # fmt: skip
        self.log = log

    def __enter__(self) -> str:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(LIB_DIR), os.environ.get("PYTHONPATH", "")]))
        self._out = open(self.log, "ab")  # noqa: SIM115 - open while the server runs
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=self._out, stderr=subprocess.STDOUT)
        try:
            wait_healthy(self.url, STARTUP_S, alive=lambda: self.proc.poll() is None)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.url

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


def measure_point(url: str, trace: Trace, *, model: str, slo_ttft_ms: float, slo_tpot_ms: float, drain_s: float):
    """``(met, summary, records)`` of one open-loop run of ``trace`` against ``url``; requests still running
    ``drain_s`` after the last arrival are cut, and count as failed."""
    records = run_load(url, trace, model=model, deadline_s=trace.duration_s + drain_s)
    s = summarize(records, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)
    return meets_slo(s, slo_ttft_ms, slo_tpot_ms), s, records


def sweep(
    point: Callable[[str, int, float], tuple[bool, dict, pd.DataFrame]],
    serve: Callable[[int, str], object],
    *,
    replicas: list[int],
    routers: list[str],
    start: float,
    steps: int,
    refine: int,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``(capacity, points, requests)`` over every (N, router): ``serve(N, router)`` is a context manager that
    gives a running server's URL, ``point(url, N, rate)`` measures one rate on it."""
    cap, points, requests = [], [], []
    for n in replicas:
        for router in [routers[0]] if n == 1 else routers:
            label = SINGLE if n == 1 else router
            with serve(n, router) as url:

                def ok(rate: float, url=url, n=n, label=label) -> bool:
                    met, s, rec = point(url, n, rate)
                    points.append({"router": label, "replicas": n, "rate": rate, "met": met, **s})
                    requests.append(rec.assign(router=label, replicas=n, rate=rate))
                    return met

                met, missed = bracket_search(ok, start=start * n, steps=steps, refine=refine)
            cap.append({"router": label, "replicas": n, "met_req_s": met, "missed_req_s": missed})
    capacity = pd.DataFrame(cap)
    if not capacity.empty:
        one = capacity.loc[capacity["replicas"] == 1, "met_req_s"]
        single = float(one.iloc[0]) if len(one) else math.nan
        capacity["per_replica_req_s"] = capacity["met_req_s"] / capacity["replicas"]
        capacity["scaling"] = capacity["met_req_s"] / (capacity["replicas"] * single)
    reqs = pd.concat([compact(r) for r in requests], ignore_index=True) if requests else pd.DataFrame()
    return capacity, pd.DataFrame(points), reqs


def compact(records: pd.DataFrame) -> pd.DataFrame:
    """A point's records for ``requests.csv`` without each token's time (an empty list): ``points.csv`` holds what
    they give, the ITL percentiles and the largest stall summarised from every token at measuring time. Kept, they
    are ~1 KB a request, ~8 MB a part at N = 4, in the tree that every GPU call carries (within 64 MiB)."""
    return records_for_csv(records).assign(token_times_s="[]")


def point_trace(params: dict, n: int, rate: float) -> Trace:
    """The trace of the point at ``rate`` on ``n`` replicas, from a run's parameters (the parsed flags, or its
    ``run.json``'s ``params``): ``n`` x ``--requests-per-replica`` Poisson arrivals with seed ``--seed`` +
    ``--repeat``, prompts of random token ids, or with ``--prefix-groups`` G, each opening with one of G shared
    prefixes of ``--prefix-tokens`` tokens (Zipf-popular, as the simulator's prediction draws them), so that the
    prefix-affinity router has something to keep together. Deterministic: the page re-draws it to replay."""
    a = argparse.Namespace(**params)
    seed = a.seed + a.repeat
    t = Trace.synthetic(rate=rate, lengths=lengths_from_args(a), n=n * a.requests_per_replica, seed=seed)
    if not getattr(a, "prefix_groups", 0):
        return t.with_prompt_ids(a.vocab_size, seed=seed)
    return with_shared_prefixes(t, groups=a.prefix_groups, prefix_tokens=a.prefix_tokens, vocab=a.vocab_size,
                                seed=seed, materialize=True)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m servelab.cluster.capacity_run", description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=list(ROUTERS))
    ap.add_argument("--slo-ttft-ms", type=float, required=True)
    ap.add_argument("--slo-tpot-ms", type=float, required=True)
    ap.add_argument("--start", type=float, required=True, help="req/s one replica is tried at first (N x this)")
    ap.add_argument("--requests-per-replica", type=int, default=200)
    ap.add_argument("--steps", type=int, default=6, help="doublings or halvings at most")
    ap.add_argument("--refine", type=int, default=2, help="bisections in log space")
    ap.add_argument("--drain-s", type=float, default=30.0)
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--prefix-groups", type=int, default=0, help="prompts open with one of this many shared prefixes")
    ap.add_argument("--prefix-tokens", type=int, default=256, help="tokens of each shared prefix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=0)
    ap.add_argument("--part", default=PART, help="the run's folder under its fingerprint (a run in parts: one each)")
    ap.add_argument("--out", type=Path, default=None)
    add_length_arguments(ap.add_argument_group("lengths"))
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    a = build_parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    try:
        if min(a.replicas) < 1 or a.requests_per_replica < 1 or not a.start > 0:
            raise ParameterError("--replicas and --requests-per-replica must be >= 1, --start > 0")
        if a.prefix_groups < 0 or a.prefix_tokens < 1:
            raise ParameterError("--prefix-groups must be >= 0 and --prefix-tokens >= 1")
        lengths = lengths_from_args(a)
        device = machine_record()
        fp = fingerprint("servelab.cluster.capacity_run").digest
        out = a.out or run_folder(device, fp, a.part, a.repeat)
        out.mkdir(parents=True, exist_ok=True)
        started = time.time()

        def trace(n: int, rate: float) -> Trace:
            return point_trace(vars(a), n, rate)

        def point(url: str, n: int, rate: float):
            met, s, rec = measure_point(url, trace(n, rate), model=a.model, slo_ttft_ms=a.slo_ttft_ms,
                                        slo_tpot_ms=a.slo_tpot_ms, drain_s=a.drain_s)  # fmt: skip
            print(f"N={n}: {rate:.2f} req/s {'meets' if met else 'misses'} the SLO (p99 TTFT "
                  f"{s['ttft_p99_ms']:.0f} ms, p99 TPOT {s['tpot_p99_ms']:.1f} ms, {s['failed']} failed)",
                  flush=True)  # fmt: skip
            return met, s, rec

        def serve(n: int, router: str) -> DataParallelServer:
            return DataParallelServer(a.model, n, router, serve_args, out / "server.log")

        capacity, points, requests = sweep(
            point, serve, replicas=a.replicas, routers=a.routers, start=a.start, steps=a.steps, refine=a.refine
        )
        capacity.to_csv(out / "capacity.csv", index=False)
        points.to_csv(out / "points.csv", index=False)
        requests.to_csv(out / "requests.csv", index=False)
        params = {k: v for k, v in vars(a).items() if k != "out"}
        params |= {"serve_args": serve_args, "lengths_source": lengths.source}
        write_run(out, part=a.part, repeat=a.repeat, seed=a.seed + a.repeat, fingerprint=fp, machine=device,
                  started=started, params=params)  # fmt: skip
        print(capacity.to_string(index=False))
        print(out)
        return 0
    except ParameterError as e:
        print(f"capacity_run: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
