import pytest
import torch

from servelab.models import ModelLoadError, ModelShape, load_model, shipped_configs


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-llama", "tiny-gpt2"])
def test_config_form_is_random_init_with_no_zero_tensors(name):
    lm = load_model(f"config:{name}", dtype="float32")
    assert lm.source == "config" and lm.tokenizer is None
    assert all(p.any() for p in lm.model.parameters())  # never time on zeros
    out = lm.model(torch.tensor([[1, 2, 3]])).logits
    assert out.shape == (1, 3, lm.config.vocab_size)


def test_config_form_is_deterministic_given_seed():
    a = load_model("config:tiny-llama", seed=3).model.state_dict()
    b = load_model("config:tiny-llama", seed=3).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_directory_form_round_trips(tmp_path):
    lm = load_model("config:tiny-gpt2")
    lm.model.save_pretrained(tmp_path / "m")
    again = load_model(str(tmp_path / "m"))
    assert again.source == "directory"
    x = torch.tensor([[5, 6, 7]])
    assert torch.allclose(lm.model(x).logits, again.model(x).logits)


def test_offline_hub_id_names_the_config_alternative():
    with pytest.raises(ModelLoadError, match="config:qwen2-0.5b"):
        load_model("Qwen/Qwen2-0.5B")


def test_bad_specs_get_clear_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="no shipped config"):
        load_model("config:nope")
    with pytest.raises(ModelLoadError, match="not a model directory"):
        load_model(str(tmp_path))
    with pytest.raises(ModelLoadError, match="dtype"):
        load_model("config:tiny-gpt2", dtype="int3")
    with pytest.raises(ModelLoadError):
        load_model("")


def test_shipped_configs_cover_the_study_models():
    assert {"qwen2-0.5b", "qwen2-1.5b", "gpt2", "gpt2-medium", "distilgpt2", "llama-3-8b"} <= set(shipped_configs())


@pytest.mark.parametrize(
    "name,params",
    [("qwen2-0.5b", 494_032_768), ("qwen2-1.5b", 1_543_714_304), ("gpt2", 124_439_808), ("llama-3-8b", 8_030_261_248)],
)
def test_shape_parameter_counts_match_the_published_models(name, params):
    from transformers import AutoConfig

    from servelab.models.loader import CONFIG_DIR

    assert ModelShape.from_config(AutoConfig.from_pretrained(CONFIG_DIR / name)).params == params


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-llama", "tiny-gpt2"])
def test_shape_counts_equal_the_instantiated_model(name):
    m = load_model(f"config:{name}").model
    assert ModelShape.from_config(m.config).params == sum(p.numel() for p in m.parameters())


def test_kv_bytes_per_token_formula_gpt2_fp16_is_36_kib():
    from transformers import AutoConfig

    from servelab.models.loader import CONFIG_DIR

    s = ModelShape.from_config(AutoConfig.from_pretrained(CONFIG_DIR / "gpt2"))
    assert s.kv_bytes_per_token(2) == 2 * 12 * 12 * 64 * 2 == 36_864


def test_decode_costs_grow_with_batch_and_context():
    from transformers import AutoConfig

    from servelab.models.loader import CONFIG_DIR

    s = ModelShape.from_config(AutoConfig.from_pretrained(CONFIG_DIR / "qwen2-0.5b"))
    assert s.decode_bytes(1, 128) == s.weight_bytes(2) + s.kv_bytes_per_token(2) * 129
    assert s.decode_flops(2, 128) == 2 * s.decode_flops(1, 128)
    assert s.attention_flops(1, 100) == 4 * s.layers * s.heads * s.head_dim * 101
