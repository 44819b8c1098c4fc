"""The Study 1 scheduling policies (FCFS, EagerContBatch, ChunkedPrefill): batch composition step by step
on hand-made arrivals, preemption when blocks run out, parameter errors, and HF-exact greedy tokens
when the engine runs each of them. The step-by-step tests are pure Python, as a simulator drives them.
"""

import random

import pytest
from test_engine_exactness import GREEDY, STEPS, family  # noqa: F401  (the HF references, per tiny family)

from servelab.engine import Engine, EngineConfig, SamplingParams, Sequence, TokenBudgetScheduler
from servelab.engine.policies import FCFS, POLICIES, ChunkedPrefill, EagerContBatch, make_scheduler
from servelab.errors import ParameterError
from servelab.kv import BlockManager

NAMES = ["fcfs", "eager_cont_batch", "chunked_prefill"]


def req(name, prompt, max_tokens):
    q = Sequence(list(range(10, 10 + prompt)), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    q.name = name
    return q


def label(it):
    """``a:p5`` a 5-token prefill (or chunk, or recompute) of a; ``a:d`` a's decode (one token past its prompt)."""
    q = it.seq
    if it.num_tokens == 1 and it.start >= len(q.prompt_token_ids) and it.samples:
        return f"{q.name}:d"
    return f"{q.name}:p{it.num_tokens}"


def trace(s, arrivals, max_steps=200):
    """Drive scheduler ``s``; ``arrivals[k]`` are added before step k. One line per step:
    the items in batch order, then ``!x`` for each sequence preempted in that step."""
    arrivals = dict(arrivals)
    lines = []
    for k in range(max_steps):
        for q in arrivals.pop(k, []):
            s.add(q)
        if not s.has_unfinished() and not arrivals:
            return lines
        batch = s.schedule()
        lines.append(" ".join([label(it) for it in batch.items] + [f"!{q.name}" for q in batch.preempted]))
        s.postprocess(batch, [7 if it.samples else None for it in batch.items])
    raise AssertionError(f"not done after {max_steps} steps: {lines}")


def split(step_line):
    """(prefill tokens, decode tokens) of one trace line."""
    p = d = 0
    for item in step_line.split():
        if item.startswith("!"):
            continue
        kind = item.split(":")[1]
        if kind == "d":
            d += 1
        else:
            p += int(kind[1:])
    return p, d


# ---- the registry and the engine's choice ----------------------------------------------------------------


def test_registry_names_the_three_policies_and_chunked_prefill_is_the_default():
    assert {"fcfs": FCFS, "eager_cont_batch": EagerContBatch, "chunked_prefill": ChunkedPrefill} == POLICIES
    assert issubclass(ChunkedPrefill, TokenBudgetScheduler)  # reused, not duplicated
    assert EngineConfig().scheduler == "chunked_prefill"


@pytest.mark.parametrize("name", NAMES)
def test_make_scheduler_builds_each_policy(name):
    s = make_scheduler(name, num_blocks=10, block_size=4, max_num_seqs=3, max_num_batched_tokens=40, eos_token_ids=[2])
    assert type(s) is POLICIES[name]
    assert (s.bm.num_blocks, s.bm.block_size, s.max_num_seqs, s.max_num_batched_tokens, s.eos_token_ids) == (
        10,
        4,
        3,
        40,
        (2,),
    )
    bm = BlockManager(5, 8)
    assert make_scheduler(name, block_manager=bm).bm is bm


@pytest.mark.parametrize(
    "name, params, match",
    [
        ("sjf", dict(num_blocks=4), "unknown scheduling policy 'sjf'; known: chunked_prefill, eager_cont_batch, fcfs"),
        ("fcfs", dict(num_blocks=4, budget=8), "unknown parameter.*budget.*accepted"),
        ("fcfs", dict(), "needs the KV pool"),
        ("fcfs", dict(num_blocks=0), "num_blocks must be a positive integer"),
        ("fcfs", dict(num_blocks=4, block_size=2.5), "block_size must be a positive integer"),
        ("fcfs", dict(block_manager=BlockManager(4, 4), num_blocks=4), "either block_manager or num_blocks"),
        ("fcfs", dict(block_manager="pool"), "block_manager must be a BlockManager"),
        ("eager_cont_batch", dict(num_blocks=4, max_num_seqs=0), "max_num_seqs must be >= 1"),
        ("eager_cont_batch", dict(num_blocks=4, max_num_seqs="8"), "max_num_seqs must be an integer"),
        ("chunked_prefill", dict(num_blocks=4, max_num_seqs=8, max_num_batched_tokens=4), "max_num_batched_tokens"),
        (
            "chunked_prefill",
            dict(num_blocks=4, max_num_batched_tokens=True),
            "max_num_batched_tokens must be an integer",
        ),
        ("chunked_prefill", dict(num_blocks=4, eos_token_ids=[-1]), "eos_token_ids"),
        ("chunked_prefill", dict(num_blocks=4, eos_token_ids=3), "eos_token_ids"),
    ],
)
def test_bad_names_and_parameters_are_clear_errors(name, params, match):
    with pytest.raises(ParameterError, match=match):
        make_scheduler(name, **params)


def test_engine_config_validates_the_policy_name():
    with pytest.raises(ParameterError, match="unknown scheduling policy 'orca'; known: "):
        EngineConfig(scheduler="orca")


@pytest.mark.parametrize("name", ["fcfs", "eager_cont_batch"])
def test_whole_prompt_policies_refuse_requests_over_one_steps_budget(name):
    s = make_scheduler(name, num_blocks=64, block_size=4, max_num_seqs=2, max_num_batched_tokens=10)
    s.add(req("a", 6, 4))  # 10 tokens: its recompute after preemption still fits one step
    with pytest.raises(ParameterError, match="does not chunk prompts"):
        s.add(req("b", 8, 3))
    c = make_scheduler("chunked_prefill", num_blocks=64, block_size=4, max_num_seqs=2, max_num_batched_tokens=10)
    c.add(req("b", 8, 3))  # chunked: fine


# ---- batch composition, step by step ---------------------------------------------------------------------


def test_fcfs_static_batches_no_one_joins_until_the_batch_is_done():
    s = make_scheduler("fcfs", num_blocks=64, block_size=4, max_num_seqs=2, max_num_batched_tokens=64)
    a, b, c, d = req("a", 5, 3), req("b", 3, 2), req("c", 4, 2), req("d", 2, 1)
    lines = trace(s, {0: [a, b, c], 2: [d]})
    assert lines == [
        "a:p5 b:p3",  # the first batch: two (max_num_seqs), prefilled together
        "a:d b:d",  # b is done
        "a:d",  # a slot is free and c, d wait, but nothing joins a running batch
        "c:p4 d:p2",  # the next batch, in arrival order; d is done at once (max_tokens=1)
        "c:d",
    ]
    assert [split(ln) for ln in lines] == [(8, 0), (0, 2), (0, 1), (6, 0), (0, 1)]


def test_fcfs_batch_is_also_limited_by_the_token_budget_and_free_blocks():
    s = make_scheduler("fcfs", num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=12)
    assert trace(s, {0: [req("a", 6, 2), req("b", 5, 2), req("c", 3, 2), req("d", 1, 2)]}) == [
        "a:p6 b:p5",  # c (3 more tokens) would exceed the budget of 12, and d waits behind c
        "a:d b:d",
        "c:p3 d:p1",
        "c:d d:d",
    ]
    s = make_scheduler("fcfs", num_blocks=3, block_size=4, max_num_seqs=4, max_num_batched_tokens=12)
    assert trace(s, {0: [req("a", 6, 2), req("b", 5, 2)]}) == ["a:p6", "a:d", "b:p5", "b:d"]  # 2 + 2 blocks > 3


def test_eager_cont_batch_admits_at_every_step_and_prefill_steps_pause_decodes():
    s = make_scheduler("eager_cont_batch", num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=64)
    a, b, c, d = req("a", 4, 5), req("b", 6, 2), req("c", 3, 1), req("d", 2, 2)
    lines = trace(s, {0: [a], 2: [b, c], 4: [d]})
    assert lines == [
        "a:p4",
        "a:d",
        "b:p6 c:p3",  # newcomers join at once, whole prompts; a's decode waits (c is done: max_tokens=1)
        "a:d b:d",  # b is done
        "d:p2",  # again a prefill step of its own
        "a:d d:d",  # d is done
        "a:d",
    ]
    assert [split(ln) for ln in lines] == [(4, 0), (0, 1), (9, 0), (0, 2), (2, 0), (0, 2), (0, 1)]


def test_eager_cont_batch_respects_running_limit_and_budget():
    s = make_scheduler("eager_cont_batch", num_blocks=64, block_size=4, max_num_seqs=2, max_num_batched_tokens=10)
    a, b, c, d = req("a", 5, 3), req("b", 4, 3), req("c", 3, 2), req("d", 2, 1)
    assert trace(s, {0: [a, b, c], 1: [d]}) == [
        "a:p5 b:p4",  # c would fit the running limit but not the budget (5 + 4 + 3 > 10)
        "a:d b:d",  # c cannot join: two running (max_num_seqs=2)
        "a:d b:d",  # a and b are done
        "c:p3 d:p2",
        "c:d",
    ]


def test_chunked_prefill_decodes_first_and_chunks_fill_the_budget():
    s = make_scheduler("chunked_prefill", num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=8)
    a, b, c = req("a", 4, 5), req("b", 13, 2), req("c", 3, 2)
    lines = trace(s, {0: [a], 1: [b], 2: [c]})
    assert lines == [
        "a:p4",
        "a:d b:p7",  # a keeps decoding; b's prompt fills the other 7 tokens of the budget
        "a:d b:p6 c:p1",  # the rest of b (it samples); newcomer c gets the one token left
        "a:d b:d c:p2",  # b is done; the rest of c
        "a:d c:d",  # a and c are done
    ]
    assert [split(ln) for ln in lines] == [(4, 0), (7, 1), (7, 1), (2, 2), (0, 2)]


def test_chunked_prefill_cuts_a_newcomer_to_the_budget_left():
    s = make_scheduler("chunked_prefill", num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=8)
    assert trace(s, {0: [req("a", 3, 2), req("b", 9, 1)]}) == [
        "a:p3 b:p5",  # b gets the 5 tokens a left
        "a:d b:p4",  # a is done; b's last chunk samples and b is done
    ]


def test_the_same_arrivals_under_the_three_policies():
    """A long prompt arriving while a short request decodes: FCFS makes it wait for the batch, EagerContBatch
    stalls the decode for one 13-token step, ChunkedPrefill spreads it over steps next to the decodes."""

    def run(name):
        s = make_scheduler(
            name,
            num_blocks=64,
            block_size=4,
            max_num_seqs=4,
            max_num_batched_tokens=8 if name == "chunked_prefill" else 16,
        )
        return trace(s, {0: [req("a", 4, 4)], 1: [req("b", 13, 2)]})

    assert run("fcfs") == ["a:p4", "a:d", "a:d", "a:d", "b:p13", "b:d"]
    assert run("eager_cont_batch") == ["a:p4", "b:p13", "a:d b:d", "a:d", "a:d"]
    assert run("chunked_prefill") == ["a:p4", "a:d b:p7", "a:d b:p6", "a:d b:d"]


# ---- preemption ----------------------------------------------------------------------------------------


def test_preemption_step_by_step():
    """16 slots; a and b each end at 10 tokens (3 blocks): a decode that finds no block preempts the newest."""
    for name, budget in (("fcfs", 16), ("eager_cont_batch", 16), ("chunked_prefill", 16)):
        s = make_scheduler(name, num_blocks=4, block_size=4, max_num_seqs=2, max_num_batched_tokens=budget)
        a, b = req("a", 4, 6), req("b", 4, 6)
        lines = trace(s, {0: [a, b]})
        assert lines == [
            "a:p4 b:p4",
            "a:d b:d",
            "a:d b:d",
            "a:d b:d",
            "a:d b:d",
            "a:d !b",  # a needs a third block: b gives its two back and goes to the queue's head
            "b:p9",
        ], name  # b recomputes prompt + 5 outputs, samples its 6th token
        assert a.output_token_ids == b.output_token_ids == [7] * 6
        assert b.num_preemptions == 1 and a.num_preemptions == 0 and s.num_preemptions == 1
        assert s.bm.num_used_blocks == 0


def test_fcfs_preempted_member_leaves_the_batch_and_heads_the_next():
    s = make_scheduler("fcfs", num_blocks=4, block_size=4, max_num_seqs=3, max_num_batched_tokens=16)
    a, b, c = req("a", 4, 6), req("b", 4, 6), req("c", 2, 1)
    lines = trace(s, {0: [a, b], 1: [c]})
    assert lines == [
        "a:p4 b:p4",
        "a:d b:d",
        "a:d b:d",
        "a:d b:d",
        "a:d b:d",  # c arrived, but the batch runs
        "a:d !b",  # b leaves the batch...
        "b:p9 c:p2",
    ]  # ...and heads the next one
    assert b.num_preemptions == 1 and all(q.is_finished for q in (a, b, c))


def _check_policy_step(name, s, batch, members: set) -> set:
    """What each policy promises of one step; returns FCFS's running batch (the members of the next check)."""
    if name == "eager_cont_batch" and batch.items:  # prefill steps and decode steps never mix
        starts_at_zero = [it.start == 0 for it in batch.items]
        assert all(starts_at_zero) or not any(starts_at_zero)
    if name == "chunked_prefill":
        kinds = ["d" if label(it).endswith(":d") else "p" for it in batch.items]
        assert kinds == sorted(kinds)  # decodes ("d") before prefill chunks ("p")
        assert sum(not it.samples for it in batch.items) <= 1  # at most one prompt left unfinished
        if not batch.preempted:  # no running sequence is left out of a step
            assert {it.seq.seq_id for it in batch.items} >= {q.seq_id for q in s.running}
    if name == "fcfs" and batch.items:
        fresh = [it.start == 0 for it in batch.items]
        assert all(fresh) or not any(fresh)  # a new batch's prefill step, or the running batch's decodes
        ids = {it.seq.seq_id for it in batch.items}
        if not any(fresh):
            assert ids <= members  # the running batch only shrinks: no one joins it
        return ids
    return members


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", range(6))
def test_random_loads_on_a_tiny_pool_never_crash_and_keep_the_limits(name, seed):
    rng = random.Random(seed)
    budget = 24
    s = make_scheduler(name, num_blocks=8, block_size=4, max_num_seqs=3, max_num_batched_tokens=budget)
    arrivals = {}
    for i in range(12):
        p = rng.randint(1, 14)
        q = req(f"r{i}", p, rng.randint(1, min(12, 32 - p, budget - p)))
        arrivals.setdefault(rng.randint(0, 40), []).append(q)
    seqs = [q for qs in arrivals.values() for q in qs]
    pending = dict(arrivals)
    produced = {q.name: 0 for q in seqs}
    members = set()
    for k in range(2000):
        for q in pending.pop(k, []):
            s.add(q)
        if not s.has_unfinished() and not pending:
            break
        batch = s.schedule()
        assert batch.num_tokens <= budget and len(s.running) <= 3
        assert s.bm.num_used_blocks <= 8
        for it in batch.items:  # every scheduled token has its own reserved slot
            assert it.slots == s.bm.slot_mapping(it.seq.seq_id, it.start, it.start + it.num_tokens)
        members = _check_policy_step(name, s, batch, members)
        for ev in s.postprocess(batch, [7 if it.samples else None for it in batch.items]):
            produced[next(q.name for q in seqs if q.seq_id == ev.seq_id)] += 1
    else:
        raise AssertionError("did not finish")
    assert all(q.is_finished and len(q.output_token_ids) == q.params.max_tokens for q in seqs)
    assert produced == {q.name: q.params.max_tokens for q in seqs}  # preemption never repeats a token
    assert s.bm.num_used_blocks == 0


# ---- the engine runs each policy, HF-exact ---------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_engine_config_picks_the_policy(name):
    from servelab.models import load_model

    hf = load_model("config:tiny-llama").model
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, scheduler=name))
    assert type(engine.scheduler) is POLICIES[name] and engine.stats()["scheduler"] == POLICIES[name].__name__
    explicit = Engine.from_hf(
        hf, EngineConfig(block_size=4, num_blocks=64, scheduler=name), scheduler_cls=TokenBudgetScheduler
    )
    assert type(explicit.scheduler) is TokenBudgetScheduler  # an explicit class wins


def run_staggered(engine, prompts, arrive_at):
    """Add prompt i before step ``arrive_at[i]``; run to the end; outputs in prompt order, and the batches."""
    seqs, k, batches = [None] * len(prompts), 0, []
    orig = engine.scheduler.schedule

    def spy():
        b = orig()
        batches.append([(it.seq.seq_id, it.start, it.num_tokens) for it in b.items])
        return b

    engine.scheduler.schedule = spy
    while k <= max(arrive_at) or engine.has_unfinished():
        for i, t in enumerate(arrive_at):
            if t == k:
                seqs[i] = engine.add_request(prompts[i], GREEDY)
        engine.step()
        k += 1
    return [q.output_token_ids for q in seqs], batches


def test_fcfs_engine_is_hf_exact(family):  # noqa: F811
    hf, prompts, refs = family
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, max_num_seqs=2, scheduler="fcfs"))
    outs, batches = run_staggered(engine, prompts, [0, 0, 1, 3])
    assert outs == refs
    assert len(batches) == 2 * STEPS  # two batches of two, each: one prefill step, then STEPS - 1 decode steps
    assert [len(b) for b in batches] == [2] * (2 * STEPS)
    assert [start for _, start, _ in batches[0] + batches[STEPS]] == [0, 0, 0, 0]  # the two prefill steps
    assert engine.block_manager.num_used_blocks == 0


def test_eager_cont_batch_engine_is_hf_exact(family):  # noqa: F811
    hf, prompts, refs = family
    engine = Engine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, scheduler="eager_cont_batch"))
    outs, batches = run_staggered(engine, prompts, [0, 0, 3, 5])
    assert outs == refs
    prefill_only = [b for b in batches if all(start == 0 for _, start, _ in b)]
    assert len(prefill_only) == 3  # steps 0, 3 and 5 held only prefills: the running decodes paused


def test_chunked_prefill_engine_is_hf_exact(family):  # noqa: F811
    hf, prompts, refs = family
    engine = Engine.from_hf(
        hf,
        EngineConfig(
            block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=8, scheduler="chunked_prefill"
        ),
    )
    outs, batches = run_staggered(engine, prompts, [0, 0, 3, 5])
    assert outs == refs
    assert any(n > 1 and start > 0 for b in batches for _, start, n in b)  # a prompt really was chunked
    assert any(
        any(n == 1 and start > 0 for _, start, n in b) and any(n > 1 for _, _, n in b) for b in batches
    )  # decodes next to prefill chunks in one step


@pytest.mark.parametrize("name", NAMES)
def test_preemption_in_the_engine_keeps_outputs_exact(family, name):  # noqa: F811
    hf, prompts, refs = family
    order = [2, 3, 0, 1]  # the 33-token prompt first: it and the 2-token one outgrow 11 blocks together
    engine = Engine.from_hf(
        hf, EngineConfig(block_size=4, num_blocks=11, max_num_seqs=4, max_num_batched_tokens=48, scheduler=name)
    )
    assert engine.generate([prompts[i] for i in order], GREEDY) == [refs[i] for i in order]
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.num_used_blocks == 0
