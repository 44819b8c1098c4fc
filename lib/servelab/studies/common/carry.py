"""What one GPU call can carry, and so how many calls SmolLM2-135M-Instruct's weights take to reach the machine.

A device call carries at most 64 MiB: the tracked tree, untracked files git does not ignore, and the paths named
in ``carry``. SmolLM2's GGUF is 90 MB even in xz, so ``scripts/stage_smollm2.sh`` cuts its xz stream into parts
sized to what the tree leaves (the first beside ``.whl/``), and ``scripts/gpu_run.sh`` joins them in ``/tmp/stage``,
which lives while the machine stays warm. The tree grows with every run committed, so the number of parts does
too: the plan reads it from here, and the script cuts the parts by the sizes this module gives it
(``part_sizes``), so that the plan keeps SmolLM2 jobs out of a session's calls that come before its weights are whole.
"""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

from servelab.paths import REPO_ROOT

CALL_LIMIT = 64 * 2**20  # bytes a device call carries, the tree included
MARGIN = 1_000_000  # what may be added to the tree between cutting the parts and the calls (stage_smollm2.sh's)
SMALL_FILES = 100  # .models/smollm2/SHA256 and .revision
# the xz stream's size (xz -9 of the Q4_1 GGUF: 98 MB in, 90.4 MB out, measured 2026-12-04), where no stream is
# packed here yet; and .whl/'s, where no wheels are fetched here (CI)
XZ_BYTES = 90_390_680
WHL_BYTES = 3_300_000


def tree_bytes(repo: Path = REPO_ROOT) -> int | None:
    """Bytes of the files a call carries without being named: tracked, and untracked but not ignored. None outside
    a git checkout."""
    total = 0
    for extra in ([], ["--others", "--exclude-standard"]):
        try:
            out = subprocess.run(
                ["git", "ls-files", "-z", *extra], cwd=repo, capture_output=True, check=True, timeout=60
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        total += sum((repo / n).stat().st_size for n in out.decode().split("\0") if n and (repo / n).is_file())
    return total


def part_sizes(tree: int, wheels: int) -> tuple[int, int]:
    """Bytes of the first part (beside the wheels) and of each later one, at a tree of ``tree`` bytes; raises where
    the tree leaves no room. ``scripts/stage_smollm2.sh`` cuts the parts by these (``python -m ... sizes``)."""
    first = CALL_LIMIT - tree - wheels - MARGIN - SMALL_FILES
    rest = CALL_LIMIT - tree - MARGIN - SMALL_FILES
    if first <= 1_000_000:
        raise ValueError(f"the tree ({tree / 1e6:.1f} MB) leaves no room for a part of SmolLM2's weights")
    return first, rest


def wheel_bytes(repo: Path = REPO_ROOT) -> int:
    return sum(p.stat().st_size for p in (repo / ".whl").glob("*.whl"))


def smollm2_parts(tree: int | None = None, repo: Path = REPO_ROOT) -> int:
    """How many calls SmolLM2's xz stream takes at a tree of ``tree`` bytes (default: this checkout's): the first
    part rides beside .whl/, each other part alone. 2 where the tree is unknown (no git checkout)."""
    tree = tree_bytes(repo) if tree is None else tree
    if tree is None:
        return 2
    packed = repo / ".models" / "smollm2.gguf.xz"
    xz = packed.stat().st_size if packed.is_file() else XZ_BYTES
    first, rest = part_sizes(tree, wheel_bytes(repo) or WHL_BYTES)
    return 1 if xz <= first else 1 + math.ceil((xz - first) / rest)


if __name__ == "__main__":
    # `python -m servelab.studies.common.carry sizes`: "FIRST REST TREE WHEELS" in bytes, for stage_smollm2.sh
    import sys

    if sys.argv[1:] != ["sizes"]:
        sys.exit("usage: python -m servelab.studies.common.carry sizes")
    tree = tree_bytes()
    if tree is None:
        sys.exit("carry: not a git checkout")
    try:
        print(*part_sizes(tree, wheel_bytes()), tree, wheel_bytes())
    except ValueError as e:
        sys.exit(f"stage_smollm2: {e}")
