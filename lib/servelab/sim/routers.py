"""Routers: which replica of a cluster receives each request.

- ``round_robin``: replica ``i mod N`` for the i-th request; blind to load.
- ``least_outstanding``: the replica with the fewest routed-but-unfinished requests (ties: lowest index),
  the usual load balancer's "least outstanding requests".
- ``prefix_affinity``: requests whose first ``k`` prompt tokens are equal go to the same replica (a hash of
  those tokens), so that a prefix cache there keeps hitting; when that replica holds more than
  ``max_imbalance`` requests above the least loaded one, the request goes to the least loaded instead
  (the load-aware fallback of cache-aware routers such as SGLang's). It needs prompt token ids in the trace.
"""

from __future__ import annotations

import zlib

import numpy as np

from servelab.errors import ParameterError

ROUTERS = ("round_robin", "least_outstanding", "prefix_affinity")


class RoundRobin:
    reads_load = False  # whether it reads the replicas' ``outstanding`` (the simulator brings it up to date)
    name = "round_robin"

    def __init__(self, replicas):
        self.replicas = replicas
        self._next = 0

    def route(self, i: int) -> int:
        r = self._next
        self._next = (r + 1) % len(self.replicas)
        return r


class LeastOutstanding:
    reads_load = True  # whether it reads the replicas' ``outstanding`` (the simulator brings it up to date)
    name = "least_outstanding"

    def __init__(self, replicas):
        self.replicas = replicas

    def route(self, i: int) -> int:
        best, best_n = 0, None
        for r, rep in enumerate(self.replicas):
            if best_n is None or rep.outstanding < best_n:
                best, best_n = r, rep.outstanding
        return best


class PrefixAffinity:
    reads_load = True  # whether it reads the replicas' ``outstanding`` (the simulator brings it up to date)
    name = "prefix_affinity"

    def __init__(self, replicas, prefix_keys: np.ndarray, max_imbalance: int = 8):
        self.replicas = replicas
        self.keys = prefix_keys
        self.max_imbalance = max_imbalance
        self._fallback = LeastOutstanding(replicas)
        self.num_fallbacks = 0

    def route(self, i: int) -> int:
        r = int(self.keys[i] % len(self.replicas))
        least = self._fallback.route(i)
        if self.replicas[r].outstanding - self.replicas[least].outstanding > self.max_imbalance:
            self.num_fallbacks += 1
            return least
        return r


def prefix_keys(prompt_ids, k: int) -> np.ndarray:
    """A stable 32-bit hash (CRC-32; Python's ``hash`` is salted per process) of each prompt's first ``k`` ids."""
    return np.array([zlib.crc32(np.asarray(ids[:k], dtype=np.int64).tobytes()) for ids in prompt_ids], dtype=np.int64)


def make_router(
    name: str, replicas, *, prompt_ids=None, prefix_groups=None, prefix_k: int = 32, max_imbalance: int = 8
):
    """Router ``name`` over ``replicas`` (objects with ``.outstanding``). ``prefix_affinity`` needs
    ``prompt_ids`` (one list of token ids per request, in trace order), or ``prefix_groups`` (an integer per
    request naming its shared prefix, when the trace does not carry the ids)."""
    if name not in ROUTERS:
        raise ParameterError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
    if name == "round_robin":
        return RoundRobin(replicas)
    if name == "least_outstanding":
        return LeastOutstanding(replicas)
    if prompt_ids is None and prefix_groups is None:
        raise ParameterError(
            "the prefix_affinity router needs prompt token ids in the trace (a prompt_ids column) "
            "or a prefix_group column"
        )
    for nm, v in (("prefix_k", prefix_k), ("max_imbalance", max_imbalance)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ParameterError(f"{nm} must be a positive integer, got {v!r}")
    if prompt_ids is not None:
        keys = prefix_keys(prompt_ids, prefix_k)
    else:  # spread group numbers like hashes, so group g does not simply land on replica g mod N
        keys = np.array([zlib.crc32(int(g).to_bytes(8, "little", signed=True)) for g in prefix_groups], dtype=np.int64)
    return PrefixAffinity(replicas, keys, max_imbalance)
