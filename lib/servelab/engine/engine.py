"""The engine: requests in, tokens out, one step at a time.

    engine = Engine.from_spec("config:qwen2-0.5b", dtype="bfloat16", device="cuda")
    seq = engine.add_request(prompt_ids, SamplingParams(max_tokens=64, temperature=0.7, seed=1))
    for event in engine.stream():      # TokenEvent(seq_id, token_id, finished, finish_reason)
        ...

Each ``step()`` asks the scheduler for a batch, launches it (``ModelRunner``) and hands the sampled
tokens back to the scheduler, which appends them, finishes sequences and frees their blocks. With async
scheduling (the default) a step's tokens are read during the next step, so the host's work for step
n+1 overlaps the GPU's for step n (``inflight.py``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import torch

from servelab.engine.compilation import compile_with_check
from servelab.engine.config import EngineConfig
from servelab.engine.inflight import InFlightStep
from servelab.engine.memory import MemoryPlan, plan_gpu_memory
from servelab.engine.model_runner import ModelRunner, max_blocks_per_sequence
from servelab.engine.policies import policy_class
from servelab.engine.scheduler import ScheduledBatch, ScheduledSequence, Scheduler, TokenEvent
from servelab.engine.sequence import PENDING_TOKEN, SamplingParams, Sequence
from servelab.errors import ParameterError
from servelab.kernels.prefill import varlen_available, varlen_self_check
from servelab.kv.block_manager import BlockManager
from servelab.kv.pool import KVPool
from servelab.kv.prefix_cache import PrefixCache

CPU_DEFAULT_BLOCKS = 4096


def resolve_backend(name: str, device: torch.device) -> str:
    """``auto`` is the Triton paged kernel on CUDA where Triton imports, else the gather backend."""
    from servelab.kernels.decode import DECODE_BACKENDS

    if name == "auto":
        return "triton" if device.type == "cuda" and "triton" in DECODE_BACKENDS else "gather"
    if name != "reference" and name not in DECODE_BACKENDS:
        raise ParameterError(f"attention backend {name!r} is not available here (have {sorted(DECODE_BACKENDS)})")
    return name


def fused_rope_kv_runs(device: torch.device) -> bool:
    """``fused_rope_kv_write="auto"``: on CUDA where Triton imports (Triton's interpreter runs it on a CPU, but far
    slower than the path it replaces, so a CPU engine takes it only when asked)."""
    if device.type != "cuda":
        return False
    from servelab.models.llama import rope_kv_write

    return rope_kv_write is not None


class StepRecord(NamedTuple):
    """What one engine step did and when (``time.perf_counter`` seconds): the batch composition timeline
    Study 1 plots, and what the simulator's cost model is validated against.

    A step runs from the start of its scheduling (``start_s``) until its sampled tokens are on the host
    (``end_s``). With async scheduling the next step is scheduled and launched before that, so consecutive
    steps overlap; the record is emitted when the step ends. ``host_ms`` (scheduling, input building and
    launch on the CPU), ``device_ms`` (the GPU's time for the step) and ``wait_ms`` (the host blocked on its
    tokens) say where a slow step's time went.
    """

    start_s: float
    end_s: float
    prefill_tokens: int  # tokens of items that are not single-token decodes (prefill chunks, recomputes)
    decode_tokens: int
    num_seqs: int  # sequences in the batch
    num_waiting: int  # queue length after scheduling
    num_preempted: int
    decode_steps: int  # >1 for a multi-step decode group
    prefill_context_tokens: int = 0  # Σ over prefill items of new tokens × tokens cached before them (attention work)
    decode_context_tokens: int = 0  # Σ over decode items of the tokens each attends to (KV bytes read)
    host_ms: float = float("nan")  # CPU time to schedule the step, build its inputs and launch it
    device_ms: float = float("nan")  # GPU time from its first kernel to its sampled tokens (CUDA events; NaN on CPU)
    wait_ms: float = float("nan")  # time the host waited for its tokens
    overlapped: bool = False  # whether the next step was launched before this one's tokens were read


def eos_ids(config) -> tuple[int, ...]:
    e = getattr(config, "eos_token_id", None)
    if e is None:
        return ()
    return tuple(e) if isinstance(e, (list, tuple)) else (int(e),)


class _Launch(NamedTuple):
    """What the step record of a launched step needs, known at launch."""

    start_s: float
    host_ms: float
    num_waiting: int
    overlapped: bool


class Engine:
    def __init__(
        self,
        model,
        config: EngineConfig | None = None,
        *,
        eos_token_ids: Iterable[int] | None = None,
        scheduler_cls: type[Scheduler] | None = None,
        graph_progress=None,
    ):
        self.config = cfg = config or EngineConfig()
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.max_model_len = self._max_model_len(model, cfg)
        self.backend = resolve_backend(cfg.attention_backend, self.device)
        for block in model.layers:  # the model was built with some backend; the engine's choice wins
            block.attn.backend = self.backend
        self._set_fused_rope_kv_write()
        self._set_small_batch()
        self._set_pdl()
        self._build_kv_cache()
        self.scheduler = self._build_scheduler(scheduler_cls, eos_token_ids)
        self.runner = ModelRunner(
            model,
            self.pool,
            self.block_manager,
            scratch_block=self.num_blocks,
            max_num_seqs=cfg.max_num_seqs,
            max_blocks=max_blocks_per_sequence(self.max_model_len, cfg.block_size),
        )
        self.runner.eos_token_ids = self.scheduler.eos_token_ids
        self._try_varlen()
        self._try_compile()
        self._capture_graphs(graph_progress)
        self.steps = 0
        self.on_step: Callable[[StepRecord], None] | None = None  # called after every step (a timeline)
        self._inflight: InFlightStep | None = None  # the launched step whose tokens are not read yet
        self._launch: _Launch | None = None

    # ---- construction, one job each ----------------------------------------------------------------
    @staticmethod
    def _max_model_len(model, cfg: EngineConfig) -> int:
        if cfg.max_model_len is not None and cfg.max_model_len > model.max_positions:
            raise ParameterError(
                f"max_model_len={cfg.max_model_len} exceeds the model's {model.max_positions} positions"
            )
        return min(cfg.max_model_len or 4096, model.max_positions)

    def _set_fused_rope_kv_write(self) -> None:
        """The config's ``fused_rope_kv_write`` on the model, before compilation and capture (a ParameterError
        where it is asked for and the kernel cannot run, or the model has no such path; "auto" takes it where it
        can run)."""
        want = self.config.fused_rope_kv_write
        setter = getattr(self.model, "set_fused_rope_kv_write", None)
        if want == "auto":
            want = setter is not None and fused_rope_kv_runs(self.device)
        if setter is not None:
            setter(want)
        elif want:
            raise ParameterError(
                f"fused_rope_kv_write: {type(self.model).__name__} has no fused RoPE + KV-write path (Llama/Qwen2 do)"
            )
        self.fused_rope_kv_write = bool(want)

    def _set_small_batch(self) -> None:
        """The config's ``small_batch``: one-row steps through ``kernels.small_linear`` (``models.small_batch``),
        set on the model before compilation, which then compiles the wide path and keeps the small one."""
        want = self.config.small_batch
        self.small_batch = False
        if want is False or (want == "auto" and not self.fused_rope_kv_write):
            return  # the fused path is off, so Triton may not even import here
        from servelab.models.small_batch import runs_on, use_small_linear, uses_small_linear

        if uses_small_linear(self.model):  # switched by the caller already (its own max_rows): kept as it is
            self.small_batch = True
            return
        if want == "auto":
            want = self.fused_rope_kv_write and runs_on(self.model)
        elif want and not (self.fused_rope_kv_write and runs_on(self.model)):
            raise ParameterError(
                "small_batch needs fused_rope_kv_write on and a Llama/Qwen2 model whole in this process, "
                f"got fused_rope_kv_write={self.fused_rope_kv_write} and {type(self.model).__name__}"
            )
        if want:
            use_small_linear(self.model)
        self.small_batch = bool(want)

    def _set_pdl(self) -> None:
        """The config's ``pdl`` on the model (``kernels.pdl.bind``), before compilation and capture: "auto" takes it
        where it runs, True refuses a place it cannot."""
        from servelab.kernels import pdl

        want = self.config.pdl
        self.pdl = pdl.supported(self.device) if want == "auto" else pdl.wanted(self.device, want)
        pdl.bind(self.model, self.pdl)

    def _build_kv_cache(self) -> None:
        """The KV pool, sized by ``num_blocks``, the GPU's free memory, or the CPU default; its block manager."""
        cfg = self.config
        self.memory_plan: MemoryPlan | None = None
        if cfg.num_blocks is not None:
            num_blocks = cfg.num_blocks
        elif self.device.type == "cuda":
            self.memory_plan = plan_gpu_memory(self.model, cfg, self.max_model_len, self.backend)
            num_blocks = self.memory_plan.num_blocks
        else:
            num_blocks = CPU_DEFAULT_BLOCKS
        self.num_blocks = num_blocks
        # one extra block that no sequence owns: padding rows of a CUDA graph write there
        self.pool = KVPool.for_model(self.model.shape, num_blocks + 1, cfg.block_size, self.dtype, self.device)
        self.pool.kv.zero_()  # masked-out keys still enter P·V as 0·value: never let that be 0·NaN
        prefix_cache = PrefixCache(cfg.block_size, cfg.prefix_eviction) if cfg.prefix_caching else None
        self.block_manager = BlockManager(num_blocks, cfg.block_size, prefix_cache)

    def _build_scheduler(self, scheduler_cls, eos_token_ids) -> Scheduler:
        cfg = self.config
        if scheduler_cls is None:  # an explicit class wins over the config's policy name
            scheduler_cls = policy_class(cfg.scheduler)
        return scheduler_cls(
            self.block_manager,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            eos_token_ids=tuple(eos_token_ids) if eos_token_ids is not None else eos_ids(self.model.config),
        )

    def _try_varlen(self) -> None:
        """Varlen flash-attention prefill, where it is installed and passes its self-check here."""
        self.varlen_status = "not tried (CPU or 32-bit)"
        if varlen_available(torch.empty(0, device=self.device, dtype=self.dtype)):
            s = self.model.shape
            why_not = varlen_self_check(self.device, self.dtype, s.heads, s.kv_heads, s.head_dim)
            self.runner.varlen = why_not is None
            self.varlen_status = "on" if why_not is None else f"off: {why_not}"

    def _try_compile(self) -> None:
        """``torch.compile`` of the blocks when the config asks (``"auto"``: on CUDA), kept only if checked."""
        auto = self.config.compile == "auto"
        if not (self.device.type == "cuda" if auto else self.config.compile):
            self.compile_status = "off (auto: on CUDA only)" if auto else "off"
            return
        self.compile_status = compile_with_check(self.model, self.pool, self.num_blocks)
        if self.compile_status.startswith("on") and self.device.type == "cuda":
            from servelab.engine.sampling import exponential_race
            from servelab.models.layers.compiled import compiled

            self.runner.race = compiled(exponential_race)

    def _capture_graphs(self, progress) -> None:
        """Decode graphs and whole-step graphs (CUDA only), each as the config asks."""
        cfg = self.config
        self.num_graphs = 0
        self.graph_capture_s = 0.0
        if cfg.cuda_graphs and self.device.type == "cuda":
            t0 = time.perf_counter()
            self.num_graphs = self.runner.capture_cuda_graphs(cfg.max_num_seqs, progress, cfg.graph_batch_sizes)
            self.graph_capture_s = time.perf_counter() - t0
        self.num_step_graphs = 0
        self.step_graphs_status = "off"
        if cfg.step_graphs and self.device.type == "cuda":
            self.step_graphs_status = self._capture_step_graphs(progress)

    def _capture_step_graphs(self, progress) -> str:
        """Capture whole prefill/mixed steps; they need the ragged Triton kernel (why not, if they are off)."""
        from servelab.engine.step_graphs import step_graph_sizes
        from servelab.kernels.decode import DECODE_BACKENDS

        if "triton" not in DECODE_BACKENDS:
            return "off: Triton is not installed"
        if self.backend == "reference":
            return "off: the reference attention backend runs every step eagerly"
        cfg = self.config
        sizes = cfg.step_graph_sizes or step_graph_sizes(cfg.max_num_batched_tokens)
        t0 = time.perf_counter()
        self.num_step_graphs = self.runner.enable_step_graphs(
            sizes, capture=True, progress=progress, split_kv=cfg.ragged_split_kv
        )
        self.graph_capture_s += time.perf_counter() - t0
        return f"on ({self.num_step_graphs} buckets, {sizes[0]}–{sizes[-1]} tokens)"

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, hf_model, config: EngineConfig | None = None, **kw) -> Engine:
        """An engine running the project's model code with ``hf_model``'s weights (same dtype and device)."""
        from servelab.models.native import native_from_hf

        cfg = config or EngineConfig()
        positions = _max_positions(hf_model.config)
        if cfg.max_model_len is not None and cfg.max_model_len > positions:
            raise ParameterError(f"max_model_len={cfg.max_model_len} exceeds the model's {positions} positions")
        limit = cfg.max_model_len or min(4096, positions)
        model = native_from_hf(hf_model, max_positions=limit)
        return cls(model, cfg, **kw)

    @classmethod
    def from_spec(
        cls, spec: str, *, dtype="bfloat16", device=None, config: EngineConfig | None = None, seed: int = 0, **kw
    ) -> Engine:
        """Load ``spec`` with the model loader (``config:<name>``, a directory or a hub id) and build an engine."""
        from servelab.models import load_model

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        lm = load_model(spec, dtype=dtype, device=device, seed=seed, load_tokenizer=False)
        engine = cls.from_hf(lm.model, config, **kw)
        del lm
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        return engine

    # ---- requests ---------------------------------------------------------------------------------
    def add_request(
        self, prompt_token_ids, params: SamplingParams | None = None, *, arrival_s: float | None = None
    ) -> Sequence:
        params = params or SamplingParams()
        seq = Sequence(
            list(prompt_token_ids), params, arrival_s=time.perf_counter() if arrival_s is None else arrival_s
        )
        vocab = self.model.shape.vocab
        if max(seq.prompt_token_ids) >= vocab:
            raise ParameterError(f"prompt token ids must be < vocab size {vocab}")
        if seq.max_total_tokens > self.max_model_len:
            raise ParameterError(
                f"prompt ({len(seq.prompt_token_ids)}) + max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len={self.max_model_len}"
            )
        if params.seed is not None:
            seq.generator = torch.Generator(device=self.device).manual_seed(params.seed)
        if params.prompt_logprobs is not None:
            seq.prompt_logprobs = [None]  # the first token has no context to be scored in
        self.scheduler.add(seq)
        return seq

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._inflight is not None

    def kv_blocks(self) -> tuple[int, int]:
        """(used, total) KV blocks: what a server's gauges and a study's idle check read, so that nothing outside
        ``engine/`` reaches into the block manager."""
        return self.block_manager.num_used_blocks, self.block_manager.num_blocks

    def set_policy(self, name: str, max_num_batched_tokens: int | None = None) -> None:
        """Replace the idle engine's scheduler by a fresh ``name`` scheduler (a policy in ``engine.policies``) with
        ``max_num_batched_tokens`` per step (None: the config's); a study swaps policies between its runs."""
        if self.has_unfinished():
            raise RuntimeError("the engine is not idle: a policy is swapped only between runs")
        budget = max_num_batched_tokens or self.config.max_num_batched_tokens
        config = dataclasses.replace(self.config, scheduler=name, max_num_batched_tokens=budget)  # checked first
        self.scheduler = policy_class(name)(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=budget,
            eos_token_ids=self.scheduler.eos_token_ids,
        )
        self.config = config

    def abort(self, seq: Sequence) -> bool:
        """Cancel a request (a client went away): its KV blocks are freed at once. Call it from the thread
        that steps the engine, between steps. Whether the request was still unfinished."""
        if not self.scheduler.abort(seq):
            return False
        if seq.output_token_ids and seq.output_token_ids[-1] == PENDING_TOKEN:
            seq.output_token_ids.pop()  # its step in flight is dropped when it lands
        self.runner.release(seq.seq_id)
        return True

    def leaked(self) -> list[int]:
        """Ids of sequences that are not running yet hold a block-table row or KV blocks, sorted: [] unless a finish,
        abort or preemption was not given back. Holds between ``step()`` calls (the benchmark checks it after a run:
        a leak there ends later runs of the same engine with "no free block-table row")."""
        running = {seq.seq_id for seq in self.scheduler.running}
        held = set(self.runner.tables.row_of) | set(self.block_manager.seq_ids)
        return sorted(held - running)

    # ---- running ----------------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        """Schedule and launch one step; return the tokens that reached the host meanwhile.

        With ``async_scheduling`` the step's tokens are read in the next call, after the next step was
        launched: the GPU runs step n+1 while the host reads step n's tokens and schedules (``inflight.py``).
        A step after which some sequence reaches ``max_tokens`` is read before the next is scheduled, so no
        step computes a token nobody asked for; a stop or EOS token costs its sequence one dropped step.
        """
        t0 = time.perf_counter()
        events = self._land() if self._inflight is not None and self._must_land(self._inflight) else []
        batch = self.scheduler.schedule()
        for seq in batch.preempted:
            self.runner.release(seq.seq_id)
        if not batch.items:
            if self._inflight is not None:
                return events + self._land()
            if events or batch.preempted or not self.has_unfinished():
                return events
            raise RuntimeError(
                f"scheduler produced no work with {len(self.scheduler.waiting)} waiting and "
                f"{len(self.scheduler.running)} running sequences"
            )
        if self.config.decode_steps > 1 and batch.is_decode_only:  # the group reads its tokens itself
            group = self._run_decode_group(batch, t0)
            if group is not None:
                return events + group
        launched = self.runner.launch(batch, self._inflight)
        self.steps += 1
        host_ms = (time.perf_counter() - t0) * 1e3
        if self._inflight is not None:
            events += self._land()  # the GPU runs the step just launched while the host waits for the one before
        self.scheduler.advance(batch)
        self._inflight = launched
        overlap = not self._must_land(launched)
        self._launch = _Launch(t0, host_ms, len(self.scheduler.waiting), overlap)
        if not overlap:
            events += self._land()
        return events

    def synchronize(self) -> list[TokenEvent]:
        """Read the tokens of the step in flight now, if any (the host waits for the GPU); the events they make.

        For callers that go on to drive the scheduler and the runner themselves (the benchmark's prepared steps):
        afterwards no sequence holds a token that is still on the device.
        """
        return self._land() if self._inflight is not None else []

    def _must_land(self, step: InFlightStep) -> bool:
        """Whether ``step``'s tokens must be read before another step is scheduled: async scheduling is off,
        a sequence ends there by length, a penalty of one must read its tokens, or no sequence of it is left running."""
        if not self.config.async_scheduling or self.config.decode_steps > 1:
            return True
        seqs = [it.seq for it in step.batch.items if not it.seq.is_finished]
        return not seqs or any(len(s.output_token_ids) >= s.params.max_tokens or s.params.penalized for s in seqs)

    def _land(self) -> list[TokenEvent]:
        """Read the step in flight's tokens (the wait for the GPU), hand them to the scheduler, log the step."""
        step, launch = self._inflight, self._launch
        self._inflight = self._launch = None
        t_wait = time.perf_counter()
        tokens = step.tokens()
        logprobs = step.token_logprobs() or [None] * len(tokens)
        step.land_prompt_logprobs()
        t_read = time.perf_counter()
        events = []
        for it, tok, lp in zip(step.items, tokens, logprobs, strict=True):
            ev = self.scheduler.accept(it.seq, tok)
            if ev is not None:  # None: the sequence finished before its token landed
                events.append(ev if lp is None else ev._replace(logprobs=lp))
        self._release_finished(events)
        if self.on_step is not None:
            self.on_step(
                _record(
                    step.batch,
                    launch.start_s,
                    time.perf_counter(),
                    launch.num_waiting,
                    1,
                    host_ms=launch.host_ms,
                    device_ms=step.device_ms(),
                    wait_ms=(t_read - t_wait) * 1e3,
                    overlapped=launch.overlapped,
                )
            )
        return events

    def _run_decode_group(self, batch: ScheduledBatch, t0: float) -> list[TokenEvent] | None:
        """A multi-step decode group (``decode_steps > 1``) and its step record; None if the batch cannot run as one."""
        steps_before = self.steps
        events = self._decode_group(batch)
        if events is None:
            return None
        if self.on_step is not None:
            end = time.perf_counter()
            self.on_step(
                _record(batch, t0, end, len(self.scheduler.waiting), self.steps - steps_before, wait_ms=float("nan"))
            )
        return events

    def _decode_group(self, batch: ScheduledBatch) -> list[TokenEvent] | None:
        """Multi-step decoding: up to ``decode_steps`` decode steps for this batch before scheduling again.

        Each sequence runs as many as it has tokens left (``max_tokens``) and free blocks allow; EOS or a
        stop token found mid-group ends it there, and the tokens computed after it are dropped (the price:
        up to ``decode_steps - 1`` wasted tokens per such request, and newcomers wait up to that many
        steps). The tokens are those single steps would give: same inputs, same kernels, same sampling.
        """
        if not all(it.samples and not it.seq.params.processed for it in batch.items):
            return None  # logits processors and logprobs run in ordinary steps
        steps = []
        for it in batch.items:
            seq = it.seq
            k = min(self.config.decode_steps, seq.params.max_tokens - len(seq.output_token_ids))
            if k > 1 and not self.scheduler.reserve(seq, it.start + k):
                k = 1
            steps.append(k)
        if max(steps) == 1:
            return None
        tokens = self.runner.decode_group(batch.items, steps)
        if tokens is None:
            return None  # no bucket holds it: one ordinary step (the extra reservations stay for later)
        events = []
        for j in range(max(steps)):
            items = [
                (ScheduledSequence(it.seq, it.start + j, 1, [it.seq.kv_slots[it.start + j]]), tokens[j][i])
                for i, (it, k) in enumerate(zip(batch.items, steps, strict=True))
                if j < k and not it.seq.is_finished
            ]
            if not items:
                break
            done = self.scheduler.postprocess(ScheduledBatch([it for it, _ in items]), [t for _, t in items])
            self._release_finished(done)
            events += done
            self.steps += 1
        return events

    def _release_finished(self, events: list[TokenEvent]) -> None:
        """Give the block-table rows of the sequences that ``events`` finish back to the runner. Every path that hands
        tokens to the scheduler (a landed step, a multi-step group) must call it: the scheduler frees a finished
        sequence's KV blocks, but the runner's rows (``max_num_seqs`` of them) are the engine's to free."""
        for event in events:
            if event.finished:
                self.runner.release(event.seq_id)

    def stream(self) -> Iterator[TokenEvent]:
        """Step until every request finished, yielding tokens as they are produced."""
        while self.has_unfinished():
            yield from self.step()

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        *,
        progress: bool = False,
    ) -> list[list[int]]:
        """Run ``prompts`` to completion; output token ids per prompt, in order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ParameterError(f"got {len(plist)} SamplingParams for {len(prompts)} prompts")
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=sum(s.params.max_tokens for s in seqs), unit="tok", desc="generate")
        for _ in self.stream():
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        return [s.output_token_ids for s in seqs]

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens found in the prefix cache / prompt tokens looked up, over all admissions (0 when off)."""
        cache = self.block_manager.prefix_cache
        return cache.hit_rate if cache is not None else 0.0

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (e.g. to time a cold start); running requests keep their blocks."""
        self.block_manager.reset_prefix_cache()

    def set_prefix_caching(self, enabled: bool, eviction: str | None = None) -> None:
        """Switch prefix caching on (an empty cache, its counters at zero) or off, between runs: no request
        may be in flight. Lets one engine (one KV pool, one set of CUDA graphs) be measured both ways."""
        if self.has_unfinished():
            raise RuntimeError("switch prefix caching only when no request is in flight")
        self.block_manager.reset_prefix_cache()
        self.block_manager.prefix_cache = (
            PrefixCache(self.config.block_size, eviction or self.config.prefix_eviction) if enabled else None
        )

    def stats(self) -> dict:
        cache = self.block_manager.prefix_cache
        prefix = {"prefix_caching": cache is not None, **(cache.stats() if cache is not None else {})}
        return {
            **prefix,
            "num_blocks": self.num_blocks,
            "block_size": self.config.block_size,
            "kv_pool_gib": self.pool.nbytes / 2**30,
            "attention_backend": self.backend,
            "fused_rope_kv_write": self.fused_rope_kv_write,
            "small_batch": self.small_batch,
            "pdl": self.pdl,
            "ragged_split_kv": self.config.ragged_split_kv,
            "varlen_prefill": self.varlen_status,
            "triton_tuning": self.runner.triton_tuning,
            "compile": self.compile_status,
            "async_scheduling": self.config.async_scheduling and self.config.decode_steps == 1,
            "cuda_graphs": self.num_graphs,
            "graph_capture_s": self.graph_capture_s,
            "steps": self.steps,
            "step_graphs": self.step_graphs_status,
            "graph_steps": self.runner.graph_steps,
            "step_graph_steps": self.runner.step_graph_steps,
            "eager_steps": self.runner.eager_steps,
            "decode_steps": self.config.decode_steps,
            "decode_groups": self.runner.decode_groups,
            "preemptions": self.scheduler.num_preemptions,
            "scheduler": type(self.scheduler).__name__,
        }


def _record(batch: ScheduledBatch, start_s: float, end_s: float, num_waiting: int, steps: int, **times) -> StepRecord:
    decodes = [it for it in batch.items if it.is_decode]
    return StepRecord(
        start_s,
        end_s,
        batch.num_tokens - len(decodes),
        len(decodes),
        len(batch.items),
        num_waiting,
        len(batch.preempted),
        steps,
        sum(it.num_tokens * it.start for it in batch.items if not it.is_decode),
        sum(it.start + 1 for it in decodes),
        **times,
    )


def _max_positions(config) -> int:
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 4096)
