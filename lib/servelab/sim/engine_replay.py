"""Drive the real engine with a trace, in-process, and record what the load generator would: the simulator's
reference when there is no server run to compare with (CPU tests, the smoke notebook).

Two clocks:

- ``clock="steps"``: time counts engine steps (each step lasts 1 s; idle time jumps to the next arrival).
  Deterministic, so a simulation with ``StepCostModel.constant(1000)`` must give exactly the same per-request
  first-token and finish times (``tests/test_sim_engine_order.py``). The engine reads each step's tokens
  before the next step (no async scheduling), so a token counts in the step that computed it;
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


def replay_on_engine(
    engine: Engine, trace, *, clock: str = "steps", vocab_low: int = 3, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run ``trace`` through ``engine`` (greedy, ``ignore_eos``, ``max_tokens`` = the trace's output tokens).
    Prompts are the trace's ``prompt_ids``, or random ids in ``[vocab_low, vocab)`` drawn from ``seed``."""
    if clock not in CLOCKS:
        raise ParameterError(f"clock must be one of {CLOCKS}, got {clock!r}")
    df = as_trace(trace).frame
    rng = np.random.default_rng(seed)
    vocab = engine.model.shape.vocab
    prompts = (
        df["prompt_ids"].tolist()
        if "prompt_ids" in df.columns
        else [rng.integers(vocab_low, vocab, int(n)).tolist() for n in df["prompt_tokens"]]
    )
    arrivals = df["arrival_s"].to_numpy(float)
    n = len(df)
    times: list[list[float]] = [[] for _ in range(n)]
    finish = np.full(n, np.nan)
    sent = np.full(n, np.nan)
    by_seq: dict[int, int] = {}
    log: list[tuple] = []
    now_steps = [0.0]
    t_wall0 = time.perf_counter()

    def now() -> float:
        return now_steps[0] if clock == "steps" else time.perf_counter() - t_wall0

    def on_step(rec):
        if clock == "steps":
            log.append(
                (
                    now_steps[0],
                    now_steps[0] + 1.0,
                    rec.prefill_tokens,
                    rec.decode_tokens,
                    rec.num_seqs,
                    rec.num_waiting,
                    rec.num_preempted,
                    rec.decode_steps,
                )
            )
        else:
            log.append(
                (
                    rec.start_s - t_wall0,
                    rec.end_s - t_wall0,
                    rec.prefill_tokens,
                    rec.decode_tokens,
                    rec.num_seqs,
                    rec.num_waiting,
                    rec.num_preempted,
                    rec.decode_steps,
                )
            )

    previous_hook, previous_config = engine.on_step, engine.config
    engine.on_step = on_step
    # on the step clock a token is stamped with the step that computed it: read every step's tokens at once
    engine.config = dataclasses.replace(
        engine.config, async_scheduling=clock == "wall" and engine.config.async_scheduling
    )
    try:
        i = 0
        while i < n or engine.has_unfinished():
            t = now()
            while i < n and arrivals[i] <= t:
                seq = engine.add_request(
                    prompts[i], SamplingParams(max_tokens=int(df["output_tokens"].iat[i]), ignore_eos=True)
                )
                by_seq[seq.seq_id] = i
                sent[i] = t if clock == "wall" else arrivals[i]
                i += 1
            if not engine.has_unfinished():
                if clock == "steps":
                    now_steps[0] = arrivals[i]
                else:
                    time.sleep(max(0.0, arrivals[i] - now()))
                continue
            steps_before = engine.steps
            events = engine.step()
            if clock == "steps":
                now_steps[0] += engine.steps - steps_before  # a step that only preempted takes no time
            t_tok = now()
            for ev in events:
                j = by_seq[ev.seq_id]
                times[j].append(t_tok)
                if ev.finished:
                    finish[j] = t_tok
    finally:
        engine.on_step, engine.config = previous_hook, previous_config
    ok = ~np.isnan(finish)
    records = pd.DataFrame(
        {
            "request_id": df["request_id"].to_numpy(),
            "arrival_s": arrivals,
            "prompt_tokens": df["prompt_tokens"].to_numpy(),
            "output_tokens": [len(x) for x in times],
            "sent_s": sent,
            "first_token_s": [x[0] if x else np.nan for x in times],
            "finish_s": finish,
            "token_times_s": times,
            "ok": ok,
            "error": np.where(ok, "", "unfinished"),
        }
    )[RECORD_COLUMNS]
    steps = pd.DataFrame(
        log,
        columns=[
            "start_s",
            "end_s",
            "prefill_tokens",
            "decode_tokens",
            "num_seqs",
            "num_waiting",
            "num_preempted",
            "decode_steps",
        ],
    )
    return records, steps
