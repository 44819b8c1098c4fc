"""The load generator in a process of its own, reused across runs: ``LoadWorker``.

A server and its load generator must not share a Python interpreter: the client's token timestamps would
wait on the server's GIL (and the server's steps on the client's). A notebook that serves in-process runs
the client here instead: one child process (``python -m servelab.loadgen.worker``), started once, which
takes one run per line on stdin and answers one JSON line on stdout when it is done:

    {"base_url": ..., "trace": "t.jsonl", "out": "records.csv", "deadline_s": 12.0}
    -> {"ok": true, "t0_perf_s": ..., "duration_s": ..., "requests": 40}

Starting it once saves the interpreter and import time (about a second; more on a busy CI box) per run.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from servelab.errors import ParameterError

LIB_DIR = Path(__file__).resolve().parents[2]


class LoadWorker:
    """Parent side: ``with LoadWorker() as w: records, meta = w.run(base_url, trace, workdir, deadline_s)``."""

    def __init__(self, python: str = sys.executable, timeout_margin_s: float = 60.0):
        self.python = python
        self.timeout_margin_s = timeout_margin_s
        self.proc: subprocess.Popen | None = None

    def start(self) -> LoadWorker:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(LIB_DIR), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            [self.python, "-m", "servelab.loadgen.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
            bufsize=1,
            env=env,
        )
        hello = self.proc.stdout.readline()
        if not hello.startswith("{"):
            raise RuntimeError(f"load worker did not start (exit code {self.proc.poll()})")
        return self

    def run(self, base_url: str, trace, workdir, deadline_s: float, name: str = "run") -> tuple[pd.DataFrame, dict]:
        """Replay ``trace`` (a ``Trace`` with prompt ids) against ``base_url`` in the worker; the records
        (``token_times_s`` as lists) and the run's facts (``t0_perf_s``, ``duration_s``)."""
        from servelab.loadgen.metrics import check_records

        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError("the load worker is not running")
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        trace_path, out_path = workdir / f"{name}.jsonl", workdir / f"{name}.csv"
        trace.write_jsonl(trace_path)
        self.proc.stdin.write(
            json.dumps({"base_url": base_url, "trace": str(trace_path), "out": str(out_path), "deadline_s": deadline_s})
            + "\n"
        )
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the load worker died (exit code {self.proc.poll()})")
        meta = json.loads(line)
        if not meta.get("ok"):
            raise RuntimeError(f"load worker: {meta.get('error')}")
        records = pd.read_csv(out_path, keep_default_na=False, na_values=[""])
        records["error"] = records["error"].astype(str)
        return check_records(records), meta

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> LoadWorker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(stdin=sys.stdin, stdout=sys.stdout) -> None:
    """Child side: one run per input line until stdin closes."""
    from servelab.loadgen.metrics import records_for_csv
    from servelab.loadgen.run import run_load
    from servelab.loadgen.workload import Trace

    print(json.dumps({"ready": True}), file=stdout, flush=True)
    for line in stdin:
        if not line.strip():
            continue
        try:
            job = json.loads(line)
            trace = Trace.read_jsonl(job["trace"])
            deadline = float(job.get("deadline_s") or math.inf)
            records = run_load(job["base_url"], trace, deadline_s=deadline)
            records_for_csv(records).to_csv(job["out"], index=False)
            answer = {
                "ok": True,
                "t0_perf_s": records.attrs["t0_perf_s"],
                "duration_s": records.attrs["duration_s"],
                "requests": len(records),
            }
        except (ParameterError, KeyError, ValueError, OSError) as e:
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), file=stdout, flush=True)


if __name__ == "__main__":
    serve()
