"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own.

Gauges are set by the engine thread after every step; histograms observe per-token times measured in
the engine thread (``time.perf_counter``), so they exclude HTTP and client time. The prefix-cache hit
rate is fed from the engine's ``stats()["prefix_hit_rate"]`` when the engine reports one, or by anyone
through ``set_prefix_hit_rate``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "servelab"
# latency buckets (s): dense from 1 ms to 1 s, where decode steps and stalls live, coarse after
TTFT_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS_S = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.5,
)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        self.model_name = model_name
        self.waiting = Gauge(
            f"{PREFIX}_num_requests_waiting", "Requests waiting to be scheduled (queue depth)", registry=r
        )
        self.running = Gauge(f"{PREFIX}_num_requests_running", "Sequences in the running batch", registry=r)
        self.kv_used = Gauge(f"{PREFIX}_kv_blocks_used", "KV cache blocks in use", registry=r)
        self.kv_total = Gauge(f"{PREFIX}_kv_blocks_total", "KV cache blocks in the pool", registry=r)
        self.prefix_hit_rate = Gauge(
            f"{PREFIX}_prefix_cache_hit_rate",
            "Prompt tokens served from the prefix cache / prompt tokens (NaN: no cache)",
            registry=r,
        )
        self.prefix_hit_rate.set(float("nan"))
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Request arrival to its first token, in the engine thread (s)",
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Time between a request's successive tokens, in the engine thread (s)",
            buckets=ITL_BUCKETS_S,
            registry=r,
        )
        self.finished = Counter(
            f"{PREFIX}_requests_finished", "Requests finished, by finish reason", ["finish_reason"], registry=r
        )
        self.rejected = Counter(
            f"{PREFIX}_requests_rejected", "Requests refused, by HTTP status", ["status"], registry=r
        )
        self.steps = Counter(f"{PREFIX}_engine_steps", "Engine steps run", registry=r)
        self.generated = Counter(f"{PREFIX}_generation_tokens", "Tokens generated", registry=r)

    def set_gauges(self, g: dict) -> None:
        """From ``EngineLoop.gauges()``: queue depth, running sequences, KV blocks in use, prefix hit rate."""
        self.waiting.set(g["waiting"])
        self.running.set(g["running"])
        self.kv_used.set(g["kv_used"])
        if g.get("hit_rate") is not None:
            self.set_prefix_hit_rate(g["hit_rate"])

    def set_prefix_hit_rate(self, rate: float) -> None:
        """Prefix-cache hit rate in [0, 1] (cached prompt tokens / prompt tokens)."""
        self.prefix_hit_rate.set(float(rate))

    def render(self) -> bytes:
        return generate_latest(self.registry)
