"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own.

Two families, side by side:

- vLLM's set, named exactly as vLLM names it after the prefix ``servelab:`` (``vllm:num_requests_running``
  is ``servelab:num_requests_running`` here), each with a ``model_name`` label, so a vLLM Grafana dashboard
  works after renaming its prefix. ``VLLM_METRICS`` lists them;
- this project's own names (``servelab_kv_blocks_used``, ``servelab_prefix_cache_hit_rate``, ...), which the
  studies read.

Gauges are set after every engine round. Per-request times are measured where the engine runs, on
``time.perf_counter`` (CLOCK_MONOTONIC, one clock for every process of the machine), from the moment the
HTTP process received the request; they exclude HTTP and client time. The engine thread reports them
through the ``RequestRecorder`` methods below; a ``ServerMetrics`` records them at once, an
``Observations`` keeps them for a trip over the engine process's pipe (``ServerMetrics.replay``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "servelab"  # this project's own names: servelab_<name>
VLLM_PREFIX = "servelab:"  # vLLM's names: servelab:<vLLM's name>
# latency buckets (s): dense from 1 ms to 1 s, where decode steps and stalls live, coarse after
TTFT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)
TTFT_BUCKETS_S += (2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1)
ITL_BUCKETS_S += (0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
# whole-request times (s): vLLM's request_latency_buckets, with the sub-second end refined for small models
REQUEST_BUCKETS_S = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0)
REQUEST_BUCKETS_S += (60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)

# vLLM's metric set (after the prefix), as this server exports it; the README's table and the tests follow it
VLLM_METRICS = {
    "num_requests_running": "gauge",
    "num_requests_waiting": "gauge",
    "kv_cache_usage_perc": "gauge",
    "prompt_tokens": "counter",
    "generation_tokens": "counter",
    "num_preemptions": "counter",
    "request_success": "counter",
    "time_to_first_token_seconds": "histogram",
    "inter_token_latency_seconds": "histogram",
    "request_time_per_output_token_seconds": "histogram",
    "e2e_request_latency_seconds": "histogram",
    "request_queue_time_seconds": "histogram",
    "request_inference_time_seconds": "histogram",
    "request_prefill_time_seconds": "histogram",
    "request_decode_time_seconds": "histogram",
    "request_prompt_tokens": "histogram",
    "request_generation_tokens": "histogram",
}


class Observations:
    """``RequestRecorder`` calls kept as ``(method, args)`` until ``take()``: the engine process ships them
    to the HTTP process with each round's updates, where ``ServerMetrics.replay`` records them."""

    def __init__(self):
        self._calls: list[tuple[str, tuple]] = []

    def take(self) -> list[tuple[str, tuple]]:
        calls, self._calls = self._calls, []
        return calls

    def request_scheduled(self, queue_s: float) -> None:
        self._calls.append(("request_scheduled", (queue_s,)))

    def request_tokens(self, ttft_s: float | None, itl_s: list[float], prompt_tokens: int, n: int) -> None:
        self._calls.append(("request_tokens", (ttft_s, itl_s, prompt_tokens, n)))

    def request_finished(self, times: dict) -> None:
        self._calls.append(("request_finished", (times,)))

    def engine_steps(self, n: int) -> None:
        self._calls.append(("engine_steps", (n,)))


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        self.model_name = model_name
        self._own_metrics(r)
        self._vllm_metrics(r)
        self._preemptions_seen = 0

    def _own_metrics(self, r: CollectorRegistry) -> None:
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
            "Request arrival to its first token, where the engine runs (s)",
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Time between a request's successive tokens, where the engine runs (s)",
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

    def _vllm_metrics(self, r: CollectorRegistry) -> None:
        label = {"model_name": self.model_name}

        def make(kind, name: str, doc: str, **kw):
            assert name in VLLM_METRICS, name  # the exported set is the documented one
            return kind(VLLM_PREFIX + name, doc, ["model_name"], registry=r, **kw).labels(**label)

        self.v_running = make(Gauge, "num_requests_running", "Requests in the running batch")
        self.v_waiting = make(Gauge, "num_requests_waiting", "Requests waiting to be scheduled")
        self.v_kv_usage = make(Gauge, "kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent")
        self.v_prompt_tokens = make(Counter, "prompt_tokens", "Prompt tokens prefilled")
        self.v_generation_tokens = make(Counter, "generation_tokens", "Tokens generated")
        self.v_preemptions = make(Counter, "num_preemptions", "Preemptions by the scheduler")
        self._success = Counter(
            VLLM_PREFIX + "request_success",
            "Requests finished, by finish reason (stop, length, abort)",
            ["model_name", "finished_reason"],
            registry=r,
        )
        hist = {
            "ttft": ("time_to_first_token_seconds", "Time to first token (s)", TTFT_BUCKETS_S),
            "itl": ("inter_token_latency_seconds", "Time between successive tokens (s)", ITL_BUCKETS_S),
            "tpot": ("request_time_per_output_token_seconds", "A request's mean time per output token (s)"),
            "e2e": ("e2e_request_latency_seconds", "Arrival to last token (s)"),
            "queue": ("request_queue_time_seconds", "Time spent waiting to be scheduled (s)"),
            "inference": ("request_inference_time_seconds", "First scheduled to last token (s)"),
            "prefill": ("request_prefill_time_seconds", "First scheduled to first token (s)"),
            "decode": ("request_decode_time_seconds", "First token to last token (s)"),
        }
        self.v_hist = {
            key: make(Histogram, name, doc, buckets=rest[0] if rest else REQUEST_BUCKETS_S)
            for key, (name, doc, *rest) in hist.items()
        }
        self.v_prompt_len = make(Histogram, "request_prompt_tokens", "Prompt tokens", buckets=TOKEN_COUNT_BUCKETS)
        self.v_output_len = make(
            Histogram, "request_generation_tokens", "Generated tokens", buckets=TOKEN_COUNT_BUCKETS
        )

    # ---- the engine's state, after each round ----------------------------------------------------------
    def set_gauges(self, g: dict) -> None:
        """From ``EngineLoop.gauges()``: queue depth, running sequences, KV blocks in use and in the pool,
        cumulative preemptions, prefix hit rate."""
        self.waiting.set(g["waiting"])
        self.v_waiting.set(g["waiting"])
        self.running.set(g["running"])
        self.v_running.set(g["running"])
        self.kv_used.set(g["kv_used"])
        if g.get("kv_total"):
            self.kv_total.set(g["kv_total"])
            self.v_kv_usage.set(g["kv_used"] / g["kv_total"])
        if "preemptions" in g:
            # cumulative in the scheduler; a new scheduler (a policy swapped between runs) starts again at 0
            new = g["preemptions"] - self._preemptions_seen if g["preemptions"] >= self._preemptions_seen else 0
            self._preemptions_seen = g["preemptions"]
            self.v_preemptions.inc(new)
        if g.get("hit_rate") is not None:
            self.set_prefix_hit_rate(g["hit_rate"])

    def set_prefix_hit_rate(self, rate: float) -> None:
        """Prefix-cache hit rate in [0, 1] (cached prompt tokens / prompt tokens)."""
        self.prefix_hit_rate.set(float(rate))

    def count_finished(self, reason: str, n: int = 1) -> None:
        """Requests (choices) that ended with the client-visible ``reason``: stop, length or abort."""
        self.finished.labels(finish_reason=reason).inc(n)
        self._success.labels(model_name=self.model_name, finished_reason=reason).inc(n)

    # ---- RequestRecorder: what the engine thread measures per request ----------------------------------
    def request_scheduled(self, queue_s: float) -> None:
        self.v_hist["queue"].observe(queue_s)

    def request_tokens(self, ttft_s: float | None, itl_s: list[float], prompt_tokens: int, n: int) -> None:
        """``n`` tokens of one request from one round; ``ttft_s`` when the first is among them (then its
        ``prompt_tokens`` were prefilled), and an inter-token gap for each of the others."""
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
            self.v_hist["ttft"].observe(ttft_s)
            self.v_prompt_tokens.inc(prompt_tokens)
        for gap in itl_s:
            self.itl.observe(gap)
            self.v_hist["itl"].observe(gap)
        self.generated.inc(n)
        self.v_generation_tokens.inc(n)

    def request_finished(self, times: dict) -> None:
        """A request's whole-life times (s: e2e, inference, prefill, decode, tpot; None where they do not
        apply) and its ``prompt_tokens`` and ``generation_tokens`` (``RequestTimer.finished`` builds it)."""
        for key in ("e2e", "inference", "prefill", "decode", "tpot"):
            if times.get(key) is not None:
                self.v_hist[key].observe(times[key])
        self.v_prompt_len.observe(times["prompt_tokens"])
        self.v_output_len.observe(times["generation_tokens"])

    def engine_steps(self, n: int) -> None:
        self.steps.inc(n)

    def replay(self, calls: list[tuple[str, tuple]]) -> None:
        """Record what an ``Observations`` kept (in the engine process)."""
        for name, args in calls:
            getattr(self, name)(*args)

    def render(self) -> bytes:
        return generate_latest(self.registry)
