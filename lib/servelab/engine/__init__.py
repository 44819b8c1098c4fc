"""A continuous-batching inference engine over a paged KV cache.

- ``sequence.py``: requests (``Sequence``) and their ``SamplingParams``;
- ``scheduler.py``: the ``Scheduler`` interface and the default ``TokenBudgetScheduler``;
- ``policies/``: the scheduling policies of Study 1 (FCFS, EagerContBatch, ChunkedPrefill), ``make_scheduler``;
- ``step_inputs.py``: a scheduled batch as flat tensors and attention metadata;
- ``block_tables.py``: every running sequence's block table, kept on the device incrementally;
- ``model_runner.py``, ``cuda_graphs.py`` and ``step_graphs.py``: one forward (or several decode steps back to
  back), eager or as replayed CUDA graphs;
- ``inflight.py``: a launched step whose sampled tokens are read during the next one (async scheduling);
- ``sampling.py``: greedy, temperature, top-k, min-p, top-p, per-request seeds; ``logits_processing.py``: penalties,
  logit bias, min_tokens, batched on the device; ``logprobs.py``: logprobs of sampled and prompt tokens;
- ``memory.py``: sizing the KV pool from a memory fraction;
- ``config.py``: the engine's settings; ``compilation.py``: ``torch.compile`` of the blocks, checked;
- ``engine.py``: the loop that ties them together.

The model code (Llama/Qwen2, GPT-2) is in ``servelab.models``, the attention kernels in ``servelab.kernels``;
the paged KV cache (block manager, pool, prefix cache) in ``servelab.kv``; the benchmarks behind
``python -m servelab.bench`` in ``servelab.bench``.
"""

from servelab.engine.config import EngineConfig
from servelab.engine.engine import Engine, StepRecord
from servelab.engine.scheduler import ScheduledBatch, ScheduledSequence, Scheduler, TokenBudgetScheduler, TokenEvent
from servelab.engine.sequence import FinishReason, SamplingParams, Sequence, SequenceStatus

__all__ = [
    "Engine",
    "StepRecord",
    "EngineConfig",
    "Scheduler",
    "TokenBudgetScheduler",
    "ScheduledBatch",
    "ScheduledSequence",
    "TokenEvent",
    "Sequence",
    "SamplingParams",
    "SequenceStatus",
    "FinishReason",
]
