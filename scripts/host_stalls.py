"""Where Study 1's long host stalls go: each engine step held on the host for ``--min-ms`` or more, beside what the
stall probe (``scripts/stall_probe/sitecustomize.py``) saw in the same window: garbage collections, Triton JIT
compiles, torch.compile compilations, and the engine thread's most sampled stack.

    python scripts/host_stalls.py RUN_DIR [RUN_DIR ...] --probe PREFIX [--min-ms 50] [--out stalls.csv]

RUN_DIR is a Study 1 run folder (its ``steps.csv.xz``); PREFIX the probe's output prefix (``PREFIX.<pid>.jsonl``,
one file a process). Both sides use time.perf_counter (CLOCK_MONOTONIC), so a step's absolute start is its point's
``t0_perf_s`` plus its ``start_s``. A development diagnostic (data/dev/), not a book figure.
"""

from __future__ import annotations

import argparse
import glob
import json
from collections import Counter
from pathlib import Path

import pandas as pd


def load_probe(prefix: str) -> tuple[pd.DataFrame, pd.DataFrame, dict[tuple[int, int], list[str]]]:
    """(timed events: gc/triton/dynamo with pid, t0, t1, what; stack samples: pid, t, tid, id; stacks by (pid, id))."""
    events, samples, stacks = [], [], {}
    for path in sorted(glob.glob(f"{prefix}.*.jsonl")):
        pid = int(path.rsplit(".", 2)[-2])
        for line in Path(path).read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the process's end
                continue
            kind = r.get("kind")
            if kind == "stack":
                samples.append((pid, r["t"], r["tid"], r["id"]))
            elif kind == "stacks":
                stacks[(pid, r["id"])] = r["frames"]
            elif kind in ("gc", "triton", "dynamo") and r.get("t0") is not None:
                what = {"gc": f"gc gen {r.get('gen')}", "triton": f"triton {r.get('fn')}", "dynamo": "dynamo"}[kind]
                events.append((pid, kind, r["t0"], r["t1"], what))
    ev = pd.DataFrame(events, columns=["pid", "kind", "t0", "t1", "what"])
    sm = pd.DataFrame(samples, columns=["pid", "t", "tid", "id"])
    return ev, sm, stacks


def _servelab_frame(frames: list[str]) -> str:
    """The innermost frame in servelab's code, or the innermost frame."""
    for f in frames:
        if "servelab/" in f:
            return f
    return frames[0] if frames else "?"


def explain(steps: pd.DataFrame, ev: pd.DataFrame, sm: pd.DataFrame, stacks: dict, min_ms: float) -> pd.DataFrame:
    rows = []
    long = steps[steps["host_ms"] >= min_ms]
    for _, s in long.iterrows():
        t0 = s["t0_perf_s"] + s["start_s"]
        t1 = t0 + s["host_ms"] / 1e3
        hit = ev[(ev["t1"] > t0) & (ev["t0"] < t1)]
        overlap = ((hit["t1"].clip(upper=t1) - hit["t0"].clip(lower=t0)) * 1e3).round(1)
        in_window = sm[(sm["t"] >= t0) & (sm["t"] <= t1)]
        # the engine's thread: samples with the engine's own code on the stack (a server's watcher threads sit in
        # servelab's code too, asleep, and would otherwise win every window)
        tops = Counter()
        for pid, sid in zip(in_window["pid"], in_window["id"], strict=True):
            frames = stacks.get((pid, sid), [])
            if any("servelab/engine/" in f for f in frames):
                tops[(pid, frames[0] if frames else "?", _servelab_frame(frames))] += 1
        top = tops.most_common(1)[0] if tops else None
        rows.append(
            {
                **{k: s[k] for k in ("scheduler", "budget", "rate_fraction", "start_s", "host_ms", "device_ms")},
                "events": "; ".join(f"{w} {o} ms" for w, o in zip(hit["what"], overlap, strict=True)) or "none",
                "event_ms": float(overlap.sum()),
                "samples": int(len(in_window)),
                "top_frame": top[0][1] if top else "",
                "top_servelab_frame": top[0][2] if top else "",
                "top_share": round(top[1] / max(1, sum(tops.values())), 2) if top else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="Study 1 run folders (each with steps.csv or steps.csv.xz)")
    ap.add_argument("--probe", required=True, help="the probe's output prefix")
    ap.add_argument("--min-ms", type=float, default=50.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    ev, sm, stacks = load_probe(a.probe)
    gcs = ev[ev["kind"] == "gc"]
    print(
        f"probe: {ev['pid'].nunique() if len(ev) else 0} processes with events; {len(gcs)} collections of >= 2 ms "
        f"(longest {((gcs['t1'] - gcs['t0']).max() * 1e3 if len(gcs) else 0):.0f} ms), "
        f"{(ev['kind'] == 'triton').sum()} Triton compiles, {(ev['kind'] == 'dynamo').sum()} torch.compile "
        f"compilations; {len(sm)} stack samples"
    )
    out = []
    for run in a.runs:
        path = next((p for p in (Path(run) / "steps.csv.xz", Path(run) / "steps.csv") if p.exists()), None)
        if path is None:
            print(f"{run}: no steps table")
            continue
        steps = pd.read_csv(path)
        table = explain(steps, ev, sm, stacks, a.min_ms)
        print(f"\n{run}: {len(steps)} steps, {len(table)} held >= {a.min_ms:g} ms on the host")
        if len(table):
            print(table.to_string(index=False, max_colwidth=110))
            out.append(table.assign(run=str(run)))
    if a.out and out:
        pd.concat(out).to_csv(a.out, index=False)


if __name__ == "__main__":
    main()
