"""The command-line arguments every engine benchmark shares (``python -m servelab.bench``, ``…bench.step_budget``):
the model, its dtype and the device, spelled and defaulted alike so that two benchmarks of one engine can be run
with the same words."""

from __future__ import annotations

import argparse


def bench_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A parser with ``--model``, ``--dtype`` and ``--device``; ``doc``: the module's docstring (its first
    paragraph is the description)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="config:qwen2-0.5b", help="any spec the model loader accepts")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    return p
