"""Speculative decoding inside the engine (issue 30): the pieces of the engine's speculative mode.

- ``rejection.py``: verifying a batch of requests' drafts at once, greedy and sampled rows together, on the device
  with no host synchronisation (the Leviathan/Chen rule, batched as vLLM's rejection sampler batches it);
- ``ngram.py``: prompt lookup for every request at once, on the device: ``spec.prompt_lookup``'s drafts, without
  a host search per request;
- ``stats.py``: what a step proposed and kept, counted as vLLM's speculative metrics count it;
- ``config.py``: which speculation runs (a draft model or prompt lookup, and γ), from vLLM's ``--speculative-config``
  JSON or this project's ``--draft-model`` flags.

The engine's mode itself is ``servelab.engine.speculative_engine`` (with ``engine.draft_model``).

``servelab.spec`` is the separate driver this package replaces: Studies 3 and 6 measure through it, so it stays, and
they keep its fingerprint, until the evidence campaign (issue 27) is done and the engine's mode takes its place.
"""
