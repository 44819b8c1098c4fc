"""The GPU session's warm-up job ``drafts:smollm2:0``: distil SmolLM2's drafts into the machine's cache once, so that
the jobs which read them (Study 6's parts; Study 3's ``real`` distils its own, with the repeat's seed in the recipe)
load them in seconds.

    python -m servelab.studies.common.warm_drafts       # on the GPU machine, before a session's draft-reading jobs

Why a job of its own: distillation takes 4-5 minutes on the H200 (1,500 steps per draft, capped at 120 s each, after
a minute of the target's generations), and Study 6's ``p0`` measures for about 5 minutes after it; together they ran
past the call's 575 s on 2026-12-04 and the run was cut. The cache (``$SERVELAB_TRAINED``, in /tmp) lives while the
machine is warm, and every job finds the same drafts there that it would train itself: the recipe is the profile's,
the training is deterministic (``distill_loss.csv`` was byte-identical across five runs), and each run still records
its drafts' training (``distill.csv``, ``distill_loss.csv``) from the cache's manifest. This module writes no data.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

# the most a warm-up takes: a minute of generations, then two drafts capped at 120 s each (drafts.distill.RECIPES),
# loading the target and a fresh process's start around them
GUESS_MIN = 5.5


def _marker(profile: str) -> Path:
    from servelab.studies.common.drafts.distill import default_cache_dir

    return default_cache_dir() / "smollm2-distill" / f"warm-{profile}.json"


def warmed(profile: str = "full") -> bool:
    """Whether a warm-up left the profile's drafts in this machine's cache (the runner then expects a draft part
    to load them in seconds; else to distil them first, and so to take the warm-up's minutes more)."""
    try:
        drafts = json.loads(_marker(profile).read_text())["drafts"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(drafts) and all(Path(d).is_dir() for d in drafts.values())


def main(argv: list[str] | None = None) -> int:
    import torch

    from servelab.models.loader import SMOLLM2
    from servelab.studies.common.drafts.distill import distill_drafts

    profile = (argv or sys.argv[1:] or ["full"])[0]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.monotonic()
    dd = distill_drafts(SMOLLM2, profile, device=device, progress=False)
    state = "found in the cache" if dd.cached else "distilled"
    _marker(profile).write_text(json.dumps({"drafts": {k: str(v) for k, v in dd.drafts.items()}}))
    print(f"drafts {', '.join(dd.drafts)} {state} in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
