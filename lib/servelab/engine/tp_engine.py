"""An engine whose model is split over N processes (``engine_from_spec(..., tensor_parallel_size=N)``; ``servelab
serve --tensor-parallel-size N``); ``generate`` runs one to completion. The Beyond-one-GPU page's TP table is
timed by ``servelab.cluster.tp_run``.

The driver is an ``Engine`` over rank 0's shard (``tensor_parallel.shard_model``) in the caller's process; ranks
1..N-1 are worker processes (``tp_worker``), each an ``Engine`` over its own shard. Every call that changes an
engine's state (a request added or aborted, a step, a synchronisation, the prefix cache's settings) goes to every
worker, in order, before the driver makes it. Each rank then holds the same requests and its scheduler makes the same
choices, its steps launch the same collectives (the all-reduces inside the blocks), and since the all-reduced logits
are the same on every rank, so are the sampled tokens: no token travels between ranks, and only the driver's are
returned. This is vLLM's and SGLang's split of the model; where they run one scheduler and send its decisions, here
every rank runs the same scheduler on the same inputs (their choices depend on nothing else: ``Engine.add_request``
takes the driver's arrival time, and every rank's KV pool has the smallest size any rank's free memory allows,
``agreed_config``). The split is a setting beside ``EngineConfig``, not in it, as vLLM keeps its ParallelConfig apart
from the cache's and the scheduler's: the engine itself does not change with it.

Random draws are the one input a rank could make differently: a request sampled without a seed is given one by the
driver (from the process's torch generator, which ``servelab serve --seed`` seeds), so every rank draws it from the
same generator. Such a request then samples from its own generator, which costs a little more than the batch's shared
draw.

Workers are started with ``subprocess``, not ``multiprocessing``: the server's engine process is a daemon, and a
daemon may not have children of its own. Each connects back to the driver over a local, authenticated
``multiprocessing.connection``. A worker that fails says so there; a driver that goes away closes it, and the worker
exits. A collective that waits for a dead rank ends after ``timeout_s`` (the process group's timeout).

On CPUs the backend is gloo (``tests/test_tp_engine.py``); on GPUs NCCL, one GPU per rank, with NVLink multicast off
in every process (``tensor_parallel.NO_MULTICAST``). No machine of several GPUs has been lent, so the NCCL path,
captured all-reduces included, has never run.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import subprocess
import sys
import time
from multiprocessing.connection import Listener

import torch
import torch.distributed as dist

from servelab.engine.config import EngineConfig
from servelab.engine.engine import Engine, _max_positions, resolve_backend
from servelab.engine.sequence import SAMPLING_EPS, SamplingParams, Sequence
from servelab.engine.tensor_parallel import NO_MULTICAST, free_port, shard_model
from servelab.errors import ParameterError

ADDRESS_ENV = "SERVELAB_TP_DRIVER"  # host:port:authkey-hex of the driver's listener, for a worker
DEFAULT_TIMEOUT_S = 600.0  # a collective's wait for the slowest rank (an 8B model loads in seconds to a minute)


def join_group(rank: int, world: int, port: int, device: str, timeout_s: float) -> torch.device:
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


def shard_for(job: dict, rank: int, device: torch.device):
    """Rank ``rank``'s shard of ``job["spec"]``: every rank loads the whole model (same seed, same weights) and
    keeps its slices."""
    from servelab.models import load_model
    from servelab.models.native import native_from_hf

    cfg: EngineConfig = job["config"]
    lm = load_model(job["spec"], dtype=job["dtype"], device=str(device), seed=job["seed"], load_tokenizer=False)
    positions = _max_positions(lm.model.config)
    if cfg.max_model_len is not None and cfg.max_model_len > positions:
        raise ParameterError(f"max_model_len={cfg.max_model_len} exceeds the model's {positions} positions")
    full = native_from_hf(lm.model, max_positions=cfg.max_model_len or min(4096, positions))
    del lm
    return shard_model(full, rank, job["world"])


def agreed_config(shard, cfg: EngineConfig) -> EngineConfig:
    """``cfg`` with the KV pool every rank can hold: on a GPU each rank sizes it from its own free memory (as
    ``Engine`` does), and the ranks take the smallest, since a rank that could hold more would schedule otherwise.
    The sizing runs a forward pass, with its all-reduces, on every rank alike."""
    device = next(shard.parameters()).device
    if cfg.num_blocks is not None or device.type != "cuda":
        return cfg  # a given size, or the CPU default: the same on every rank
    from servelab.engine.memory import plan_gpu_memory

    backend = resolve_backend(cfg.attention_backend, device)
    for block in shard.layers:
        block.attn.backend = backend
    plan = plan_gpu_memory(shard, cfg, Engine._max_model_len(shard, cfg), backend)
    return dataclasses.replace(cfg, num_blocks=shard.smallest_over_ranks(plan.num_blocks))


class TensorParallelEngine(Engine):
    """The driver: rank 0's engine, which sends every state change to the workers before making it."""

    def __init__(self, model, config: EngineConfig, *, world: int, workers: list, procs: list, **kw):
        self.tensor_parallel_size = world
        self._workers, self._procs = workers, procs
        super().__init__(model, config, **kw)

    @classmethod
    def launch(
        cls,
        spec: str,
        *,
        world: int,
        dtype="bfloat16",
        device=None,
        config: EngineConfig | None = None,
        seed: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        threads: int | None = None,
        **kw,
    ) -> TensorParallelEngine:
        """Start the workers, join the process group, and build every rank's engine over its shard."""
        config = config or EngineConfig()
        device = str(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.startswith("cuda") and torch.cuda.device_count() < world:
            raise ParameterError(
                f"tensor_parallel_size={world} needs {world} GPUs; {torch.cuda.device_count()} visible"
            )
        if dist.is_initialized():
            raise ParameterError("this process already belongs to a process group: one tensor parallel engine each")
        threads = threads or max(1, (os.cpu_count() or 1) // world)
        engine_kw = {k: v for k, v in kw.items() if k != "graph_progress"}  # the workers' engines draw no bars
        job = dict(spec=spec, dtype=dtype, device=device, seed=seed, config=config, world=world, port=free_port(),
                   timeout_s=timeout_s, threads=threads, engine_kw=engine_kw)  # fmt: skip
        authkey = os.urandom(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        host, port = listener.address
        env = {**os.environ, **NO_MULTICAST, ADDRESS_ENV: f"{host}:{port}:{authkey.hex()}"}
        procs = [
            subprocess.Popen([sys.executable, "-m", "servelab.engine.tp_worker", str(rank)], env=env)
            for rank in range(1, world)
        ]
        workers = []
        try:
            for _ in procs:
                workers.append(listener.accept())
            workers.sort(key=lambda c: c.recv())  # each says its rank first
            for conn in workers:
                conn.send(job)
            dev = join_group(0, world, job["port"], device, timeout_s)
            shard = shard_for(job, 0, dev)
            engine = cls(shard, agreed_config(shard, config), world=world, workers=workers, procs=procs, **kw)
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
        return {**super().stats(), "tensor_parallel_size": self.tensor_parallel_size}

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


def engine_from_spec(spec: str, *, config: EngineConfig | None = None, tensor_parallel_size: int = 1, **kw) -> Engine:
    """``Engine.from_spec``, split over ``tensor_parallel_size`` processes where that is more than 1."""
    tp = tensor_parallel_size
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ParameterError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
    if tp > 1:
        return TensorParallelEngine.launch(spec, world=tp, config=config, **kw)
    kw.pop("timeout_s", None)
    return Engine.from_spec(spec, config=config, **kw)


def generate(
    spec: str,
    prompts: list[list[int]],
    *,
    world: int,
    max_tokens: int = 16,
    dtype: str = "float32",
    device: str = "cpu",
    seed: int = 0,
    max_positions: int = 512,
    engine: dict | None = None,
    timeout_s: float = 600.0,
) -> list[list[int]]:
    """Greedy tokens of ``prompts`` from ``spec`` split over ``world`` processes (CPUs over gloo; ``device="cuda"``,
    one GPU each over NCCL). The page's timings are ``servelab.cluster.tp_run``'s."""
    from servelab.engine import SamplingParams

    settings = engine or {"num_blocks": 64, "cuda_graphs": device == "cuda"}
    cfg = EngineConfig(**settings, max_model_len=max_positions)
    kw = {"timeout_s": timeout_s} if world > 1 else {}
    e = engine_from_spec(spec, dtype=dtype, device=device, config=cfg, seed=seed, tensor_parallel_size=world, **kw)
    try:
        return e.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    finally:
        if hasattr(e, "close"):
            e.close()
