"""Speculative decoding: the pieces of the engine's speculative mode, and the model that predicts what it gains.

The mode itself is ``servelab.engine.speculative_engine`` (with ``engine.draft_model``, ``engine.draft_rounds`` and
``engine.rollback``): running requests draft together and one target step verifies them all. It is the one door: the
server serves through it and Studies 3 and 6 measure through it; nothing outside ``engine/`` touches the runner's
tables or graphs, the pool or the block manager.

- ``rejection.py``: verifying a batch of requests' drafts at once, greedy and sampled rows together, on the device
  with no host synchronisation (the Leviathan/Chen rule, batched as vLLM's rejection sampler batches it);
- ``ngram.py``: prompt lookup for every request at once, on the device; ``prompt_lookup.py``: the same drafts for one
  context, searched on the host (the reference the batched search is tested against, and α's teacher-forced count);
- ``gamma.py``: fixed and adaptive γ; ``controlled.py``: drafts overridden to a set acceptance α (cost at random
  weights); ``self_draft.py``: the target's first layers as a draft;
- ``stats.py``: what a step proposed and kept, counted as vLLM's speculative metrics count it;
- ``config.py``: which speculation runs (a draft model or prompt lookup, and γ), from vLLM's ``--speculative-config``
  JSON or this project's ``--draft-model`` flags;
- ``leviathan.py``: the analytical model (Leviathan et al. 2023); ``syncs.py``: counting the host's waits on the
  device.
"""
