"""An OpenAI-compatible HTTP server on the servelab engine (``servelab serve MODEL``, ``python -m servelab.server``).

- ``cli.py``: the ``servelab`` console script; ``flags.py``: the flags, and ``engine_from_args`` (the one
  place flags become an engine); ``serve.py``: serving until the first signal drains, the second stops;
- ``app.py``: the FastAPI app and its lifecycle; ``routes_openai.py``: ``/v1/completions``,
  ``/v1/chat/completions``, ``/v1/models[/{id}]``; ``routes_ops.py``: ``/health``, ``/metrics``,
  ``/version``, ``/tokenize``, ``/detokenize``; ``state.py``: what handlers share and the request checks;
  ``request_body.py``: reading bodies; ``respond.py``: streamed or whole responses;
- ``protocol.py``: OpenAI's request bodies as pydantic models (no coercion; unknown fields logged and ignored);
  ``errors.py``: OpenAI-style errors; ``responses.py``: response bodies and SSE chunks; ``logprob_format.py``:
  logprobs in OpenAI's completion and chat shapes;
- ``vllm_flags.py``: vLLM's flags without an engine setting here, accepted or refused; ``draining.py``: uvicorn
  with the two-signal shutdown (503 while draining, error events on a stop);
- ``engine_loop.py``: the single thread that steps the engine; ``engine_process.py``: that thread in a
  process of its own; ``supervision.py``: the engine process dies with the server; ``heap.py``: the built
  engine's heap frozen out of the garbage collector's view;
- ``generation.py``: one HTTP request's tokens on the asyncio side; ``output_text.py``: incremental text
  and stop strings; ``tokenizer.py``: the model's tokenizer or a byte-level fallback;
- ``metrics.py``: Prometheus (vLLM's set under ``servelab:``, and this project's own names);
  ``request_timing.py``: per-request times; ``step_log.py``: the per-step JSONL log;
- ``launch.py``: ``ServerProcess`` (a subprocess, for load tests) and ``ServerThread`` (in-process).
"""

from servelab.server.launch import ServerProcess, ServerStartError, ServerThread

__all__ = ["ServerProcess", "ServerThread", "ServerStartError"]
