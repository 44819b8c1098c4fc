"""Where a user's latency goes beyond the forward: ``mixed_step_ms`` and ``e2e_ms_per_token_b1``.

- ``mixed_step_ms``: one step of D decodes at context C plus a prefill chunk of N tokens (``plan.mixed_step``),
  next to the sum of the same decodes and the same chunk each measured alone. Each row of ``latency.csv``
  also holds the host's time to build the step's inputs and launch it (``host_ms``: the call returns before
  the GPU is done, so on a GPU this is the CPU side alone).
- ``e2e_ms_per_token_b1``: one request through ``Engine.generate`` (wall time per output token, prefill
  included), next to the captured forward of one decode step at the request's middle context. The step
  loop's share is their ratio (``e2e_over_forward_b1``); the step log's medians (host, device, wait) say
  where it goes. With ``extra_settings``, the same request with async scheduling off, labelled.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from servelab.bench.offline_rows import default_engine
from servelab.bench.rows import ratio
from servelab.bench.session import BenchSession

NAN = float("nan")


# the sync row's setting as a switch row names it (the engine page reads key=value before "(not the default)")
SYNC_SETTING = "async_scheduling=False (not the default)"


def host_ms(s: BenchSession, fn, repeats: int) -> float:
    """Median ms until ``fn()`` returns, the device idle at each call: the host's share of a step."""
    samples = []
    for _ in range(repeats):
        s.sync()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    s.sync()
    return statistics.median(samples) * 1e3


def time_step(s: BenchSession, label: str, batch, new_tokens, context, decodes=0, decode_context=0) -> dict:
    """One ``latency.csv`` row for an engine step of the default configuration."""
    from servelab.bench.step import engine_step
    from servelab.measure import time_fn

    fn = None
    row = dict(what=label, batch=batch, new_tokens=new_tokens, context=context, decodes=decodes)
    row["decode_context"] = decode_context
    try:
        kinds = dict(decodes=decodes, decode_context=decode_context)
        fn, _ = engine_step(s.hf, batch, new_tokens, context, **kinds, seed=s.plan.seed, compile="auto")
        t = time_fn(fn, warmup=3, repeats=s.plan.repeats, device=s.plan.device)
        row.update(median_ms=t.median_ms, p25_ms=t.p25_ms, p75_ms=t.p75_ms, status="ok")
        row.update(host_ms=host_ms(s, fn, max(3, s.plan.repeats // 3)), path=fn.path())
    except Exception as e:
        row.update(median_ms=NAN, status=f"{type(e).__name__}: {e}"[:300])
    finally:
        fn = None
        s.free()
    s.latency_rows.append(row)
    s.log(f"{label}: {row['median_ms']:.3f} ms ({row['status'][:80]})")
    return row


def mixed_section(s: BenchSession) -> None:
    d, dctx, chunk = s.plan.mixed_step
    if s.clock.left() < 60:
        s.add("mixed_step_ms", NAN, "ms", None, "skipped: time budget")
        return
    mixed = time_step(s, "mixed step", 1, chunk, 0, d, dctx)
    dec = time_step(s, "its decodes alone", d, 1, dctx)
    pre = time_step(s, "its chunk alone", 1, chunk, 0)
    parts = dec["median_ms"] + pre["median_ms"]
    floor = float(
        s.roof.floor_ms(
            s.shape.decode_flops(d, dctx) + s.shape.prefill_flops(chunk), s.shape.decode_bytes(d, dctx, s.dtype_bytes)
        )
    )
    note = (
        f"{d} decodes at context {dctx} + a {chunk}-token first chunk, default configuration ({mixed.get('path')}); "
        f"bound: the decodes alone {dec['median_ms']:.3f} ms + the chunk alone {pre['median_ms']:.3f} ms; "
        f"roofline floor {floor:.3f} ms; host time to build and launch: mixed {mixed.get('host_ms', NAN):.3f} ms, "
        f"decodes {dec.get('host_ms', NAN):.3f} ms, chunk {pre.get('host_ms', NAN):.3f} ms"
        + ("" if s.cuda else " (CPU: the whole step)")
    )
    s.add("mixed_step_ms", mixed["median_ms"], "ms", parts, note)
    s.flush()


def generate_ms_per_token(s: BenchSession, engine, prompt, out: int, repeats: int) -> tuple[float, list]:
    """Median wall ms per output token of ``engine.generate([prompt])``, and the last run's step log."""
    from servelab.engine import SamplingParams

    params = SamplingParams(max_tokens=out, ignore_eos=True)
    engine.generate([prompt[:8]], SamplingParams(max_tokens=8, ignore_eos=True))  # first-use costs
    times, records = [], []
    for _ in range(repeats):
        records.clear()
        engine.on_step = records.append
        s.sync()
        t0 = time.perf_counter()
        engine.generate([prompt], params)
        s.sync()
        times.append(time.perf_counter() - t0)
    engine.on_step = None
    return statistics.median(times) * 1e3 / out, list(records)


def step_log_summary(records) -> str:
    """Medians of the step log's host, device and wait times, and how many steps overlapped."""

    def med(name):
        vals = [getattr(r, name) for r in records if getattr(r, name) == getattr(r, name)]
        return statistics.median(vals) if vals else NAN

    overlapped = sum(r.overlapped for r in records)
    return (
        f"per step (median): host {med('host_ms'):.3f} ms, device {med('device_ms'):.3f} ms, "
        f"wait {med('wait_ms'):.3f} ms; {overlapped} of {len(records)} steps overlapped"
    )


def e2e_section(s: BenchSession) -> None:
    import torch

    from servelab.bench.step import engine_step
    from servelab.engine import Engine
    from servelab.measure import time_fn

    p = s.plan
    prompt_len, out = p.e2e_tokens
    if s.clock.left() < 60:
        s.add("e2e_ms_per_token_b1", NAN, "ms/token", None, "skipped: time budget")
        return
    spec = p.e2e_model or p.model
    model = s.hf if spec == p.model else s.load(spec)
    engine = default_engine(s) if model is s.hf else Engine.from_hf(model)
    g = torch.Generator().manual_seed(p.seed)
    prompt = torch.randint(0, model.config.vocab_size, (prompt_len,), generator=g).tolist()
    repeats = max(3, p.repeats // 5)
    e2e, records = generate_ms_per_token(s, engine, prompt, out, repeats)
    fn, _ = engine_step(model, 1, 1, prompt_len + out // 2, seed=p.seed, compile="auto")
    forward = time_fn(fn, warmup=3, repeats=p.repeats, device=p.device).median_ms
    fn = None
    st = engine.stats()
    note = (
        f"{spec}, one request: {prompt_len}-token prompt, {out} output tokens (greedy, EOS ignored), wall time / "
        f"{out}; median of {repeats}; default configuration (compile {st['compile']}, async "
        f"{st['async_scheduling']}); bound: the captured forward alone at batch 1, context "
        f"{prompt_len + out // 2}; " + step_log_summary(records)
    )
    s.add("e2e_ms_per_token_b1", e2e, "ms/token", forward, note)
    s.add("e2e_over_forward_b1", ratio(e2e, forward), "x", None, "e2e_ms_per_token_b1 / the captured forward alone")
    if p.extra_settings:
        engine.config = dataclasses.replace(engine.config, async_scheduling=False)
        try:
            sync, records = generate_ms_per_token(s, engine, prompt, out, repeats)
        finally:
            engine.config = dataclasses.replace(engine.config, async_scheduling=True)
        note = f"{SYNC_SETTING}; " + step_log_summary(records)
        s.add("e2e_ms_per_token_b1_sync", sync, "ms/token", forward, note)
    engine = model = None
    s.free()
    s.flush()
