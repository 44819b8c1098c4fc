"""The server's speculative switch (``--draft-model``, ``--num-speculative-tokens``, vLLM's ``--speculative-config``)
builds the engine's speculative mode: a greedy completion with speculation on equals the one with it off, streamed
one chunk per token; concurrent requests speculate in the same steps; blocks are freed after each request."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from servelab.engine import Engine
from servelab.engine.speculative_engine import SpeculativeEngine
from servelab.server import ServerThread
from servelab.server.cli import engine_from_args, parse_args
from servelab.server.engine_loop import EngineLoop
from servelab.server.metrics import ServerMetrics
from servelab.server.tokenizer import ByteTokenizer, special_ids

PROMPTS = [[5, 6, 7], [10, 20, 30, 40, 50, 60, 70], [300, 301, 302, 303]]
BASE = [
    "--model",
    "config:tiny-llama",
    "--dtype",
    "float32",
    "--device",
    "cpu",
    "--num-blocks",
    "256",
    "--max-num-seqs",
    "8",
    "--max-num-batched-tokens",
    "512",
    "--max-model-len",
    "256",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one intra-op thread


def _completions(engine, stream=False, concurrent=False):
    """Greedy completions of PROMPTS through a real server (uvicorn in a thread) on ``engine``: wrapped in an
    EngineLoop as ``python -m servelab.server`` does, so the engine is used exactly as the CLI uses it. ``concurrent``:
    the requests are sent at once."""
    codec = ByteTokenizer(engine.model.shape.vocab, special_ids(engine.model.config))
    loop = EngineLoop(engine, metrics=ServerMetrics("servelab"))  # as __main__ builds it for a thread backend
    with ServerThread(loop, codec) as srv, httpx.Client(base_url=srv.base_url, timeout=60) as c:

        def one(p):
            body = dict(prompt=p, max_tokens=12, temperature=0, return_token_ids=True)
            if stream:
                r = c.post("/v1/completions", json=body | {"stream": True})
                chunks = [json.loads(ln[6:]) for ln in r.text.split("\n\n") if ln.startswith("data: {")]
                assert all(len(ch["choices"][0]["token_ids"]) == 1 for ch in chunks if ch["choices"])
                return [ch["choices"][0]["token_ids"][0] for ch in chunks if ch["choices"]]
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["token_ids"]

        if concurrent:
            with ThreadPoolExecutor(len(PROMPTS)) as pool:
                return list(pool.map(one, PROMPTS))
        return [one(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def plain():
    engine = engine_from_args(parse_args(BASE))
    assert isinstance(engine, Engine) and not isinstance(engine, SpeculativeEngine)
    return _completions(engine)


def test_speculative_server_gives_the_same_greedy_completions(plain):
    engine = engine_from_args(
        parse_args(BASE + ["--draft-model", "config:tiny-llama", "--num-speculative-tokens", "3"])
    )
    assert isinstance(engine, SpeculativeEngine) and engine.gamma == 3
    assert _completions(engine) == plain
    assert _completions(engine, stream=True) == plain  # one SSE chunk per token, even when a step emits several
    stats = engine.stats()
    assert stats["speculative"] == "draft_model" and stats["spec_num_draft_tokens"] > 0
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished() and engine.leaked() == []


def test_concurrent_requests_speculate_in_the_same_steps(plain):
    engine = engine_from_args(parse_args(BASE + ["--draft-model", "config:tiny-llama", "--no-warmup"]))
    engine.draft.model.load_state_dict(engine.model.state_dict())  # a twin: it drafts at every step
    widths = []
    verify_step = engine._verify_step

    def counted(batch, proposals, *a):
        widths.append(len(proposals))
        return verify_step(batch, proposals, *a)

    engine._verify_step = counted
    # the engine takes no step until every request is in: three HTTP requests sent at once may otherwise reach
    # the engine thread a step apart on a loaded machine (seen with two test workers on two cores)
    added, add_request, has_unfinished = [], engine.add_request, engine.has_unfinished
    engine.add_request = lambda *a, **kw: added.append(add_request(*a, **kw)) or added[-1]
    engine.has_unfinished = lambda: len(added) >= len(PROMPTS) and has_unfinished()
    assert _completions(engine, concurrent=True) == plain
    assert max(widths) == len(PROMPTS)  # one target step verified every request's drafts
    assert engine.spec_stats.num_accepted_tokens == engine.spec_stats.num_draft_tokens > 0


def test_speculative_engine_refuses_bad_requests():
    from servelab.engine import SamplingParams
    from servelab.errors import ParameterError

    engine = engine_from_args(parse_args(BASE + ["--draft-model", "config:tiny-llama", "--no-warmup"]))
    with pytest.raises(ParameterError, match="max_model_len"):
        engine.add_request([1, 2], SamplingParams(max_tokens=300))
    with pytest.raises(ParameterError, match="vocab"):
        engine.add_request([10**6])
    seq = engine.add_request([1, 2, 3], SamplingParams(max_tokens=20, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.abort(seq) and not engine.has_unfinished() and engine.block_manager.num_used_blocks == 0
    assert engine.draft.bm.num_used_blocks == 0 and engine.leaked() == []


# ---- prompt lookup (no draft model) --------------------------------------------------------------------
LOOKUP_JSON = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}'


@pytest.mark.parametrize(
    "flags",
    [["--draft-model", "prompt-lookup", "--num-speculative-tokens", "3"], ["--speculative-config", LOOKUP_JSON]],
)
def test_prompt_lookup_server_gives_the_same_greedy_completions(plain, flags):
    engine = engine_from_args(parse_args(BASE + flags))
    assert isinstance(engine, SpeculativeEngine) and engine.draft is None and engine.gamma == 3
    assert _completions(engine) == plain
    stats = engine.stats()
    assert stats["speculative"] == "ngram"
    # the prompts repeat nothing, but the random target's answers do: lookup proposed some tokens
    assert stats["spec_num_draft_tokens"] > 0
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished()


def test_speculative_config_json_is_read_as_vllm_reads_it():
    from servelab.speculative.config import SpeculativeConfig, speculative_config

    assert speculative_config(None, 4, LOOKUP_JSON) == SpeculativeConfig("ngram", 3, None, 2, 1)
    # neither bound: vLLM's 5 and 5; one bound: both
    assert speculative_config(None, 4, '{"method": "ngram"}') == SpeculativeConfig("ngram", 4, None, 5, 5)
    assert speculative_config(None, 4, '{"method": "ngram", "prompt_lookup_max": 2}').prompt_lookup_min == 2
    draft = speculative_config(None, 4, '{"model": "config:tiny-llama", "num_speculative_tokens": 2}')
    assert draft == SpeculativeConfig("draft_model", 2, "config:tiny-llama")
    assert speculative_config("prompt-lookup", 2) == SpeculativeConfig("ngram", 2)
    assert speculative_config(None, 4) is None


@pytest.mark.parametrize(
    "flags",
    [
        ["--speculative-config", "{method: ngram}"],  # not JSON
        ["--speculative-config", '{"method": "eagle"}'],
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 0}'],
        ["--speculative-config", '{"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2}'],
        ["--speculative-config", '{"method": "ngram", "n": 3}'],
        ["--speculative-config", '{"method": "draft_model"}'],
        ["--speculative-config", LOOKUP_JSON, "--draft-model", "config:tiny-llama"],
    ],
)
def test_bad_speculative_settings_stop_the_parser(flags, capsys):
    with pytest.raises(SystemExit):
        parse_args(BASE + flags)
    assert "speculative" in capsys.readouterr().err.lower()
