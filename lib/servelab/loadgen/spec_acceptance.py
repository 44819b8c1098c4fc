"""A run's speculative-decoding acceptance, from the server's ``/metrics`` before and after it.

A speculating server (vLLM, or the servelab server with ``--speculative-config``) counts its drafts in vLLM's
counters (``server.spec_metrics`` lists them). The load generator scrapes ``/metrics`` before and after the run and
reports what the run added, as ``vllm bench serve`` does:

- acceptance rate: accepted draft tokens / draft tokens;
- acceptance length: tokens a speculating request emits per step, 1 + accepted / drafts;
- per position: drafts at position j kept / drafts.

A server without the counters (plain decoding, or one that exports no metrics) gives None, and the report has no
speculative section. The counters are server-wide: a run that shares its server with other traffic counts that too.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "vllm:spec_decode_"
TOTALS = {"num_drafts": "drafts", "num_draft_tokens": "draft_tokens", "num_accepted_tokens": "accepted_tokens"}
PER_POSITION = "num_accepted_tokens_per_pos"


def scrape(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> str | None:
    """The server's ``/metrics`` text; None when it has none or cannot be reached."""
    req = urllib.request.Request(base_url.rstrip("/") + "/metrics")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.read().decode()
    except (urllib.error.URLError, OSError, UnicodeDecodeError):
        return None


def spec_counters(text: str | None) -> dict | None:
    """The four counters' totals (summed over models) from a ``/metrics`` text: ``drafts``, ``draft_tokens``,
    ``accepted_tokens`` and ``per_position`` (a list, position 0 first); None when the text has none of them."""
    if not text:
        return None
    out: dict = {}
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        key = family.name.removeprefix(PREFIX)
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue  # the parser also yields each counter's _created time
            if key == PER_POSITION:
                j = int(sample.labels["position"])
                per_pos[j] = per_pos.get(j, 0.0) + sample.value
            elif key in TOTALS:
                out[TOTALS[key]] = out.get(TOTALS[key], 0.0) + sample.value
    if not out:
        return None
    out["per_position"] = [per_pos.get(j, 0.0) for j in range(max(per_pos) + 1)] if per_pos else []
    return out


def acceptance(before: str | None, after: str | None) -> dict | None:
    """What the run between two scrapes added, and the rates derived from it; None without counters in both."""
    a, b = spec_counters(before), spec_counters(after)
    if a is None or b is None:
        return None
    d = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in TOTALS.values()}
    width = max(len(a["per_position"]), len(b["per_position"]))
    pad = lambda xs: xs + [0.0] * (width - len(xs))  # noqa: E731
    kept = [y - x for x, y in zip(pad(a["per_position"]), pad(b["per_position"]), strict=True)]
    drafts = d["drafts"]
    return {
        "drafts": int(drafts),
        "draft_tokens": int(d["draft_tokens"]),
        "accepted_tokens": int(d["accepted_tokens"]),
        "acceptance_rate": d["accepted_tokens"] / d["draft_tokens"] if d["draft_tokens"] else None,
        "acceptance_length": 1 + d["accepted_tokens"] / drafts if drafts else None,
        "per_position": [k / drafts for k in kept] if drafts else [],
    }
