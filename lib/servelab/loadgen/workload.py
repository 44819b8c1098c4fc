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
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.errors import ParameterError
from servelab.loadgen.arrivals import arrival_times

REQUIRED = ["arrival_s", "prompt_tokens", "output_tokens"]
OPTIONAL = ["prompt_ids", "prompt"]


def _check_numbers(df: pd.DataFrame) -> None:
    """Arrival times and lengths: valid, and cast in place (float s, int tokens)."""
    arr = pd.to_numeric(df["arrival_s"], errors="coerce")
    if arr.isna().any() or (arr < 0).any() or not np.isfinite(arr).all():
        raise ParameterError("trace arrival_s must be finite numbers >= 0 (seconds from the run's start)")
    df["arrival_s"] = arr.astype(float)
    for c in ("prompt_tokens", "output_tokens"):
        v = pd.to_numeric(df[c], errors="coerce")
        if v.isna().any() or (v < 1).any() or (v != np.floor(v)).any():
            raise ParameterError(f"trace {c} must be integers >= 1")
        df[c] = v.astype(int)


def _check_prompt_ids(df: pd.DataFrame) -> None:
    if df["prompt_ids"].isna().any():
        raise ParameterError("prompt_ids must be given for every request of a trace or for none")
    for rid, ids, n in zip(df["request_id"], df["prompt_ids"], df["prompt_tokens"], strict=True):
        if not isinstance(ids, (list, tuple, np.ndarray)) or len(ids) != n:
            raise ParameterError(f"request {rid}: prompt_ids must be a list of prompt_tokens ({n}) ids")


def json_lines(path, what: str = "file"):
    """``(line number, object)`` for each non-blank line of a JSONL file; a ``ParameterError`` names the line
    that is not a JSON object (``what`` names the file's role in the message)."""
    path = Path(path)
    if not path.exists():
        raise ParameterError(f"{what} file {str(path)!r} does not exist")
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise ParameterError(f"{path}:{i}: not JSON ({e.msg})") from None
        if not isinstance(d, dict):
            raise ParameterError(f"{path}:{i}: each line must be a JSON object")
        yield i, d


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
        _check_numbers(df)
        if "prompt_ids" in df.columns:
            _check_prompt_ids(df)
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
        rng = np.random.default_rng(seed)
        arrivals = arrival_times(
            rate, rng, n=n, duration_s=duration_s, burstiness=burstiness, max_requests=max_requests
        )
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
            for rid, n in zip(df["request_id"], df["prompt_tokens"], strict=True)
        ]
        return Trace(df, source=self.source)

    def fit_context(self, max_model_len: int) -> tuple[Trace, int, int]:
        """This trace fitted to a server whose context holds ``max_model_len`` tokens (prompt + output, as vLLM
        and the servelab server check), and how many requests were clipped and dropped: ``(trace, clipped,
        dropped)``.

        A request that does not fit keeps its output length and has its prompt cut to the rest of the context
        (its first tokens kept), so the decode work it asks for stays; an output alone of ``max_model_len`` or
        more is cut to leave one prompt token. A text prompt cannot be cut without the tokenizer: its output is
        cut instead, and it is dropped when its prompt alone fills the context.
        """
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, (int, np.integer)) or max_model_len < 2:
            raise ParameterError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
        df = self.frame.copy()
        prompt, output = df["prompt_tokens"].to_numpy(), df["output_tokens"].to_numpy()
        over = prompt + output > max_model_len
        if not over.any():
            return self, 0, 0
        text = np.full(len(df), "prompt" in df.columns and not self.has_prompt_ids)
        new_out = np.where(text, max_model_len - prompt, np.minimum(output, max_model_len - 1))
        new_prompt = np.where(text, prompt, max_model_len - new_out)
        keep = ~over | (new_out >= 1)
        df["output_tokens"] = np.where(over, new_out, output)
        df["prompt_tokens"] = np.where(over, new_prompt, prompt)
        if self.has_prompt_ids:
            df["prompt_ids"] = [list(ids[:n]) for ids, n in zip(df["prompt_ids"], df["prompt_tokens"], strict=True)]
        clipped, dropped = int((over & keep).sum()), int((~keep).sum())
        note = f"fitted to a {max_model_len:,}-token context ({clipped} clipped, {dropped} dropped)"
        return Trace(df[keep], source=f"{self.source}; {note}" if self.source else note), clipped, dropped

    def head(self, n: int) -> Trace:
        """The first ``n`` arrivals."""
        return Trace(self.frame.head(n), source=self.source)

    # ---- JSONL ----------------------------------------------------------------------------------
    def write_jsonl(self, path) -> Path:
        path = Path(path)
        cols = ["request_id"] + REQUIRED + [c for c in OPTIONAL if c in self.frame.columns]
        with path.open("w") as f:
            for row in self.frame[cols].itertuples(index=False):
                d = dict(zip(cols, row, strict=True))
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
        rows = []
        for i, d in json_lines(path, "trace"):
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
