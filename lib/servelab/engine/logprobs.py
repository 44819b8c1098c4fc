"""Log-probabilities of sampled tokens (``SamplingParams.logprobs``) and of prompt tokens (``prompt_logprobs``).

Which distribution: the model's raw one, ``log_softmax`` of the very logits tensor the step handed to the
sampler, before penalties, bias, temperature, top-k/top-p/min-p (vLLM V1's default, ``--logprobs-mode
raw_logprobs``). That is what a loglikelihood evaluation (lm-eval's ``echo`` + ``logprobs`` requests) scores,
and it does not change with the sampling settings. ``rank`` is 1 for the most likely token (vLLM's convention).

Everything is computed on the device for all rows that ask at once: one ``log_softmax``, one ``gather`` of the
chosen tokens, one comparison for their ranks, one ``topk`` of the largest ``k`` any row asks for; the host
reads the few numbers each row wants when the step's tokens land.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


class TokenLogprob(NamedTuple):
    """One position's logprobs: the chosen token's, its rank, and the ``k`` most likely (token id, logprob)."""

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


@dataclass
class LogprobTensors:
    """Device results for some rows: ``chosen`` [r], ``ranks`` [r], ``top_ids``/``top_lps`` [r, kmax]; ``ks[j]``
    is how many of the top row ``j`` wants, ``token_ids`` [r] the chosen tokens."""

    token_ids: torch.Tensor
    chosen: torch.Tensor
    ranks: torch.Tensor
    top_ids: torch.Tensor
    top_lps: torch.Tensor
    ks: list[int]

    def to_host(self) -> list[TokenLogprob]:
        """The rows' ``TokenLogprob``s (waits for the device)."""
        ids, chosen, ranks = self.token_ids.tolist(), self.chosen.tolist(), self.ranks.tolist()
        top_ids, top_lps = self.top_ids.tolist(), self.top_lps.tolist()
        return [
            TokenLogprob(ids[j], chosen[j], ranks[j], tuple(zip(top_ids[j][:k], top_lps[j][:k], strict=True)))
            for j, k in enumerate(self.ks)
        ]


def logprobs_of(logits: torch.Tensor, token_ids: torch.Tensor, ks: list[int]) -> LogprobTensors:
    """Logprobs of ``token_ids`` [r] under ``logits`` [r, vocab] (raw), with each row's top ``ks[j]``."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, token_ids[:, None]).squeeze(1)
    ranks = (lp > chosen[:, None]).sum(dim=-1) + 1
    kmax = min(max(ks, default=0), lp.shape[1])
    top_lps, top_ids = lp.topk(kmax, dim=-1) if kmax else (lp[:, :0], lp[:, :0].long())
    return LogprobTensors(token_ids, chosen, ranks, top_ids, top_lps, list(ks))


class SampledLogprobs(NamedTuple):
    """A step's logprobs of its sampled tokens: ``rows`` (which sampling rows asked) and their results."""

    rows: list[int]
    tensors: LogprobTensors

    def per_row(self, n: int) -> list[TokenLogprob | None]:
        """One entry per sampling row of the step (None for rows that did not ask)."""
        out: list[TokenLogprob | None] = [None] * n
        for r, v in zip(self.rows, self.tensors.to_host(), strict=True):
            out[r] = v
        return out


class PromptLogprobs(NamedTuple):
    """A step's prompt logprobs: for each (sequence, first prompt token, count), ``count`` consecutive rows."""

    spans: list[tuple[object, int, int]]
    tensors: LogprobTensors

    def land(self) -> None:
        """Append each sequence's new entries to ``seq.prompt_logprobs`` (in position order: chunks land in order)."""
        values, at = self.tensors.to_host(), 0
        for seq, first, count in self.spans:
            if len(seq.prompt_logprobs) == first:  # not landed before (a recompute does not ask again)
                seq.prompt_logprobs.extend(values[at : at + count])
            at += count
