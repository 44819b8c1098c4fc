"""A tensor parallel engine's worker process (``tp_engine``): ``python -m servelab.engine.tp_worker RANK``, started by
the driver with its listener's address in ``SERVELAB_TP_DRIVER``. It builds its rank's engine, then makes each state
change the driver sends, in order, until the driver says stop or goes away."""

from __future__ import annotations

import contextlib
import os
import sys
from multiprocessing.connection import Client

import torch
import torch.distributed as dist

from servelab.engine.engine import Engine
from servelab.engine.sequence import SamplingParams, Sequence
from servelab.engine.tp_engine import ADDRESS_ENV, agreed_config, join_group, shard_for


class _Rank:
    """A worker's engine and its copies of the driver's sequences, making each state change the driver sends."""

    def __init__(self, engine: Engine, conn):
        self.engine, self.conn = engine, conn
        self.seqs: dict[int, Sequence] = {}  # the driver's sequence id -> this rank's copy

    def add(self, key: int, prompt: list[int], params: SamplingParams, arrival_s: float) -> None:
        self.seqs[key] = self.engine.add_request(prompt, params, arrival_s=arrival_s)

    def abort(self, key: int) -> None:
        self.engine.abort(self.seqs.pop(key))

    def step(self) -> None:
        self.engine.step()
        self._forget_finished()

    def synchronize(self) -> None:
        self.engine.synchronize()
        self._forget_finished()

    def call(self, name: str, args: tuple) -> None:
        getattr(self.engine, name)(*args)

    def outputs(self) -> None:
        self.conn.send(("outputs", {k: list(s.output_token_ids) for k, s in self.seqs.items()}))

    def _forget_finished(self) -> None:
        for key in [k for k, s in self.seqs.items() if s.is_finished]:
            del self.seqs[key]


def serve_rank(rank: int, conn) -> None:
    """A worker: build this rank's engine, then make each state change the driver sends, in order, until it says
    stop or goes away."""
    conn.send(rank)
    job = conn.recv()
    try:
        if not job["device"].startswith("cuda"):
            torch.set_num_threads(job["threads"])
        dev = join_group(rank, job["world"], job["port"], job["device"], job["timeout_s"])
        shard = shard_for(job, rank, dev)
        me = _Rank(Engine(shard, agreed_config(shard, job["config"]), **job["engine_kw"]), conn)
        conn.send(("ready",))
        while True:
            try:
                op, *args = conn.recv()
            except EOFError:  # the driver went away
                return
            if op == "stop":
                return
            getattr(me, op)(*args)
    except Exception as e:  # noqa: BLE001 - the driver reports it
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(e).__name__}: {e}"))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    rank = int((argv or sys.argv[1:])[0])
    host, port, key = os.environ[ADDRESS_ENV].rsplit(":", 2)
    with Client((host, int(port)), authkey=bytes.fromhex(key)) as conn:
        serve_rank(rank, conn)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
