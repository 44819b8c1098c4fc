"""On trained weights (SmolLM2-135M-Instruct), the engine's greedy tokens equal HF ``generate``'s, in float32.

Random weights make near-ties rare and hide some bugs; a trained model's chat answers have real
near-ties and end in a trained EOS. Both sides are compared up to and including the first EOS: HF
stops there, and ``min_new_tokens`` would mask EOS and change HF's choice, so neither is forced on.
"""

import pytest
import torch

from servelab.engine import Engine, EngineConfig, SamplingParams
from servelab.models import SMOLLM2, load_model

# short answers (8 to 13 tokens, each ending in EOS) keep the test near a minute of CPU on 2 cores
PROMPTS = ["What is the capital of France?", "Name three primary colors.", "What is 2+2?"]
MAX_NEW = 16


def up_to_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.fixture(scope="module")
def smollm2():
    lm = load_model(SMOLLM2, dtype="float32")
    tok = lm.tokenizer
    prompts = []
    for text in PROMPTS:
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tok.encode(rendered, add_special_tokens=False))
    refs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW)
            refs.append(out[0, len(p) :].tolist())
    return lm, prompts, refs


def test_engine_greedy_equals_hf_greedy_on_smollm2_chat_prompts(smollm2):
    lm, prompts, refs = smollm2
    eos = lm.config.eos_token_id
    engine = Engine.from_hf(lm.model, EngineConfig(block_size=16, num_blocks=64, max_num_seqs=4))
    assert engine.scheduler.eos_token_ids == (eos,)
    ours = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW))
    assert [up_to_eos(o, eos) for o in ours] == [up_to_eos(r, eos) for r in refs]
    assert sum(r[-1] == eos for r in refs) >= 2  # the answers end on the trained EOS: the stop is compared too
