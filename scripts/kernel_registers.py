"""Registers, spills and shared memory of the ragged kernel's packed launch, compiled ahead of time for sm90 on a CPU.

No GPU is needed: Triton compiles a kernel for a named target (``GPUTarget("cuda", 90, 32)``, the H100's and the
H200's) down to a cubin with the ``ptxas`` it ships, and ``cuobjdump -res-usage`` reads what each thread holds:
``REG`` registers (255 at most), ``STACK`` bytes of local memory a thread spills to (0: no spill), ``SHARED``
bytes a program takes. A kernel at 255 registers with a stack spills its live values to local memory, which sits in
L1/L2 and costs a round trip per access inside the key loop.

Why: a packed tile of Qwen2-0.5B holds 16 tokens × 8 padded query heads = 128 rows, and the engine launches it with
4 warps (``triton_ragged``: 8 only past 64 × 128 row-lanes). A decode fills 7 of those rows. This lists what each
(tile tokens, warps, keys an iteration) launch of ``_ragged_kernel`` costs in registers, for the models' two
attention shapes, so a GPU run need only time the launches that do not spill.

    python scripts/kernel_registers.py --out registers.csv
    python scripts/kernel_registers.py --quick --out x.csv   # two launches (a test)
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from servelab.kernels.ragged import POS0, Q_LEN, Q_START, ROW, SPLIT, SPLITS, ragged_tile_tokens  # noqa: E402
from servelab.kernels.split_kv import head_pad  # noqa: E402
from servelab.kernels.triton_ragged import _ragged_kernel  # noqa: E402

SHAPES = {"qwen2-0.5b": (14, 2, 64), "llama-3-8b": (32, 8, 128)}  # query heads, KV heads, head_dim
TILE_TOKENS = (16, 8, 4, 2, 1)
WARPS = (1, 2, 4, 8)
KEYS = (32, 64, 128)
STAGES = 3  # Triton's default for a loop
USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def padded_group(heads: int, kv_heads: int) -> int:
    """Query heads per KV head, padded to a power of two as ``triton_ragged`` pads them."""
    return triton.next_power_of_2(heads // kv_heads)


def signature(kernel, const: dict, elem: str) -> dict:
    pointers = {"Q": elem, "K": elem, "V": elem, "Out": elem, "BT": "i64", "TILES": "i64", "SPLIT_TILES": "i64"}
    pointers.update(PART="fp32", LSE="fp32", COUNT="i32")
    sig = {}
    for name in kernel.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = "*" + pointers[name]
        elif name == "scale":
            sig[name] = "fp32"
        else:
            sig[name] = "i64" if name.startswith("stride") else "i32"
    return sig


def usage(heads: int, kv_heads: int, head_dim: int, tokens: int, warps: int, keys: int, splits: bool) -> dict:
    """The compiled launch's resource usage, or ``error`` where it does not compile (e.g. shared memory)."""
    groups = heads // kv_heads
    const = dict(
        GROUPS=groups, GROUPS_PAD=padded_group(heads, kv_heads), TILE_TOKENS=tokens, HEAD_DIM=head_dim,
        HEAD_PAD=head_pad(head_dim), BLOCK_SIZE=16, KEYS=keys, IEEE=False, INTERPRETED=False, C_ROW=ROW,
        C_START=Q_START, C_LEN=Q_LEN, C_POS=POS0, C_SPLIT=SPLIT, C_SPLITS=SPLITS, HAS_SPLITS=splits,
    )  # fmt: skip
    kernel = _ragged_kernel
    src = ASTSource(
        kernel, signature(kernel, const, "bf16"), constexprs={(kernel.arg_names.index(n),): v for n, v in const.items()}
    )
    try:
        compiled = triton.compile(
            src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=STAGES)
        )
    except Exception as e:  # a launch that does not build is a row, not a crash
        return {"error": f"{type(e).__name__}: {e}"[:200]}
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    try:
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    m = USAGE.search(out)
    if not m:
        return {"error": "cuobjdump gave no REG/STACK line"}
    reg, stack, shared, local = (int(g) for g in m.groups())
    return {"registers": reg, "stack_bytes": stack, "static_shared": shared, "local": local,
            "dynamic_shared": compiled.metadata.shared}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--splits", action="store_true", help="the launch with split columns (HAS_SPLITS)")
    ap.add_argument("--quick", action="store_true", help="Qwen2-0.5B's shape at 16 and 2 tokens, 4 warps, 64 keys")
    args = ap.parse_args()
    shapes = {"qwen2-0.5b": SHAPES["qwen2-0.5b"]} if args.quick else SHAPES
    sweep = ((16, 2), (4,), (64,)) if args.quick else (TILE_TOKENS, WARPS, KEYS)
    rows = []
    for (model, shape), tokens, warps, keys in itertools.product(shapes.items(), *sweep):
        if tokens < ragged_tile_tokens(*shape[:2]):  # fewer than 16 rows: tl.dot needs 16
            continue
        row = dict(model=model, tile_tokens=tokens, rows=tokens * padded_group(*shape[:2]), warps=warps, keys=keys,
                   splits=args.splits, **usage(*shape, tokens, warps, keys, args.splits))  # fmt: skip
        rows.append(row)
        print({k: v for k, v in row.items() if k != "splits"})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
