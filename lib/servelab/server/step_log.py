"""``--step-log PATH``: one JSON line per engine step (the engine's ``StepRecord``).

Times are ``time.perf_counter()`` seconds (CLOCK_MONOTONIC on Linux), the clock the load generator
stamps tokens with, so a client on the same machine can put both on one axis. The file is flushed
whenever the engine goes idle and at shutdown, so it is complete once a load has drained.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

from servelab.engine import StepRecord


class StepLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._files = contextlib.ExitStack()  # the file stays open for the server's life; close() closes it
        self._f = self._files.enter_context(self.path.open("w", buffering=1 << 16))  # one log per server run
        self._lock = threading.Lock()

    def __call__(self, record: StepRecord) -> None:
        with self._lock:
            self._f.write(json.dumps(record._asdict()) + "\n")

    def flush(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._files.close()


def read_step_log(path: str | Path):
    """The step log as a DataFrame (columns: the ``StepRecord`` fields)."""
    import pandas as pd

    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return pd.DataFrame(rows, columns=list(StepRecord._fields))
