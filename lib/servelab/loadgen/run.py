"""Open-loop replay of a trace against a server: ``run_load(base_url, trace) -> records``.

Each request is sent at its arrival time (seconds after the run starts) whatever the server is doing, as
real users would (open loop: a slow server does not slow the arrivals down). All requests stream
concurrently on one aiohttp session. A ``deadline_s`` bounds the run: requests still streaming then are
cancelled (the client disconnects, so the server frees their KV blocks) and recorded as failed with the
tokens they had received; requests not yet sent are recorded as failed without being sent.
"""

from __future__ import annotations

import asyncio
import math
import time

import aiohttp
import numpy as np
import pandas as pd

from servelab.errors import ParameterError
from servelab.loadgen.client import StreamResult, completion_body, stream_completion
from servelab.loadgen.metrics import RECORD_COLUMNS
from servelab.loadgen.workload import Trace

DEADLINE_ERROR = "cut at the run's deadline"


async def _replay(
    base_url: str,
    trace: Trace,
    *,
    model: str | None,
    api_key: str | None,
    deadline_s: float,
    progress,
    request_timeout_s: float,
) -> tuple[float, list[StreamResult]]:
    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    df = trace.frame
    results = [StreamResult() for _ in range(len(df))]
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=request_timeout_s)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        t0 = time.perf_counter()

        async def one(i: int, arrival: float, prompt, n_out: int):
            delay = t0 + arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = completion_body(prompt, n_out, model)
            await stream_completion(session, url, body, headers, res=results[i])
            if progress is not None:
                progress.update(1)

        prompts = df["prompt_ids"].map(list) if "prompt_ids" in df else df["prompt"].astype(str)
        tasks = [
            asyncio.create_task(one(i, float(a), p, int(n)))
            for i, (a, p, n) in enumerate(zip(df["arrival_s"], prompts, df["output_tokens"], strict=True))
        ]
        done, pending = await asyncio.wait(tasks, timeout=deadline_s if math.isfinite(deadline_s) else None)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    return t0, results


def run_load(
    base_url: str,
    trace: Trace,
    *,
    model: str | None = None,
    api_key: str | None = None,
    deadline_s: float = math.inf,
    progress: bool | object = False,
    request_timeout_s: float = 600.0,
) -> pd.DataFrame:
    """Replay ``trace`` (its ``prompt_ids``, else its text ``prompt``) against ``base_url`` and return the records
    (``servelab.loadgen.metrics.RECORD_COLUMNS``), times in seconds from the run's start.

    ``records.attrs`` holds ``t0_perf_s`` (the run's start on ``time.perf_counter``, to put a server step
    log on the same axis), ``deadline_s`` and ``duration_s`` (first send to last finish, s). ``progress``:
    True for a tqdm bar, or a tqdm-like object to update.
    """
    if not isinstance(trace, Trace):
        raise ParameterError(f"run_load needs a Trace, got {type(trace).__name__}")
    if not trace.has_prompt_ids and "prompt" not in trace.frame.columns:
        raise ParameterError("the trace has neither prompt_ids nor prompt text: call trace.with_prompt_ids(vocab_size)")
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ParameterError(f"base_url must be an http(s) URL, got {base_url!r}")
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not deadline_s > 0:
        raise ParameterError(f"deadline_s must be a positive number of seconds, got {deadline_s!r}")
    bar, own_bar = progress, False
    if progress is True:
        from tqdm.auto import tqdm

        bar, own_bar = tqdm(total=len(trace), unit="req", desc="requests", leave=False), True
    elif progress is False:
        bar = None
    try:
        t0, results = asyncio.run(
            _replay(
                base_url,
                trace,
                model=model,
                api_key=api_key,
                deadline_s=deadline_s,
                progress=bar,
                request_timeout_s=request_timeout_s,
            )
        )
    finally:
        if own_bar:
            bar.close()
    return records_from_results(trace, results, t0, deadline_s)


def records_from_results(
    trace: Trace, results: list[StreamResult], t0: float, deadline_s: float = math.inf
) -> pd.DataFrame:
    """Turn the client's results into records on the run's time axis (seconds since ``t0``), with the
    trace's ``target_output_tokens`` beside the schema's columns.

    The cut is exact at ``deadline_s``: a token that came after it is dropped, and a request that finished after it
    is cut there. The client cancels its streams when the event loop gets round to the deadline, which on a busy
    loop is later (Study 1 on the H200: a median of up to 94 ms per run), and the records would otherwise hold
    tokens and completions past the horizon that every rule reading them assumes."""
    rows = []
    cut_at = t0 + deadline_s if math.isfinite(deadline_s) else math.inf
    for rec, r in zip(trace.frame.itertuples(index=False), results, strict=True):
        times = [t - t0 for t in r.token_times if t <= cut_at]
        ok = bool(r.ok) and r.finish <= cut_at
        error = "" if ok else r.error
        if not ok and not error:
            error = DEADLINE_ERROR
        rows.append(
            {
                "request_id": int(rec.request_id),
                "arrival_s": float(rec.arrival_s),
                "prompt_tokens": int(rec.prompt_tokens),
                "output_tokens": len(times),
                "sent_s": r.sent - t0,
                "first_token_s": times[0] if times else np.nan,
                "finish_s": (r.finish - t0) if ok else (times[-1] if times else np.nan),
                "token_times_s": times,
                "ok": ok,
                "error": error,
                "target_output_tokens": int(rec.output_tokens),
            }
        )
    # beyond the schema: the trace's output length, which a cut request did not reach (a replay needs it)
    df = pd.DataFrame(rows, columns=RECORD_COLUMNS + ["target_output_tokens"])
    df.attrs["t0_perf_s"] = t0
    df.attrs["deadline_s"] = deadline_s
    ok = df[df["ok"]]
    df.attrs["duration_s"] = float(ok["finish_s"].max() - df["sent_s"].min()) if len(ok) else float("nan")
    return df
