"""Async scheduling (``engine/inflight.py``): a step's tokens are read during the next step, and nothing changes.

Greedy tokens equal HF's (float32, CPU) on every input path (eager, whole-step graphs and decode graphs run
uncaptured); the host reads device data once per step, after the next step was launched; stop tokens, aborts
and preemption behave as in the synchronous loop.
"""

import pytest
import torch
from hf_reference import hf_greedy, varies

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.engine.cuda_graphs import DecodeGraphs
from servelab.engine.inflight import InFlightStep
from servelab.engine.policies import make_scheduler
from servelab.engine.sequence import PENDING_TOKEN, FinishReason, Sequence, SequenceStatus
from servelab.errors import ParameterError
from servelab.kernels import attention
from servelab.models import load_model

STEPS = 8
LENGTHS = (5, 19, 33, 2)


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    hf = load_model("config:tiny-llama", dtype="float32", device="cpu").model
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in LENGTHS]
    refs = hf_greedy(hf, prompts, STEPS)
    assert varies(refs), refs  # tiny-llama's continuations vary at the loader's init
    return hf, prompts, refs


def greedy(n=STEPS, **kw):
    return SamplingParams(max_tokens=n, ignore_eos=True, **kw)


def engine_for(hf, path: str, **cfg) -> Engine:
    """An engine whose steps take ``path``: "eager", "step graph" (whole steps) or "decode graph", uncaptured."""
    sizes = dict(block_size=4, num_blocks=96, max_num_seqs=8, max_num_batched_tokens=24)
    engine = Engine.from_hf(hf, EngineConfig(**{**sizes, **cfg}))
    runner = engine.runner
    if path == "step graph":
        runner.enable_step_graphs((8, 16, 24), capture=False)
    elif path == "decode graph":
        runner.graphs = DecodeGraphs(
            engine.model, engine.pool, runner.tables, max_batch=runner.max_num_seqs, scratch_block=engine.num_blocks
        )
    return engine


@pytest.mark.parametrize("path", ["eager", "step graph", "decode graph"])
def test_overlapped_steps_give_hf_greedy_tokens(llama, path):
    """Chunked prompts, decodes and requests of different lengths together; every step but those where a request
    ends by length is read after the next one was launched."""
    hf, prompts, refs = llama
    engine = engine_for(hf, path)
    records = []
    engine.on_step = records.append
    lengths = [STEPS, 3, 7, 1]
    got = engine.generate(prompts, [greedy(n) for n in lengths])
    assert got == [r[:n] for r, n in zip(refs, lengths, strict=True)]
    assert len(records) == engine.steps
    assert sum(r.overlapped for r in records) >= engine.steps - len(prompts)  # one read-first step per finish
    runner = engine.runner
    ran = {"eager": runner.eager_steps, "step graph": runner.step_graph_steps, "decode graph": runner.eager_steps}
    assert ran[path] == engine.steps if path != "decode graph" else runner.eager_steps > 0
    if path == "decode graph":
        assert runner.graphs is not None and not runner.graphs.graphs  # the uncaptured packed decode path ran
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished()


def test_async_and_synchronous_loops_schedule_the_same_steps(llama):
    """Requests that end by length: the same steps, in the same order, with the same tokens."""
    hf, prompts, _ = llama
    runs = []
    for on in (True, False):
        engine = engine_for(hf, "eager", async_scheduling=on)
        records = []
        engine.on_step = records.append
        out = engine.generate(prompts, [greedy(n) for n in (STEPS, 3, 7, 1)])
        runs.append((out, [(r.prefill_tokens, r.decode_tokens, r.num_seqs) for r in records]))
        assert engine.stats()["async_scheduling"] is on
    assert runs[0] == runs[1]


class HostReads:
    """Counts what would make the host wait for a GPU (reading a tensor's values) and orders launches and reads."""

    NAMES = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__")

    def __init__(self, monkeypatch, engine):
        self.reads, self.log, self.paused = 0, [], False
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(t, *a, _original=original, **kw):
                self.reads += not self.paused
                return _original(t, *a, **kw)

            monkeypatch.setattr(torch.Tensor, name, counted)
        ragged = attention.ragged_attention

        def uncounted(*a, **kw):  # the CPU stand-in for the Triton ragged kernel reads its tiles on the host
            self.paused = True
            try:
                return ragged(*a, **kw)
            finally:
                self.paused = False

        monkeypatch.setattr(attention, "ragged_attention", uncounted)
        launch, tokens = engine.runner.launch, InFlightStep.tokens

        self.kept = []  # steps stay alive so that no later step reuses an id() (a freed object's id is recycled)

        def logged_launch(batch, previous=None):
            step = launch(batch, previous)
            self.kept.append(step)
            self.log.append(("launch", id(step)))
            return step

        def logged_tokens(step):
            self.log.append(("read", id(step)))
            return tokens(step)

        monkeypatch.setattr(engine.runner, "launch", logged_launch)
        monkeypatch.setattr(InFlightStep, "tokens", logged_tokens)


@pytest.mark.parametrize("path", ["eager", "step graph", "decode graph"])
def test_one_host_read_per_step_and_after_the_next_launch(llama, monkeypatch, path):
    hf, prompts, refs = llama
    engine = engine_for(hf, path)
    engine.generate(prompts[:1], greedy(2))  # first-use work (lazy initialisation) outside the count
    seqs = [engine.add_request(p, greedy()) for p in prompts[:3]]
    probe = HostReads(monkeypatch, engine)
    while engine.has_unfinished():
        engine.step()
    assert [s.output_token_ids for s in seqs] == refs[:3]
    launches = [k for what, k in probe.log if what == "launch"]
    reads = [k for what, k in probe.log if what == "read"]
    assert sorted(launches) == sorted(reads) and probe.reads == len(reads)  # one read per step, nothing else
    overlapped = 0
    for i, k in enumerate(launches[:-1]):  # a step's read comes after the next step's launch, but the last ones
        overlapped += probe.log.index(("launch", launches[i + 1])) < probe.log.index(("read", k))
    assert overlapped >= len(launches) - 2


def test_the_synchronous_loop_reads_each_step_before_the_next_launch(llama, monkeypatch):
    hf, prompts, refs = llama
    engine = engine_for(hf, "eager", async_scheduling=False)
    probe = HostReads(monkeypatch, engine)
    assert engine.generate(prompts[:2], greedy()) == refs[:2]
    assert [what for what, _ in probe.log] == ["launch", "read"] * engine.steps


def test_a_stop_token_ends_a_request_one_step_late_on_the_device_only(llama):
    """The step in flight still computes a token for the stopped request; it is dropped, and the others go on."""
    hf, prompts, refs = llama
    engine = engine_for(hf, "eager")
    stop = refs[1][2]
    first = refs[1].index(stop)
    seqs = [engine.add_request(prompts[0], greedy()), engine.add_request(prompts[1], greedy(stop_token_ids=(stop,)))]
    while engine.has_unfinished():
        engine.step()
    assert seqs[1].output_token_ids == refs[1][: first + 1] and seqs[1].finish_reason is FinishReason.STOP
    assert seqs[0].output_token_ids == refs[0]
    assert engine.block_manager.num_used_blocks == 0


def test_abort_with_a_token_in_flight(llama):
    hf, prompts, refs = llama
    engine = engine_for(hf, "eager")
    keep, drop, queued = (engine.add_request(p, greedy()) for p in prompts[:3])
    for _ in range(4):
        engine.step()
    assert drop.output_token_ids[-1] == PENDING_TOKEN  # its token of the step in flight is not read yet
    assert engine.abort(drop) and not engine.abort(drop)
    assert PENDING_TOKEN not in drop.output_token_ids and drop.finish_reason is FinishReason.ABORT
    assert drop.output_token_ids == refs[1][: len(drop.output_token_ids)]
    events = []
    while engine.has_unfinished():
        events += engine.step()
    assert all(ev.seq_id != drop.seq_id for ev in events)
    assert keep.output_token_ids == refs[0] and queued.output_token_ids == refs[2]
    assert engine.block_manager.num_used_blocks == 0


def test_preemption_with_tokens_in_flight_keeps_outputs_exact(llama):
    hf, prompts, refs = llama
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=14, max_num_seqs=4, max_num_batched_tokens=16))
    assert engine.generate(prompts, greedy()) == refs
    assert engine.scheduler.num_preemptions > 0


def test_a_preempted_sequence_whose_token_in_flight_stops_it_finishes_from_the_queue():
    sched = make_scheduler("chunked_prefill", num_blocks=8, block_size=4, eos_token_ids=(7,))
    seq = Sequence([1, 2, 3], SamplingParams(max_tokens=5))
    sched.add(seq)
    batch = sched.schedule()
    assert sched.advance(batch) == batch.items and seq.output_token_ids == [PENDING_TOKEN]
    sched._preempt(seq)  # blocks ran short while its token was on the device
    event = sched.accept(seq, 7)
    assert event.finished and event.finish_reason is FinishReason.EOS
    assert seq.status is SequenceStatus.FINISHED and not sched.has_unfinished() and sched.bm.num_used_blocks == 0
    assert sched.accept(seq, 9) is None  # a finished sequence's late token is dropped


def test_accept_without_a_pending_token_is_refused():
    sched = make_scheduler("chunked_prefill", num_blocks=8, block_size=4)
    seq = Sequence([1, 2, 3], SamplingParams(max_tokens=5))
    sched.add(seq)
    sched.schedule()
    with pytest.raises(ValueError, match="no token waiting"):
        sched.accept(seq, 4)


def test_compile_defaults_to_auto_and_bad_switches_are_refused(llama):
    hf, _, _ = llama
    assert EngineConfig().compile == "auto" and EngineConfig().async_scheduling is True
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=16))
    assert engine.compile_status.startswith("off (auto")  # on a CPU, auto leaves it off
    for bad in (dict(compile="yes"), dict(compile=1), dict(async_scheduling=1), dict(cuda_graphs="no")):
        with pytest.raises(ParameterError):
            EngineConfig(**bad)


@pytest.mark.gpu  # counts the host's waits for the GPU
def test_steady_decode_steps_never_synchronise_but_to_read_tokens():
    """On a GPU, a decode step's host work (scheduling, inputs, launch, reading the step before) calls nothing
    that synchronises the device: ``torch.cuda.set_sync_debug_mode("error")`` would raise."""
    hf = load_model("config:tiny-llama", dtype="float32", device="cuda").model
    engine = Engine.from_hf(hf, EngineConfig(block_size=16, num_blocks=64, max_num_seqs=4, compile=False))
    for p in ([1, 2, 3], [4, 5, 6, 7]):
        engine.add_request(p, greedy(40))
    for _ in range(4):  # prefill, first decodes, lazy initialisation
        engine.step()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert engine.runner.graph_steps >= 20


# ---- multi-step decoding (decode_steps > 1) with async scheduling on: rows and blocks come back -----------------
MANY = 12  # requests, four times max_num_seqs: every block-table row is handed out and given back several times
LONGEST = 20  # output tokens of the longest request
# a group's uncaptured steps gather every sequence's table at its full width (max_model_len): keep it short on a CPU
SHORT = dict(max_model_len=64)


@pytest.fixture(scope="module")
def offline(llama):
    """The offline benchmark's workload scaled down: prompt and output lengths uneven, EOS ignored; HF's greedy
    tokens and the synchronous single-step loop's beside them."""
    hf = llama[0]
    g = torch.Generator().manual_seed(11)
    prompt_lens = torch.randint(2, 31, (MANY,), generator=g).tolist()
    output_lens = torch.randint(1, LONGEST + 1, (MANY,), generator=g).tolist()
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in prompt_lens]
    full = hf_greedy(hf, prompts, LONGEST)
    refs = [r[:n] for r, n in zip(full, output_lens, strict=True)]
    sync = engine_for(hf, "eager", async_scheduling=False, max_num_seqs=3, **SHORT).generate(
        prompts, [greedy(n) for n in output_lens]
    )
    return hf, prompts, output_lens, refs, sync, full


def watch_leaks(engine) -> list:
    """After every step, the sequences that hold a row or blocks but are not running (an empty list while none)."""
    leaks = []
    engine.on_step = lambda record: leaks.extend(engine.leaked())
    return leaks


@pytest.mark.parametrize(
    "path, num_blocks", [("eager", 96), ("step graph", 96), ("decode graph", 96), ("eager", 16)], ids=str
)
def test_multi_step_decoding_gives_back_every_row_on_the_offline_workload(offline, path, num_blocks):
    """The H200 failure (``decode_steps=8``, async scheduling on: "no free block-table row"): a sequence that
    finished inside a multi-step group kept its block-table row, so after ``max_num_seqs`` such finishes no row was
    left. Here more requests than rows; 16 blocks also make groups fall back to single steps and preempt."""
    hf, prompts, output_lens, refs, sync, _ = offline
    engine = engine_for(hf, path, max_num_seqs=3, decode_steps=8, num_blocks=num_blocks, **SHORT)
    assert engine.config.async_scheduling
    leaks = watch_leaks(engine)
    got = engine.generate(prompts, [greedy(n) for n in output_lens])
    assert got == refs and got == sync
    assert engine.runner.decode_groups > 0 and not leaks
    assert not engine.runner.tables.row_of and engine.block_manager.num_used_blocks == 0
    assert sorted(engine.runner.tables.free_rows) == list(range(3))
    if num_blocks == 16:
        assert engine.scheduler.num_preemptions > 0


def test_multi_step_stop_and_eos_mid_group_give_back_rows_and_blocks(llama):
    """A stop id and an EOS found inside a group end their requests there; their rows go to the queued requests."""
    hf, prompts, refs = llama
    stop_at = next(i for i in range(2, STEPS - 1) if refs[1].index(refs[1][i]) == i)  # not its first token
    eos_at = next(i for i in range(2, STEPS - 1) if refs[2].index(refs[2][i]) == i)
    stop, eos = refs[1][stop_at], refs[2][eos_at]
    engine = Engine.from_hf(
        hf,
        EngineConfig(block_size=4, num_blocks=96, max_num_seqs=2, max_num_batched_tokens=24, decode_steps=8, **SHORT),
        eos_token_ids=(eos,),
    )
    leaks = watch_leaks(engine)
    params = [greedy(), greedy(stop_token_ids=(stop,)), SamplingParams(max_tokens=STEPS), greedy()]
    seqs = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    while engine.has_unfinished():
        engine.step()
    assert [s.output_token_ids for s in seqs] == [refs[0], refs[1][: stop_at + 1], refs[2][: eos_at + 1], refs[3]]
    assert seqs[1].finish_reason is FinishReason.STOP and seqs[2].finish_reason is FinishReason.EOS
    assert engine.runner.decode_groups > 0 and not leaks
    assert not engine.runner.tables.row_of and engine.block_manager.num_used_blocks == 0


def test_multi_step_abort_between_groups_gives_back_its_row_and_blocks(offline):
    hf, prompts, _, _, _, refs = offline
    engine = engine_for(hf, "eager", max_num_seqs=3, decode_steps=8, **SHORT)
    leaks = watch_leaks(engine)
    seqs = [engine.add_request(p, greedy(LONGEST)) for p in prompts[:4]]
    drop = seqs[1]
    while engine.runner.decode_groups == 0 or drop.seq_id not in engine.runner.tables.row_of:
        engine.step()
    assert 1 < len(drop.output_token_ids) < LONGEST  # a group ran for it and it has more to go
    assert engine.abort(drop)
    assert drop.seq_id not in engine.runner.tables.row_of and drop.seq_id not in engine.block_manager
    while engine.has_unfinished():
        engine.step()
    assert drop.output_token_ids == refs[1][: len(drop.output_token_ids)]
    assert [s.output_token_ids for s in seqs if s is not drop] == [refs[0], refs[2], refs[3]]
    assert not leaks and not engine.runner.tables.row_of and engine.block_manager.num_used_blocks == 0


@pytest.mark.gpu  # multi-step groups through captured decode graphs
@pytest.mark.gpu_quick
def test_multi_step_groups_in_captured_graphs_give_back_rows_and_match_single_steps():
    """The H200 setting of the failure: captured decode graphs and whole-step graphs, async scheduling on, many more
    requests than ``max_num_seqs``; float32, so ``decode_steps=8`` gives the single-step loop's tokens exactly."""
    hf = load_model("config:tiny-llama", dtype="float32", device="cuda").model
    g = torch.Generator().manual_seed(3)
    prompt_lens, output_lens = torch.randint(2, 60, (40,), generator=g), torch.randint(1, 40, (40,), generator=g)
    prompts = [torch.randint(3, hf.config.vocab_size, (int(n),), generator=g).tolist() for n in prompt_lens]
    params = [greedy(int(n)) for n in output_lens]
    outs = []
    for steps in (1, 8):
        cfg = EngineConfig(
            max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128, decode_steps=steps, compile=False
        )
        engine = Engine.from_hf(hf, cfg)
        leaks = watch_leaks(engine)
        outs.append(engine.generate(prompts, params))
        assert engine.num_graphs > 0 and not leaks and not engine.runner.tables.row_of
        assert engine.block_manager.num_used_blocks == 0
    assert engine.runner.decode_groups > 0 and outs[0] == outs[1]
