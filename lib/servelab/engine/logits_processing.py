"""vLLM's logits processors, applied to a whole batch at once on the device: penalties, logit bias, min_tokens.

Each processor touches only the rows that ask for it, through one index tensor per processor built from host
lists (the requests' settings and token ids): never a Python loop over the vocabulary, never a per-row kernel.

- ``repetition_penalty`` (CTRL's, as in vLLM and HF): a token seen in the prompt or the output has its logit
  divided by the penalty if positive, multiplied if negative;
- ``frequency_penalty`` / ``presence_penalty`` (OpenAI's): ``logit -= frequency × count + presence × (count > 0)``
  over the output tokens (the counts: one ``scatter_add`` of the rows' padded output ids);
- ``logit_bias``: added to the named tokens' logits;
- ``min_tokens``: EOS (unless ignored) and the stop ids get ``-inf`` until the request has that many tokens.

Penalties read every output token on the host, so a step of a penalized request is read before the next is
scheduled (``Engine._must_land``): such requests give up the async-scheduling overlap, nobody else does.
"""

from __future__ import annotations

import torch

from servelab.engine.sequence import Sequence


def _on(values, device, dtype=torch.long) -> torch.Tensor:
    """A host list on ``device`` without waiting for the GPU."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def token_counts(rows: list[list[int]], vocab: int, device) -> torch.Tensor:
    """``[len(rows), vocab]`` float32: how often each token occurs in each row (one ``scatter_add``).

    Rows are padded with ``vocab`` into one column past the vocabulary, dropped at the end; ids outside the
    vocabulary (none should be) land there too."""
    width = max((len(r) for r in rows), default=0)
    padded = [[t if 0 <= t < vocab else vocab for t in r] + [vocab] * (width - len(r)) for r in rows]
    counts = torch.zeros(len(rows), vocab + 1, dtype=torch.float32, device=device)
    if width:
        ids = _on(padded, device)
        counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab]


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """``logits`` [n, vocab] (float32, modified in place and returned) with every row's penalties applied."""
    rows = [i for i, s in enumerate(seqs) if s.params.penalized]
    if not rows:
        return logits
    dev, vocab = logits.device, logits.shape[1]
    idx = _on(rows, dev)
    params = [seqs[i].params for i in rows]
    out_counts = token_counts([seqs[i].output_token_ids for i in rows], vocab, dev)
    x = logits.index_select(0, idx)
    if any(p.repetition_penalty != 1 for p in params):
        seen = out_counts > 0
        prompt_rows = [seqs[i].prompt_token_ids if seqs[i].params.repetition_penalty != 1 else [] for i in rows]
        seen |= token_counts(prompt_rows, vocab, dev) > 0
        rep = _on([p.repetition_penalty for p in params], dev, torch.float32)[:, None].expand_as(x)
        rep = torch.where(seen, rep, torch.ones_like(rep))
        x = torch.where(x > 0, x / rep, x * rep)
    freq = _on([p.frequency_penalty for p in params], dev, torch.float32)[:, None]
    pres = _on([p.presence_penalty for p in params], dev, torch.float32)[:, None]
    x = x - freq * out_counts - pres * (out_counts > 0).float()
    logits.index_copy_(0, idx, x)
    return logits


def apply_logit_bias(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Each row's ``logit_bias`` added in one ``index_put_`` (ids outside the vocabulary are skipped)."""
    vocab = logits.shape[1]
    hits = [(i, t, b) for i, s in enumerate(seqs) for t, b in s.params.logit_bias if t < vocab]
    if hits:
        r, t, b = zip(*hits, strict=True)
        dev = logits.device
        logits.index_put_((_on(r, dev), _on(t, dev)), _on(b, dev, torch.float32), accumulate=True)
    return logits


def under_min_tokens(seq: Sequence) -> bool:
    """Whether the token ``seq`` samples now comes before its ``min_tokens``-th output (its stops held back)."""
    return bool(seq.params.min_tokens) and len(seq.output_token_ids) < seq.params.min_tokens


def held_stops(params, eos_token_ids: tuple[int, ...], vocab: int) -> list[int]:
    """The tokens ``min_tokens`` holds back for a request with ``params``: its stop ids, and EOS unless ignored
    (sorted, within the vocabulary). The speculative mode's verify step and its draft hold back the same."""
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    return [t for t in sorted(stops) if 0 <= t < vocab]


def apply_min_tokens(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: tuple[int, ...]) -> torch.Tensor:
    """``-inf`` on the tokens that would stop a row (its stop ids, EOS unless ignored) while it has fewer than
    ``min_tokens`` outputs (the token sampled now would be output number ``len(output_token_ids)``)."""
    vocab = logits.shape[1]
    hits = []
    for i, s in enumerate(seqs):
        if under_min_tokens(s):
            hits += [(i, t) for t in held_stops(s.params, eos_token_ids, vocab)]
    if hits:
        r, t = zip(*hits, strict=True)
        dev = logits.device
        logits.index_put_((_on(r, dev), _on(t, dev)), torch.tensor(float("-inf"), device=dev))
    return logits


def process_logits(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: tuple[int, ...]) -> torch.Tensor:
    """A float32 copy of ``logits`` [n, vocab] with every processor applied (vLLM's order: penalties, bias,
    min_tokens); temperature, top-k, min-p and top-p come after, in the sampler."""
    x = logits.float().clone()
    apply_penalties(x, seqs)
    apply_logit_bias(x, seqs)
    apply_min_tokens(x, seqs, eos_token_ids)
    return x
