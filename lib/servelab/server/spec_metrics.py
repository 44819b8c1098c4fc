"""vLLM's speculative-decoding counters for ``/metrics``, fed by the engine's ``SpecDecodeStats`` totals.

vLLM (v1) exports, per model:

    vllm:spec_decode_num_drafts_total                        requests that proposed in a step, summed over steps
    vllm:spec_decode_num_draft_tokens_total                  draft tokens proposed
    vllm:spec_decode_num_accepted_tokens_total               draft tokens the target kept
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="j"}   drafts at position j (0-based) kept

Dashboards derive the acceptance rate (accepted / draft tokens), the mean acceptance length (1 + accepted / drafts)
and the acceptance at each position from them; the load generator does (``loadgen.spec_acceptance``).

The engine keeps running totals (``speculative.stats.SpecDecodeStats``); they reach the HTTP process as a snapshot
with each round's gauges, as the preemption count does, and ``update`` advances each counter by what the snapshot
adds. Staged (issue 30): ``ServerMetrics`` takes these counters when the speculative mode joins ``EngineConfig``
after the evidence campaign (``server/metrics.py`` is in Studies 1 and 7's measuring path until then).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from servelab.errors import ParameterError

TOTALS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


class SpecDecodeCounters:
    def __init__(self, registry: CollectorRegistry, model_name: str, num_spec_tokens: int):
        if num_spec_tokens < 1:
            raise ParameterError(f"num_spec_tokens must be >= 1, got {num_spec_tokens}")
        self.num_spec_tokens = num_spec_tokens
        labels = {"model_name": model_name}
        docs = {
            "num_drafts": "Number of spec decoding drafts.",
            "num_draft_tokens": "Number of draft tokens.",
            "num_accepted_tokens": "Number of accepted tokens.",
        }
        self.totals = {
            key: Counter(f"vllm:spec_decode_{key}", doc, list(labels), registry=registry).labels(**labels)
            for key, doc in docs.items()
        }
        per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [*labels, "position"],
            registry=registry,
        )
        self.per_position = [per_pos.labels(**labels, position=str(j)) for j in range(num_spec_tokens)]
        self._seen = {key: 0 for key in TOTALS} | {"per_position": [0] * num_spec_tokens}

    def update(self, stats: dict) -> None:
        """``stats``: the engine's running totals (``dataclasses.asdict(SpecDecodeStats)``). Each counter advances
        by what they add since the last snapshot; when the drafts went down (a new engine, counting from 0 again),
        all of the snapshot is new, and no counter moves back."""
        if len(stats["per_position"]) != self.num_spec_tokens:
            raise ParameterError(
                f"{len(stats['per_position'])} positions counted, the counters have {self.num_spec_tokens}"
            )
        seen = self._seen
        if stats["num_drafts"] < seen["num_drafts"]:  # a new engine: all its totals are new
            seen = {key: 0 for key in TOTALS} | {"per_position": [0] * self.num_spec_tokens}
        for key in TOTALS:
            self.totals[key].inc(stats[key] - seen[key])
        for j, (now, before) in enumerate(zip(stats["per_position"], seen["per_position"], strict=True)):
            self.per_position[j].inc(now - before)
        self._seen = {key: stats[key] for key in TOTALS} | {"per_position": list(stats["per_position"])}
