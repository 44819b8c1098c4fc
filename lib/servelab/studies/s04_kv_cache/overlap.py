"""F4.4: compaction during active decode: alone, serialised, and overlapped on two CUDA streams.

Five conditions, each timed as one unit of work:

- ``compaction_alone``: one compaction on the side stream;
- ``decode_alone``:     ``decode_steps`` decode steps on the main stream;
- ``serialised``:       the decode steps, then the compaction (side stream waits for main);
- ``concurrent``:       the compaction queued on the side stream, the decode steps on the main stream at once;
- ``concurrent_prioritised``: the same, with the decode on a high-priority stream (the GPU's block scheduler then
  hands freed SMs to the decode's kernels first, instead of to the compaction's remaining thread blocks).

CUDA events on each stream give the compaction's own time (side stream), the decode's own time (main stream)
and the whole (from the first launch to both streams done). Conditions are interleaved in a random order
each round, so clock drift and thermal state fall on all of them alike.

The reporting path (``derived.overlap_summary``) turns the rounds into the verdict's numbers. The seed's claim can be
read two ways, and both are reported: (a) the compaction itself runs faster while
decode is active; (b) compaction + decode take less wall time overlapped than serialised.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pandas as pd

CONDITIONS = ("compaction_alone", "decode_alone", "serialised", "concurrent", "concurrent_prioritised")


class OverlapRig:
    """Runs one condition of compaction (``compact_fn``) and ``decode_steps`` × ``decode_fn`` and times its parts.

    ``compact_fn`` and ``decode_fn`` just queue work on the current stream; the rig chooses the stream.
    """

    def __init__(
        self, decode_fn: Callable[[], object], compact_fn: Callable[[], object], decode_steps: int, device="cuda"
    ):
        import torch

        if decode_steps < 1:
            raise ValueError(f"decode_steps must be >= 1, got {decode_steps}")
        self.decode_fn, self.compact_fn, self.decode_steps = decode_fn, compact_fn, decode_steps
        self.cuda = torch.device(device).type == "cuda"
        if self.cuda:
            self.main = torch.cuda.current_stream(device)
            self.side = torch.cuda.Stream(device)
            try:  # out-of-range priorities map to the highest the device has (lower number = higher priority)
                self.high = torch.cuda.Stream(device, priority=-100)
            except (RuntimeError, ValueError):  # an older build that refuses out-of-range values
                self.high = torch.cuda.Stream(device, priority=-1)

    @property
    def conditions(self) -> tuple[str, ...]:
        """Every condition on CUDA; on the CPU there are no streams to overlap on, so no ``concurrent``."""
        return CONDITIONS if self.cuda else CONDITIONS[:3]

    def _decode(self):
        for _ in range(self.decode_steps):
            self.decode_fn()

    def run(self, condition: str) -> dict:
        """Run ``condition`` once; return ``compaction_ms``, ``decode_ms``, ``total_ms`` (NaN for parts not run)."""
        if condition not in self.conditions:
            raise ValueError(f"condition must be one of {self.conditions}, got {condition!r}")
        return self._run_cuda(condition) if self.cuda else self._run_cpu(condition)

    def _run_cpu(self, condition: str) -> dict:
        out = dict(compaction_ms=np.nan, decode_ms=np.nan)
        t0 = time.perf_counter()
        if condition in ("decode_alone", "serialised"):
            a = time.perf_counter()
            self._decode()
            out["decode_ms"] = (time.perf_counter() - a) * 1e3
        if condition in ("compaction_alone", "serialised"):
            a = time.perf_counter()
            self.compact_fn()
            out["compaction_ms"] = (time.perf_counter() - a) * 1e3
        out["total_ms"] = (time.perf_counter() - t0) * 1e3
        return out

    def _run_cuda(self, condition: str) -> dict:
        import torch

        ev = {k: torch.cuda.Event(enable_timing=True) for k in ("start", "c0", "c1", "d0", "d1", "end")}
        main, side = self.main, self.side
        decode_stream = self.high if condition == "concurrent_prioritised" else main
        ev["start"].record(main)

        def compaction():
            side.wait_stream(main)  # after everything queued on main so far (the start event, or the decode)
            with torch.cuda.stream(side):
                ev["c0"].record(side)
                self.compact_fn()
                ev["c1"].record(side)

        def decode():
            decode_stream.wait_stream(main)  # a no-op on main itself
            with torch.cuda.stream(decode_stream):
                ev["d0"].record(decode_stream)
                self._decode()
                ev["d1"].record(decode_stream)

        if condition == "compaction_alone":
            compaction()
        elif condition == "decode_alone":
            decode()
        elif condition == "serialised":
            decode()
            compaction()
        else:  # concurrent: compaction queued first on the side stream, decode right behind it
            compaction()
            decode()
        main.wait_stream(side)
        main.wait_stream(decode_stream)
        ev["end"].record(main)
        ev["end"].synchronize()
        ran_c = condition != "decode_alone"
        ran_d = condition != "compaction_alone"
        return dict(
            compaction_ms=ev["c0"].elapsed_time(ev["c1"]) if ran_c else np.nan,
            decode_ms=ev["d0"].elapsed_time(ev["d1"]) if ran_d else np.nan,
            total_ms=ev["start"].elapsed_time(ev["end"]),
        )


def overlap_experiment(rig: OverlapRig, rounds: int = 30, warmup_rounds: int = 3, seed: int = 0) -> pd.DataFrame:
    """``rounds`` rounds of every condition in a fresh random order; one row per (round, condition)."""
    if rounds < 3:
        raise ValueError(f"rounds must be >= 3 to give a spread, got {rounds}")
    rng = np.random.default_rng(seed)
    conds = list(rig.conditions)
    for _ in range(warmup_rounds):
        for c in conds:
            rig.run(c)
    rows = []
    for r in range(rounds):
        for pos, c in enumerate(rng.permutation(conds)):
            rows.append(dict(round=r, order=pos, condition=str(c), **rig.run(str(c))))
    return pd.DataFrame(rows)


def build_rig(
    model,
    *,
    batch: int,
    context: int,
    pool_mib: int,
    block_size: int,
    move_fraction: float,
    live_fraction: float = 0.5,
    seed: int = 0,
) -> tuple[OverlapRig, dict]:
    """Decode of ``model`` (``batch`` × ``context``; CUDA graph on a GPU, eager on the CPU) and a gather/scatter
    compaction of a ``pool_mib`` pool with the model's KV geometry; ``decode_steps`` is chosen so the decode
    takes about as long as the compaction (the most overlap there is to find)."""
    import torch

    from servelab.bench.hf_modes import cuda_graph_step, eager_step
    from servelab.kv.compaction import block_index, move_gather_scatter, plan_compaction
    from servelab.kv.pool import KVPool
    from servelab.measure.timing import time_fn
    from servelab.studies.s04_kv_cache.bytes_per_token import KVGeometry
    from servelab.studies.s04_kv_cache.compaction_bench import fragmented_manager

    dev = model.device
    geom = KVGeometry.from_config(model.config)
    per_block = KVPool.block_bytes(geom, block_size, model.dtype)
    num_blocks = pool_mib * 2**20 // per_block
    if num_blocks < 4:
        raise ValueError(f"a {pool_mib} MiB pool holds only {num_blocks} blocks of {per_block} bytes")
    gen = torch.Generator(device=dev).manual_seed(seed)
    pool = KVPool(geom.layers, num_blocks, block_size, geom.kv_heads, geom.head_dim, model.dtype, dev).fill_random(gen)
    plan = plan_compaction(
        fragmented_manager(num_blocks, block_size, live_fraction, move_fraction, np.random.default_rng(seed))
    )
    src, dst = block_index(pool, plan.src), block_index(pool, plan.dst)

    def compact_fn():
        move_gather_scatter(pool, src, dst)

    mode = "hf_cuda_graph" if dev.type == "cuda" else "hf_eager"
    fallback = None
    if mode == "hf_cuda_graph":
        try:
            replay, rewind = cuda_graph_step(model, batch, 1, context)

            def decode_fn():
                rewind()  # tiny kernels that put the static cache's write counter back; replays would overrun it
                replay()
        except RuntimeError as e:  # a model HF cannot capture still gets measured, eagerly, and says so
            mode, fallback = "hf_eager", f"CUDA graph capture failed: {str(e).splitlines()[0][:160]}"
            torch.cuda.synchronize()
    if mode == "hf_eager":
        step, before = eager_step(model, batch, 1, context)

        def decode_fn():
            before()  # eager decode appends to HF's cache: restore the context so every step reads the same
            step()

    t_comp = time_fn(compact_fn, warmup=2, repeats=5, device=dev).median_ms
    t_step = time_fn(decode_fn, warmup=2, repeats=5, device=dev).median_ms
    steps = max(1, round(t_comp / t_step))
    info = dict(
        pool_mib=pool_mib,
        pool_blocks=num_blocks,
        block_size=block_size,
        blocks_moved=plan.moved,
        bytes_moved=plan.moved * per_block,
        decode_batch=batch,
        decode_context=context,
        decode_mode=mode,
        decode_mode_note=fallback,
        decode_steps=steps,
        probe_compaction_ms=t_comp,
        probe_decode_step_ms=t_step,
    )
    return OverlapRig(decode_fn, compact_fn, steps, dev), info
