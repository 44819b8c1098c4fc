"""The target scores all γ + 1 positions of a round in one forward pass.

Its input is the one committed token it has not cached (the last emitted) followed by the γ drafted tokens;
the logits at row i are the target's prediction for the token after input i, i.e. for draft position i + 1
(and, at row γ, for the token after the last draft: the bonus). In the engine this is one decode-only step
of γ + 1 rows of the same sequence, a CUDA-graph replay on the GPU (see ``paged_lm``).
"""

from __future__ import annotations

import torch

from servelab.spec.paged_lm import PagedLM


class TargetVerifier:
    def __init__(self, lm: PagedLM):
        self.lm = lm

    def score(self, pending_token: int, draft_tokens: list[int]) -> torch.Tensor:
        """Logits ``[γ + 1, vocab]`` of the target for the drafted positions and the bonus position."""
        if self.lm.num_cached == 0:
            raise RuntimeError("the target must have prefilled the prompt before it verifies drafts")
        return self.lm.forward([pending_token] + list(draft_tokens))
