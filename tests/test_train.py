"""The trained family: tokenizer, models in HF format, time-bounded training, the cache, held-out prompts."""

import json
import math

import pytest
import torch

from servelab.errors import ParameterError
from servelab.studies.common.family.cache import load_family
from servelab.studies.common.family.corpus import build_corpus, default_roots
from servelab.studies.common.family.loop import lr_at, model_config
from servelab.studies.common.family.recipe import RECIPES, FamilyRecipe, ModelRecipe
from servelab.studies.common.family.tokenizer import EOS, PAD, train_tokenizer
from servelab.studies.common.family.train import train_family


def _m(name, d, layers, heads, kv, budget_s=60.0, max_steps=12):
    return ModelRecipe(
        name,
        d,
        layers,
        heads,
        kv,
        2 * d,
        tie_embeddings=name != "t",
        budget_s=budget_s,
        max_steps=max_steps,
        batch_size=8,
        lr=1e-2,
        warmup_steps=2,
    )


TINY = FamilyRecipe(
    profile="smoke",
    vocab_size=400,
    seq_len=32,
    corpus_bytes=120_000,
    max_file_bytes=16_384,
    heldout_fraction=0.1,
    tokenizer_sample_bytes=60_000,
    eval_windows=4,
    evals=2,
    log_every=2,
    target=_m("t", 32, 2, 2, 1),
    drafts=(_m("d-a", 16, 1, 2, 1), _m("d-b", 16, 1, 1, 1), _m("d-c", 24, 1, 2, 2)),
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one intra-op thread


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(
        TINY.corpus_bytes,
        TINY.heldout_fraction,
        roots={"stdlib": default_roots()["stdlib"]},
        max_file_bytes=TINY.max_file_bytes,
    )


@pytest.fixture(scope="module")
def family(corpus, tmp_path_factory):
    cache = tmp_path_factory.mktemp("trained")
    return train_family("smoke", cache_dir=cache, recipe=TINY, corpus=corpus, device="cpu", progress=False)


def test_tokenizer_round_trips_python_and_loads_with_autotokenizer(family):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(family.tokenizer_dir)
    src = "def f(x):\n    return {'a': x ** 2}  # ünïcode\n"
    ids = tok(src, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == src
    assert len(tok) == TINY.vocab_size
    assert tok.eos_token == EOS and tok.pad_token == PAD and tok.eos_token_id != tok.pad_token_id


def test_family_layout_and_models_load_and_assist(family):
    from servelab.models import load_model

    assert family.target.name == "t" and list(family.drafts) == ["d-a", "d-b", "d-c"]  # smallest draft first
    assert family.params["d-a"] < family.params["d-b"] < family.params["d-c"] < family.params["t"]
    assert set(family.params) == {"t", "d-a", "d-b", "d-c"}
    lm = load_model(str(family.target))
    assert lm.tokenizer is not None and lm.model.config.model_type == "llama"
    assert sum(p.numel() for p in lm.model.parameters()) == family.params["t"]
    draft = load_model(str(family.drafts["d-a"])).model
    prompt = torch.tensor([family.eval_prompts(1, 16)[0]])
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(prompt))
    plain = lm.model.generate(prompt, **kw)
    assisted = lm.model.generate(prompt, assistant_model=draft, **kw)
    assert torch.equal(plain, assisted)  # float32 greedy: the assistant changes the speed, not the output


def test_loss_curves_fall_and_are_recorded(family):
    loss = family.loss
    assert list(loss.columns[:5]) == ["model", "step", "tokens", "train_loss", "eval_loss"]
    assert set(loss["model"]) == {m.name for m in TINY.models}  # every model's curve: the loop checks each
    for name, g in loss.groupby("model"):
        assert g["step"].is_monotonic_increasing
        assert not math.isnan(g["eval_loss"].iloc[-1])  # an eval at the last step
        assert g["train_loss"].iloc[-1] < g["train_loss"].iloc[0] - 0.3, name
    tr = family.training.set_index("model")
    assert (tr["steps"] == 12).all() and (tr["tokens"] == 12 * 8 * 32).all()
    assert (tr["tokens_per_s"] > 0).all() and (tr["final_eval_loss"] < math.log(TINY.vocab_size) + 0.5).all()
    s = family.summary()
    assert s.set_index("model").loc["t", "role"] == "target" and len(s) == 4


def test_eval_prompts_come_from_heldout_files(family):
    held = family.heldout_tokens()
    prompts = family.eval_prompts(3, 24, seed=2)
    assert len(prompts) == 3 and all(len(p) == 24 for p in prompts)
    for p in prompts:
        assert any(_contains(h.tolist(), p) for h in held)
    assert family.eval_prompts(3, 24, seed=2) == prompts


def _contains(seq, sub):
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_cache_hit_loads_instead_of_training(family, corpus):
    again = train_family("smoke", cache_dir=family.dir.parent, recipe=TINY, corpus=corpus, device="cpu", progress=False)
    assert again.cached and again.dir == family.dir and not family.cached
    assert again.loss.equals(family.loss)
    assert set(again.timings) == {"corpus_s", "tokenizer_s", "encode_s", "total_s"}
    assert again.timings["total_s"] >= again.timings["encode_s"] > 0
    meta = json.loads((family.dir / "family.json").read_text())
    assert meta["manifest"]["sha256"] == corpus.manifest["sha256"]
    assert TINY.digest(corpus.manifest["sha256"], 0) != TINY.digest(corpus.manifest["sha256"], 1)
    assert not list(family.dir.parent.glob(".tmp-*"))  # the temp dir was renamed into place


def test_training_stops_at_its_wall_time_budget(corpus, tmp_path):
    quick = FamilyRecipe(
        **{
            **TINY.__dict__,
            "target": _m("t", 32, 2, 2, 1, budget_s=0.05, max_steps=10_000),
            "drafts": (_m("d", 16, 1, 2, 1, max_steps=3),),
            "log_every": 1,
        }
    )
    fam = train_family("smoke", cache_dir=tmp_path, recipe=quick, corpus=corpus, device="cpu", progress=False)
    steps = fam.training.set_index("model")["steps"]
    assert steps["t"] < 100 and steps["d"] == 3


def test_schedule_warms_up_then_decays():
    peak = 1e-3
    assert lr_at(0, 100, peak, 10) == pytest.approx(peak / 10)
    assert lr_at(9, 100, peak, 10) == pytest.approx(peak)
    assert lr_at(100, 100, peak, 10) == pytest.approx(0.1 * peak)
    vals = [lr_at(s, 100, peak, 10) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(vals, vals[1:], strict=False))


def test_bad_inputs_are_rejected(corpus, tmp_path):
    with pytest.raises(ParameterError, match="seed"):
        train_family("smoke", cache_dir=tmp_path, recipe=TINY, corpus=corpus, seed=-1)
    with pytest.raises(ParameterError, match="profile"):
        train_family("medium", cache_dir=tmp_path)
    with pytest.raises(ParameterError, match="divide"):
        model_config(_m("x", 30, 1, 4, 1), 400, 32, 0, 1)
    with pytest.raises(ParameterError, match="vocab_size"):
        train_tokenizer(["x = 1"], 100)
    with pytest.raises(ParameterError, match="distinct names"):
        train_family(
            "smoke",
            cache_dir=tmp_path,
            recipe=FamilyRecipe(**{**TINY.__dict__, "drafts": (_m("t", 16, 1, 2, 1),)}),
            corpus=corpus,
        )
    with pytest.raises(ParameterError, match="no trained family"):
        load_family(tmp_path)


def test_shipped_recipes_have_a_target_and_three_drafts_of_the_stated_sizes():
    from transformers import LlamaForCausalLM

    for name, rec in RECIPES.items():
        assert len(rec.drafts) >= 3
        sizes = {}
        for m in rec.models:
            with torch.device("meta"):
                model = LlamaForCausalLM(model_config(m, rec.vocab_size, rec.seq_len, 0, 1))
            sizes[m.name] = sum(p.numel() for p in model.parameters())
        assert max(sizes, key=sizes.get) == rec.target.name
        if name == "full":  # the brief's ranges: target ≈ 100–350M, drafts ≈ 5–50M; names say the size
            assert 100e6 <= sizes[rec.target.name] <= 350e6
            for d in rec.drafts:
                assert 5e6 <= sizes[d.name] <= 50e6
            for n, s in sizes.items():
                assert n.endswith(f"{round(s / 1e6)}m"), (n, s)
            assert sum(m.budget_s for m in rec.models) <= 125  # leaves room for corpus, tokenizer and saves


def test_tokenizer_parallelism_is_on_only_while_encoding(monkeypatch):
    import os

    from servelab.studies.common.family.tokenizer import tokenizers_parallel

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    with tokenizers_parallel():
        assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    with tokenizers_parallel():
        pass
    assert "TOKENIZERS_PARALLELISM" not in os.environ
