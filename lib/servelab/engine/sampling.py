"""Turning a step's logits into tokens: greedy, temperature, top-k, min-p, top-p, per-request seeds.

Greedy rows are an ``argmax`` over the whole batch at once. Sampled rows without a seed share one
batched draw; a row with a seed draws from its own ``torch.Generator``, so a seeded request produces
the same tokens whatever else runs in the batch (given the same logits).

One request's settings can never fail the batch: a temperature below ``SAMPLING_EPS`` is greedy (as in
vLLM), top-p always keeps the most likely token (a ``top_p`` of 1e-300 is 0 in float32), and a row whose
distribution is still not a distribution (non-finite logits: a model fault) falls back to its argmax
instead of making ``torch.multinomial`` raise for every row (or, on CUDA, assert and end the process).

``sample_step`` is what the model runner calls: a batch whose requests ask for nothing beyond temperature,
top-p and seeds goes straight to ``sample`` (the common batch keeps its whole-batch argmax or race); otherwise
the logits processors run first (``logits_processing.py``) and the logprobs of the raw logits are computed for
the rows that ask (``logprobs.py``). Top-k and min-p are masks over the batch's probabilities, as top-p is.
"""

from __future__ import annotations

import torch

from servelab.engine.logits_processing import process_logits
from servelab.engine.logprobs import SampledLogprobs, logprobs_of
from servelab.engine.sequence import SamplingParams, Sequence


def top_p_filter(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero every token outside the smallest set whose probabilities sum to ``top_p`` (per row); renormalise.

    ``probs`` [n, vocab], ``top_p`` [n]. The most likely token always survives.
    """
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass of the tokens ranked above each one
    drop = before >= top_p[:, None]
    drop[:, 0] = False  # even when top_p underflows to 0 (or rounding puts the top token's "before" above it)
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return out / out.sum(dim=-1, keepdim=True)


def top_k_filter(probs: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Zero every token outside each row's ``top_k`` most likely ([n] long; 0 keeps all); not renormalised.

    One ``topk`` of the largest k asked; a row's threshold is its k-th value (ties at it survive, as in vLLM)."""
    vocab = probs.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    kmax = int(top_k.clamp(max=vocab).max()) if top_k.numel() else 0
    if kmax <= 0:
        return probs
    values = probs.topk(kmax, dim=-1).values
    kth = values.gather(1, (k.clamp(max=kmax) - 1)[:, None])
    kth = torch.where((top_k > 0)[:, None], kth, torch.zeros_like(kth))
    return probs.masked_fill(probs < kth, 0.0)


def min_p_filter(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Zero every token whose probability is below ``min_p`` [n] times its row's largest; not renormalised."""
    return probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)


def valid_rows(probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``probs`` [n, vocab] with every row that is not a distribution (a NaN or inf, or no mass) replaced by
    a one-hot on its logits' argmax (NaN counted as -inf), without a host sync: ``torch.multinomial`` raises
    for the whole batch on one bad row on the CPU, and asserts on the device (ending the process) on CUDA."""
    ok = torch.isfinite(probs).all(dim=-1, keepdim=True) & (probs.sum(dim=-1, keepdim=True) > 0)
    top = torch.nan_to_num(logits.float(), nan=float("-inf")).argmax(dim=-1, keepdim=True)
    one_hot = torch.zeros_like(probs).scatter_(-1, top, 1.0)
    return torch.where(ok, probs, one_hot)


def exponential_race(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """One draw per row from softmax(logits / temperature): argmax(p / E) with E ~ Exp(1) picks i with probability p_i.

    Eagerly that is five passes over a [batch, vocab] float32 tensor (150 MB at batch 256 and a 150k
    vocabulary); ``torch.compile`` fuses them into about two (``Engine`` does so when it compiles).
    """
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return probs.div_(torch.empty_like(probs).exponential_()).argmax(dim=-1)


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list, race=exponential_race) -> torch.Tensor:
    """One token per row of ``logits`` [n, vocab]; returns LongTensor [n] on the logits' device.

    ``race`` draws a whole batch that shares one temperature and has no top-p or seeds (the common case).
    """
    n = logits.shape[0]
    if len(params) != n or len(generators) != n:
        raise ValueError(
            f"need one SamplingParams and one generator (or None) per row; got {len(params)}, "
            f"{len(generators)} for {n} rows"
        )
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return logits.argmax(dim=-1)
    t0, p0 = params[0].temperature, params[0].top_p
    if (
        len(rows) == n
        and p0 == 1
        and all(g is None for g in generators)
        and all(p.temperature == t0 and p.top_p == 1 and p.top_k <= 0 and not p.min_p for p in params)
    ):
        return race(logits, t0)  # the common batch: one whole-batch draw, no per-row indexing
    tokens = logits.argmax(dim=-1)
    dev = logits.device  # host lists travel without blocking: a blocking copy would wait for the GPU
    idx = torch.tensor(rows).to(dev, non_blocking=True)
    temps = torch.tensor([params[i].temperature for i in rows], dtype=torch.float32).to(dev, non_blocking=True)
    probs = torch.softmax(logits[idx].float() / temps[:, None], dim=-1)
    if any(params[i].top_k > 0 for i in rows):
        probs = top_k_filter(probs, torch.tensor([max(params[i].top_k, 0) for i in rows]).to(dev, non_blocking=True))
    if any(params[i].min_p for i in rows):
        min_p = torch.tensor([params[i].min_p for i in rows], dtype=torch.float32).to(dev, non_blocking=True)
        probs = min_p_filter(probs, min_p)
    if any(params[i].top_k > 0 or params[i].min_p for i in rows):
        probs = probs / probs.sum(dim=-1, keepdim=True)  # top_p_filter reads cumulative mass
    if any(params[i].top_p < 1 for i in rows):
        top_p = torch.tensor([params[i].top_p for i in rows], dtype=torch.float32).to(dev, non_blocking=True)
        probs = top_p_filter(probs, top_p)
    probs = valid_rows(probs, logits[idx])
    seeded = [j for j, i in enumerate(rows) if generators[i] is not None]
    drawn = torch.empty(len(rows), dtype=torch.long, device=logits.device)
    unseeded = [j for j in range(len(rows)) if generators[rows[j]] is None]
    if unseeded:
        u = torch.tensor(unseeded).to(dev, non_blocking=True)
        drawn[u] = torch.multinomial(probs[u], 1).squeeze(1)
    for j in seeded:
        drawn[j] = torch.multinomial(probs[j], 1, generator=generators[rows[j]])[0]
    tokens[idx] = drawn
    return tokens


def sample_step(
    logits: torch.Tensor, seqs: list[Sequence], race=exponential_race, eos_token_ids: tuple[int, ...] = ()
) -> tuple[torch.Tensor, SampledLogprobs | None]:
    """One token per row of ``logits`` [n, vocab] for ``seqs`` (row i is ``seqs[i]``), and the logprobs of the rows
    that ask for them (None if none does). A batch without processors or logprobs is ``sample`` as before."""
    params = [s.params for s in seqs]
    generators = [s.generator for s in seqs]
    if not any(p.processed for p in params):
        return sample(logits, params, generators, race), None
    tokens = sample(process_logits(logits, seqs, eos_token_ids), params, generators, race)
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return tokens, None
    idx = torch.tensor(rows).to(logits.device, non_blocking=True)
    ks = [params[i].logprobs for i in rows]
    return tokens, SampledLogprobs(rows, logprobs_of(logits.index_select(0, idx), tokens.index_select(0, idx), ks))
