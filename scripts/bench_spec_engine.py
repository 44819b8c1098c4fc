"""What the engine's speculative mode costs on a GPU (issue 30): c, a draft step against a target step, and the
verify step against a plain decode step, at batch 1 and 8.

    python scripts/bench_spec_engine.py [--target config:llama-3-8b] [--draft config:qwen2-0.5b-vocab128k]
                                        [--gamma 4] [--batch 1 8] [--out spec_engine.csv]

Random weights (``config:``) cost what trained ones cost, but a random draft agrees with a random target on almost
nothing, so the speed-up measured here is the one at acceptance ≈ 0: the costs are the point, and Leviathan's
model turns them into the speed-up at any acceptance (``c`` and the verify step's price are its inputs). Each
phase is timed with CUDA events around whole engine steps after a warm-up request; medians with the quartiles.
Development data, not a book figure.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from servelab.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from servelab.engine.speculative_engine import SpeculativeEngine, load_draft  # noqa: E402
from servelab.models import load_model  # noqa: E402
from servelab.speculative.config import SpeculativeConfig  # noqa: E402


class Timer:
    """CUDA-event times (ms) of the calls of one method, wrapped in place."""

    def __init__(self, owner, name: str):
        self.times: list[float] = []
        self._pending: list[tuple] = []
        inner = getattr(owner, name)

        def timed(*a, **kw):
            if not torch.cuda.is_available():  # a CPU smoke run (--device cpu): wall time
                t0 = time.perf_counter()
                out = inner(*a, **kw)
                self.times.append((time.perf_counter() - t0) * 1e3)
                return out
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = inner(*a, **kw)
            end.record()
            self._pending.append((start, end))
            return out

        setattr(owner, name, timed)

    def read(self) -> list[float]:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.times += [s.elapsed_time(e) for s, e in self._pending]
        self._pending.clear()
        return self.times


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 4:
        m = statistics.median(xs) if xs else float("nan")
        return m, m, m
    q = statistics.quantiles(xs, n=4)
    return q[1], q[0], q[2]


def run(engine, prompts, new: int) -> None:
    engine.generate(prompts, SamplingParams(max_tokens=new, ignore_eos=True))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="config:llama-3-8b")
    ap.add_argument("--draft", default="config:qwen2-0.5b-vocab128k")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--out", default="spec_engine.csv")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = args.device
    cfg = EngineConfig(num_blocks=2048, max_model_len=1024, max_num_seqs=max(args.batch), block_size=16)
    hf = load_model(args.target, dtype="bfloat16", device=dev, load_tokenizer=False).model
    draft = load_draft(args.draft, dtype="bfloat16", device=dev)
    vocab = hf.config.vocab_size
    g = torch.Generator().manual_seed(0)
    rows = []
    plain = Engine.from_hf(hf, cfg)
    spec = SpeculativeEngine.from_hf(
        hf, cfg, speculative=SpeculativeConfig("draft_model", args.gamma, args.draft), draft=draft
    )
    for b in args.batch:
        prompts = [torch.randint(3, vocab, (args.prompt,), generator=g).tolist() for _ in range(b)]
        run(plain, prompts, 8)  # warm-up: compile caches, graphs, allocator
        t_plain = Timer(plain, "step")
        run(plain, prompts, args.new)
        plain_ms = t_plain.read()[1:]  # the first step is the prefill
        run(spec, prompts, 8)
        t_step, t_draft = Timer(spec, "step"), Timer(spec.draft, "propose")
        t_verify = Timer(spec, "_verify_step")
        run(spec, prompts, args.new)
        steps, drafts, verifies = t_step.read()[1:], t_draft.read(), t_verify.read()
        for name, xs in (
            ("plain decode step", plain_ms),
            ("spec step", steps),
            ("draft round", drafts),
            ("verify step", verifies),
        ):
            med, lo, hi = quartiles(xs)
            rows.append(
                {"batch": b, "gamma": args.gamma, "what": name, "ms": med, "p25_ms": lo, "p75_ms": hi, "n": len(xs)}
            )
        c = quartiles(drafts)[0] / args.gamma / quartiles(plain_ms)[0]
        v = quartiles(verifies)[0] / quartiles(plain_ms)[0]
        s = spec.spec_stats
        rows.append({"batch": b, "gamma": args.gamma, "what": "c (draft step / target step)", "ms": c})
        rows.append({"batch": b, "gamma": args.gamma, "what": "verify step / plain step", "ms": v})
        rows.append({"batch": b, "gamma": args.gamma, "what": "acceptance", "ms": s.acceptance_rate})
        spec.spec_stats = type(s)(args.gamma)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["batch", "gamma", "what", "ms", "p25_ms", "p75_ms", "n"])
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f"b{r['batch']:<3} {r['what']:<30} {r['ms']:.4f}  [{r.get('p25_ms', '')}, {r.get('p75_ms', '')}]")
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(name, plain.stats()["compile"], spec.draft.compile_status, spec.draft.num_graphs)


if __name__ == "__main__":
    main()
