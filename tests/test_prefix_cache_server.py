"""Prefix caching in the HTTP server: ``--prefix-caching`` builds a caching engine, the warm-up request does not
count, and ``/metrics`` exports the hit rate (tiny model, CPU)."""

import time

import httpx
import pytest

from servelab.server.cli import engine_config_from_args, engine_from_args, parse_args
from servelab.server.launch import ServerThread
from servelab.studies.s07_prefix_cache.serving import HIT_RATE_GAUGE, read_gauge

ARGS = [
    "--model",
    "config:tiny-llama",
    "--device",
    "cpu",
    "--num-blocks",
    "256",
    "--max-num-seqs",
    "8",
    "--max-num-batched-tokens",
    "512",
]


def test_flags_reach_the_engine_config():
    off = engine_config_from_args(parse_args(ARGS))
    on = engine_config_from_args(parse_args(ARGS + ["--prefix-caching", "--prefix-eviction", "lfu"]))
    assert (off.prefix_caching, on.prefix_caching, on.prefix_eviction) == (False, True, "lfu")
    with pytest.raises(SystemExit):
        parse_args(ARGS + ["--prefix-eviction", "fifo"])


def test_metrics_export_the_hit_rate_of_a_caching_server():
    engine = engine_from_args(parse_args(ARGS + ["--prefix-caching"]))
    assert engine.stats()["prefix_queried_tokens"] == 0  # the warm-up request is not counted
    body = {"prompt": list(range(10, 90)), "max_tokens": 2, "temperature": 0}
    with ServerThread(engine) as srv:
        first = httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=60).json()
        time.sleep(0.7)  # the engine loop refreshes the gauge at most every 0.5 s
        second = httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=60).json()
        gauge = read_gauge(srv.base_url, HIT_RATE_GAUGE)
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    assert engine.stats()["prefix_hit_tokens"] == 64  # (80 - 1) // 16 blocks of the second prompt
    assert gauge == pytest.approx(64 / 160)
