"""A streaming load generator for OpenAI-compatible completion servers, and a benchmark tool like vLLM's.

- ``arrivals.py``: Poisson / gamma (burstiness) arrival times;
- ``lengths.py``: fixed, uniform and ShareGPT-like prompt/output lengths (and their command-line flags);
- ``workload.py``: ``Trace``, the requests of a run (arrival, lengths, prompt ids), JSONL in and out, fitted to a
  server's context; ``dataset.py``: prompts and output lengths from a JSONL file;
- ``client.py``: one streaming request over aiohttp, every token timestamped; ``server_info.py``: the server's
  ``max_model_len`` (``/v1/models``) and prompt token counts (``/tokenize``);
- ``run.py``: ``run_load(base_url, trace, ...)``, open-loop replay of a trace, records out; ``worker.py``: the same
  in a process of its own;
- ``metrics.py``: the records' schema and vLLM's metrics (TTFT, TPOT, ITL, E2E, goodput), one summary for the load
  generator and the simulator; ``report.py``: that summary in vLLM ``benchmark_serving``'s layout;
  ``compare.py``: two runs of one trace side by side (``python -m servelab.loadgen.compare``);
- ``__main__.py``: ``python -m servelab.loadgen``.
"""

from servelab.loadgen.metrics import RECORD_COLUMNS, SUMMARY_KEYS, request_metrics, summarize
from servelab.loadgen.workload import Trace

__all__ = ["Trace", "RECORD_COLUMNS", "SUMMARY_KEYS", "request_metrics", "summarize"]
