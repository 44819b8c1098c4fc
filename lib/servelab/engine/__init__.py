"""A continuous-batching inference engine over a paged KV cache.

- ``sequence.py``: requests (``Sequence``) and their ``SamplingParams``;
- ``scheduler.py``: the ``Scheduler`` interface and the default ``TokenBudgetScheduler``;
- ``step_inputs.py``: a scheduled batch as flat tensors and attention metadata;
- ``model_runner.py`` and ``cuda_graphs.py``: one forward, eager or as a replayed CUDA graph;
- ``sampling.py``: greedy, temperature, top-p, per-request seeds;
- ``memory.py``: sizing the KV pool from a memory fraction;
- ``engine.py``: the loop that ties them together.
"""

from servelab.engine.config import EngineConfig
from servelab.engine.engine import Engine
from servelab.engine.scheduler import ScheduledBatch, ScheduledSequence, Scheduler, TokenBudgetScheduler, TokenEvent
from servelab.engine.sequence import FinishReason, SamplingParams, Sequence, SequenceStatus

__all__ = ["Engine", "EngineConfig", "Scheduler", "TokenBudgetScheduler", "ScheduledBatch", "ScheduledSequence",
           "TokenEvent", "Sequence", "SamplingParams", "SequenceStatus", "FinishReason"]
