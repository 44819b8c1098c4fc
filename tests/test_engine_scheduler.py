"""The scheduler without a model: budgets, admission, queueing, preemption, finishing. Pure Python."""

import pytest

from servelab.engine.scheduler import Scheduler, TokenBudgetScheduler
from servelab.engine.sequence import FinishReason, SamplingParams, Sequence, SequenceStatus
from servelab.errors import ParameterError
from servelab.kv import BlockManager


def make(num_blocks=64, block_size=4, max_num_seqs=8, budget=32, eos=(2,)):
    bm = BlockManager(num_blocks, block_size)
    return TokenBudgetScheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, eos_token_ids=eos), bm


def seq(n, **params):
    return Sequence(list(range(10, 10 + n)), SamplingParams(**{"max_tokens": 4, "ignore_eos": True, **params}))


def drive(s, token=7, max_steps=1000):
    """Run the scheduler as a simulator would: every sampling item gets ``token``."""
    steps, events = [], []
    while s.has_unfinished() and len(steps) < max_steps:
        batch = s.schedule()
        steps.append(batch)
        events += s.postprocess(batch, [token if it.samples else None for it in batch.items])
    return steps, events


def test_the_interface_is_abstract():
    with pytest.raises(TypeError):
        Scheduler(BlockManager(4, 4), max_num_seqs=1, max_num_batched_tokens=1)


def test_token_budget_splits_a_long_prompt_into_chunks():
    s, _ = make(budget=8)
    a = seq(20)
    s.add(a)
    sizes = []
    while a.num_computed_tokens < 20:
        b = s.schedule()
        sizes.append([it.num_tokens for it in b.items])
        s.postprocess(b, [5 if it.samples else None for it in b.items])
    assert sizes == [[8], [8], [4]]
    assert a.output_token_ids == [5]  # only the last chunk samples


def test_running_sequences_go_first_and_newcomers_fill_the_budget():
    s, _ = make(budget=10)
    a, b = seq(6), seq(30)
    s.add(a)
    s.add(b)
    first = s.schedule()
    assert [(it.seq, it.num_tokens) for it in first.items] == [(a, 6), (b, 4)]
    s.postprocess(first, [1 if it.samples else None for it in first.items])
    second = s.schedule()
    assert [(it.seq, it.num_tokens) for it in second.items] == [(a, 1), (b, 9)]  # a's decode, then b's next chunk


def test_every_step_respects_budget_and_slots_are_the_block_managers():
    s, bm = make(budget=12, max_num_seqs=3)
    seqs = [seq(n, max_tokens=5) for n in (3, 11, 7, 20, 1)]
    for q in seqs:
        s.add(q)
    while s.has_unfinished():
        batch = s.schedule()
        assert 0 < batch.num_tokens <= 12 and len(s.running) <= 3
        for it in batch.items:
            assert it.slots == bm.slot_mapping(it.seq.seq_id, it.start, it.start + it.num_tokens)
        s.postprocess(batch, [3 if it.samples else None for it in batch.items])
    assert all(len(q.output_token_ids) == 5 and q.finish_reason is FinishReason.LENGTH for q in seqs)
    assert bm.num_used_blocks == 0


def test_a_request_that_does_not_fit_now_waits_in_the_queue():
    s, bm = make(num_blocks=6, block_size=4, budget=64)  # 24 token slots
    a, b = seq(14, max_tokens=2), seq(12, max_tokens=2)
    s.add(a)
    s.add(b)
    first = s.schedule()
    assert [it.seq for it in first.items] == [a] and b.status is SequenceStatus.WAITING
    steps, _ = drive(s)
    assert a.is_finished and b.is_finished and s.num_preemptions == 0
    assert bm.num_free_blocks == 6


def test_when_blocks_run_out_the_newest_running_sequence_is_preempted_and_recomputed():
    s, bm = make(num_blocks=6, block_size=4, budget=64)
    a, b = seq(8, max_tokens=12), seq(8, max_tokens=12)  # each needs 5 blocks in the end, 2 at the start
    s.add(a)
    s.add(b)
    steps, events = drive(s)
    assert s.num_preemptions >= 1 and b.num_preemptions >= 1 and a.num_preemptions == 0
    assert any(b in st.preempted for st in steps)
    assert a.output_token_ids == [7] * 12 and b.output_token_ids == [7] * 12
    assert sum(1 for e in events if e.seq_id == b.seq_id) == 12  # no token is produced twice
    assert bm.num_used_blocks == 0


def test_a_request_larger_than_the_pool_is_refused_not_deadlocked():
    s, _ = make(num_blocks=4, block_size=4)
    with pytest.raises(ParameterError, match="pool holds 16"):
        s.add(seq(10, max_tokens=7))


@pytest.mark.parametrize(
    "params, expected, reason",
    [
        (dict(max_tokens=3), [7, 2, 9], FinishReason.LENGTH),  # ignore_eos: EOS (2) does not stop it
        (dict(max_tokens=9, ignore_eos=False), [7, 2], FinishReason.EOS),
        (dict(max_tokens=9, stop_token_ids=(9,)), [7, 2, 9], FinishReason.STOP),
    ],
)
def test_finish_reasons(params, expected, reason):
    s, bm = make()
    q = seq(3, **params)
    s.add(q)
    tokens = iter([7, 2, 9, 4, 4, 4, 4, 4, 4])
    while s.has_unfinished():
        batch = s.schedule()
        s.postprocess(batch, [next(tokens) if it.samples else None for it in batch.items])
    assert q.output_token_ids == expected and q.finish_reason is reason and bm.num_used_blocks == 0


def test_postprocess_checks_its_input():
    s, _ = make()
    s.add(seq(3))
    batch = s.schedule()
    with pytest.raises(ValueError, match="one sampled entry"):
        s.postprocess(batch, [])
    with pytest.raises(ValueError, match="no token was sampled"):
        s.postprocess(batch, [None])


def test_budget_must_cover_one_decode_per_running_sequence():
    with pytest.raises(ParameterError, match="max_num_batched_tokens"):
        TokenBudgetScheduler(BlockManager(4, 4), max_num_seqs=8, max_num_batched_tokens=4)


@pytest.mark.parametrize(
    "bad",
    [
        dict(max_tokens=0),
        dict(temperature=-1.0),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(seed="x"),
        dict(stop_token_ids=(-1,)),
        dict(temperature=float("nan")),
    ],
)
def test_sampling_params_are_validated(bad):
    with pytest.raises(ParameterError):
        SamplingParams(**bad)


def test_sequences_need_real_prompts():
    with pytest.raises(ParameterError):
        Sequence([])
    with pytest.raises(ParameterError):
        Sequence([1, -2])
