"""Serving until told to stop: load the model, then serve until SIGINT/SIGTERM.

The first SIGINT or SIGTERM drains (new requests get 503 with Retry-After while the socket stays open, running
ones finish, up to ``--drain-timeout``: ``draining.py``);
the second stops now (the engine process is ended, open streams get an error event, the process exits);
a third exits without waiting for the streams to write it. By default the engine runs in a forked process of its own
(``engine_process.py`` says why); the fork happens first, before this process creates a thread or
touches CUDA, and the engine process dies with this one (``supervision.py``).
"""

from __future__ import annotations

import logging
import socket
import sys
import time

from servelab.server.flags import parse_args
from servelab.server.heap import freeze_heap

# The engine thread and the HTTP thread of one process share the GIL. A thread that wants it waits up to
# the switch interval (5 ms by default) for the holder to yield: longer than a decode step on a GPU.
# 0.5 ms bounds what HTTP work can add to a step when both share a process (--no-engine-process).
GIL_SWITCH_INTERVAL_S = 0.0005


def port_taken(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now (None if it can): checked before the model loads, so a busy port
    fails in a second rather than after minutes of loading. ``SO_REUSEADDR`` as uvicorn binds, so a port in
    TIME_WAIT counts as free."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return f"cannot listen on {host}:{port}: {e.strerror or e}"
    return None


def main(argv=None, prog: str = "python -m servelab.server") -> int:
    args = parse_args(argv, prog=prog)  # --help and bad flags end here, before anything heavy is imported
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("servelab.server")
    busy = port_taken(args.host, args.port)
    if busy is not None:
        log.error("%s (is another server running there? pick another --port)", busy)
        return 1
    if args.data_parallel_size > 1:
        from servelab.cluster.serve import serve_data_parallel

        return serve_data_parallel(args, list(sys.argv[1:] if argv is None else argv), log)
    return serve(args, log)


def serve(args, log: logging.Logger) -> int:
    import functools
    import signal

    import uvicorn

    from servelab.server.app import ServerSettings, create_app
    from servelab.server.draining import DrainingServer
    from servelab.server.engine_loop import EngineLoop
    from servelab.server.engine_process import EngineProcess, EngineStartError
    from servelab.server.flags import engine_from_args
    from servelab.server.metrics import ServerMetrics
    from servelab.server.step_log import StepLog
    from servelab.server.tokenizer import load_codec, special_ids
    from servelab.server.vllm_flags import vllm_flag_notes

    for note in vllm_flag_notes(args):
        log.info(note)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    name = args.served_model_name or args.model
    metrics = ServerMetrics(name)
    settings = ServerSettings(
        model_name=name,
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        max_waiting=args.max_queue,
        drain_timeout_s=args.drain_timeout,
    )
    t0 = time.perf_counter()
    if args.engine_process:
        backend = EngineProcess(
            functools.partial(engine_from_args, args),
            max_waiting=args.max_queue,
            metrics=metrics,
            step_log_path=args.step_log,
            start_method="fork",
        )
        try:
            info = backend.launch()
        except EngineStartError as e:
            log.error("%s", e)
            return 1
        specials, stats, device = info["special_ids"], info["stats"], info["device"]
    else:
        engine = engine_from_args(args)
        backend = EngineLoop(
            engine,
            max_waiting=args.max_queue,
            metrics=metrics,
            step_log=StepLog(args.step_log) if args.step_log else None,
        )
        metrics.kv_total.set(engine.num_blocks)
        specials, stats, device = special_ids(engine.model.config), engine.stats(), str(engine.device)
    # this process serves HTTP (and, without engine_process, steps the engine): its built heap leaves the collector
    frozen = freeze_heap()
    log.info(
        "engine: %s on %s (%s), %s, %d KV blocks of %d tokens, max_model_len %d, CUDA graphs %d; ready in %.1f s; "
        "%d objects frozen out of the garbage collector's view",
        args.model,
        device,
        "own process" if args.engine_process else "thread",
        stats["scheduler"],
        stats["num_blocks"],
        stats["block_size"],
        backend.max_model_len,
        stats["cuda_graphs"],
        time.perf_counter() - t0,
        info["gc_frozen"] if args.engine_process else frozen,
    )
    codec, note = load_codec(args.tokenizer or args.model, specials, backend.vocab, chat_template=args.chat_template)
    log.info(note)
    app = create_app(backend, codec, settings, metrics=metrics)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level or args.log_level,
        access_log=False,
        timeout_graceful_shutdown=args.drain_timeout,
        timeout_keep_alive=30,
    )
    server = DrainingServer(
        config,
        on_shutdown=backend.begin_drain,
        on_force=backend.stop_now,
        num_open=lambda: backend.num_open,
        drain_timeout_s=args.drain_timeout,
    )
    # uvicorn re-raises a caught signal after its graceful shutdown; by then there is nothing left to do
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    print(
        f"servelab server starting on http://{args.host}:{args.port} (model {name!r}; /v1/completions, "
        f"/v1/chat/completions, /metrics)",
        flush=True,
    )
    server.run()
    return 0 if server.started else 1
