"""The streaming client and ``run_load`` against a small fake SSE server whose token timing is known;
the CLI end to end. (The real server is exercised by notebook 01's smoke profile and test_scheduling_*.)"""

import asyncio
import json
import threading
import time

import pandas as pd
import pytest
from aiohttp import web

from servelab.errors import ParameterError
from servelab.loadgen.__main__ import main
from servelab.loadgen.lengths import FixedLengths, UniformLengths
from servelab.loadgen.metrics import summarize
from servelab.loadgen.report import parse_report
from servelab.loadgen.run import DEADLINE_ERROR, run_load
from servelab.loadgen.workload import Trace

TOKEN_GAP_S = 0.02
FIRST_TOKEN_S = 0.05


class FakeServer:
    """OpenAI-style streaming completions: first token after 50 ms, then one every 20 ms; a prompt that
    starts with id 99 gets HTTP 400; ``seen`` keeps the request bodies. With ``max_model_len`` it lists its model
    with that context in ``/v1/models`` (as vLLM does); with ``tokenize`` it counts a text prompt's tokens at
    ``/tokenize`` as its number of words; with ``metrics`` (``observe(body)`` per completion, ``render()`` for the
    text) it serves ``/metrics``."""

    def __init__(self, max_model_len=None, tokenize=False, metrics=None):
        self.max_model_len, self.tokenize, self.metrics = max_model_len, tokenize, metrics
        self.seen, self.cancelled = [], 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    async def completions(self, request):
        body = await request.json()
        self.seen.append(body)
        if self.metrics is not None:
            self.metrics.observe(body)
        if isinstance(body["prompt"], list) and body["prompt"][0] == 99:
            return web.json_response({"error": {"message": "bad prompt", "type": "invalid_request_error"}}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await asyncio.sleep(FIRST_TOKEN_S)
            n = body["max_tokens"]
            for i in range(n):
                if i:
                    await asyncio.sleep(TOKEN_GAP_S)
                choice = {
                    "index": 0,
                    "text": "" if i == 1 else "x",
                    "token_ids": [7],
                    "finish_reason": "length" if i == n - 1 else None,
                }
                await resp.write(f"data: {json.dumps({'choices': [choice], 'usage': None})}\n\n".encode())
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': n}})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            raise
        return resp

    async def models(self, request):
        return web.json_response(
            {"object": "list", "data": [{"id": "fake", "object": "model", "max_model_len": self.max_model_len}]}
        )

    async def count(self, request):
        body = await request.json()
        n = len(body["prompt"].split())
        return web.json_response({"count": n, "tokens": list(range(n)), "max_model_len": self.max_model_len})

    def _run(self):
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        if self.max_model_len is not None:
            app.router.add_get("/v1/models", self.models)
        if self.tokenize:
            app.router.add_post("/tokenize", self.count)
        if self.metrics is not None:
            app.router.add_get("/metrics", lambda request: web.Response(body=self.metrics.render()))
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self):
        self.thread.start()
        self.ready.wait(10)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def small_trace(n=6, rate=50.0, out=5):
    return Trace.synthetic(rate=rate, lengths=FixedLengths(8, out), n=n, seed=0).with_prompt_ids(90, seed=0)


def test_run_load_times_every_token_and_sends_on_schedule():
    fake = FakeServer()
    trace = small_trace()
    with fake as url:
        rec = run_load(url, trace)
    assert rec["ok"].all() and (rec["output_tokens"] == 5).all()
    assert all(len(t) == 5 for t in rec["token_times_s"])  # the empty-text token counted too
    lag = rec["sent_s"] - rec["arrival_s"]
    assert (lag >= 0).all() and lag.max() < 0.25  # open loop: sent at the trace's times
    s = summarize(rec)
    # never earlier than the server sends; later only by scheduling noise (loose: CI boxes are busy)
    assert FIRST_TOKEN_S * 1e3 - 1 <= s["ttft_p50_ms"] < FIRST_TOKEN_S * 1e3 + 150
    assert TOKEN_GAP_S * 1e3 - 2 <= s["itl_p50_ms"] < TOKEN_GAP_S * 1e3 + 60
    assert TOKEN_GAP_S * 1e3 - 2 <= s["tpot_p50_ms"] < TOKEN_GAP_S * 1e3 + 60
    body = fake.seen[0]
    assert body["stream"] and body["ignore_eos"] and body["max_tokens"] == 5
    assert body["prompt"] in [list(map(int, p)) for p in trace.frame["prompt_ids"]]
    assert rec.attrs["t0_perf_s"] < time.perf_counter()


def test_http_errors_are_recorded_not_raised():
    trace = small_trace(n=3)
    df = trace.frame.copy()
    df.at[1, "prompt_ids"] = [99] + df.at[1, "prompt_ids"][1:]
    with FakeServer() as url:
        rec = run_load(url, Trace(df))
    assert rec["ok"].tolist() == [True, False, True]
    assert "HTTP 400" in rec.loc[1, "error"] and "bad prompt" in rec.loc[1, "error"]
    assert summarize(rec)["failed"] == 1


def test_text_prompts_are_sent_as_text():
    fake = FakeServer()
    df = Trace.synthetic(rate=100, lengths=FixedLengths(3, 2), n=2).frame.assign(prompt=["hello there", "bye"])
    with fake as url:
        rec = run_load(url, Trace(df))
    assert rec["ok"].all()
    assert sorted(b["prompt"] for b in fake.seen) == ["bye", "hello there"]


def test_deadline_cuts_long_requests_and_keeps_their_tokens():
    fake = FakeServer()
    trace = Trace.synthetic(rate=float("inf"), lengths=FixedLengths(4, 200), n=3).with_prompt_ids(50)
    with fake as url:
        t = time.perf_counter()
        rec = run_load(url, trace, deadline_s=0.3)
        assert time.perf_counter() - t < 5.0  # far less than 200 tokens × 20 ms
    assert not rec["ok"].any() and (rec["error"] == DEADLINE_ERROR).all()
    assert (rec["output_tokens"] > 3).all() and (rec["output_tokens"] < 200).all()
    assert (rec["target_output_tokens"] == 200).all()  # what the trace asked, for a replay


def test_unreachable_server_and_bad_arguments():
    rec = run_load("http://127.0.0.1:9", small_trace(n=2))  # nothing listens on port 9
    assert not rec["ok"].any() and rec["error"].str.contains("Connect").all()
    with pytest.raises(ParameterError, match="prompt_ids nor prompt text"):
        run_load("http://127.0.0.1:9", Trace.synthetic(rate=1, lengths=FixedLengths(4, 2), n=1))
    with pytest.raises(ParameterError, match="base_url"):
        run_load("127.0.0.1:9", small_trace(n=1))


def test_cli_writes_records_and_trace(tmp_path, capsys):
    out, tr, summ = tmp_path / "r.csv", tmp_path / "t.jsonl", tmp_path / "s.json"
    with FakeServer() as url:
        rc = main(
            [
                "--base-url",
                url,
                "--rate",
                "40",
                "--num-requests",
                "4",
                "--lengths",
                "fixed",
                "--prompt-tokens",
                "6",
                "--output-tokens",
                "3",
                "--out",
                str(out),
                "--save-trace",
                str(tr),
                "--summary-out",
                str(summ),
                "--slo-ttft-ms",
                "1000",
                "--no-progress",
            ]
        )
        assert rc == 0
        rc2 = main(["--base-url", url, "--trace", str(tr), "--no-progress"])  # replay the saved trace
        assert rc2 == 0
    rec = pd.read_csv(out)
    assert len(rec) == 4 and rec["ok"].all() and (rec["output_tokens"] == 3).all()
    assert json.loads(summ.read_text())["goodput_req_s"] > 0
    assert len(Trace.read_jsonl(tr)) == 4
    out = capsys.readouterr().out
    assert "============ Serving Benchmark Result ============" in out
    rows = parse_report(out)
    assert rows["Successful requests:"] == 4 and rows["Failed requests:"] == 0
    assert rows["Total input tokens:"] == 24 and rows["Total generated tokens:"] == 12
    assert "Request goodput (req/s):" in rows and "P99 TTFT (ms):" in rows
    assert main(["--base-url", "http://127.0.0.1:9", "--no-progress"]) == 2  # neither --trace nor --rate


def test_cli_fits_the_workload_to_the_servers_context(tmp_path, capsys):
    saved = tmp_path / "t.jsonl"
    args = ["--rate", "inf", "--num-requests", "12", "--lengths", "uniform", "--prompt-range", "20", "60"]
    args += ["--output-range", "2", "4", "--no-progress", "--save-trace", str(saved)]
    want = Trace.synthetic(rate=float("inf"), lengths=UniformLengths(20, 60, 2, 4), n=12, seed=0).frame
    over = int((want["prompt_tokens"] + want["output_tokens"] > 40).sum())
    assert 0 < over < 12
    fake = FakeServer(max_model_len=40)
    with fake as url:
        assert main(["--base-url", url, *args]) == 0
    err = capsys.readouterr().err
    assert "server's max_model_len (from /v1/models): 40" in err
    assert f"{over} of 12 prompts clipped to fit 40 tokens" in err
    assert all(len(b["prompt"]) + b["max_tokens"] <= 40 for b in fake.seen) and len(fake.seen) == 12
    fitted = Trace.read_jsonl(saved).frame
    assert (fitted["output_tokens"].to_numpy() == want["output_tokens"].to_numpy()).all()  # outputs kept
    # a server that does not report it: the flag; neither: no fitting
    fake = FakeServer()
    with fake as url:
        assert main(["--base-url", url, *args, "--max-model-len", "30"]) == 0
        assert "fitting to --max-model-len 30" in capsys.readouterr().err
        assert all(len(b["prompt"]) + b["max_tokens"] <= 30 for b in fake.seen)
        assert main(["--base-url", url, *args]) == 0
        assert "prompts not fitted" in capsys.readouterr().err
    assert max(len(b["prompt"]) + b["max_tokens"] for b in fake.seen[-12:]) > 40


def test_cli_dataset_of_text_and_of_ids(tmp_path, capsys):
    text = tmp_path / "text.jsonl"
    text.write_text(
        "\n".join(json.dumps({"prompt": p, "output_len": 3}) for p in ["one two three", "four five", "six"]) + "\n"
    )
    fake = FakeServer(tokenize=True)
    with fake as url:
        out = tmp_path / "r.csv"
        assert (
            main(["--base-url", url, "--dataset", str(text), "--rate", "50", "--no-progress", "--out", str(out)]) == 0
        )
    rec = pd.read_csv(out)
    assert rec["prompt_tokens"].tolist() == [3, 2, 1]  # counted by the server's /tokenize
    assert sorted(b["prompt"] for b in fake.seen) == ["four five", "one two three", "six"]
    assert parse_report(capsys.readouterr().out)["Total input tokens:"] == 6
    # without /tokenize, text prompts need their lengths in the file
    with FakeServer() as url:
        assert main(["--base-url", url, "--dataset", str(text), "--rate", "50", "--no-progress"]) == 2
        assert "/tokenize" in capsys.readouterr().err
    ids = tmp_path / "ids.jsonl"
    ids.write_text("\n".join(json.dumps({"prompt_ids": [5, 6, 7 + i], "output_tokens": 2}) for i in range(3)))
    fake = FakeServer()
    with fake as url:
        assert (
            main(["--base-url", url, "--dataset", str(ids), "--rate", "50", "--num-prompts", "5", "--no-progress"]) == 0
        )
    assert sorted(b["prompt"][2] for b in fake.seen) == [7, 7, 8, 8, 9]  # rows reused in order
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "hi"}))
    assert main(["--base-url", "http://127.0.0.1:9", "--dataset", str(bad), "--rate", "1", "--no-progress"]) == 2
    assert "bad.jsonl:1: needs an output length" in capsys.readouterr().err


def test_cli_exit_status_follows_the_failure_rate(tmp_path, capsys):
    ds = tmp_path / "ds.jsonl"
    # one prompt in four starts with id 99: the fake server answers it 400
    ds.write_text("\n".join(json.dumps({"prompt_ids": [99 if i == 0 else 5, 6], "output_len": 2}) for i in range(4)))
    args = ["--dataset", str(ds), "--rate", "100", "--no-progress"]
    with FakeServer() as url:
        assert main(["--base-url", url, *args]) == 1  # 25 % failed, over the default 1 %
        captured = capsys.readouterr()
        assert "1 of 4 requests failed (25.0%), over --max-failure-rate 0.01" in captured.err
        assert parse_report(captured.out)["Failed requests:"] == 1
        assert main(["--base-url", url, *args, "--max-failure-rate", "0.25"]) == 0
        assert main(["--base-url", url, *args, "--max-failure-rate", "2"]) == 2
    assert main(["--base-url", "http://127.0.0.1:9", *args]) == 1  # nothing completed
    assert "no request completed" in capsys.readouterr().err


def test_the_records_cut_exactly_at_the_deadline_however_late_the_client_cancelled():
    """The client cancels when its event loop reaches the deadline, which a busy loop reaches late: the records
    drop every token after the deadline and count a request that finished after it as cut, with the tokens it had."""
    from servelab.loadgen.client import StreamResult
    from servelab.loadgen.run import records_from_results

    trace = Trace.synthetic(rate=float("inf"), lengths=FixedLengths(4, 5), n=4).with_prompt_ids(50)
    t0 = 100.0
    results = [
        StreamResult(sent=t0, token_times=[t0 + x for x in (0.1, 0.2, 0.3)], finish=t0 + 0.3, ok=True),  # in time
        StreamResult(sent=t0, token_times=[t0 + x for x in (0.4, 0.9, 1.05)], finish=t0 + 1.05, ok=True),  # late
        StreamResult(sent=t0 + 0.5, token_times=[t0 + 1.02], finish=float("nan"), ok=False),  # first token late
        StreamResult(sent=t0, error="HTTP 500: boom"),  # an error keeps its own message
    ]
    rec = records_from_results(trace, results, t0, deadline_s=1.0)
    assert rec["ok"].tolist() == [True, False, False, False]
    assert rec["output_tokens"].tolist() == [3, 2, 0, 0]
    assert rec["error"].tolist()[1:] == [DEADLINE_ERROR, DEADLINE_ERROR, "HTTP 500: boom"]
    assert rec["finish_s"].iloc[1] == pytest.approx(0.9) and pd.isna(rec["first_token_s"].iloc[2])
    assert max(max(t) for t in rec["token_times_s"] if t) <= 1.0
    # without a deadline nothing is cut
    assert records_from_results(trace, results, t0)["ok"].tolist() == [True, True, False, False]
