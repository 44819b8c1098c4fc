"""A workload trace: when each request arrives, how long its prompt is, how many tokens it asks for.

``Trace.frame`` is a DataFrame with one row per request, sorted by arrival:

- ``request_id`` (int), ``arrival_s`` (s from the run's start), ``prompt_tokens``, ``output_tokens``;
- optionally ``prompt_ids`` (list of token ids, length ``prompt_tokens``) or ``prompt`` (text).

JSONL form (``write_jsonl`` / ``read_jsonl``), one request per line::

    {"request_id": 0, "arrival_s": 0.12, "prompt_tokens": 812, "output_tokens": 64, "prompt_ids": [...]}

The load generator sends it over HTTP; the simulator replays the same file, so the two see the same load.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.errors import ParameterError
from servelab.loadgen.arrivals import gamma_arrivals

REQUIRED = ["arrival_s", "prompt_tokens", "output_tokens"]
OPTIONAL = ["prompt_ids", "prompt"]


class Trace:
    """A validated, arrival-sorted request trace (see the module docstring for the columns)."""

    def __init__(self, frame: pd.DataFrame, *, source: str = ""):
        if not isinstance(frame, pd.DataFrame):
            raise ParameterError(f"a trace is built from a DataFrame, got {type(frame).__name__}")
        missing = [c for c in REQUIRED if c not in frame.columns]
        if missing:
            raise ParameterError(f"trace lacks columns {missing}; needs {REQUIRED} (+ optional {OPTIONAL})")
        df = frame.copy()
        if "request_id" not in df.columns:
            df.insert(0, "request_id", range(len(df)))
        if df["request_id"].duplicated().any():
            raise ParameterError("trace request_id values must be unique")
        arr = pd.to_numeric(df["arrival_s"], errors="coerce")
        if arr.isna().any() or (arr < 0).any() or not np.isfinite(arr).all():
            raise ParameterError("trace arrival_s must be finite numbers >= 0 (seconds from the run's start)")
        df["arrival_s"] = arr.astype(float)
        for c in ("prompt_tokens", "output_tokens"):
            v = pd.to_numeric(df[c], errors="coerce")
            if v.isna().any() or (v < 1).any() or (v != np.floor(v)).any():
                raise ParameterError(f"trace {c} must be integers >= 1")
            df[c] = v.astype(int)
        if "prompt_ids" in df.columns:
            if df["prompt_ids"].isna().any():
                raise ParameterError("prompt_ids must be given for every request of a trace or for none")
            for rid, ids, n in zip(df["request_id"], df["prompt_ids"], df["prompt_tokens"]):
                if not isinstance(ids, (list, tuple, np.ndarray)) or len(ids) != n:
                    raise ParameterError(f"request {rid}: prompt_ids must be a list of prompt_tokens ({n}) ids")
        self.frame = df.sort_values(["arrival_s", "request_id"], kind="stable").reset_index(drop=True)
        self.source = source

    def __len__(self) -> int:
        return len(self.frame)

    def __repr__(self) -> str:
        return f"Trace({len(self)} requests over {self.duration_s:.2f} s; {self.source or 'no source given'})"

    @property
    def duration_s(self) -> float:
        """Time of the last arrival (s)."""
        return float(self.frame["arrival_s"].max()) if len(self) else 0.0

    @property
    def has_prompt_ids(self) -> bool:
        return "prompt_ids" in self.frame.columns

    # ---- building --------------------------------------------------------------------------------
    @classmethod
    def synthetic(
        cls,
        *,
        rate: float,
        lengths,
        n: int | None = None,
        duration_s: float | None = None,
        burstiness: float = 1.0,
        seed: int = 0,
        max_requests: int = 100_000,
    ) -> Trace:
        """Requests at ``rate`` per second (gamma arrivals with ``burstiness``; 1 is Poisson) with lengths
        from ``lengths`` (``servelab.loadgen.lengths``): either ``n`` requests, or every arrival within
        ``duration_s`` seconds (at least one). Deterministic given ``seed``."""
        if (n is None) == (duration_s is None):
            raise ParameterError("give exactly one of n (requests) or duration_s (seconds of arrivals)")
        rng = np.random.default_rng(seed)
        if n is not None:
            arrivals = gamma_arrivals(rate, n, rng, burstiness)
        else:
            if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not duration_s > 0:
                raise ParameterError(f"duration_s must be a positive number, got {duration_s!r}")
            if math.isinf(rate):
                raise ParameterError("an infinite rate needs n (requests), not a duration")
            chunk = int(rate * duration_s * 1.5 + 10 * math.sqrt(rate * duration_s) + 10)
            arrivals = gamma_arrivals(rate, chunk, rng, burstiness)
            while arrivals[-1] <= duration_s and len(arrivals) < max_requests:  # bursty gaps can fall short
                arrivals = np.concatenate([arrivals, arrivals[-1] + gamma_arrivals(rate, chunk, rng, burstiness)])
            arrivals = arrivals[arrivals <= duration_s][:max_requests] if arrivals[0] <= duration_s else arrivals[:1]
        prompt, output = lengths.sample(len(arrivals), rng)
        frame = pd.DataFrame(
            {
                "request_id": np.arange(len(arrivals)),
                "arrival_s": arrivals,
                "prompt_tokens": prompt,
                "output_tokens": output,
            }
        )
        b = f", burstiness {burstiness:g}" if burstiness != 1 else " (Poisson)"
        return cls(frame, source=f"{rate:g} req/s{b}, seed {seed}; {lengths.source}")

    def with_prompt_ids(self, vocab_size: int, seed: int = 0, low: int = 0) -> Trace:
        """This trace with random prompt token ids, uniform on ``[low, vocab_size)`` (random, never a
        constant: a prompt of one repeated token would be an unrepresentative input), deterministic given
        ``seed`` and the request id."""
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= low or low < 0:
            raise ParameterError(f"vocab_size must be an integer > low ({low}), got {vocab_size!r}")
        df = self.frame.copy()
        df["prompt_ids"] = [
            np.random.default_rng([seed, int(rid)]).integers(low, vocab_size, int(n)).tolist()
            for rid, n in zip(df["request_id"], df["prompt_tokens"])
        ]
        return Trace(df, source=self.source)

    def head(self, n: int) -> Trace:
        """The first ``n`` arrivals."""
        return Trace(self.frame.head(n), source=self.source)

    # ---- JSONL ----------------------------------------------------------------------------------
    def write_jsonl(self, path) -> Path:
        path = Path(path)
        cols = ["request_id"] + REQUIRED + [c for c in OPTIONAL if c in self.frame.columns]
        with path.open("w") as f:
            for row in self.frame[cols].itertuples(index=False):
                d = dict(zip(cols, row))
                d["request_id"] = int(d["request_id"])
                d["arrival_s"] = float(d["arrival_s"])
                d["prompt_tokens"], d["output_tokens"] = int(d["prompt_tokens"]), int(d["output_tokens"])
                if "prompt_ids" in d:
                    d["prompt_ids"] = [int(t) for t in d["prompt_ids"]]
                f.write(json.dumps(d) + "\n")
        return path

    @classmethod
    def read_jsonl(cls, path) -> Trace:
        """Read a trace written by ``write_jsonl`` (or by hand: ``arrival_s``, ``output_tokens`` and either
        ``prompt_tokens``, ``prompt_ids`` or ``prompt`` per line; ``prompt_tokens`` defaults to the length
        of ``prompt_ids``). Errors name the line."""
        path = Path(path)
        if not path.exists():
            raise ParameterError(f"trace file {str(path)!r} does not exist")
        rows = []
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ParameterError(f"{path}:{i}: not JSON ({e.msg})") from None
            if not isinstance(d, dict):
                raise ParameterError(f"{path}:{i}: each line must be a JSON object")
            if "prompt_tokens" not in d:
                if "prompt_ids" in d:
                    d["prompt_tokens"] = len(d["prompt_ids"])
                elif "prompt" in d:
                    raise ParameterError(f"{path}:{i}: a text prompt needs prompt_tokens (its length in tokens)")
            missing = [c for c in REQUIRED if c not in d]
            if missing:
                raise ParameterError(f"{path}:{i}: missing {missing}")
            rows.append(d)
        if not rows:
            raise ParameterError(f"trace file {path} holds no requests")
        return cls(pd.DataFrame(rows), source=f"replayed from {path.name}")
