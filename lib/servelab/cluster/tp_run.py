"""What splitting one model over N GPUs does to the time to first token and to a decode step: the tensor
parallel table of the "Beyond one GPU" page (issue 31).

    python -m servelab.cluster.tp_run config:llama-3-8b --sizes 1 2 4 --repeat 0

For each size N it builds the model split over N processes, one GPU each (``tp_engine.engine_from_spec(...,
tensor_parallel_size=N)``; N = 1 is the plain engine, with the same settings), and for each batch size and prompt
length it times, after one untimed warm-up of each, ``--samples`` calls of each of two generations, greedy with
EOS ignored: one token (``first``: the prefill and the first token, the batch's time to first token) and
``--new-tokens`` tokens (``whole``). A sample's decode step is ``(whole - first) / (new_tokens - 1)``, pairing the
k-th samples of each; the page takes medians. Every rank runs each generation in lockstep, so the all-reduces sit
inside the times. On CUDA each call is bracketed by CUDA events on the driver's stream (rank 0's GPU), recorded
before the call's first launch and after its last; the host reads the tokens inside each call, so the events and
the host agree on where a call ends. On CPUs the clock is ``perf_counter``, and the times mean nothing.

It writes, under ``--out`` (default: the book's layout,
``data/results/<device>-x<GPUs>/09_beyond_one_gpu/runs/<fingerprint>/tp/r<repeat>/``): ``samples.csv`` (one row per
timed call), ``tokens.csv`` (each sequence's greedy tokens, from the warm-up of the longer generation) and
``run.json``, the device record with clocks at the start and the end. Repeat ``r`` draws its prompts with seed
``--seed`` + ``r``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from servelab.cluster.run_record import machine_record, run_folder, write_run
from servelab.errors import ParameterError
from servelab.measure.fingerprint import fingerprint

PART = "tp"
BLOCK = 16  # the KV pool is sized in blocks of this many tokens: the engine's default block size


def prompts_for(batch: int, tokens: int, vocab: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of ``tokens`` ids each, drawn uniformly below ``vocab`` (ids 0-9 left out: a random-init
    model has no special tokens, and ``ignore_eos`` keeps a trained one going)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + batch * 10_007 + tokens)
    return torch.randint(10, vocab, (batch, tokens), generator=g).tolist()


class Clock:
    """Milliseconds of a call: CUDA events on the current stream on a GPU, else ``perf_counter``."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.name = "cuda_event" if self.cuda else "perf_counter"

    def __call__(self, fn) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def measure_size(engine, *, world: int, batches: list[int], prompt_tokens: list[int], new_tokens: int,
                 samples: int, seed: int) -> tuple[list[dict], list[dict]]:  # fmt: skip
    """One size's timing rows and token rows: per (batch, prompt length), a warm-up of each generation, then
    ``samples`` timed calls of each, interleaved (first, whole, first, whole, ...), so that a drift of clocks or
    temperature reaches both; the warm-up's greedy tokens are kept, one row per sequence, so that the page can say
    whether a split changed them (its all-reduces add in another order than one GPU's GEMMs)."""
    from servelab.engine import SamplingParams

    clock = Clock(engine.device)
    vocab = engine.model.shape.vocab
    rows, outputs = [], []
    for batch in batches:
        for tokens in prompt_tokens:
            prompts = prompts_for(batch, tokens, vocab, seed)
            calls = {
                "first": SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
                "whole": SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True),
            }
            for params in calls.values():
                got = engine.generate(prompts, params)  # first use of these shapes: kernels, graphs, allocator
            outputs += [dict(tp=world, batch=batch, prompt_tokens=tokens, sequence=i, tokens=json.dumps(ids))
                        for i, ids in enumerate(got)]  # fmt: skip
            for k in range(samples):
                for call, params in calls.items():
                    ms = clock(lambda p=params, x=prompts: engine.generate(x, p))
                    rows.append(dict(tp=world, batch=batch, prompt_tokens=tokens, new_tokens=new_tokens, call=call,
                                     sample=k, ms=ms, clock=clock.name))  # fmt: skip
    return rows, outputs


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m servelab.cluster.tp_run", description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="config:llama-3-8b")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[128, 2048])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=0)
    ap.add_argument("--part", default=PART, help="the run's folder under its fingerprint (one size a part: tp1, ...)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="a rank's wait for the slowest to load or step")
    ap.add_argument("--out", type=Path, default=None)
    return ap


def check(a: argparse.Namespace, gpus: int) -> None:
    small = [n for n in (*a.sizes, *a.batches, *a.prompt_tokens, a.samples) if n < 1]
    if small or a.new_tokens < 2:
        raise ParameterError("--sizes, --batches, --prompt-tokens and --samples must be >= 1, --new-tokens >= 2")
    if a.device.startswith("cuda") and max(a.sizes) > gpus:
        raise ParameterError(f"--sizes up to {max(a.sizes)} needs as many GPUs; this machine shows {gpus}")


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        from servelab.engine import EngineConfig
        from servelab.engine.tp_engine import engine_from_spec

        device = machine_record()
        check(a, device["gpus"])
        fp = fingerprint("servelab.cluster.tp_run").digest
        out = a.out or run_folder(device, fp, a.part, a.repeat)
        out.mkdir(parents=True, exist_ok=True)
        started = time.time()
        positions = max(a.prompt_tokens) + a.new_tokens + BLOCK
        # every batch at its longest prompt fits at once, so no size is timed with preemptions
        cfg = EngineConfig(num_blocks=max(a.batches) * (positions // BLOCK + 1) + 8, max_num_seqs=max(a.batches),
                           max_model_len=positions, cuda_graphs=a.device.startswith("cuda"))  # fmt: skip
        rows, outputs = [], []
        for world in a.sizes:
            kw = {"timeout_s": a.timeout_s} if world > 1 else {}
            t0 = time.time()
            engine = engine_from_spec(a.model, dtype=a.dtype, device=a.device, config=cfg, seed=a.seed,
                                      tensor_parallel_size=world, **kw)  # fmt: skip
            try:
                load_s = time.time() - t0
                got, greedy = measure_size(engine, world=world, batches=a.batches, prompt_tokens=a.prompt_tokens,
                                   new_tokens=a.new_tokens, samples=a.samples, seed=a.seed + a.repeat)  # fmt: skip
                rows += [r | {"load_s": load_s} for r in got]
                outputs += greedy
            finally:
                if hasattr(engine, "close"):
                    engine.close()
                # the next size's rank 0 runs in this process, on the same GPU: this size's weights and KV pool go
                del engine
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            print(f"TP = {world}: {len(got)} calls timed, loaded in {load_s:.0f} s", flush=True)
        pd.DataFrame(rows).to_csv(out / "samples.csv", index=False)
        pd.DataFrame(outputs).to_csv(out / "tokens.csv", index=False)
        params = {k: v for k, v in vars(a).items() if k != "out"}
        write_run(out, part=a.part, repeat=a.repeat, seed=a.seed + a.repeat, fingerprint=fp, machine=device,
                  started=started, params=params)  # fmt: skip
        print(out)
        return 0
    except ParameterError as e:
        print(f"tp_run: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
