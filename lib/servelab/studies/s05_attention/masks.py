"""Attention masks: which (query, key) pairs may interact, in three forms from one definition.

A ``Mask`` answers ``allows(q_idx, kv_idx)`` on index tensors; the dense boolean matrix passed to SDPA,
the ``mask_mod`` that FlexAttention compiles into a block-sparse kernel, the float64 reference and the
FLOP count (``allowed_pairs``) are all derived from that one rule, so they cannot disagree.

Kinds:
- ``none``: every query sees every key (a decode step: one new token against its whole KV cache);
- ``causal``: query i sees keys 0..i;
- ``sliding_window``: causal, and only the last ``window`` keys (i - window < j <= i);
- ``document``: causal within each document of a packed (ragged) batch row, no attention across documents.

Masked kinds are square (query length = key length): the prefill of a fresh sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MASK_KINDS = ("none", "causal", "sliding_window", "document")
PAD_TO = 128  # FlexAttention's block size


@dataclass(frozen=True)
class Mask:
    kind: str = "causal"
    window: int | None = None  # keys each query sees, sliding_window only
    doc_lengths: tuple[int, ...] | None = None  # tokens per packed document, document only

    def __post_init__(self):
        if self.kind not in MASK_KINDS:
            raise ValueError(f"mask kind must be one of {MASK_KINDS}, got {self.kind!r}")
        if self.kind == "sliding_window" and (not isinstance(self.window, int) or self.window < 1):
            raise ValueError(f"a sliding_window mask needs a positive integer window, got {self.window!r}")
        if self.kind == "document" and (
            not self.doc_lengths or any((not isinstance(d, (int, np.integer))) or d < 1 for d in self.doc_lengths)
        ):
            raise ValueError(f"a document mask needs positive document lengths, got {self.doc_lengths!r}")

    @property
    def label(self) -> str:
        if self.kind == "sliding_window":
            return f"sliding_window({self.window})"
        if self.kind == "document":
            return f"document({len(self.doc_lengths)} docs)"
        return self.kind

    def check_lengths(self, q_len: int, kv_len: int) -> None:
        """Masked kinds are defined for square prefill; a document mask must cover the row exactly."""
        if self.kind != "none" and q_len != kv_len:
            raise ValueError(f"a {self.kind} mask needs q_len == kv_len, got {q_len} and {kv_len}")
        if self.kind == "document" and sum(self.doc_lengths) != kv_len:
            raise ValueError(f"document lengths sum to {sum(self.doc_lengths)}, not the sequence length {kv_len}")

    # ---- the rule ---------------------------------------------------------------------------------
    def document_ids(self, device=None, pad_to: int = PAD_TO):
        """Document index of every position, padded with -1 up to a multiple of ``pad_to``.

        FlexAttention evaluates ``mask_mod`` on whole 128-token blocks, so indices up to the next
        multiple of 128 are looked up: without the padding a length that is not a multiple would read
        past the end (a device-side assert on CUDA).
        """
        import torch

        lengths = torch.tensor(self.doc_lengths, dtype=torch.long, device=device)
        ids = torch.repeat_interleave(torch.arange(len(self.doc_lengths), device=device), lengths)
        pad = -len(ids) % pad_to
        return torch.cat([ids, torch.full((pad,), -1, dtype=torch.long, device=device)])

    def mask_mod(self, device=None):
        """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool``; the document ids live on ``device``."""
        if self.kind == "none":
            return lambda b, h, q, kv: q >= 0  # all true, traced as a tensor expression
        if self.kind == "causal":
            return lambda b, h, q, kv: q >= kv
        if self.kind == "sliding_window":
            w = self.window
            return lambda b, h, q, kv: (q >= kv) & (q - kv < w)
        doc = self.document_ids(device)
        return lambda b, h, q, kv: (q >= kv) & (doc[q] == doc[kv])

    def dense(self, q_len: int, kv_len: int, device=None):
        """Boolean (q_len, kv_len) matrix, True where attention is allowed (SDPA's ``attn_mask`` convention)."""
        import torch

        self.check_lengths(q_len, kv_len)
        q = torch.arange(q_len, device=device)[:, None]
        kv = torch.arange(kv_len, device=device)[None, :]
        return self.mask_mod(device)(None, None, q, kv).expand(q_len, kv_len)

    def allowed_pairs(self, q_len: int, kv_len: int) -> int:
        """Number of (query, key) pairs that interact: what attention's FLOPs are counted over.

        causal: L(L+1)/2 (≈ L²/2, the causal half); sliding window W: W(W+1)/2 + (L-W)·W for L ≥ W;
        document: the causal half of every document.
        """
        self.check_lengths(q_len, kv_len)
        if self.kind == "none":
            return q_len * kv_len
        if self.kind == "causal":
            return q_len * (q_len + 1) // 2
        if self.kind == "sliding_window":
            w = min(self.window, q_len)
            return w * (w + 1) // 2 + (q_len - w) * w
        return sum(d * (d + 1) // 2 for d in self.doc_lengths)


def ragged_documents(total: int, documents: int, seed: int = 0) -> tuple[int, ...]:
    """Split ``total`` tokens into ``documents`` ragged lengths (each ≥ 1), as a packed batch row has.

    Lengths are drawn from a Dirichlet(1) split, so a few documents are long and many are short.
    """
    if not 1 <= documents <= total:
        raise ValueError(f"need 1 <= documents <= total, got documents={documents}, total={total}")
    rng = np.random.default_rng(seed)
    extra = rng.multinomial(total - documents, rng.dirichlet(np.ones(documents)))
    return tuple(int(x) for x in 1 + extra)
