"""Study 7, item 2: prefix-cache policies (LRU, LFU, radix-tree LRU) on Zipf(α) popularity, against the optimum.

- ``workload``  Zipf(α) streams of prefix ids, and token prefixes sharing system prompts
- ``policies``  ``LRU`` and ``LFU`` (slots); ``Hit``, what every ``access(...)`` returns
- ``radix``     ``RadixLRU`` (blocks): a prefix tree, LRU eviction of unreferenced leaves
- ``optimum``   static top-k (expected), best fixed block set, Belady's MIN
- ``simulate``  ``hit_rates(...)``: the tidy sweep
"""

from servelab.prefix.optimum import belady_hit_rate, static_block_optimum, static_optimum
from servelab.prefix.policies import LFU, LRU, Hit
from servelab.prefix.radix import Lease, RadixLRU
from servelab.prefix.simulate import POLICY_NAMES, hit_rates
from servelab.prefix.workload import ZipfWorkload, shared_prefixes, zipf_probabilities

__all__ = ["Hit", "Lease", "LRU", "LFU", "RadixLRU", "ZipfWorkload", "shared_prefixes", "zipf_probabilities",
           "static_optimum", "static_block_optimum", "belady_hit_rate", "hit_rates", "POLICY_NAMES"]
