"""Study 7: prefix caching. The cache itself lives in the engine (``servelab.kv.prefix_cache``); here are the
policy simulator and the study's measurements.

Policy simulator (no GPU): prefix-cache policies (LRU, LFU, radix-tree LRU) on Zipf(α) popularity, against the optimum.

- ``workload``  Zipf(α) streams of prefix ids, and token prefixes sharing system prompts
- ``policies``  ``LRU`` and ``LFU`` (slots); ``Hit``, what every ``access(...)`` returns
- ``radix``     ``RadixLRU`` (blocks): a prefix tree, LRU eviction of unreferenced leaves
- ``optimum``   static top-k (expected), best fixed block set, Belady's MIN
- ``simulate``  ``hit_rates(...)``: the tidy sweep

Measurements on the engine (notebook 07):

- ``params``         profile defaults and validation; ``study``: the engine the study measures
- ``first_token``    time requests with the cache primed or off (``time_requests``)
- ``prefix_length``  F7.1: TTFT against the shared prefix length; ``speedups``
- ``multi_turn``     F7.2: a conversation, speedup per turn
- ``batch_sharing``  F7.3: n requests sharing a prefix, shared vs independent prefill; ``breakeven``
- ``serving``        server level: a prefix-repetition workload over HTTP, caching off and on
- ``cost_fit``       straight-line cost models (a fixed cost plus a cost per token or request)
- ``page``           the study page's sections, one call each; ``verdicts`` F7.1–F7.4; ``plots`` the figures
"""

from servelab.studies.s07_prefix_cache.optimum import belady_hit_rate, static_block_optimum, static_optimum
from servelab.studies.s07_prefix_cache.policies import LFU, LRU, Hit
from servelab.studies.s07_prefix_cache.radix import Lease, RadixLRU
from servelab.studies.s07_prefix_cache.simulate import POLICY_NAMES, hit_rates
from servelab.studies.s07_prefix_cache.workload import ZipfWorkload, shared_prefixes, zipf_probabilities

__all__ = [
    "Hit",
    "Lease",
    "LRU",
    "LFU",
    "RadixLRU",
    "ZipfWorkload",
    "shared_prefixes",
    "zipf_probabilities",
    "static_optimum",
    "static_block_optimum",
    "belady_hit_rate",
    "hit_rates",
    "POLICY_NAMES",
]
