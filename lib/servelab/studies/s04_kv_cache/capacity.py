"""How many sequences fit in a KV memory budget: contiguous max-length preallocation vs paged blocks.

Contiguous: each request reserves ``max_len`` tokens of K/V up front (what a static per-request cache of
the model's maximum length does), so capacity is ``budget // (max_len × bytes/token)`` whatever the request
lengths; the reserved but unused tail is waste.

Paged: a ``BlockManager`` over the blocks that fit in the same budget (``KVPool.blocks_for_budget``) takes
requests until ``OutOfBlocks``; the only waste is the unfilled part of each sequence's last block.

Waste is *measured* by filling the real block manager with sampled request lengths, and reported as
fragmentation % = unused token slots / reserved token slots.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from servelab.kv.block_manager import BlockManager, OutOfBlocks


@dataclass(frozen=True)
class LengthDistribution:
    """Lognormal prompt and output lengths (tokens), clipped to ``[1, max_len]`` in total.

    The default parameters are this project's *assumption* of chat-like traffic (ShareGPT-like: a median prompt
    of a couple of hundred tokens, a long tail of long conversations); they are not fitted to a dataset.
    """

    prompt_median: float = 200.0
    prompt_sigma: float = 1.0
    output_median: float = 250.0
    output_sigma: float = 0.8
    max_len: int = 4096
    origin: str = "assumed ShareGPT-like chat traffic, not a fit to data"

    @property
    def source(self) -> str:
        """Where the lengths come from, with every parameter (for figure captions and the CSVs)."""
        return (
            f"{self.origin}: lognormal prompt (median {self.prompt_median:g}, σ {self.prompt_sigma:g}) + "
            f"output (median {self.output_median:g}, σ {self.output_sigma:g}) tokens, ≤ {self.max_len:,}"
        )

    def __post_init__(self):
        for name in ("prompt_median", "output_median", "prompt_sigma", "output_sigma"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not isinstance(self.max_len, int) or self.max_len < 2:
            raise ValueError(f"max_len must be an integer >= 2, got {self.max_len!r}")

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt, output) length pairs, in tokens, with prompt + output <= max_len."""
        prompt = np.rint(rng.lognormal(np.log(self.prompt_median), self.prompt_sigma, n)).astype(int)
        output = np.rint(rng.lognormal(np.log(self.output_median), self.output_sigma, n)).astype(int)
        prompt = np.clip(prompt, 1, self.max_len - 1)
        output = np.clip(output, 1, self.max_len - prompt)
        return prompt, output

    def as_dict(self) -> dict:
        return {**asdict(self), "source": self.source}


def snapshot_lengths(dist: LengthDistribution, n: int, phase: str, rng: np.random.Generator) -> np.ndarray:
    """Tokens each request holds at a moment: ``"complete"`` (prompt + all output, the peak) or ``"mid_decode"``
    (prompt + a uniformly random part of the output: what a running server holds at an instant)."""
    prompt, output = dist.sample(n, rng)
    if phase == "complete":
        return prompt + output
    if phase == "mid_decode":
        return prompt + np.floor(rng.random(n) * (output + 1)).astype(int)
    raise ValueError(f"phase must be 'complete' or 'mid_decode', got {phase!r}")


def contiguous_fill(lengths: np.ndarray, budget_tokens: int, max_len: int) -> dict:
    """Admit requests in order, each reserving ``max_len`` slots, until the budget is spent."""
    fits = min(len(lengths), budget_tokens // max_len)
    if fits == len(lengths) and budget_tokens // max_len > fits:
        raise ValueError("not enough sampled requests to fill the budget; sample more")
    used = int(lengths[:fits].sum())
    reserved = fits * max_len
    return dict(sequences=fits, tokens_stored=used, slots_reserved=reserved)


def paged_fill(lengths: np.ndarray, num_blocks: int, block_size: int) -> dict:
    """Admit requests in order into a real ``BlockManager`` until one does not fit (``OutOfBlocks``)."""
    bm = BlockManager(num_blocks, block_size)
    used = 0
    for i, n in enumerate(lengths):
        try:
            bm.allocate(i, int(n))
        except OutOfBlocks:
            break
        used += int(n)
    else:
        raise ValueError("not enough sampled requests to fill the pool; sample more")
    return dict(sequences=len(bm.seq_ids), tokens_stored=used, slots_reserved=bm.num_used_blocks * block_size)


def capacity_table(
    bytes_per_token: int,
    budget_bytes: int,
    dist: LengthDistribution,
    block_sizes,
    *,
    phases=("complete", "mid_decode"),
    trials: int = 5,
    seed: int = 0,
) -> pd.DataFrame:
    """Sequences that fit and fragmentation %, contiguous vs paged (per block size), over ``trials`` samples."""
    if budget_bytes <= 0 or bytes_per_token <= 0:
        raise ValueError("budget_bytes and bytes_per_token must be positive")
    budget_tokens = budget_bytes // bytes_per_token
    rng = np.random.default_rng(seed)
    # enough requests to overfill the budget: twice the budget over a pessimistically short mean length
    n_sample = int(max(1000, 2 * budget_tokens / max(1.0, dist.prompt_median / 2)))
    rows = []
    for phase in phases:
        for trial in range(trials):
            lengths = snapshot_lengths(dist, n_sample, phase, rng)
            base = dict(
                phase=phase,
                trial=trial,
                budget_bytes=budget_bytes,
                bytes_per_token=bytes_per_token,
                budget_tokens=budget_tokens,
                mean_length=float(lengths.mean()),
            )
            rows.append(
                dict(
                    base,
                    layout="contiguous",
                    block_size=dist.max_len,
                    **contiguous_fill(lengths, budget_tokens, dist.max_len),
                )
            )
            for bs in block_sizes:
                num_blocks = budget_bytes // (bs * bytes_per_token)  # as KVPool.blocks_for_budget sizes a pool
                rows.append(dict(base, layout="paged", block_size=bs, **paged_fill(lengths, num_blocks, bs)))
    df = pd.DataFrame(rows)
    df["fragmentation_pct"] = 100.0 * (1 - df["tokens_stored"] / df["slots_reserved"])
    df["budget_used_pct"] = 100.0 * df["tokens_stored"] / df["budget_tokens"]
    return df


def fixed_length_capacity(
    bytes_per_token: int, budget_bytes: int, lengths, max_len: int, block_size: int
) -> pd.DataFrame:
    """Sequences of exactly ``L`` tokens that fit: contiguous at ``max_len`` each vs paged blocks (arithmetic)."""
    rows = []
    budget_tokens = budget_bytes // bytes_per_token
    blocks = budget_bytes // (block_size * bytes_per_token)
    for L in lengths:
        if not 0 < L <= max_len:
            raise ValueError(f"lengths must be in (0, max_len={max_len}], got {L}")
        rows.append(dict(length=L, layout="contiguous", sequences=budget_tokens // max_len))
        rows.append(
            dict(length=L, layout=f"paged ({block_size}-token blocks)", sequences=blocks // -(-L // block_size))
        )
    return pd.DataFrame(rows)
