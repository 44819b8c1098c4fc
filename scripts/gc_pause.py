"""How long a full garbage collection pauses a process that holds a built engine, and what freezing the heap after
warm-up leaves of it (vLLM's ``freeze_gc_heap``: ``gc.collect(); gc.freeze()`` once the server is up).

    python scripts/gc_pause.py [--spec config:qwen2-0.5b] [--device cuda] [--repeats 5] [--out gc_pause.csv]

For each stage (imports only; the engine built and warmed up like the server's ``--warmup``; the same after
``gc.freeze()``) it prints the objects the collector tracks and the median of ``--repeats`` full collections.
Python's collector runs a full collection by itself once the objects that survived into the oldest generation
since the last one reach a quarter of it, so in a long-running server the pause arrives at a time no one chose: a
step held on the host for its length. A development diagnostic (data/dev/), not a book figure.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time


def full_collection_ms(repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="config:qwen2-0.5b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 elsewhere")
    ap.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--num-blocks", type=int, default=None, help="the KV pool's blocks (default: the engine's)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch

    from servelab.engine import Engine, EngineConfig
    from servelab.server.flags import warm_up

    rows = [("imports", len(gc.get_objects()), full_collection_ms(a.repeats))]
    dtype = a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32")
    compile_ = {"auto": "auto", "on": True, "off": False}[a.compile]
    cfg = EngineConfig(compile=compile_, num_blocks=a.num_blocks or (None if a.device.startswith("cuda") else 512))
    engine = Engine.from_spec(a.spec, dtype=dtype, device=a.device, config=cfg)
    warm_up(engine)
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()
    rows.append(("engine built and warmed up", len(gc.get_objects()), full_collection_ms(a.repeats)))
    gc.freeze()  # what the server would do once warm: the objects alive now leave the collector's view
    rows.append(("the same after gc.freeze()", len(gc.get_objects()), full_collection_ms(a.repeats)))
    gc.unfreeze()
    print(f"{a.spec} on {a.device} ({dtype}, compile {a.compile}), median of {a.repeats} full collections:")
    for stage, objects, ms in rows:
        print(f"  {stage:<30} {objects:>10,} objects tracked   {ms:8.1f} ms")
    if a.out:
        import pandas as pd

        pd.DataFrame(rows, columns=["stage", "objects", "full_collection_ms"]).assign(
            spec=a.spec, device=a.device, dtype=dtype, compile=a.compile
        ).to_csv(a.out, index=False)
    del engine


if __name__ == "__main__":
    main()
