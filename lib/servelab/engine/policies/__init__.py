"""The scheduling policies of Study 1, behind the engine's ``Scheduler`` interface; pure Python, no GPU.

- ``fcfs``: FCFS, request-level (static) batching;
- ``eager_cont_batch``: EagerContBatch, continuous batching, whole prompts prefilled in steps of their own;
- ``chunked_prefill``: ChunkedPrefill, a token budget per step, decodes first and prefill chunks after.

All three share the ``Scheduler`` bookkeeping: at most ``max_num_seqs`` running sequences, a KV pool (a
``BlockManager``), preemption by recompute of the newest running sequence when blocks run out, at most
``max_num_batched_tokens`` tokens per step. The engine picks one with ``EngineConfig(scheduler=NAME)``; a
simulator builds one with ``make_scheduler(NAME, num_blocks=..., block_size=..., ...)`` and drives it with
``add`` / ``schedule`` / ``postprocess``.
"""

from __future__ import annotations

from servelab.engine.policies.chunked_prefill import ChunkedPrefill
from servelab.engine.policies.eager_cont_batch import EagerContBatch
from servelab.engine.policies.fcfs import FCFS
from servelab.engine.scheduler import Scheduler
from servelab.errors import ParameterError
from servelab.kv.block_manager import BlockManager

POLICIES: dict[str, type[Scheduler]] = {
    "fcfs": FCFS,
    "eager_cont_batch": EagerContBatch,
    "chunked_prefill": ChunkedPrefill,
}

DEFAULTS = {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "eos_token_ids": (), "block_size": 16}
PARAMS = ("block_manager", "num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "eos_token_ids")


def policy_class(name: str) -> type[Scheduler]:
    """The scheduler class registered under ``name``; a ``ParameterError`` naming the known ones otherwise."""
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise ParameterError(f"unknown scheduling policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None


def make_scheduler(name: str, **params) -> Scheduler:
    """Build policy ``name``.

    Parameters (all keyword): the KV pool, either ``block_manager`` (a ``BlockManager``, shared with whoever
    owns the K/V) or ``num_blocks`` (and ``block_size``, default 16) for a fresh one; ``max_num_seqs``
    (running sequences, FCFS's batch size; default 256); ``max_num_batched_tokens`` (tokens per step,
    ChunkedPrefill's budget; default 8192); ``eos_token_ids`` (default none). Unknown names, unknown
    parameters and bad values raise ``ParameterError``.
    """
    cls = policy_class(name)
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise ParameterError(
            f"unknown parameter(s) {', '.join(unknown)} for scheduler {name!r}; accepted: {', '.join(PARAMS)}"
        )
    p = {**DEFAULTS, **params}
    bm = p.pop("block_manager", None)
    num_blocks = p.pop("num_blocks", None)
    block_size = p.pop("block_size")
    if bm is not None:
        if num_blocks is not None or "block_size" in params:
            raise ParameterError("give either block_manager or num_blocks/block_size, not both")
        if not isinstance(bm, BlockManager):
            raise ParameterError(f"block_manager must be a BlockManager, got {type(bm).__name__}")
    else:
        if num_blocks is None:
            raise ParameterError(
                f"scheduler {name!r} needs the KV pool: block_manager=, or num_blocks= (and block_size=)"
            )
        for k, v in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParameterError(f"{k} must be a positive integer, got {v!r}")
        bm = BlockManager(num_blocks, block_size)
    eos = p.pop("eos_token_ids")
    try:
        eos = tuple(eos)
    except TypeError:
        raise ParameterError(f"eos_token_ids must be a sequence of token ids, got {eos!r}") from None
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in eos):
        raise ParameterError(f"eos_token_ids must be non-negative integers, got {eos!r}")
    return cls(bm, eos_token_ids=eos, **p)


__all__ = ["POLICIES", "FCFS", "EagerContBatch", "ChunkedPrefill", "make_scheduler", "policy_class"]
