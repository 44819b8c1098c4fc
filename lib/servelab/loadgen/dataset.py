"""A dataset of prompts for the load generator (``--dataset FILE``): JSONL, one request per line.

    {"prompt": "Explain paged attention in two sentences.", "output_len": 128}
    {"prompt_ids": [1, 887, 526, 29892], "output_len": 64}

- the prompt: ``prompt`` (text) or ``prompt_ids`` / ``prompt_token_ids`` (token ids; all lines of one kind);
- its output length in tokens: ``output_len`` (vLLM's name), ``output_tokens`` or ``max_tokens``;
- a text prompt's length in tokens: ``prompt_tokens`` (or ``prompt_len``) if the file has it, else the server
  counts it (``servelab.loadgen.server_info.count_tokens``).

``dataset_trace`` gives the rows arrival times (the command line's rate and burstiness) and uses them in file
order, from the first row again when more requests are asked for than the file holds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from servelab.errors import ParameterError
from servelab.loadgen.arrivals import arrival_times
from servelab.loadgen.workload import Trace, json_lines

OUTPUT_KEYS = ("output_len", "output_tokens", "max_tokens")
IDS_KEYS = ("prompt_ids", "prompt_token_ids")
LENGTH_KEYS = ("prompt_tokens", "prompt_len")


def _first(d: dict, keys: tuple):
    return next((d[k] for k in keys if k in d), None)


def _row(where: str, d: dict) -> dict:
    out = _first(d, OUTPUT_KEYS)
    if isinstance(out, bool) or not isinstance(out, int) or out < 1:
        raise ParameterError(f"{where}: needs an output length >= 1 ({' or '.join(OUTPUT_KEYS)}), got {out!r}")
    ids = _first(d, IDS_KEYS)
    if ids is not None:
        if not isinstance(ids, list) or not ids or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
            raise ParameterError(f"{where}: prompt_ids must be a non-empty list of token ids")
        return {"prompt_ids": ids, "prompt_tokens": len(ids), "output_tokens": out}
    text = d.get("prompt")
    if not isinstance(text, str) or not text:
        raise ParameterError(f"{where}: needs a prompt (non-empty text) or prompt_ids")
    n = _first(d, LENGTH_KEYS)
    return {"prompt": text, "prompt_tokens": np.nan if n is None else n, "output_tokens": out}


def read_dataset(path) -> pd.DataFrame:
    """The dataset's rows: ``prompt`` or ``prompt_ids``, ``prompt_tokens`` (NaN for a text prompt of unknown
    length) and ``output_tokens``. Errors name the line."""
    rows = [_row(f"{path}:{i}", d) for i, d in json_lines(path, "dataset")]
    if not rows:
        raise ParameterError(f"dataset file {path} holds no prompts")
    if len({"prompt_ids" in r for r in rows}) > 1:
        raise ParameterError(f"dataset {path}: prompts must be all text or all token ids, not both")
    return pd.DataFrame(rows)


def with_token_counts(rows: pd.DataFrame, count) -> pd.DataFrame:
    """``rows`` with every text prompt's missing ``prompt_tokens`` filled by ``count(list of texts)`` (a list of
    ints, or None when it cannot count)."""
    missing = rows["prompt_tokens"].isna().to_numpy()
    if not missing.any():
        return rows
    counts = count(rows.loc[missing, "prompt"].tolist())
    if counts is None:
        raise ParameterError(
            f"{int(missing.sum())} text prompts have no prompt_tokens and the server has no /tokenize to count "
            "them: add prompt_tokens to the dataset's lines"
        )
    out = rows.copy()
    out.loc[missing, "prompt_tokens"] = counts
    return out


def dataset_trace(
    rows: pd.DataFrame,
    *,
    rate: float,
    n: int | None = None,
    duration_s: float | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
    source: str = "a dataset",
) -> Trace:
    """A trace of ``n`` requests (every row once when neither ``n`` nor ``duration_s`` is given), or of every
    arrival within ``duration_s`` s, arriving at ``rate`` requests/s with ``burstiness`` (1: Poisson), their
    prompts and output lengths the dataset's rows in order (cycled)."""
    if n is None and duration_s is None:
        n = len(rows)
    rng = np.random.default_rng(seed)
    arrivals = arrival_times(rate, rng, n=n, duration_s=duration_s, burstiness=burstiness, max_requests=10_000_000)
    frame = rows.iloc[np.arange(len(arrivals)) % len(rows)].reset_index(drop=True)
    frame.insert(0, "request_id", np.arange(len(arrivals)))
    frame.insert(1, "arrival_s", arrivals)
    b = f", burstiness {burstiness:g}" if burstiness != 1 else " (Poisson)"
    return Trace(frame, source=f"{rate:g} req/s{b}, seed {seed}; prompts from {source}")
