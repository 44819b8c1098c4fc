"""How many more speculative steps a closed batch runs than its mean request needs, under Leviathan et al.'s
independent draws (no GPU, no model): the part of a batch's shortfall against the formula that is the batch waiting
for its slowest request, which a server that refills finished places does not pay.

    python scripts/spec_batch_tail.py --alpha 0.8 --gamma 4 --tokens 255 --batch 1 8 [--trials 400]

Each request emits tokens until it has ``--tokens`` (the bench's 256 new tokens, less the prefill's): per step it keeps
k drafts with P(k) = α^k (1 − α) for k < γ and α^γ at γ, plus the target's token, and its drafts never reach past its
last token (as ``speculative.controlled`` proposes them). Prints the mean, over trials, of the batch's steps (its
slowest request's) over its mean request's, with the 5th and 95th percentiles. Development analysis for issue 30.
"""

from __future__ import annotations

import argparse

import numpy as np


def steps(rng: np.random.Generator, alpha: float, gamma: int, tokens: int) -> int:
    """Speculative steps one request takes to emit ``tokens`` tokens."""
    emitted = count = 0
    while emitted < tokens:
        room = min(gamma, tokens - emitted - 1)  # drafts stop before the request's last token
        keep = rng.random(room) < alpha
        kept = room if keep.all() else int(np.argmin(keep))
        emitted += kept + 1
        count += 1
    return count


def batch_tail(alpha: float, gamma: int, tokens: int, batch: int, trials: int, seed: int = 0) -> np.ndarray:
    """Per trial: the batch's steps (its slowest request's) over its mean request's."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(trials):
        s = np.array([steps(rng, alpha, gamma, tokens) for _ in range(batch)])
        out.append(s.max() / s.mean())
    return np.array(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--alpha", type=float, default=0.8)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--tokens", type=int, default=255)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--trials", type=int, default=400)
    args = p.parse_args(argv)
    for b in args.batch:
        t = batch_tail(args.alpha, args.gamma, args.tokens, b, args.trials)
        lo, hi = np.percentile(t, [5, 95])
        print(f"batch {b}: steps over the mean request's {t.mean():.3f} (5-95%: {lo:.3f}-{hi:.3f}) over {args.trials}")


if __name__ == "__main__":
    main()
