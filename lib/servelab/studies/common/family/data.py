"""The training data on the device: random windows from the train stream, fixed windows from the held-out files.

Files are joined into one stream with EOS between them; the held-out files' token ids are kept on disk beside the
models (``heldout_tokens.npz``: a flat array and offsets) so that prompts can be drawn from text never trained on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servelab.errors import ParameterError


def join_files(ids: list[np.ndarray], eos_id: int) -> np.ndarray:
    """One int32 token stream: each file's ids followed by EOS."""
    return np.concatenate([np.append(t, eos_id) for t in ids]).astype(np.int32)


def save_heldout(path: Path, ids: list[np.ndarray]) -> int:
    """Write the held-out files' ids (flat tokens and offsets) to ``path``; returns the number of tokens."""
    offsets = np.cumsum([0] + [len(t) for t in ids])
    np.savez(path, tokens=np.concatenate(ids).astype(np.int32), offsets=offsets)
    return int(offsets[-1])


def load_heldout(path: Path) -> list[np.ndarray]:
    """The held-out files' ids, one array per file, as :func:`save_heldout` wrote them."""
    with np.load(path) as z:
        flat, offsets = z["tokens"], z["offsets"]
    return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


class TokenStream:
    """Random training windows from one long token stream (files joined by EOS), on the device."""

    def __init__(self, tokens: np.ndarray, seq_len: int, device, seed: int):
        import torch

        if len(tokens) < seq_len + 2:
            raise ParameterError(f"corpus too small: {len(tokens)} tokens for windows of {seq_len + 1}")
        self.tokens = torch.as_tensor(tokens.astype(np.int64), device=device)
        self.seq_len = seq_len
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.offsets = torch.arange(seq_len + 1, device=device)

    def batch(self, batch_size: int):
        import torch

        starts = torch.randint(
            0, len(self.tokens) - self.seq_len - 1, (batch_size, 1), generator=self.gen, device=self.tokens.device
        )
        w = self.tokens[starts + self.offsets]
        return w[:, :-1], w[:, 1:]


def eval_windows(heldout: list[np.ndarray], seq_len: int, n: int, eos_id: int) -> np.ndarray:
    """Up to ``n`` non-overlapping windows of seq_len+1 tokens from the held-out stream."""
    stream = np.concatenate([np.append(t, eos_id) for t in heldout]).astype(np.int64)
    k = min(n, (len(stream) - 1) // (seq_len + 1))
    if k < 1:
        raise ParameterError(f"held-out split too small: {len(stream)} tokens for one window of {seq_len + 1}")
    return stream[: k * (seq_len + 1)].reshape(k, seq_len + 1)
