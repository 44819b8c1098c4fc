"""Starting and stopping as a vLLM user would: ``--help`` without torch, vLLM's common flags, a busy port found
before the model loads, ``--seed`` as the sampling seed, and the README's two-signal shutdown (503 with
``Retry-After`` during the drain, an error event on every open stream after the second, no tracebacks)."""

import asyncio
import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from servelab.engine import SamplingParams
from servelab.engine.policies import POLICIES
from servelab.server import ServerProcess
from servelab.server.flags import POLICY_NAMES, build_parser, engine_from_args, parse_args, resolve_device_dtype
from servelab.server.launch import LIB_DIR
from servelab.server.tokenizer import load_codec

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(LIB_DIR), os.environ.get("PYTHONPATH", "")]))


def test_help_imports_neither_torch_nor_the_web_stack():
    code = (
        "import sys\nfrom servelab.server.cli import console_main\n"
        "try:\n    console_main(['serve', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'fastapi', 'uvicorn', 'transformers'})\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert "--max-queue" in out.stdout and "HEAVY []" in out.stdout, out.stdout[-500:] + out.stderr[-2000:]
    assert "(default: 4096)" in " ".join(out.stdout.split())


def test_policy_names_match_the_engine():
    assert tuple(sorted(POLICIES)) == POLICY_NAMES


@pytest.mark.parametrize(
    "argv, why",
    [
        (["--pipeline-parallel-size", "2"], "only 1 is supported"),
        (["-tp", "0"], "must be a positive integer"),
        (["-tp", "2", "--speculative-config", '{"method": "ngram"}'], "speculative decoding runs on one device"),
        (["-tp", "2", "--data-parallel-size", "2"], "replicas run on one device each"),
        (["--kv-cache-dtype", "fp8"], "only 'auto' is supported"),
        (["--dtype", "int8"], "invalid choice"),
    ],
)
def test_flags_this_server_cannot_honour_are_refused_clearly(argv, why, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and why in capsys.readouterr().err


def test_vllm_flags_are_accepted():
    args = parse_args(
        ["config:tiny-llama", "--trust-remote-code", "--tensor-parallel-size", "1", "--chat-template", "t.jinja",
         "--tokenizer", "some/tokenizer", "--disable-log-requests", "--uvicorn-log-level", "warning",
         "--kv-cache-dtype", "auto", "--generation-config", "vllm", "--dtype", "half", "--seed", "7"]
    )  # fmt: skip
    assert args.trust_remote_code and args.tokenizer == "some/tokenizer" and args.uvicorn_log_level == "warning"
    assert resolve_device_dtype(args) == (resolve_device_dtype(args)[0], "float16")
    assert resolve_device_dtype(parse_args(["--dtype", "float", "--device", "cpu"])) == ("cpu", "float32")
    helptext = build_parser().format_help()
    flags = "--trust-remote-code --tensor-parallel-size --chat-template --tokenizer --disable-log-requests"
    for flag in (flags + " --uvicorn-log-level --kv-cache-dtype --generation-config").split():
        assert flag in helptext


def test_chat_template_gives_a_byte_tokenizer_chat(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>")
    codec, _ = load_codec("config:tiny-llama", [0, 1, 2], 512, chat_template=str(path))
    assert codec.decode(codec.chat_prompt([{"role": "user", "content": "hi"}])) == "<user>hi<assistant>"
    inline, _ = load_codec("config:tiny-llama", [0, 1, 2], 512, chat_template="{{ messages[0]['content'] }}!")
    assert inline.decode(inline.chat_prompt([{"role": "user", "content": "yo"}])) == "yo!"


def test_seed_is_the_sampling_seed_of_unseeded_requests():
    def run(seed: int) -> list[int]:
        args = parse_args(["config:tiny-llama", "--device", "cpu", "--num-blocks", "64", "--seed", str(seed)])
        engine = engine_from_args(args)
        return engine.generate([[5, 6, 7]], SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True))[0]

    first = run(3)
    assert run(3) == first
    assert run(4) != first


def test_a_busy_port_is_found_before_the_model_loads():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "servelab.server", "--port", str(port), "--model", "config:tiny-llama"]
        out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 1 and "Address already in use" in out.stderr, out.stderr[-2000:]
    assert "engine:" not in out.stderr and "Traceback" not in out.stderr  # it stopped before loading anything


async def _stream(client: httpx.AsyncClient):
    body = {"prompt": [5, 6, 7], "max_tokens": 3000, "stream": True, "ignore_eos": True}
    lines = []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line:
                lines.append(line)
    return lines


def test_drain_answers_503_and_a_second_signal_ends_streams_with_an_error_event():
    args = ["--num-blocks", "1024", "--max-num-seqs", "4", "--drain-timeout", "120"]
    srv = ServerProcess("config:tiny-llama", extra_args=args, startup_timeout_s=300).start()
    try:

        async def scenario():
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as c:
                streams = [asyncio.create_task(_stream(c)) for _ in range(3)]
                await asyncio.sleep(2.0)
                srv.proc.send_signal(signal.SIGINT)  # drain: the streams go on, newcomers get 503
                await asyncio.sleep(1.0)
                refused = await c.post("/v1/completions", json={"prompt": [1], "max_tokens": 2})
                assert not any(t.done() for t in streams)
                srv.proc.send_signal(signal.SIGINT)  # stop now
                return refused, await asyncio.gather(*streams)

        refused, streams = asyncio.run(scenario())
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "shutting_down"
        for lines in streams:
            assert lines[-1] == "data: [DONE]" and '"error"' in lines[-2], lines[-3:]
        assert srv.proc.wait(60) == 0
    finally:
        srv.stop()
    log = srv.log(400)
    assert "Traceback" not in log and "CancelledError" not in log, log
