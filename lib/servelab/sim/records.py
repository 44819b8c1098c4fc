"""What the simulator observed per request, kept in flat arrays, turned into the load generator's records.

The hot loop writes token times into ``RequestBook``; at the end ``records()`` gives the same schema as the
real load generator (``servelab.loadgen.metrics.RECORD_COLUMNS``), so ``servelab.loadgen.metrics`` summarizes
both. With ``token_times=False`` (long capacity or speed runs) only first token, finish and the largest
inter-token gap are kept: then the per-request metrics are computed here, vectorised (``compact_metrics``), and
summarized by the same ``servelab.loadgen.metrics.summarize_metrics`` without ITL percentiles.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from servelab.engine.sequence import SequenceStatus
from servelab.loadgen.metrics import RECORD_COLUMNS

FINISHED = SequenceStatus.FINISHED


class RequestBook:
    """Per-request arrays indexed by the request's position in the trace (times in s on the trace's clock)."""

    def __init__(self, n: int, *, token_times: bool):
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.last_token_s = [np.nan] * n  # Python list: read and written once per token batch
        self.max_gap_s = [0.0] * n
        self.num_tokens = [0] * n
        self.replica = np.full(n, -1, dtype=np.int32)
        self.token_times: list[list[float]] | None = [[] for _ in range(n)] if token_times else None
        self.errors: dict[int, str] = {}  # requests the scheduler refused (the server's 400)

    def token(self, i: int, t: float) -> None:
        """Request ``i`` received one token at ``t``."""
        last = self.last_token_s[i]
        if self.num_tokens[i] == 0:
            self.first_token_s[i] = t
        elif t - last > self.max_gap_s[i]:
            self.max_gap_s[i] = t - last
        self.last_token_s[i] = t
        self.num_tokens[i] += 1
        if self.token_times is not None:
            self.token_times[i].append(t)

    def step_tokens(self, seqs, t: float) -> list:
        """Each of ``seqs`` (objects with ``index``) received one token at ``t``; returns those that
        finished with it (status ``FINISHED``), their finish booked at ``t``: one step's samplers at once."""
        first, last, gap, count, times = (
            self.first_token_s,
            self.last_token_s,
            self.max_gap_s,
            self.num_tokens,
            self.token_times,
        )
        done = []
        for seq in seqs:
            i = seq.index
            if count[i] == 0:
                first[i] = t
            elif t - last[i] > gap[i]:
                gap[i] = t - last[i]
            last[i] = t
            count[i] += 1
            if times is not None:
                times[i].append(t)
            if seq.status is FINISHED:
                self.finish_s[i] = t
                done.append(seq)
        return done

    def tokens(self, i: int, times: list[float], max_step_gap_s: float) -> None:
        """Request ``i`` received one token at each of ``times`` (ascending; consecutive gaps at most
        ``max_step_gap_s``)."""
        first = times[0]
        if self.num_tokens[i] == 0:
            self.first_token_s[i] = first
        else:
            gap = first - self.last_token_s[i]
            if gap > self.max_gap_s[i]:
                self.max_gap_s[i] = gap
        if len(times) > 1 and max_step_gap_s > self.max_gap_s[i]:
            self.max_gap_s[i] = max_step_gap_s
        self.last_token_s[i] = times[-1]
        self.num_tokens[i] += len(times)
        if self.token_times is not None:
            self.token_times[i].extend(times)

    def run_tokens(
        self, i: int, first: float, last: float, count: int, max_step_gap_s: float, times: list[float] | None = None
    ) -> None:
        """Request ``i`` received ``count`` tokens from ``first`` to ``last`` (s), consecutive ones at most
        ``max_step_gap_s`` apart: the first ``count`` of ``times`` when token times are kept."""
        if self.num_tokens[i] == 0:
            self.first_token_s[i] = first
        else:
            gap = first - self.last_token_s[i]
            if gap > self.max_gap_s[i]:
                self.max_gap_s[i] = gap
        if max_step_gap_s > self.max_gap_s[i]:
            self.max_gap_s[i] = max_step_gap_s
        self.last_token_s[i] = last
        self.num_tokens[i] += count
        if self.token_times is not None:
            self.token_times[i].extend(times[:count])

    def finish(self, i: int, t: float) -> None:
        self.finish_s[i] = t


def records_frame(book: RequestBook, trace_frame: pd.DataFrame, sent_s: np.ndarray) -> pd.DataFrame:
    """The load generator's record schema (``RECORD_COLUMNS``) plus ``replica``."""
    done = ~np.isnan(book.finish_s)
    df = pd.DataFrame(
        {
            "request_id": trace_frame["request_id"].to_numpy(),
            "arrival_s": trace_frame["arrival_s"].to_numpy(dtype=float),
            "prompt_tokens": trace_frame["prompt_tokens"].to_numpy(),
            "output_tokens": np.asarray(book.num_tokens),
            "sent_s": sent_s,
            "first_token_s": book.first_token_s,
            "finish_s": book.finish_s,
            "token_times_s": book.token_times if book.token_times is not None else [[] for _ in range(len(done))],
            "ok": done,
            "error": [
                ("" if d else book.errors.get(i, "not finished when the simulation ended")) for i, d in enumerate(done)
            ],
        }
    )
    df["replica"] = book.replica
    return df[RECORD_COLUMNS + ["replica"]]


def compact_metrics(records: pd.DataFrame, max_gap_s) -> pd.DataFrame:
    """``request_metrics``' columns without the per-token lists (vectorised): ``ttft_ms``, ``tpot_ms``,
    ``e2e_ms``, ``max_itl_ms``."""
    ok = records["ok"].to_numpy(bool)
    sent = records["sent_s"].to_numpy(float)
    ttft = np.where(ok, (records["first_token_s"].to_numpy(float) - sent) * 1e3, np.nan)
    e2e = np.where(ok, (records["finish_s"].to_numpy(float) - sent) * 1e3, np.nan)
    n = records["output_tokens"].to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(ok & (n > 1), (e2e - ttft) / (n - 1), np.nan)
    gap = np.where(ok & (n > 1), np.asarray(max_gap_s, dtype=float) * 1e3, np.nan)
    return pd.DataFrame(
        {
            "request_id": records["request_id"].to_numpy(),
            "ok": ok,
            "prompt_tokens": records["prompt_tokens"].to_numpy(),
            "output_tokens": n.astype(int),
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2e_ms": e2e,
            "max_itl_ms": gap,
            "replica": records["replica"].to_numpy(),
        }
    )


__all__ = ["RequestBook", "records_frame", "compact_metrics"]
