"""Study 1's measurement loop: per model, a probe, then every (policy, budget, rate) point over HTTP.

For each model: load it once (``PolicyServer``), probe its capacity (``capacity_probe``), then for each
policy setting and each rate fraction replay Poisson arrivals through the load generator for a window sized to
complete ``min_requests`` requests (``sizing.window_s``), cut ``drain_s`` after it; then the budget sweep of
ChunkedPrefill at one rate. The points of one rate fraction replay prefixes of one trace (one seed), so every
policy sees the same requests in the same order (paired runs). ``parts`` restricts the run to some points.

Every point runs in a try/except that records its failure; a time budget skips the points that would not
finish within it (recorded as ``skipped``), so the notebook always ends, on time, with what it measured.
"""

from __future__ import annotations

import gc
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from servelab.loadgen.lengths import ShareGPTLike
from servelab.loadgen.metrics import records_for_csv, request_metrics, summarize
from servelab.loadgen.run import DEADLINE_ERROR
from servelab.loadgen.workload import Trace
from servelab.studies.s01_scheduling import sizing
from servelab.studies.s01_scheduling.capacity_probe import CapacityEstimate, estimate_capacity, probe_roofline
from servelab.studies.s01_scheduling.params import slo_for
from servelab.studies.s01_scheduling.serving import PolicyServer
from servelab.studies.s01_scheduling.sizing import load_guess_s, point_cost_s, selected
from servelab.studies.s01_scheduling.stall import p99_of_max_itl

# the step log's phase times in ms, kept to 0.1 µs (see run_point)
STEP_MS_DIGITS = {"host_ms": 4, "device_ms": 4, "wait_ms": 4}


@dataclass
class Point:
    model: str
    scheduler: str
    budget: int
    rate_fraction: float
    sweep: str  # "rate" or "budget"
    seed: int
    rate: float = float("nan")

    @property
    def key(self) -> str:
        return f"{self.model.split(':')[-1]}_{self.scheduler}_{self.budget}_{self.sweep}_{self.rate_fraction:g}"


@dataclass
class StudyData:
    """What the sweep measured, as tidy frames (the notebook writes them with ``StudyResults.write``)."""

    requests: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    summary: list = field(default_factory=list)
    probes: list = field(default_factory=list)
    servers: list = field(default_factory=list)

    def frames(self) -> dict[str, pd.DataFrame]:
        cat = lambda xs: pd.concat(xs, ignore_index=True) if xs else pd.DataFrame()  # noqa: E731
        return {
            "requests": cat(self.requests),
            "steps": cat(self.steps),
            "summary": pd.DataFrame(self.summary),
            "probes": pd.DataFrame(self.probes),
            "servers": pd.DataFrame(self.servers),
        }


def workload_lengths(P: dict) -> ShareGPTLike:
    return ShareGPTLike(
        prompt_scale=P["prompt_scale"],
        output_scale=P["output_scale"],
        prompt_max=P["prompt_max"],
        output_max=P["output_max"],
    )


def plan_points(P: dict, model: str) -> list[Point]:
    """The points of one model in run order: the rate sweep of every policy setting (most loaded rate first, so that
    a saturated point's completion rate sizes the lighter ones), then the budget sweep (at one of the sweep's rate
    fractions, with that fraction's trace, so the rate sweep's ChunkedPrefill points at that fraction belong to the
    budget series too). Rates are filled in later (``Point.rate = rate_fraction × capacity``). Only the points that
    ``P['parts']`` selects. The capacity search's points (``sweep="search"``) are not planned: they depend on what
    the rate sweep measured (``_search``)."""
    seed = {f: P["seed"] * 1000 + i for i, f in enumerate(P["rate_fractions"])}
    pts = [
        Point(model, name, budget, f, "rate", seed[f])
        for name, budget in P["policies"]
        for f in sorted(P["rate_fractions"], reverse=True)
    ]
    if P["budget_sweep"] and model == P["budget_sweep_model"]:
        f = P["budget_sweep_fraction"]
        done = {b for name, b in P["policies"] if name == "chunked_prefill"}
        pts += [Point(model, "chunked_prefill", b, f, "budget", seed[f]) for b in P["budget_sweep"] if b not in done]
    parts = P.get("parts")
    return [pt for pt in pts if selected(parts, pt.model, pt.scheduler, pt.budget, pt.sweep, pt.rate_fraction)]


def estimate_runtime_s(P: dict, model_load_s: dict | None = None) -> float:
    """The most seconds the sweep can take (s): probes, model loads (a guess per load unless given) and every
    selected point at its cap (``point_cap_s``). ``gpu_time.gpu_time_table`` gives the expected time instead."""
    model_load_s = model_load_s or {}
    total = 0.0
    for m in P["models"]:
        n = len(plan_points(P, m))
        if n:
            total += model_load_s.get(m, load_guess_s(P)) + P["probe_s"] + n * point_cost_s(P, P["point_cap_s"])
    return total


def _tag(df: pd.DataFrame, pt: Point, **extra) -> pd.DataFrame:
    df = df.copy()
    df.insert(0, "model", pt.model)
    df.insert(1, "scheduler", pt.scheduler)
    df.insert(2, "budget", pt.budget)
    df.insert(3, "rate", pt.rate)
    df.insert(4, "rate_fraction", pt.rate_fraction)
    df.insert(5, "sweep", pt.sweep)
    for k, v in extra.items():
        df[k] = v
    return df


def run_probe(srv: PolicyServer, worker, P: dict, lengths: ShareGPTLike, workdir: Path, batch: int) -> CapacityEstimate:
    """Serve a burst of ``probe_requests`` under EagerContBatch and estimate the capacity from its steps."""
    srv.use_policy("eager_cont_batch", P["max_num_batched_tokens"])
    trace = Trace.synthetic(rate=math.inf, lengths=lengths, n=P["probe_requests"], seed=P["seed"] + 7)
    trace = trace.with_prompt_ids(srv.vocab, seed=P["seed"] + 7)
    records, meta = worker.run(srv.base_url, trace, workdir, P["probe_s"], name="probe")
    srv.wait_idle()
    t0 = meta["t0_perf_s"]
    steps = srv.steps_between(t0, t0 + P["probe_s"] + 5)
    mean_p, mean_o = lengths.means()
    return estimate_capacity(steps, mean_prompt_tokens=mean_p, mean_output_tokens=mean_o, batch=batch)


def point_trace(pt: Point, P: dict, lengths: ShareGPTLike, window: float) -> Trace:
    """The point's requests: the first ``window`` seconds' worth of its rate fraction's trace (one seed per fraction,
    ``point_cap_s`` of arrivals long), so that points of one rate replay prefixes of the same requests."""
    full = Trace.synthetic(rate=pt.rate, lengths=lengths, n=sizing.max_arrivals(P, pt.rate), seed=pt.seed)
    return full.head(min(len(full), sizing.arrivals(pt.rate, window)))


def point_span_s(pt: Point, P: dict, lengths: ShareGPTLike, window: float) -> float:
    """Seconds from the run's start to its point's last arrival, at least ``window``: a trace of ``rate × window``
    Poisson arrivals ends about √n / rate either side of the window (±4 s for the 8B model at 0.3 of capacity).
    The run's deadline is this span plus ``drain_s``, so that every request is sent and has the drain to finish;
    a deadline of window + drain had cut the late ones, unsent or half-served, and a point where every request sent
    met the SLO read as a miss (the capacity search then stepped the wrong way)."""
    return max(window, point_trace(pt, P, lengths, window).duration_s)


def run_point(
    srv: PolicyServer,
    worker,
    pt: Point,
    P: dict,
    lengths: ShareGPTLike,
    workdir: Path,
    slo_itl_ms: float | None,
    served_req_s: float | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """One load point: switch policy, replay the trace (sized by ``sizing.window_s`` for a point that completes
    ``served_req_s`` req/s at most), collect records, steps and the summary row."""
    srv.use_policy(pt.scheduler, pt.budget)
    window = sizing.window_s(P, pt.rate, served_req_s)
    trace = point_trace(pt, P, lengths, window).with_prompt_ids(srv.vocab, seed=pt.seed)
    deadline = max(window, trace.duration_s) + P["drain_s"]  # point_span_s
    # the HTTP server (and, with engine_process off, the engine thread) shares this interpreter: a full garbage
    # collection over the notebook's objects would pause it mid-run and show up as a stall, so they are frozen
    gc.collect()
    gc.freeze()
    try:
        records, meta = worker.run(srv.base_url, trace, workdir, deadline, name=pt.key)
        srv.wait_idle()
    finally:
        gc.unfreeze()
    t0 = meta["t0_perf_s"]
    steps = srv.steps_between(t0, t0 + deadline + 1.0)
    steps[["start_s", "end_s"]] = steps[["start_s", "end_s"]] - t0  # onto the records' axis
    s = summarize(records, slo_ttft_ms=P["slo_ttft_ms"], slo_tpot_ms=slo_itl_ms)
    # the window a point was sized for and the raw facts of its run: the report recomputes every statistic from the
    # requests; these it cannot (``measure.POINT_COLUMNS``)
    m = request_metrics(records)
    ok = m[m["ok"]]
    times = [t for ts in records["token_times_s"] for t in ts]
    span = (max(times) - float(records["sent_s"].min())) if times else float("nan")
    row = {
        **_row_head(pt),
        "status": "ok",
        "attempts": 1,
        "requests": len(records),
        "cut": int((records["error"] == DEADLINE_ERROR).sum()),
        "min_requests": P["min_requests"],
        "shortfall": max(0, P["min_requests"] - int(s["completed"])),
        "window_s": window,
        "deadline_s": deadline,
        **s,
        **p99_of_max_itl(m.loc[m["ok"], "max_itl_ms"], seed=pt.seed),
        "mean_ttft_ms": float(ok["ttft_ms"].mean()) if len(ok) else float("nan"),
        # every token received (cut requests included) per second of the run: the work the server did
        "delivered_tok_s": len(times) / span if times and span > 0 else float("nan"),
        "duration_s": meta["duration_s"],
        "t0_perf_s": t0,
        "slo_itl_ms": slo_itl_ms,
        "warmup_ms": srv.last_warmup_s * 1e3,
        "steps": len(steps),
        "preemptions": int(steps["num_preempted"].sum()) if len(steps) else 0,
        "max_queue": int(steps["num_waiting"].max()) if len(steps) else 0,
        "max_lag_ms": float(m["queue_lag_ms"].max()) if len(m) else float("nan"),
    }
    # times to the microsecond, and the steps' phase times to a tenth of one (CUDA events resolve about half a
    # microsecond): the CSVs stay small enough to ship with the book. Every GPU call carries the tracked tree within
    # 64 MiB, and a step's three full-precision ms columns were half the bytes of Study 1's xz'd step logs
    req = _tag(
        records_for_csv(records).round({"arrival_s": 6, "sent_s": 6, "first_token_s": 6, "finish_s": 6}),
        pt,
        t0_perf_s=t0,
    )
    st = _tag(steps.round({"start_s": 6, "end_s": 6, **STEP_MS_DIGITS}), pt, t0_perf_s=t0)
    return req, st, row


@dataclass
class _Sweep:
    """What every model's part of the sweep shares: the parameters, the output, the clock and the progress bar."""

    P: dict
    workdir: Path
    lengths: object  # workload_lengths(P)
    worker: object  # a started LoadWorker
    data: StudyData
    budget_end: float  # time.perf_counter() at which the time budget runs out
    bar: object  # tqdm
    log: Callable[[str], None]
    roofline: object = None
    rates_from: dict = field(default_factory=dict)  # per model: the capacity (req/s) its rates are fractions of

    def skip(self, points, status: str) -> None:
        for pt in points:
            self.data.summary.append({**_row_head(pt), "status": status})
            self.bar.update(1)


def run_study(P: dict, workdir, *, device: str, roofline=None, progress: bool = True, log=print) -> StudyData:
    """Run every model's probe and points within ``P['time_budget_s']``; never raises for a failed point.
    With a ``Roofline`` (this run's measured ceilings) the probe's costs are set against their floors."""
    from tqdm import tqdm  # not tqdm.auto: in a notebook without ipywidgets it warns

    from servelab.loadgen.worker import LoadWorker

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    n_points = sum(len(plan_points(P, m)) for m in P["models"])
    bar = tqdm(total=n_points, desc="load points", unit="pt", disable=not progress)
    with LoadWorker() as worker:
        sw = _Sweep(
            P, workdir, workload_lengths(P), worker, StudyData(), t_start + P["time_budget_s"], bar, log, roofline
        )
        for model in P["models"]:
            _run_model(sw, model, device)
    bar.close()
    log(f"sweep: {time.perf_counter() - t_start:.0f} s of wall time (budget {P['time_budget_s']:.0f} s)")
    return sw.data


def _run_model(sw: _Sweep, model: str, device: str) -> None:
    """One model's server, probe and load points; whatever breaks is recorded and the next model still runs."""
    P, data = sw.P, sw.data
    points = plan_points(P, model)
    left = sw.budget_end - time.perf_counter()
    if not points:
        return
    if left < P["probe_s"] + point_cost_s(P, 0.0) + load_guess_s(P):
        sw.log(f"{model}: skipped, {left:.0f} s of the time budget left")
        data.servers.append({"model": model, "engine_process": P["engine_process"], "status": "skipped: time budget"})
        sw.skip(points, "skipped: time budget")
        return
    srv = _start_server(sw, model, device)
    if srv is None:
        sw.skip(points, "error: server did not start")
        return
    rows_before = len(data.summary)
    try:
        data.servers.append(
            {"model": model, "status": "ok", "engine_process": srv.engine_process, "load_s": srv.load_s, **srv.stats}
        )
        rates_from, slo = _probe(sw, srv, model)
        rates_from = _fixed_capacity(sw, model, rates_from)
        sw.rates_from[model] = rates_from
        _run_points(sw, srv, points, rates_from, slo)
        if slo is None:  # no probe and no SLO given: 5x (the factor) the lightest run's median ITL
            _slo_from_lightest(data.summary[rows_before:], P["slo_itl_factor"])
    except Exception as e:  # noqa: BLE001 - whatever broke, the other model still runs
        sw.log(f"{model}: stopped early: {type(e).__name__}: {e}")
        recorded = {(r["scheduler"], r["budget"], r["rate_fraction"], r["sweep"]) for r in data.summary[rows_before:]}
        missing = [pt for pt in points if (pt.scheduler, pt.budget, pt.rate_fraction, pt.sweep) not in recorded]
        sw.skip(missing, f"error: {type(e).__name__}: {e}"[:300])
    finally:
        srv.stop()


def _start_server(sw: _Sweep, model: str, device: str) -> PolicyServer | None:
    """The model's server, started; None (and a ``servers`` row saying why) if it did not start."""
    P = sw.P
    num_blocks = P["num_blocks"] or P["max_num_seqs"] * -(-P["max_model_len"] // 16)
    srv = PolicyServer(
        model,
        dtype=P["dtype"],
        device=device,
        max_num_seqs=P["max_num_seqs"],
        max_num_batched_tokens=P["max_num_batched_tokens"],
        max_model_len=P["max_model_len"],
        num_blocks=num_blocks,
        step_log_path=sw.workdir / f"steps_{model.split(':')[-1]}.jsonl",
        seed=P["seed"],
        engine_process=P["engine_process"],
    )
    try:
        srv.start()
    except Exception as e:  # noqa: BLE001 - a model that cannot load must not end the study
        sw.log(f"{model}: server did not start: {type(e).__name__}: {e}")
        srv.stop()
        status = f"error: {type(e).__name__}: {e}"[:300]
        sw.data.servers.append({"model": model, "engine_process": P["engine_process"], "status": status})
        return None
    return srv


def _probe(sw: _Sweep, srv: PolicyServer, model: str) -> tuple[float | None, float | None]:
    """The capacity estimate (req/s) the rates are fractions of, and the ITL SLO (ms); (None, the given SLO) if the
    probe failed, so that the fallback rates are used."""
    P = sw.P
    t = time.perf_counter()
    try:
        est = run_probe(srv, sw.worker, P, sw.lengths, sw.workdir, P["max_num_seqs"])
    except Exception as e:  # noqa: BLE001
        sw.data.probes.append({"model": model, "status": f"error: {type(e).__name__}: {e}"[:300]})
        sw.log(f"{model}: probe failed ({type(e).__name__}: {e}); using fallback_rates {P['fallback_rates']}")
        return None, slo_for(P, model)
    slo = slo_for(P, model) or P["slo_itl_factor"] * est.decode_step_s * 1e3
    floors = probe_roofline(est, srv.shape, sw.roofline, srv.dtype_bytes) if sw.roofline is not None else {}
    sw.data.probes.append(
        {
            "model": model,
            "status": "ok",
            **est.as_dict(),
            **floors,
            "probe_wall_s": time.perf_counter() - t,
            "slo_itl_ms": slo,
        }
    )
    sw.log(
        f"{model}: probe {time.perf_counter() - t:.1f} s; prefill {est.prefill_s_per_token * 1e6:.1f} "
        f"µs/token, decode iteration {est.decode_step_s * 1e3:.2f} ms (batch {est.decode_batch:.0f}); "
        f"capacity estimate {est.capacity_req_s:.2f} req/s; ITL SLO {slo:.1f} ms"
    )
    return est.capacity_req_s, slo


def _fixed_capacity(sw: _Sweep, model: str, probed: float | None) -> float | None:
    """The capacity (req/s) the rates are fractions of: ``P['capacities']``' value for the model where given (every
    part of a sweep then offers the same rates and traces), else the probe's."""
    caps = sizing.capacities(sw.P["capacities"])
    if model not in caps:
        return probed
    sw.log(f"{model}: rates from the given capacity {caps[model]:.2f} req/s (the probe's: {probed})")
    return caps[model]


def _run_points(sw: _Sweep, srv: PolicyServer, points, rates_from: float | None, slo: float | None) -> None:
    """Every load point of one model, each at its rate, until the time budget runs out; then, per policy setting
    of the rate sweep, the capacity search (``_search``)."""
    P = sw.P
    fallback = dict(zip(P["rate_fractions"], P["fallback_rates"], strict=False))  # lengths unchecked
    for pt in points:
        if rates_from is not None:
            pt.rate = pt.rate_fraction * rates_from
        else:
            pt.rate = fallback.get(pt.rate_fraction, P["fallback_rates"][-1])
        _measure_point(sw, srv, pt, P, slo)
    settings = dict.fromkeys((pt.scheduler, pt.budget) for pt in points if pt.sweep == "rate")
    for scheduler, budget in settings:
        _search(sw, srv, points[0].model, scheduler, budget, rates_from, slo)


def _measure_point(sw: _Sweep, srv: PolicyServer, pt: Point, P: dict, slo: float | None) -> dict | None:
    """One point measured (its row appended to the summary), once more with a window sized from its own completion
    rate where it saturated and fell short of ``min_requests`` (``attempts`` 2); None where it was skipped or
    failed."""
    # The first window is the model's, the same for every policy at this rate, so that policies are compared on the
    # same requests. It used to take a policy's completion rate from a saturated higher rate: ChunkedPrefill@512
    # then replayed 9.6 s of arrivals at 36 req/s against EagerContBatch's 4.7 s (qwen2-0.5b, the H200 runs at
    # 94c0bf13c028). It completed 16.2-16.7 req/s there (a third of its requests cut), so the shorter window and its
    # drain would still have given it about 160 completed requests, past min_requests. Only a point that falls short
    # of min_requests replays a longer prefix, sized by its own completion rate.
    served = sw.rates_from.get(pt.model)
    window = sizing.window_s(P, pt.rate, served)
    if time.perf_counter() + point_cost_s(P, point_span_s(pt, P, sw.lengths, window)) > sw.budget_end:
        sw.skip([pt], "skipped: time budget")
        return None
    if not srv.alive:
        sw.skip([pt], f"error: engine loop stopped ({srv.error})"[:300])
        return None
    try:
        req, st, row = run_point(srv, sw.worker, pt, P, sw.lengths, sw.workdir, slo, served)
        if row["cut"] > 0 and row["duration_s"] > 0:
            own = row["completed"] / row["duration_s"]
            again = sizing.window_s(P, pt.rate, own)
            fits = time.perf_counter() + point_cost_s(P, point_span_s(pt, P, sw.lengths, again)) <= sw.budget_end
            if row["shortfall"] > 0 and again > window + 1.0 and fits:  # saturated and short: size it by itself
                req, st, row = run_point(srv, sw.worker, pt, P, sw.lengths, sw.workdir, slo, own)
                row["attempts"], row["first_window_s"] = 2, window
        sw.data.requests.append(req)
        sw.data.steps.append(st)
        sw.data.summary.append(row)
        return row
    except Exception as e:  # noqa: BLE001 - record and go on
        sw.log(f"{pt.key}: {type(e).__name__}: {e}")
        sw.data.summary.append(
            {
                **_row_head(pt),
                "status": f"error: {type(e).__name__}: {e}"[:300],
                "traceback": traceback.format_exc(limit=3)[-600:],
            }
        )
        _recover(srv)
        return None
    finally:
        sw.bar.update(1)


def meets_slo(row: dict, slo: float | None) -> bool | None:
    """Whether a measured point met the ITL SLO (p99 ITL within it, nothing cut or failed): the capacity search's
    step, the same test ``capacity.meets_slo`` applies at report time; None where it cannot tell."""
    if row is None or slo is None or row.get("status") != "ok" or row.get("itl_p99_ms") != row.get("itl_p99_ms"):
        return None
    return bool(row["itl_p99_ms"] <= slo and row.get("cut", 0) == 0 and row.get("failed", 0) == 0)


def _search(sw: _Sweep, srv, model: str, scheduler: str, budget: int, rates_from: float | None, slo) -> None:
    """Bracket the setting's capacity at the ITL SLO: where its lowest rate fraction (measured in this run) missed
    the SLO, measure at rates ``search_factor`` times lower, step by step (at most ``search_steps``), until one meets
    it; where its highest met it, search upwards until one misses. Each searched point completes
    ``search_min_requests`` requests: its statistic, the p99 ITL, pools every token gap of every request (about
    100 per request), so 40 requests give thousands of gaps; the p99 of per-request maxima (F1.1) is not read there.
    """
    P = sw.P
    rows = [
        r
        for r in sw.data.summary
        if r.get("model") == model and r.get("scheduler") == scheduler and r.get("budget") == budget
    ]
    rate_rows = {r["rate_fraction"]: r for r in rows if r.get("sweep") == "rate" and r.get("status") == "ok"}
    if not rate_rows or slo is None or P["search_steps"] == 0:
        return
    fr = sorted(P["rate_fractions"])
    Ps = {**P, "min_requests": P["search_min_requests"]}
    for edge, direction, want in ((fr[0], -1, False), (fr[-1], +1, True)):
        row = rate_rows.get(edge)
        if row is None or meets_slo(row, slo) is not want:
            continue
        rate, fraction = row["rate"], edge
        for step in range(1, P["search_steps"] + 1):
            rate, fraction = rate * P["search_factor"] ** direction, fraction * P["search_factor"] ** direction
            seed = P["seed"] * 1000 + 100 * (direction + 2) + step  # one trace per searched rate
            pt = Point(model, scheduler, budget, round(fraction, 6), "search", seed)
            pt.rate = rate
            got = _measure_point(sw, srv, pt, Ps, slo)
            if got is None or meets_slo(got, slo) is not want:
                break


def _slo_from_lightest(rows: list[dict], factor: float) -> None:
    """Set each ok row's ITL SLO to ``factor`` × the lightest run's median ITL (ms); None if none measured one."""
    rows = [r for r in rows if r.get("status") == "ok"]
    light = min((r["itl_p50_ms"] for r in rows if r["itl_p50_ms"] == r["itl_p50_ms"]), default=None)
    for r in rows:
        r["slo_itl_ms"] = None if light is None else factor * light


def _row_head(pt: Point) -> dict:
    return {
        "model": pt.model,
        "scheduler": pt.scheduler,
        "budget": pt.budget,
        "rate": pt.rate,
        "rate_fraction": pt.rate_fraction,
        "sweep": pt.sweep,
    }


def _recover(srv: PolicyServer) -> None:
    """After a failed point: wait for the engine to empty (cut requests abort), free cached GPU memory."""
    try:
        srv.wait_idle(timeout_s=20)
        srv.release_cached_memory()
    except (TimeoutError, RuntimeError):
        pass
