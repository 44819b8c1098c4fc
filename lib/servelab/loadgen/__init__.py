"""A streaming load generator for OpenAI-compatible completion servers (Study 1).

- ``arrivals.py``: Poisson / gamma (burstiness) arrival times;
- ``lengths.py``: fixed, uniform and ShareGPT-like prompt/output lengths;
- ``workload.py``: ``Trace``, the requests of a run (arrival, lengths, prompt ids), JSONL in and out;
- ``client.py``: one streaming request over aiohttp, every token timestamped;
- ``run.py``: ``run_load(base_url, trace, ...)``, open-loop replay of a trace, records out;
- ``metrics.py``: the records' schema and vLLM's metrics (TTFT, TPOT, ITL, E2E, goodput);
- ``__main__.py``: ``python -m servelab.loadgen``.
"""

from servelab.loadgen.metrics import RECORD_COLUMNS, SUMMARY_KEYS, request_metrics, summarize
from servelab.loadgen.workload import Trace

__all__ = ["Trace", "RECORD_COLUMNS", "SUMMARY_KEYS", "request_metrics", "summarize"]
