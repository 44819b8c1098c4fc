"""An OpenAI-compatible HTTP server on the servelab engine (``python -m servelab.server``).

- ``cli.py``: the flags, and ``engine_from_args`` (the one place flags become an engine);
- ``app.py``: the FastAPI app (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``,
  ``/metrics``);
- ``protocol.py``: OpenAI's request bodies as strict pydantic models; ``errors.py``: OpenAI-style errors;
- ``engine_loop.py``: the single thread that steps the engine; ``generation.py``: one HTTP request's
  tokens on the asyncio side; ``output_text.py``: incremental text and stop strings;
- ``tokenizer.py``: the model's tokenizer or a byte-level fallback; ``metrics.py``: Prometheus;
  ``step_log.py``: the per-step JSONL log;
- ``launch.py``: ``ServerProcess`` (a subprocess, for load tests) and ``ServerThread`` (in-process).
"""

from servelab.server.launch import ServerProcess, ServerStartError, ServerThread

__all__ = ["ServerProcess", "ServerThread", "ServerStartError"]
