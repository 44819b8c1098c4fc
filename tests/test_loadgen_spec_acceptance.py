"""Speculative acceptance from the server to the load generator's report.

- ``server.spec_metrics.SpecDecodeCounters`` exports an engine's ``SpecDecodeStats`` totals under vLLM's names, and
  advances them by what each snapshot adds (a new engine's totals start again without moving a counter back);
- ``loadgen.spec_acceptance`` reads them back from ``/metrics`` text and gives what a run added: the acceptance rate,
  length and per-position rates equal the engine's own, for a real speculative engine's run;
- the load generator's CLI reports them in ``vllm bench serve``'s speculative section, and writes them to the
  summary, against a server that counts; a plain server's report has no such section; ``compare`` puts the
  acceptance beside the latencies.
"""

from dataclasses import asdict

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from test_loadgen_client import FakeServer

from servelab.errors import ParameterError
from servelab.loadgen.__main__ import main
from servelab.loadgen.compare import format_comparison
from servelab.loadgen.report import parse_report, spec_lines
from servelab.loadgen.spec_acceptance import acceptance, spec_counters
from servelab.server.spec_metrics import SpecDecodeCounters
from servelab.speculative.stats import SpecDecodeStats


def counters(gamma=3):
    registry = CollectorRegistry()
    return registry, SpecDecodeCounters(registry, "m", gamma)


def text(registry) -> str:
    return generate_latest(registry).decode()


def test_the_counters_have_vllms_names_and_follow_the_engines_totals():
    registry, c = counters()
    stats = SpecDecodeStats(3)
    stats.observe([3, 3, 2], [4, 1, 2])  # kept 3, 0, 1
    c.update(asdict(stats))
    body = text(registry)
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert f'vllm:spec_decode_{name}_total{{model_name="m"}}' in body
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 2.0' in body
    assert spec_counters(body) == {"drafts": 3, "draft_tokens": 8, "accepted_tokens": 4, "per_position": [2, 1, 1]}
    stats.observe([1], [2])
    c.update(asdict(stats))
    c.update(asdict(stats))  # the same snapshot again adds nothing
    assert spec_counters(text(registry))["drafts"] == 4
    fresh = SpecDecodeStats(3)  # a new engine counts from 0: the counters keep what they had and go on
    fresh.observe([2], [3])
    c.update(asdict(fresh))
    assert spec_counters(text(registry)) == {
        "drafts": 5,
        "draft_tokens": 11,
        "accepted_tokens": 7,
        "per_position": [4, 2, 1],
    }
    with pytest.raises(ParameterError):
        c.update(asdict(SpecDecodeStats(2)))
    with pytest.raises(ParameterError):
        counters(gamma=0)


def test_a_runs_acceptance_is_what_it_added_between_two_scrapes():
    registry, c = counters(gamma=2)
    stats = SpecDecodeStats(2)
    stats.observe([2] * 10, [3] * 10)  # before the run: every draft kept
    c.update(asdict(stats))
    before = text(registry)
    stats.observe([2, 2, 2, 2], [1, 2, 3, 1])  # the run: 4 drafts, 3 of 8 tokens kept
    c.update(asdict(stats))
    got = acceptance(before, text(registry))
    assert got == {
        "drafts": 4,
        "draft_tokens": 8,
        "accepted_tokens": 3,
        "acceptance_rate": 3 / 8,
        "acceptance_length": 1 + 3 / 4,
        "per_position": [2 / 4, 1 / 4],
    }
    assert acceptance(None, text(registry)) is None
    assert acceptance("# no counters here\n", text(registry)) is None
    assert acceptance(before, before)["acceptance_rate"] is None  # nothing drafted in between


def test_a_speculative_engines_run_reads_back_as_its_own_acceptance():
    import torch
    from hf_reference import varied

    from servelab.engine import EngineConfig, SamplingParams
    from servelab.engine.speculative_engine import SpeculativeEngine
    from servelab.speculative.config import SpeculativeConfig

    hf = varied("tiny-llama")
    motif = torch.randint(3, 500, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    cfg = EngineConfig(block_size=4, num_blocks=128, max_model_len=256)
    e = SpeculativeEngine.from_hf(hf, cfg, speculative=SpeculativeConfig("ngram", 3, None, 3, 1))
    registry, c = counters(gamma=3)
    before = text(registry)
    e.generate([motif * 3, motif[:5] * 4], SamplingParams(max_tokens=24, ignore_eos=True))
    c.update(asdict(e.spec_stats))
    got = acceptance(before, text(registry))
    s = e.spec_stats
    assert s.num_drafts > 0
    assert got["acceptance_rate"] == pytest.approx(s.acceptance_rate)
    assert got["acceptance_length"] == pytest.approx(s.mean_acceptance_length)
    assert got["per_position"] == pytest.approx([k / s.num_drafts for k in s.per_position])


class CountingMetrics:
    """A speculating server's ``/metrics``: each completion adds 2 drafts of 3 tokens, 4 kept (3 + 1)."""

    def __init__(self):
        self.registry, self.counters = counters()
        self.stats = SpecDecodeStats(3)

    def observe(self, body):
        self.stats.observe([3, 3], [4, 2])
        self.counters.update(asdict(self.stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)


ARGS = ["--rate", "40", "--num-requests", "4", "--lengths", "fixed", "--prompt-tokens", "6"]
ARGS += ["--output-tokens", "3", "--no-progress"]


def test_the_load_generator_reports_a_speculating_servers_acceptance(tmp_path, capsys):
    import json

    summary = tmp_path / "spec.json"
    metrics = CountingMetrics()
    metrics.observe({})  # traffic before the run is not the run's
    with FakeServer(metrics=metrics) as url:
        assert main(["--base-url", url, *ARGS, "--summary-out", str(summary)]) == 0
    out = capsys.readouterr().out
    assert "---------------Speculative Decoding---------------" in out
    rows = parse_report(out)
    assert rows["Drafts:"] == 8 and rows["Draft tokens:"] == 24 and rows["Accepted tokens:"] == 16
    assert rows["Acceptance rate (%):"] == pytest.approx(100 * 16 / 24, abs=0.01)
    assert rows["Acceptance length:"] == pytest.approx(3.0)
    assert rows["Position 0:"] == 100 and rows["Position 2:"] == 50
    spec = json.loads(summary.read_text())

    plain = tmp_path / "plain.json"
    with FakeServer() as url:  # no /metrics: no section, nothing in the summary
        assert main(["--base-url", url, *ARGS, "--summary-out", str(plain)]) == 0
    assert "Speculative Decoding" not in capsys.readouterr().out
    base = json.loads(plain.read_text())
    assert "spec_decode" not in base
    table = format_comparison(base, spec)
    line = next(x for x in table.splitlines() if x.startswith("Acceptance rate:"))
    assert line.split()[2:4] == ["nan", "0.667"]


def test_the_report_section_prints_nan_where_nothing_was_drafted():
    spec = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "acceptance_rate": None}
    rows = parse_report("\n".join(spec_lines(spec | {"acceptance_length": None, "per_position": []})))
    assert rows["Drafts:"] == 0
    assert rows["Acceptance rate (%):"] != rows["Acceptance rate (%):"]  # nan
