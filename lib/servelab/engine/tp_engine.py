"""An engine whose model is split over N processes (``EngineConfig.tensor_parallel_size``; ``servelab serve
--tensor-parallel-size N``), built by ``Engine.from_spec``.

The driver is an ``Engine`` over rank 0's shard (``tensor_parallel.shard_model``) in the caller's process; ranks
1..N-1 are worker processes, each an ``Engine`` over its own shard. Every call that changes an engine's state (a
request added or aborted, a step, a synchronisation, the prefix cache's settings) goes to every worker, in order,
before the driver makes it. Each rank then holds the same requests and its scheduler makes the same choices, its
steps launch the same collectives (the all-reduces inside the blocks), and since the all-reduced logits are the same
on every rank, so are the sampled tokens: no token travels between ranks, and only the driver's are returned. This is
vLLM's and SGLang's split of the model; where they run one scheduler and send its decisions, here every rank runs
the same scheduler on the same inputs (their choices depend on nothing else: ``Engine.add_request`` takes the
driver's arrival time, and ``Engine._build_kv_cache`` agrees on the smallest pool of any rank).

Random draws are the one input a rank could make differently: a request sampled without a seed is given one by the
driver (from the process's torch generator, which ``servelab serve --seed`` seeds), so every rank draws it from the
same generator. Such a request then samples from its own generator, which costs a little more than the batch's
shared draw.

Workers are started with ``subprocess``, not ``multiprocessing``: the server's engine process is a daemon, and a
daemon may not have children of its own. Each connects back to the driver over a local, authenticated
``multiprocessing.connection``. A worker that fails says so there; a driver that goes away closes it, and the worker
exits. A collective that waits for a dead rank ends after ``timeout_s`` (the process group's timeout).

On CPUs the backend is gloo (``tests/test_tp_engine.py``); on GPUs NCCL, one GPU per rank, with NVLink multicast
off in every process (``tensor_parallel.NO_MULTICAST``). No machine of several GPUs has been lent, so the NCCL path,
captured all-reduces included, has never run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import subprocess
import sys
import time
from multiprocessing.connection import Client, Listener

import torch
import torch.distributed as dist

from servelab.engine.config import EngineConfig
from servelab.engine.engine import Engine, native_model
from servelab.engine.sequence import SAMPLING_EPS, SamplingParams, Sequence
from servelab.engine.tensor_parallel import NO_MULTICAST, free_port, shard_model
from servelab.errors import ParameterError

ADDRESS_ENV = "SERVELAB_TP_DRIVER"  # host:port:authkey-hex of the driver's listener, for a worker
DEFAULT_TIMEOUT_S = 600.0  # a collective's wait for the slowest rank (an 8B model loads in seconds to a minute)


def _join_group(rank: int, world: int, port: int, device: str, timeout_s: float) -> torch.device:
    os.environ.update(NO_MULTICAST)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return torch.device(f"cuda:{rank}" if cuda else "cpu")


def _shard(job: dict, rank: int, device: torch.device):
    """Rank ``rank``'s shard of ``job["spec"]``: every rank loads the whole model (same seed, same weights) and
    keeps its slices."""
    from servelab.models import load_model

    cfg: EngineConfig = job["config"]
    lm = load_model(job["spec"], dtype=job["dtype"], device=str(device), seed=job["seed"], load_tokenizer=False)
    full = native_model(lm.model, cfg)
    del lm
    return shard_model(full, rank, cfg.tensor_parallel_size)


class TensorParallelEngine(Engine):
    """The driver: rank 0's engine, which sends every state change to the workers before making it."""

    def __init__(self, model, config: EngineConfig, *, workers: list, procs: list, **kw):
        self._workers, self._procs = workers, procs
        super().__init__(model, config, **kw)

    @classmethod
    def launch(
        cls,
        spec: str,
        *,
        dtype="bfloat16",
        device=None,
        config: EngineConfig,
        seed: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        threads: int | None = None,
        **kw,
    ) -> TensorParallelEngine:
        """Start the workers, join the process group, and build every rank's engine over its shard."""
        world = config.tensor_parallel_size
        device = str(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.startswith("cuda") and torch.cuda.device_count() < world:
            raise ParameterError(
                f"tensor_parallel_size={world} needs {world} GPUs; {torch.cuda.device_count()} visible"
            )
        if dist.is_initialized():
            raise ParameterError("this process already belongs to a process group: one tensor parallel engine each")
        threads = threads or max(1, (os.cpu_count() or 1) // world)
        engine_kw = {k: v for k, v in kw.items() if k != "graph_progress"}  # the workers' engines draw no bars
        job = dict(spec=spec, dtype=dtype, device=device, seed=seed, config=config, port=free_port(),
                   timeout_s=timeout_s, threads=threads, engine_kw=engine_kw)  # fmt: skip
        authkey = os.urandom(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        host, port = listener.address
        env = {**os.environ, **NO_MULTICAST, ADDRESS_ENV: f"{host}:{port}:{authkey.hex()}"}
        procs = [
            subprocess.Popen([sys.executable, "-m", "servelab.engine.tp_engine", str(rank)], env=env)
            for rank in range(1, world)
        ]
        workers = []
        try:
            for _ in procs:
                workers.append(listener.accept())
            workers.sort(key=lambda c: c.recv())  # each says its rank first
            for conn in workers:
                conn.send(job)
            dev = _join_group(0, world, job["port"], device, timeout_s)
            engine = cls(_shard(job, 0, dev), config, workers=workers, procs=procs, **kw)
            for rank, conn in enumerate(workers, start=1):
                _expect(conn, rank, "ready", timeout_s)
        except BaseException:
            _stop(workers, procs)
            if dist.is_initialized():
                dist.destroy_process_group()
            raise
        finally:
            listener.close()
        return engine

    # ---- every state change goes to the workers first --------------------------------------------
    def _send(self, *msg) -> None:
        for rank, conn in enumerate(self._workers, start=1):
            try:
                if conn.poll():  # unasked, a worker only speaks to say it failed
                    _raise(rank, conn.recv())
                conn.send(msg)
            except (EOFError, OSError) as e:
                raise RuntimeError(f"tensor parallel rank {rank} is gone ({type(e).__name__})") from None

    def rank_outputs(self) -> list[dict[int, list[int]]]:
        """Each worker's output tokens of its running sequences, by the driver's sequence id (the check that every
        rank samples what the driver samples)."""
        self._send("outputs")
        return [_expect(conn, rank, "outputs", 60)[1] for rank, conn in enumerate(self._workers, start=1)]

    def add_request(
        self, prompt_token_ids, params: SamplingParams | None = None, *, arrival_s: float | None = None
    ) -> Sequence:
        params = params or SamplingParams()
        if params.temperature >= SAMPLING_EPS and params.seed is None:
            params = dataclasses.replace(params, seed=int(torch.randint(0, 2**62, ())))
        arrival_s = time.perf_counter() if arrival_s is None else arrival_s
        seq = super().add_request(prompt_token_ids, params, arrival_s=arrival_s)  # checked here before it is sent
        self._send("add", seq.seq_id, list(seq.prompt_token_ids), params, arrival_s)
        return seq

    def abort(self, seq: Sequence) -> bool:
        if not super().abort(seq):
            return False
        self._send("abort", seq.seq_id)
        return True

    def step(self):
        self._send("step")
        return super().step()

    def synchronize(self):
        self._send("synchronize")
        return super().synchronize()

    def reset_prefix_cache(self) -> None:
        self._send("call", "reset_prefix_cache", ())
        super().reset_prefix_cache()

    def set_prefix_caching(self, enabled: bool, eviction: str | None = None) -> None:
        self._send("call", "set_prefix_caching", (enabled, eviction))
        super().set_prefix_caching(enabled, eviction)

    def stats(self) -> dict:
        return {**super().stats(), "tensor_parallel_size": self.config.tensor_parallel_size}

    def close(self) -> None:
        """Stop the workers and leave the process group (also when the driver is collected)."""
        _stop(self._workers, self._procs)
        self._workers, self._procs = [], []
        if dist.is_initialized():
            dist.destroy_process_group()

    def __del__(self):
        if getattr(self, "_procs", None):
            _stop(self._workers, self._procs)


def _expect(conn, rank: int, what: str, timeout_s: float):
    if not conn.poll(timeout_s):
        raise RuntimeError(f"tensor parallel rank {rank} said nothing in {timeout_s:.0f} s")
    msg = conn.recv()
    if msg[0] != what:
        _raise(rank, msg)
    return msg


def _raise(rank: int, msg) -> None:
    raise RuntimeError(f"tensor parallel rank {rank} failed: {msg[1] if msg[0] == 'error' else msg!r}")


def _stop(workers: list, procs: list) -> None:
    for conn in workers:
        try:
            conn.send(("stop",))
            conn.close()
        except OSError:
            pass
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


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
        dev = _join_group(rank, job["config"].tensor_parallel_size, job["port"], job["device"], job["timeout_s"])
        me = _Rank(Engine(_shard(job, rank, dev), job["config"], **job["engine_kw"]), conn)
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
