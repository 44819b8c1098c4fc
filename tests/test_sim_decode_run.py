"""A decode run booked at once equals the scheduler stepped one step at a time: its step times, which request
finishes when, what an arrival mid-run keeps, and when the pattern it relies on does not hold."""

import math

import pytest

from servelab.engine.policies import make_scheduler
from servelab.engine.sequence import SamplingParams
from servelab.sim import StepCostModel
from servelab.sim.cost_model import CostModel
from servelab.sim.decode_run import SIM_TOKEN, DecodeRun
from servelab.sim.records import RequestBook
from servelab.sim.replica import SimBlockManager, SimSequence

COST = StepCostModel(
    gpu=CostModel(
        "m",
        "test",
        {"intercept_ms": 3.0, "ms_per_token": 0.002, "ms_per_attn_pair": 1e-6},
        {"intercept_ms": 2.5, "ms_per_seq": 0.01, "ms_per_ctx_token": 1e-3},
        {},
    ),
    step_overhead_ms=0.4,
    seq_overhead_ms=0.02,
)
OUTPUTS = [7, 3, 12, 3, 20]


def _decoding(policy="chunked_prefill", blocks=4096, outputs=OUTPUTS, stop=()):
    """A scheduler whose requests are all past their prefill (each sampled its first token)."""
    sched = make_scheduler(
        policy, block_manager=SimBlockManager(blocks, 16), max_num_seqs=16, max_num_batched_tokens=1024
    )
    for i, m in enumerate(outputs):
        sched.add(SimSequence(i, 30 + 17 * i, SamplingParams(max_tokens=m, ignore_eos=True, stop_token_ids=stop), 0.0))
    batch = sched.schedule()
    sched.postprocess(batch, [SIM_TOKEN] * len(batch.items))
    return sched


def _step_by_step(sched, t):
    """Every step through schedule/postprocess: per request its token times, and the step end times."""
    times, ends = {}, []
    while sched.running:
        batch = sched.schedule()
        assert not sched.waiting and all(it.num_tokens == 1 for it in batch.items)
        t += COST.step_ms(0, 0, len(batch.items), sum(it.start for it in batch.items), len(batch.items)) / 1e3
        ends.append(t)
        for it in batch.items:
            times.setdefault(it.seq.index, []).append(t)
        sched.postprocess(batch, [SIM_TOKEN] * len(batch.items))
    return times, ends


@pytest.mark.parametrize("policy", ["chunked_prefill", "eager_cont_batch", "fcfs"])
def test_run_equals_step_by_step(policy):
    t0 = 2.0
    plain_times, ends = _step_by_step(_decoding(policy), t0)
    sched = _decoding(policy)
    run = DecodeRun.plan(sched, COST, t0)
    assert run.steps == len(ends) == max(OUTPUTS) - 1
    assert len(run.end) == len(set(OUTPUTS))  # one segment per distinct finish step
    assert run.token_times() == pytest.approx(ends, rel=1e-12)
    # (not at step ends: the run's closed-form times and the step-by-step sums differ in the last bits)
    for t in (t0, ends[0], (ends[1] + ends[2]) / 2, (ends[5] + ends[6]) / 2, ends[-1] + 1):
        done = sum(1 for ts in plain_times.values() if ts[-1] < t)
        assert run.finished_before(t)[0] == done
    book = RequestBook(len(OUTPUTS), token_times=True)
    assert run.commit(sched, book) == len(OUTPUTS)
    assert not sched.running and sched.bm.num_free_blocks == sched.bm.num_blocks
    for i, ts in plain_times.items():
        assert book.token_times[i] == pytest.approx(ts, rel=1e-12)
        assert book.finish_s[i] == pytest.approx(ts[-1], rel=1e-12)


def test_cut_keeps_the_steps_that_start_before_the_arrival():
    t0 = 1.0
    _, ends = _step_by_step(_decoding(), t0)
    starts = [t0] + ends[:-1]
    # (t0 is the run's start in both; other step starts differ in the last bits, so arrivals fall between them)
    for t_arrival in (
        t0 - 0.5,
        t0,
        (t0 + starts[1]) / 2,
        (starts[3] + starts[4]) / 2,
        (starts[7] + starts[8]) / 2,
        ends[-1] - 1e-6,
    ):
        sched = _decoding()
        run = DecodeRun.plan(sched, COST, t0)
        end = run.cut(t_arrival)
        kept = sum(1 for s in starts if s < t_arrival)
        assert run.steps == kept
        assert end == (None if kept == len(ends) else pytest.approx(ends[kept - 1], rel=1e-12) if kept else t0)
        book = RequestBook(len(OUTPUTS), token_times=True)
        finished = run.commit(sched, book)
        assert finished == sum(1 for m in OUTPUTS if m - 1 <= kept)
        # the scheduler is where step-by-step scheduling would leave it after `kept` steps
        assert sorted(len(s.output_token_ids) for s in sched.running) == sorted(
            1 + kept for m in OUTPUTS if m - 1 > kept
        )
        assert all(s.num_tokens - s.num_computed_tokens == 1 for s in sched.running)
    assert DecodeRun.plan(_decoding(), COST, t0).cut(ends[-1] + 1) is None  # after its end: nothing to cut


def test_no_run_when_the_pattern_does_not_hold():
    sched = _decoding()
    sched.add(SimSequence(99, 40, SamplingParams(max_tokens=5, ignore_eos=True), 0.0))
    assert DecodeRun.plan(sched, COST, 0.0) is None  # someone waits: it may be admitted
    assert DecodeRun.plan(_decoding(stop=(SIM_TOKEN,)), COST, 0.0) is None  # a request may stop early
    # too few free KV blocks for every step: the run stops where they run out, the scheduler then preempts
    tight = _decoding(blocks=24, outputs=[40, 40, 40, 40, 40])  # prompts hold 22 blocks
    run = DecodeRun.plan(tight, COST, 0.0)
    assert run is not None and run.steps < 39 and run.finished_before(math.inf)[0] == 0
    run.commit(tight, RequestBook(5, token_times=False))
    assert tight.schedule().preempted, "the run should end where the next step needs a block that is not free"
