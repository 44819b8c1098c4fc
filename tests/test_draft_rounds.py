"""The draft's round in one graph (``engine.draft_rounds``), run uncaptured on a CPU in float32: the chained forward
is the one a captured graph replays, so its drafts, and the tokens the target keeps, must be the step-by-step
path's, token for token, whatever each row drafts (a request near its ``max_tokens`` drafts fewer), as requests
come and go, and after γ changes; sampled rounds keep the step-by-step path."""

import pytest
import torch
from test_engine_speculation import GREEDY, engine, family  # noqa: F401 - family is a fixture

from servelab.engine import SamplingParams
from servelab.engine.draft_rounds import RoundGraphs
from servelab.errors import ParameterError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def chained(e) -> None:
    e.draft.capture_rounds(e.gamma - 1, capture=False)


@pytest.mark.parametrize("method", ["twin", "random"])
def test_greedy_rounds_in_one_graph_give_the_plain_engines_tokens(family, method):  # noqa: F811
    hf, prompts, plain, drafts = family
    e = engine(hf, method, drafts)
    chained(e)
    assert e.generate(prompts, GREEDY) == plain
    assert e.draft.round_graph_rounds > 0 and e.leaked() == []
    if method == "twin":  # the twin's drafts are the target's tokens: all kept, so the chain drafted them right
        assert e.spec_stats.num_accepted_tokens == e.spec_stats.num_draft_tokens


def test_rows_that_draft_fewer_sit_out_the_later_steps(family):  # noqa: F811
    """Requests that end at different lengths draft fewer tokens near their end, beside rows that draft γ: those
    rounds still run as one chain (their max is γ), and the short rows' later steps write nothing of theirs."""
    hf, prompts, _, drafts = family
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (7, 20, 12, 16)]
    want = engine(hf, "twin", drafts, max_num_seqs=2).generate(prompts, params)
    e = engine(hf, "twin", drafts, max_num_seqs=2)
    chained(e)
    assert e.generate(prompts, params) == want
    s = e.spec_stats
    assert e.draft.round_graph_rounds > 0 and s.num_accepted_tokens == s.num_draft_tokens
    assert e.leaked() == [] and e.draft.bm.num_used_blocks == 0


def test_a_new_gamma_chains_its_own_steps_and_sampled_rounds_go_step_by_step(family):  # noqa: F811
    hf, prompts, plain, drafts = family
    e = engine(hf, "twin", drafts, gamma=4)
    chained(e)
    e.set_gamma(2)
    assert e.draft.rounds.steps == 1
    assert e.generate(prompts, GREEDY) == plain and e.draft.round_graph_rounds > 0
    before = e.draft.round_graph_rounds
    sampled = SamplingParams(max_tokens=8, temperature=1.0, seed=3, ignore_eos=True)
    e.generate(prompts, sampled)
    assert e.draft.round_graph_rounds == before  # a sampled draft draws with its generator: no graph
    assert e.spec_stats.num_accepted_tokens == e.spec_stats.num_draft_tokens  # the twin: p/q = 1, all kept


def test_a_round_graph_refuses_a_plan_of_another_length():
    with pytest.raises(ParameterError, match="1 or more"):
        RoundGraphs(None, None, None, steps=0, max_batch=1, scratch_block=0)
    from servelab.kv.pool import KVPool
    from servelab.models import load_model
    from servelab.models.native import native_from_hf

    model = native_from_hf(load_model("config:tiny-llama").model, max_positions=64)
    pool = KVPool.for_model(model.shape, 5, 4, torch.float32, torch.device("cpu"))

    class Tables:
        max_blocks, pad_row = 4, 1
        device_table = torch.zeros(2, 4, dtype=torch.long)

    rounds = RoundGraphs(model, pool, Tables(), steps=2, max_batch=1, scratch_block=4)
    with pytest.raises(ParameterError, match="chains 2 steps, the plan has 1"):
        rounds.run(torch.zeros(1, dtype=torch.long), [[(0, 0, 0)]])


@pytest.mark.gpu
def test_on_the_gpu_a_captured_round_gives_the_step_by_step_drafts():
    """Captured, in float32: a twin draft's rounds from one graph each are all kept, the tokens are the plain
    engine's, and a round with no graph of its length (γ lowered, then the graphs of the old length dropped) runs
    step by step with the same tokens."""
    from hf_reference import varied

    from servelab.engine import Engine, EngineConfig
    from servelab.engine.speculative_engine import SpeculativeEngine
    from servelab.models.native import native_from_hf
    from servelab.speculative.config import SpeculativeConfig

    hf = varied("tiny-llama", 0).cuda()
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in (19, 7, 30)]
    cfg = EngineConfig(block_size=16, num_blocks=256, max_model_len=256, max_num_seqs=8)
    plain = Engine.from_hf(hf, cfg).generate(prompts, GREEDY)
    spec = SpeculativeConfig("draft_model", 4, "(given)")
    draft = native_from_hf(hf, max_positions=256)
    assert SpeculativeEngine.from_hf(hf, cfg, speculative=spec, draft=draft).draft.rounds is None  # off by default
    e = SpeculativeEngine.from_hf(hf, cfg, speculative=spec, draft=draft, round_graph=True)
    assert e.draft.rounds is not None and e.draft.rounds.graphs and e.draft.rounds.steps == 3
    assert e.generate(prompts, GREEDY) == plain
    s = e.spec_stats
    assert e.draft.round_graph_rounds > 0 and s.num_accepted_tokens == s.num_draft_tokens
    e.draft.rounds = None  # every round step by step, through the decode graphs
    before = e.draft.runner.graph_steps
    assert e.generate(prompts, GREEDY) == plain and e.draft.runner.graph_steps > before
