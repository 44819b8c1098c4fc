"""The engine bench's offline workload with the step graphs' packed tiles at several sizes, on the GPU.

``scripts/bench_ragged_tiles.py`` times one layer's attention; this asks what the tile size does to the numbers
issue 29 sets goals on: ``offline_tok_s`` (the default ``max_num_batched_tokens``, 8192) and the 512-token budget's
rate, whose ratio to it is ``offline_budget512_ratio``. Each setting builds its own engine (``EngineConfig()``, or
``max_num_batched_tokens=512``) with ``engine.step_graphs.ragged_tile_tokens`` replaced by a constant, so the step
graphs are captured with that packed-tile size; nothing else changes. The workload is the bench's: 256 requests,
prompt and output lengths U[100, 1024], temperature 0.6, EOS ignored (``bench.workload``), on Qwen2-0.5B's
architecture (random weights, bf16). The engines hold a fixed KV pool of 36,000 blocks (the default sizes it from
free memory), big enough that none preempts, so the settings' engines fit side by side. Each engine runs it
``--runs`` times after a warm-up (``bench.offline.run_offline``: wall clock, synchronised); the settings interleave
run by run, so a drift of the host's speed spreads over all of them. Writes one row per (budget, tile tokens, run).

    python scripts/bench_ragged_tiles_offline.py --out offline_tiles.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

import servelab.engine.step_graphs as step_graphs  # noqa: E402
from servelab.bench.offline import run_offline  # noqa: E402
from servelab.bench.workload import offline_workload  # noqa: E402
from servelab.engine import Engine, EngineConfig  # noqa: E402
from servelab.kernels.ragged import ragged_tile_tokens  # noqa: E402
from servelab.models import load_model  # noqa: E402


def build(hf, tile_tokens: int | None, budget: int | None) -> tuple[Engine, float]:
    """An engine whose step graphs use packed tiles of ``tile_tokens`` (None: the engine's own choice)."""
    step_graphs.ragged_tile_tokens = ragged_tile_tokens if tile_tokens is None else (lambda *_: tile_tokens)
    t0 = time.perf_counter()
    # a fixed pool, so the settings' engines fit on the GPU side by side (the workload needs at most 256 × 2,048
    # tokens: 32,768 blocks of 16; none is preempted either way)
    changes = {"num_blocks": 36_000}
    if budget is not None:
        changes.update(max_num_batched_tokens=budget, max_num_seqs=min(256, budget))
    try:
        engine = Engine.from_hf(hf, EngineConfig(**changes))
    finally:
        step_graphs.ragged_tile_tokens = ragged_tile_tokens
    return engine, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="config:qwen2-0.5b")
    ap.add_argument("--tiles", default="16,2", help="packed-tile sizes in tokens, comma-separated")
    ap.add_argument("--budgets", default="default,512")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (no step graphs there)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    hf = load_model(args.model, dtype=dtype, device=args.device, seed=0, load_tokenizer=False).model
    name = torch.cuda.get_device_name() if cuda else "cpu"
    vocab = hf.config.vocab_size
    work = offline_workload(args.num_requests, min(100, args.max_len), args.max_len, vocab=vocab, seed=0)
    warm = offline_workload(16, 8, 32, vocab=vocab, seed=1)
    print(f"{name}: {args.model}, {work.num_requests} requests, {work.output_tokens} tokens")
    rows = []
    for budget in args.budgets.split(","):
        b = None if budget == "default" else int(budget)
        engines = {}
        for tt in (int(t) for t in args.tiles.split(",")):
            engine, build_s = build(hf, tt, b)
            run_offline(engine, warm)
            engines[tt] = engine
            print(f"budget {budget}, tiles of {tt}: built in {build_s:.1f} s")
        for i in range(args.runs):
            for tt, engine in engines.items():
                st0 = engine.stats()
                res = run_offline(engine, work)
                st = engine.stats()
                steps = {k: st[k] - st0[k] for k in ("graph_steps", "step_graph_steps", "eager_steps")}
                rows.append(dict(device=name, budget=budget, tile_tokens=tt, run=i, **res,
                                 **steps))  # fmt: skip
                print(f"budget {budget}, tiles of {tt}, run {i}: {res['tok_s']:,.0f} tok/s {steps}")
        for tt in engines:
            rates = [r["tok_s"] for r in rows if r["budget"] == budget and r["tile_tokens"] == tt]
            print(f"budget {budget}, tiles of {tt}: median {statistics.median(rates):,.0f} tok/s "
                  f"({min(rates):,.0f}-{max(rates):,.0f})")  # fmt: skip
        del engines
        if cuda:
            torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
