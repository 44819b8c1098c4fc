"""Two runs of one trace side by side (``python -m servelab.loadgen.compare``).

Every row of the comparison is the summaries' own number, with B's as a multiple of A's; summaries from
``summarize_metrics`` (the load generator's) carry every key it reads; runs of different traces are refused,
and the command line exits 2 for them or for a file that is not a summary.
"""

import json

import pandas as pd
import pytest

from servelab.errors import ParameterError
from servelab.loadgen.compare import ROWS, format_comparison, main
from servelab.loadgen.metrics import summarize_metrics


def summary(scale: float, requests: int = 4) -> dict:
    """A run of ``requests`` requests of 10 prompt tokens whose latencies are ``scale`` times the first run's."""
    metrics = pd.DataFrame(
        {
            "ok": [True] * requests,
            "prompt_tokens": [10] * requests,
            "output_tokens": [5] * requests,
            "ttft_ms": [20.0 * scale * (i + 1) for i in range(requests)],
            "tpot_ms": [4.0 * scale] * requests,
            "e2e_ms": [36.0 * scale * (i + 1) for i in range(requests)],
            "max_itl_ms": [6.0 * scale] * requests,
        }
    )
    return summarize_metrics(metrics, [4.0 * scale] * (4 * requests), duration_s=2.0 * scale)


def test_each_row_gives_both_runs_and_b_over_a():
    a, b = summary(1.0), summary(0.5)
    text = format_comparison(a, b, labels=("plain", "speculative"))
    lines = {line.split(":")[0]: line for line in text.splitlines()[2:]}
    assert len(lines) == len(ROWS)
    assert "plain" in text.splitlines()[0] and "speculative" in text.splitlines()[0]
    assert lines["Mean ITL (ms)"].split()[-3:] == ["4.00", "2.00", "0.500"]
    assert lines["Output token throughput (tok/s)"].split()[-1] == "2.000"  # the same tokens in half the time
    assert lines["Failed requests"].split()[-1] == "-"  # none failed in A: no ratio


def test_runs_of_different_traces_are_refused():
    with pytest.raises(ParameterError, match="4 requests against 5"):
        format_comparison(summary(1.0), summary(1.0, requests=5))
    other = summary(1.0) | {"total_input_tokens": 41}
    with pytest.raises(ParameterError, match="total_input_tokens 40 against 41"):
        format_comparison(summary(1.0), other)


def test_the_command_line_prints_the_table_and_exits_2_for_what_does_not_compare(tmp_path, capsys):
    paths = []
    for name, s in (("a", summary(1.0)), ("b", summary(2.0)), ("c", summary(1.0, requests=5))):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(s))
    assert main([str(paths[0]), str(paths[1])]) == 0
    assert "Median TTFT (ms):" in capsys.readouterr().out
    assert main([str(paths[0]), str(paths[2])]) == 2
    assert "not one trace" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert main([str(paths[0]), str(tmp_path / "bad.json")]) == 2
