"""Drive the real engine with a trace, in-process, and record what the load generator would: the simulator's
reference when there is no server run to compare with (CPU tests, the smoke notebook).

Two clocks:

- ``clock="steps"``: time counts engine steps (each step lasts 1 s; idle time jumps to the next arrival).
  Deterministic, so a simulation with ``StepCostModel.constant(1000)`` must give exactly the same per-request
  first-token and finish times (``tests/test_sim_engine_order.py``);
- ``clock="wall"``: ``time.perf_counter`` from the start of the replay; the engine sleeps until the next
  arrival when idle. Token times are taken when each step returns, as a server would stream them.

Returns ``(records, steps)``: records in the load generator's schema (``servelab.loadgen.metrics``), and the
step log (the engine's ``StepRecord`` fields on the same clock).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd

from servelab.engine import Engine, SamplingParams
from servelab.errors import ParameterError
from servelab.loadgen.metrics import RECORD_COLUMNS
from servelab.sim.simulator import as_trace

CLOCKS = ("steps", "wall")
STEP_LOG_COLUMNS = [
    "start_s",
    "end_s",
    "prefill_tokens",
    "decode_tokens",
    "num_seqs",
    "num_waiting",
    "num_preempted",
    "decode_steps",
]


class _Clock:
    """The replay's time: engine steps (each one unit; a step that only preempts takes none) or wall seconds
    since the replay began."""

    def __init__(self, kind: str):
        self.kind = kind
        self.steps = 0.0
        self.t_wall0 = time.perf_counter()

    def now(self) -> float:
        return self.steps if self.kind == "steps" else time.perf_counter() - self.t_wall0

    def wait_until(self, t: float) -> None:
        """Idle until ``t`` (the next arrival)."""
        if self.kind == "steps":
            self.steps = t
        else:
            time.sleep(max(0.0, t - self.now()))

    def log_row(self, rec) -> tuple:
        """The engine's step record on this clock (``STEP_LOG_COLUMNS``)."""
        if self.kind == "steps":
            start, end = self.steps, self.steps + 1.0
        else:
            start, end = rec.start_s - self.t_wall0, rec.end_s - self.t_wall0
        counts = (rec.prefill_tokens, rec.decode_tokens, rec.num_seqs, rec.num_waiting, rec.num_preempted)
        return (start, end, *counts, rec.decode_steps)


class _Book:
    """Per trace row: when it was sent, its token times and its finish, on the clock's axis."""

    def __init__(self, n: int):
        self.times: list[list[float]] = [[] for _ in range(n)]
        self.finish = np.full(n, np.nan)
        self.sent = np.full(n, np.nan)
        self.by_seq: dict[int, int] = {}  # the engine's seq_id -> trace row

    def tokens(self, events, t: float) -> None:
        for ev in events:
            j = self.by_seq[ev.seq_id]
            self.times[j].append(t)
            if ev.finished:
                self.finish[j] = t

    def records(self, df: pd.DataFrame) -> pd.DataFrame:
        """The load generator's record schema."""
        ok = ~np.isnan(self.finish)
        return pd.DataFrame(
            {
                "request_id": df["request_id"].to_numpy(),
                "arrival_s": df["arrival_s"].to_numpy(float),
                "prompt_tokens": df["prompt_tokens"].to_numpy(),
                "output_tokens": [len(x) for x in self.times],
                "sent_s": self.sent,
                "first_token_s": [x[0] if x else np.nan for x in self.times],
                "finish_s": self.finish,
                "token_times_s": self.times,
                "ok": ok,
                "error": np.where(ok, "", "unfinished"),
            }
        )[RECORD_COLUMNS]


def _prompts(df: pd.DataFrame, vocab: int, vocab_low: int, seed: int) -> list:
    if "prompt_ids" in df.columns:
        return df["prompt_ids"].tolist()
    rng = np.random.default_rng(seed)
    return [rng.integers(vocab_low, vocab, int(n)).tolist() for n in df["prompt_tokens"]]


def replay_on_engine(
    engine: Engine, trace, *, clock: str = "steps", vocab_low: int = 3, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run ``trace`` through ``engine`` (greedy, ``ignore_eos``, ``max_tokens`` = the trace's output tokens).
    Prompts are the trace's ``prompt_ids``, or random ids in ``[vocab_low, vocab)`` drawn from ``seed``."""
    if clock not in CLOCKS:
        raise ParameterError(f"clock must be one of {CLOCKS}, got {clock!r}")
    df = as_trace(trace).frame
    prompts = _prompts(df, engine.model.shape.vocab, vocab_low, seed)
    outputs = df["output_tokens"].to_numpy()
    arrivals = df["arrival_s"].to_numpy(float)
    n = len(df)
    book, log, clk = _Book(n), [], _Clock(clock)
    previous_hook, previous_config = engine.on_step, engine.config
    engine.on_step = lambda rec: log.append(clk.log_row(rec))
    # on the step clock a token is stamped with the step that computed it: read every step's tokens at once
    engine.config = dataclasses.replace(
        engine.config, async_scheduling=clock == "wall" and engine.config.async_scheduling
    )
    try:
        i = 0
        while i < n or engine.has_unfinished():
            t = clk.now()
            while i < n and arrivals[i] <= t:
                seq = engine.add_request(prompts[i], SamplingParams(max_tokens=int(outputs[i]), ignore_eos=True))
                book.by_seq[seq.seq_id] = i
                book.sent[i] = t if clock == "wall" else arrivals[i]
                i += 1
            if not engine.has_unfinished():
                clk.wait_until(arrivals[i])
                continue
            steps_before = engine.steps
            events = engine.step()
            if clock == "steps":
                clk.steps += engine.steps - steps_before  # a step that only preempted takes no time
            book.tokens(events, clk.now())
    finally:
        engine.on_step, engine.config = previous_hook, previous_config
    return book.records(df), pd.DataFrame(log, columns=STEP_LOG_COLUMNS)
