"""The replicas of a data-parallel server and which one serves the next request.

The choice is the simulator's routers' (``servelab.sim.routers``), over the replicas in rotation: the cluster the
book predicts and the one it measures route alike. A router is rebuilt when a replica leaves the rotation (its
state, a round-robin position, restarts over the survivors).
"""

from __future__ import annotations

import json

from servelab.cluster.replica import Replica
from servelab.sim.routers import ROUTERS, make_router, prefix_keys

PREFIX_TOKENS = 32  # what prefix affinity hashes: the first 32 prompt token ids, or 32 bytes of prompt text


class _Current:
    """The one key ``PrefixAffinity.route`` reads (it indexes a trace's keys by request; live, there is one)."""

    def __init__(self):
        self.key = 0

    def __getitem__(self, i: int) -> int:
        return self.key


def prompt_key(body: dict) -> int:
    """A stable hash of the request's prompt prefix: its token ids where the client sent ids, else the bytes of its
    text (a completion's prompt, a chat's messages); requests that share a system prompt share a key."""
    prompt = body.get("prompt") if "prompt" in body else body.get("messages")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]  # a batch of prompts: the first one's prefix
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = prompt
    else:
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
        ids = list(text.encode()[:PREFIX_TOKENS])
    return int(prefix_keys([ids], PREFIX_TOKENS)[0])


class ReplicaPool:
    def __init__(self, replicas: list[Replica], router: str = "least_outstanding"):
        if router not in ROUTERS:
            raise ValueError(f"unknown router {router!r}; known: {', '.join(ROUTERS)}")
        self.replicas, self.router_name = replicas, router
        self._key = _Current()
        self._router, self._live = None, ()

    def up(self) -> list[Replica]:
        return [r for r in self.replicas if r.up]

    def choose(self, body: dict) -> Replica | None:
        """The replica that serves ``body`` (None: none is in rotation)."""
        live = tuple(self.up())
        if not live:
            return None
        if live != self._live:
            kw = {"prompt_ids": [[0]]} if self.router_name == "prefix_affinity" else {}
            self._router, self._live = make_router(self.router_name, list(live), **kw), live
            if self.router_name == "prefix_affinity":
                self._router.keys = self._key
        if self.router_name == "prefix_affinity":
            self._key.key = prompt_key(body)
        return live[self._router.route(0)]
