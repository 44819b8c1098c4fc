"""The engine's speculative mode (``engine.speculative_engine``) on a CPU, float32.

- Greedy requests get the plain engine's tokens, token for token, with prompt lookup, a twin draft (every draft
  kept) and a random draft (nearly every draft rejected), under a small token budget, under preemption and with
  prefix caching; stops, EOS and ``max_tokens`` that fall inside the drafts end a request there.
- No sequence holds blocks past its tokens after a step (rejected drafts gave theirs back), in the draft's pool too;
  nothing leaks after a run or an abort.
- Sampled requests keep the target's distribution: over 6,000 requests with a tiny vocabulary, the joint of the
  second and third tokens (both from a speculative step, drafted by a model far from the target) fits the target's
  exact joint (χ²), and the same test rejects a verifier that keeps every draft.
"""

import numpy as np
import pytest
import torch
from hf_reference import varied
from scipy import stats
from test_speculative_loop import tiny_llama

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.engine.cuda_graphs import DecodeGraphs
from servelab.engine.speculative_engine import SpeculativeEngine, wider_step_graphs
from servelab.errors import ParameterError
from servelab.models import load_model
from servelab.models.native import native_from_hf
from servelab.speculative.config import SpeculativeConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NEW = 20
GREEDY = SamplingParams(max_tokens=NEW, ignore_eos=True)
NGRAM = SpeculativeConfig("ngram", 4, prompt_lookup_max=3, prompt_lookup_min=1)
DRAFT = SpeculativeConfig("draft_model", 4, model="(given)")


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen2", "tiny-gpt2"])
def family(request):
    """The HF target, ragged prompts (two repeat themselves, so prompt lookup finds drafts), the plain engine's
    greedy tokens, and two drafts: the target's twin and an unrelated random model of the same family."""
    hf = varied(request.param, 0)
    g = torch.Generator().manual_seed(11)
    vocab = hf.config.vocab_size
    motif = torch.randint(3, vocab, (12,), generator=g).tolist()
    prompts = [motif * 3, torch.randint(3, vocab, (19,), generator=g).tolist(), motif[:5] * 4, [5, 6]]
    plain = Engine.from_hf(hf, config()).generate(prompts, GREEDY)
    other = varied(request.param, 5)
    drafts = {"twin": hf, "random": other}
    return hf, prompts, plain, drafts


def config(**kw) -> EngineConfig:
    return EngineConfig(**{"block_size": 4, "num_blocks": 128, "max_model_len": 256, **kw})


def engine(hf, method: str, drafts=None, gamma: int = 4, **kw) -> SpeculativeEngine:
    if method == "ngram":
        return SpeculativeEngine.from_hf(hf, config(**kw), speculative=SpeculativeConfig("ngram", gamma, None, 3, 1))
    draft = native_from_hf(drafts[method], max_positions=256)
    return SpeculativeEngine.from_hf(
        hf, config(**kw), speculative=SpeculativeConfig("draft_model", gamma, "(given)"), draft=draft
    )


@pytest.mark.parametrize("method", ["ngram", "twin", "random"])
def test_greedy_tokens_are_the_plain_engines(family, method):
    hf, prompts, plain, drafts = family
    e = engine(hf, method, drafts)
    assert e.generate(prompts, GREEDY) == plain
    s = e.spec_stats
    assert s.num_drafts > 0
    if method == "twin":  # the twin proposes the target's own tokens: every draft is kept, 5 tokens a step
        assert s.num_accepted_tokens == s.num_draft_tokens
        assert e.steps <= 1 + -(-(NEW - 1) // 5)
    if method == "ngram":  # the repeating prompts give drafts that the target keeps
        assert s.num_accepted_tokens > 0
    assert e.leaked() == []
    assert e.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_twin_draft_keeps_every_draft_as_requests_come_and_go(family, temperature):
    """A draft that is the target proposes what the target would emit: greedy, every draft is kept; sampled, every
    draft is too (p/q = 1). With two running at once, a request admitted mid-run catches its draft up on a whole
    prompt while the others catch up on their last tokens: the draft's rows must stay with their sequences."""
    hf, prompts, _, drafts = family
    e = engine(hf, "twin", drafts, max_num_seqs=2)
    params = [SamplingParams(max_tokens=n, temperature=temperature, ignore_eos=True) for n in (7, 20, 12, 16)]
    e.generate(prompts, params)
    s = e.spec_stats
    assert s.num_drafts > 8 and s.num_accepted_tokens == s.num_draft_tokens


@pytest.mark.parametrize("method", ["ngram", "twin", "random"])
def test_budget_preemption_and_prefix_caching_keep_tokens_exact(family, method):
    hf, prompts, plain, drafts = family
    tight = engine(hf, method, drafts, num_blocks=20, max_num_seqs=4, max_num_batched_tokens=9)
    assert tight.generate(prompts, GREEDY) == plain
    assert tight.scheduler.num_preemptions > 0
    cached = engine(hf, method, drafts, prefix_caching=True)
    assert cached.generate(prompts + prompts[:2], GREEDY) == plain + plain[:2]
    assert cached.prefix_hit_rate > 0
    if method != "ngram":  # the draft caches prefixes of its own: a repeated prompt starts on its cached blocks
        assert cached.draft.bm.prefix_cache.hit_tokens > 0
    # both at once: preemption frees cached blocks, eviction recycles them, in the target's pool and the draft's
    both = engine(hf, method, drafts, num_blocks=20, max_num_seqs=4, max_num_batched_tokens=9, prefix_caching=True)
    assert both.generate(prompts + prompts[:2], GREEDY) == plain + plain[:2]
    if method == "twin":  # wrong K/V in a draft's cached block would not change the target's tokens, but would
        for e in (cached, both):  # make the twin propose other tokens than the target's
            assert e.spec_stats.num_accepted_tokens == e.spec_stats.num_draft_tokens > 0
    assert tight.leaked() == [] and cached.leaked() == [] and both.leaked() == []


@pytest.mark.parametrize("method", ["ngram", "twin"])
def test_verify_steps_fit_graphs_with_gamma_plus_one_rows_per_sequence(family, method, monkeypatch):
    """Four requests verifying γ + 1 = 5 positions each are 20 rows, over ``max_num_seqs`` (4). With the target's
    graphs ``graph_rows`` wide (uncaptured on a CPU, as ``_capture_graphs`` captures them on CUDA), no step falls back
    to building eager inputs; sized for ``max_num_seqs``, the verify steps do."""
    import servelab.engine.model_runner as model_runner
    import servelab.engine.speculative_engine as speculative_engine

    fallbacks, target = [], {}

    def counting(real):  # the target's eager steps only (the draft's runner, uncaptured on a CPU, builds its own)
        return lambda batch, tables, *a, **k: (
            fallbacks.extend([1] * (tables is target.get("tables"))) or real(batch, tables, *a, **k)
        )

    for module in (model_runner, speculative_engine):
        monkeypatch.setattr(module, "build_step_inputs", counting(module.build_step_inputs))
    hf, prompts, plain, drafts = family
    for rows in ("max_num_seqs", "graph_rows"):
        fallbacks.clear()
        e = engine(hf, method, drafts, max_num_seqs=4)
        r = e.runner
        target["tables"] = r.tables
        width = e.graph_rows if rows == "graph_rows" else r.max_num_seqs
        r.graphs = DecodeGraphs(e.model, e.pool, r.tables, max_batch=width, scratch_block=e.num_blocks)
        with wider_step_graphs(r, width):
            r.enable_step_graphs((8, 16, 32, 64, 128), capture=False)
        assert e.generate(prompts, GREEDY) == plain
        assert e.spec_stats.num_drafts > 0
        assert (len(fallbacks) == 0) == (rows == "graph_rows"), (rows, len(fallbacks))


def test_stops_and_max_tokens_inside_the_drafts_end_the_request_there(family):
    hf, prompts, plain, drafts = family
    out = plain[0]
    stop = out[6]  # inside the second round of five tokens the twin proposes
    params = [
        SamplingParams(max_tokens=NEW, ignore_eos=True, stop_token_ids=(stop,)),
        SamplingParams(max_tokens=7, ignore_eos=True),
        SamplingParams(max_tokens=2, ignore_eos=True),
        SamplingParams(max_tokens=1, ignore_eos=True),
    ]
    want = Engine.from_hf(hf, config()).generate(prompts, params)
    assert want[0] == out[: out.index(stop) + 1]
    e = engine(hf, "twin", drafts)
    assert e.generate(prompts, params) == want
    assert e.leaked() == []


@pytest.mark.parametrize("method", ["twin", "random", "ngram"])
def test_min_tokens_requests_speculate_and_keep_the_plain_engines_tokens(family, method):
    """vLLM's ``min_tokens`` (what HF calls ``min_new_tokens``): EOS is held back until a request has that many
    tokens. Such requests draft like plain ones (Study 6 runs its engine rows so, as HF's assisted generation runs),
    and the verify step holds EOS back at every drafted position below the count, the draft too, so the tokens are
    the plain engine's: with EOS set to a token greedy decoding emits early, the held requests run to their count
    past it (a fourth, held for 2 tokens, may stop at it after them). The twin, whose draws hold EOS back as the
    target's do, keeps every draft."""
    hf, prompts, plain, drafts = family
    eos = plain[0][3]  # the first prompt's fourth greedy token, made the end of sequence
    params = [SamplingParams(max_tokens=NEW, min_tokens=NEW)] * 3 + [SamplingParams(max_tokens=NEW, min_tokens=2)]
    want = Engine.from_hf(hf, config(), eos_token_ids=(eos,)).generate(prompts, params)
    first = plain[0].index(eos)  # where greedy decoding emits it first (it may repeat an earlier token)
    assert [len(w) for w in want[:3]] == [NEW] * 3 and want[0][:first] == plain[0][:first] and want[0][first] != eos
    assert eos not in want[0][:NEW] and eos not in want[3][:2]
    if method == "ngram":
        e = SpeculativeEngine.from_hf(hf, config(), speculative=NGRAM, eos_token_ids=(eos,))
    else:
        draft = native_from_hf(drafts[method], max_positions=256)
        e = SpeculativeEngine.from_hf(hf, config(), speculative=DRAFT, draft=draft, eos_token_ids=(eos,))
    assert e.generate(prompts, params) == want
    s = e.spec_stats
    assert s.num_drafts > 0
    if method == "twin":
        assert s.num_accepted_tokens == s.num_draft_tokens
    assert e.leaked() == [] and e.block_manager.num_used_blocks == 0


def test_prompts_reach_the_draft_with_the_targets_chunks(family):
    """Under a budget of 9 tokens a step, the draft computes each prompt chunk by chunk beside the target (and the
    decodes that had no room to draft), so a speculative step's catch-up is the one or two tokens the target emitted
    last, never a whole prompt."""
    hf, prompts, plain, drafts = family
    e = engine(hf, "twin", drafts, max_num_seqs=4, max_num_batched_tokens=9)
    catch_up = []
    propose = e.draft.propose

    def watched(seqs, ks):
        catch_up.extend(s.num_tokens - e.draft.mirrors[s.seq_id].num_computed_tokens for s in seqs)
        return propose(seqs, ks)

    e.draft.propose = watched
    assert e.generate(prompts, GREEDY) == plain
    assert catch_up and max(catch_up) <= 2
    assert e.spec_stats.num_accepted_tokens == e.spec_stats.num_draft_tokens


def test_no_sequence_keeps_blocks_past_its_tokens_after_a_step(family):
    """Each step reserves slots for γ drafts; whatever the target rejects (all of it, with the random draft) goes back,
    in the target's pool and the draft's."""
    hf, prompts, _, drafts = family
    e = engine(hf, "random", drafts)
    for p in prompts:
        e.add_request(p, GREEDY)
    checked = 0
    while e.has_unfinished():
        e.step()
        bs = e.block_manager.block_size
        for seq in e.scheduler.running:
            assert e.block_manager.num_tokens(seq.seq_id) <= -(-seq.num_tokens // bs) * bs
            if seq.seq_id in e.draft.bm:
                assert e.draft.bm.num_tokens(seq.seq_id) <= -(-seq.num_tokens // bs) * bs
            checked += 1
    assert checked > 0 and e.spec_stats.num_draft_tokens > e.spec_stats.num_accepted_tokens
    assert e.draft.bm.num_used_blocks == 0


def test_an_abort_frees_the_drafts_blocks_too(family):
    hf, prompts, _, drafts = family
    e = engine(hf, "twin", drafts)
    seqs = [e.add_request(p, GREEDY) for p in prompts]
    for _ in range(3):
        e.step()
    assert e.draft.bm.num_used_blocks > 0
    for s in seqs:
        e.abort(s)
    assert e.leaked() == []
    assert e.block_manager.num_used_blocks == 0 and e.draft.bm.num_used_blocks == 0


def test_a_logprobs_request_runs_plain_steps_with_the_same_tokens(family):
    hf, prompts, plain, drafts = family
    e = engine(hf, "twin", drafts)
    params = [SamplingParams(max_tokens=NEW, ignore_eos=True, logprobs=2)] + [GREEDY] * 3
    assert e.generate(prompts, params) == plain
    assert e.spec_stats.num_drafts == 0  # every step served the logprobs request


@pytest.mark.parametrize("alpha", [0.0, 0.7, 1.0])
def test_controlled_drafts_are_kept_at_the_rate_set_and_leave_tokens_exact(family, alpha):
    """Drafts overridden to the plain engine's token with probability α (else a wrong one): the target keeps the
    leading run of right ones, so a step that drafted γ keeps (α − α^(γ+1)) / (1 − α) on average; α = 1 keeps all,
    α = 0 none, and the tokens are the plain engine's either way."""
    from servelab.speculative.controlled import ControlledDrafts

    hf, prompts, plain, drafts = family
    e = engine(hf, "random", drafts)
    many = prompts * 4
    seqs = [e.add_request(p, GREEDY) for p in many]
    e.override = ControlledDrafts(
        {s.seq_id: plain[i % len(prompts)] for i, s in enumerate(seqs)}, alpha, hf.config.vocab_size, seed=1
    )
    while e.has_unfinished():
        e.step()
    assert [s.output_token_ids for s in seqs] == plain * 4
    assert e.override.disagreed == 0  # in float32 the target's own verification kept what the draws kept
    s = e.spec_stats
    if alpha == 1.0:
        assert s.num_accepted_tokens == s.num_draft_tokens
    elif alpha == 0.0:
        assert s.num_accepted_tokens == 0
    else:
        g = e.gamma
        full = s.per_position[0]  # steps are mostly full-γ drafts; compare the first position's rate with α
        assert abs(full / s.num_drafts - alpha) < 0.12
        assert s.per_position[g - 1] < s.per_position[0]


def test_controlled_drafts_decide_what_is_kept_where_the_target_would_leave_the_reference(family):
    """In bf16 the verify step's near-ties can part from the plain engine's reference; the draws still decide: a
    reference with a token the target would not choose is followed (after the prefill's token, the target's own),
    and ``disagreed`` counts the verifications where the target would have emitted something else."""
    from servelab.speculative.controlled import ControlledDrafts

    hf, prompts, plain, drafts = family
    e = engine(hf, "random", drafts)
    seq = e.add_request(prompts[1], GREEDY)
    ref = list(plain[1])
    ref[6] = (ref[6] + 1) % hf.config.vocab_size
    e.override = ControlledDrafts({seq.seq_id: ref}, 1.0, hf.config.vocab_size)
    while e.has_unfinished():
        e.step()
    assert seq.output_token_ids[0] == plain[1][0] and seq.output_token_ids[1:] == ref[1:]
    assert e.override.disagreed > 0


def test_bad_configurations_are_refused_before_anything_runs():
    hf = load_model("config:tiny-llama").model
    small = tiny_llama(seed=0, layers=1, vocab=24, hidden=32)
    with pytest.raises(ParameterError, match="vocabulary"):
        SpeculativeEngine.from_hf(hf, config(), speculative=DRAFT, draft=native_from_hf(small, max_positions=256))
    with pytest.raises(ParameterError, match="draft model"):
        SpeculativeEngine.from_hf(hf, config(), speculative=DRAFT)
    with pytest.raises(ParameterError, match="draft model"):
        SpeculativeEngine.from_hf(hf, config(), speculative=NGRAM, draft=native_from_hf(hf, max_positions=256))
    with pytest.raises(ParameterError, match="decode_steps"):
        SpeculativeEngine.from_hf(hf, config(decode_steps=2), speculative=NGRAM)
    with pytest.raises(ParameterError, match="positions"):
        SpeculativeEngine.from_hf(hf, config(), speculative=DRAFT, draft=native_from_hf(hf, max_positions=64))


def test_a_lower_gamma_set_between_requests_drafts_fewer_and_keeps_tokens_exact(family):
    hf, prompts, plain, drafts = family
    e = engine(hf, "twin", drafts, gamma=4)
    e.set_gamma(2)
    assert e.generate(prompts, GREEDY) == plain
    s = e.spec_stats
    assert s.num_accepted_tokens == s.num_draft_tokens <= 2 * s.num_drafts  # the twin: every draft kept, 2 a step
    assert s.per_position[2:] == [0, 0] and s.per_position[1] > 0
    assert e.graph_rows == config().max_num_seqs * 5  # the graphs stay as wide as the engine was built
    e.set_gamma(4)
    assert e.generate(prompts, GREEDY) == plain and e.spec_stats.per_position[3] > 0


def test_gamma_is_refused_outside_the_engines_width_or_while_requests_run():
    hf = load_model("config:tiny-llama").model
    e = SpeculativeEngine.from_hf(hf, config(), speculative=NGRAM)
    for bad in (0, 5, True, 2.0):
        with pytest.raises(ParameterError, match="gamma must be an integer from 1 to 4"):
            e.set_gamma(bad)
    e.add_request([1, 2, 3], GREEDY)
    with pytest.raises(ParameterError, match="between requests"):
        e.set_gamma(2)
    assert e.gamma == 4


# ---- sampled: the target's distribution ------------------------------------------------------------------
VOCAB, RUNS = 6, 6000
PROMPT = [1, 4, 2]


@pytest.fixture(scope="module")
def pair():
    """A target and a draft far from it (different seeds, sharper weights), on a 6-token vocabulary."""
    target = tiny_llama(seed=0, layers=2, vocab=VOCAB, hidden=32, init=0.5)
    draft = tiny_llama(seed=3, layers=1, vocab=VOCAB, hidden=32, init=0.5)
    return target, draft


def exact_joint(target, temperature: float = 1.0, top_p: float = 1.0) -> np.ndarray:
    """P(t2, t3) = Σ_t1 p(t1 | prompt) p(t2 | …, t1) p(t3 | …, t1, t2), from the HF model, each p at ``temperature``
    and cut to ``top_p`` as the engine's sampler cuts it."""
    from servelab.engine.sampling import top_p_filter

    def probs(ctx):
        with torch.no_grad():
            p = torch.softmax(target(torch.tensor([ctx])).logits[0, -1].double() / temperature, -1)
        return top_p_filter(p[None], torch.tensor([top_p], dtype=torch.float64))[0].numpy()

    joint = np.zeros((VOCAB, VOCAB))
    p1 = probs(PROMPT)
    for a in range(VOCAB):
        p2 = probs(PROMPT + [a])
        for b in range(VOCAB):
            joint[b] += p1[a] * p2[b] * probs(PROMPT + [a, b])
    return joint


def sampled_joint(target, draft, temperature: float = 1.0, top_p: float = 1.0) -> tuple[np.ndarray, SpeculativeEngine]:
    """Counts of (t2, t3) over RUNS requests of 4 tokens: t1 from the prefill step, then a speculative step with
    γ = 2 drafts emits t2 (a kept draft, or the replacement of a rejected one) and, when it kept the first draft,
    t3 (the second draft kept, or its replacement); otherwise t3 comes from the next step, with one draft."""
    e = SpeculativeEngine.from_hf(
        target,
        EngineConfig(block_size=4, num_blocks=RUNS + 64, max_model_len=64, max_num_seqs=512),
        speculative=SpeculativeConfig("draft_model", 2, "(given)"),
        draft=native_from_hf(draft, max_positions=64),
    )
    torch.manual_seed(0)
    params = SamplingParams(max_tokens=4, temperature=temperature, top_p=top_p, ignore_eos=True)
    outs = e.generate([PROMPT] * RUNS, params)
    counts = np.zeros((VOCAB, VOCAB))
    for o in outs:
        counts[o[1], o[2]] += 1
    return counts, e


def chi2_p(counts: np.ndarray, joint: np.ndarray) -> float:
    expected = joint.ravel() * counts.sum()
    keep = expected >= 5  # cells too rare for χ² are pooled into one
    obs = np.append(counts.ravel()[keep], counts.ravel()[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs, exp).pvalue


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (1.5, 0.9)])
def test_sampled_tokens_keep_the_targets_distribution(pair, temperature, top_p):
    """With top-p 0.9 both distributions are cut (the target's in the verifier, the draft's where it draws), and the
    joint is the target's cut one: 8 of its 36 cells keep mass at temperature 1.5 (at 1.0 this sharp target keeps
    one token, and there would be nothing to test)."""
    target, draft = pair
    counts, e = sampled_joint(target, draft, temperature, top_p)
    s = e.spec_stats
    assert 0.05 < s.acceptance_rate < 0.95  # drafts both kept and rejected: the residual draw is exercised
    assert s.per_position[1] > 0  # second drafts were kept too
    assert chi2_p(counts, exact_joint(target, temperature, top_p)) > 1e-3


def test_the_same_test_rejects_a_verifier_that_keeps_every_draft(pair, monkeypatch):
    import servelab.engine.speculative_engine as mode
    from servelab.speculative.rejection import Verified

    def keep_all(target_logits, draft_tokens, num_drafts, *args, **kw):
        batch, gamma = draft_tokens.shape
        rows = torch.arange(batch)
        tokens = draft_tokens.new_full((batch, gamma + 1), -1)
        tokens[:, :gamma] = draft_tokens
        tokens[rows, num_drafts] = target_logits[rows, num_drafts].argmax(-1)
        return Verified(tokens, num_drafts + 1)

    monkeypatch.setattr(mode, "verify", keep_all)
    target, draft = pair
    counts, _ = sampled_joint(target, draft)
    assert chi2_p(counts, exact_joint(target)) < 1e-6


def test_the_same_test_rejects_a_verifier_that_ignores_top_p(pair, monkeypatch):
    import servelab.engine.speculative_engine as mode

    monkeypatch.setattr(mode, "_filter_top_p", lambda target, seqs: target)
    target, draft = pair
    counts, _ = sampled_joint(target, draft, 1.5, 0.9)
    assert chi2_p(counts, exact_joint(target, 1.5, 0.9)) < 1e-6


def test_a_seeded_request_gets_the_same_tokens_whatever_runs_beside_it(pair):
    target, draft = pair

    def run(n_others: int) -> list[int]:
        e = SpeculativeEngine.from_hf(
            target,
            EngineConfig(block_size=4, num_blocks=256, max_model_len=64),
            speculative=SpeculativeConfig("draft_model", 3, "(given)"),
            draft=native_from_hf(draft, max_positions=64),
        )
        mine = SamplingParams(max_tokens=12, temperature=0.8, seed=7, ignore_eos=True)
        others = SamplingParams(max_tokens=9, temperature=1.0, ignore_eos=True)
        return e.generate([PROMPT] + [[2, 3]] * n_others, [mine] + [others] * n_others)[0]

    assert run(0) == run(5)


# ---- on a GPU: the captured draft steps and the compiled blocks ---------------------------------------------------
@pytest.mark.gpu
@pytest.mark.gpu_quick
@pytest.mark.parametrize("method", ["ngram", "twin", "random"])
def test_on_the_gpu_speculative_steps_give_the_plain_engines_greedy_tokens(method):
    """float32 on CUDA, graphs and compilation as the engine picks them: verify steps replay the target's graphs with
    the drafts patched in on the device; the draft's decode steps replay its graphs with their tokens patched in, and
    its catch-up steps replay whole-step graphs."""
    hf = varied("tiny-llama", 0).cuda()
    g = torch.Generator().manual_seed(11)
    motif = torch.randint(3, hf.config.vocab_size, (12,), generator=g).tolist()
    prompts = [motif * 3, torch.randint(3, hf.config.vocab_size, (19,), generator=g).tolist(), motif[:5] * 4, [5, 6]]
    cfg = EngineConfig(block_size=16, num_blocks=256, max_model_len=256, max_num_seqs=8)
    plain = Engine.from_hf(hf, cfg).generate(prompts, GREEDY)
    drafts = {"twin": hf, "random": varied("tiny-llama", 5).cuda()}
    if method == "ngram":
        e = SpeculativeEngine.from_hf(hf, cfg, speculative=NGRAM)
    else:
        draft = native_from_hf(drafts[method], max_positions=256)
        e = SpeculativeEngine.from_hf(hf, cfg, speculative=DRAFT, draft=draft)
        assert e.draft.num_graphs > 0
        # the draft takes the target's fused RoPE + KV write and small blocks (on by default on CUDA with Triton)
        from servelab.models.small_batch import uses_small_linear

        assert e.stats()["small_batch"] and uses_small_linear(e.draft.model) and e.draft.model.fused_rope_kv_write
    assert e.generate(prompts, GREEDY) == plain
    assert e.spec_stats.num_drafts > 0 and e.leaked() == []
    assert e.runner.eager_steps == 0  # verify steps replayed the target's decode graphs (or whole-step graphs)
    if method != "ngram":  # the draft's catch-up steps replayed whole-step graphs, and its rounds' steps the
        # decode graphs: the round graph (engine.draft_rounds) is opt-in
        assert e.draft.runner.step_graph_steps > 0 and e.draft.round_graph_rounds == 0
        assert e.draft.runner.eager_steps == 0
    if method == "twin":
        assert e.spec_stats.num_accepted_tokens == e.spec_stats.num_draft_tokens


@pytest.mark.gpu
def test_on_the_gpu_a_speculative_step_waits_for_the_device_once():
    """Issue 30: one host sync per round, the step's read of its kept tokens. Each draft step used to build an index
    with a blocking copy, so the host waited for the round's earlier draft steps before it queued the next one and
    the GPU idled between them. Counted with PyTorch's sync debug mode (``speculative.syncs.HostSyncs``), every step
    after the prefill, two sequences drafting with a twin draft."""
    from servelab.speculative.syncs import HostSyncs

    hf = varied("tiny-llama", 0).cuda()
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist() for n in (19, 7)]
    cfg = EngineConfig(block_size=16, num_blocks=256, max_model_len=256, max_num_seqs=8)
    e = SpeculativeEngine.from_hf(hf, cfg, speculative=DRAFT, draft=native_from_hf(hf, max_positions=256))
    for p in prompts:
        e.add_request(p, GREEDY)
    e.step()  # the prefill
    # PyTorch warns once per process that its sync debug mode is a prototype, and HostSyncs counts that warning
    # too (its "synchroniz" matches it): an empty block takes it first, so only the steps' real waits are counted.
    # The H100 at 949817b read [2, 1, 1, 1] without it, the 2 being that warning (scripts/diag_spec_syncs.py).
    with HostSyncs("cuda"):
        pass
    counts = []
    while e.has_unfinished():
        with HostSyncs("cuda") as h:
            e.step()
        counts.append(h.count)
    assert e.spec_stats.num_drafts > 0 and counts and max(counts) <= 1, counts
