"""``servelab serve MODEL --data-parallel-size N``: start the replicas, serve the router until told to stop.

Replica ``i`` runs on GPU ``i mod G`` (``CUDA_VISIBLE_DEVICES``; G from the parent's ``CUDA_VISIBLE_DEVICES``, else
every GPU torch sees), or on the CPU. The replicas load at once, in parallel. SIGINT or SIGTERM stops the router,
then drains every replica (each is sent SIGINT, as a single server is).
"""

from __future__ import annotations

import logging
import os
import signal
from concurrent.futures import ThreadPoolExecutor

REPLICA_STARTUP_S = 900.0  # model loading and graph capture of one replica, as a single server may take


def gpus(device: str) -> list[str]:
    """The GPUs replicas are spread over (empty: none, every replica inherits the parent's devices)."""
    if device == "cpu":
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        return []


def serve_data_parallel(args, argv: list[str], log: logging.Logger) -> int:
    import uvicorn

    from servelab.cluster.pool import ReplicaPool
    from servelab.cluster.replica import Replica, replica_argv
    from servelab.cluster.router_app import create_router_app

    n, rest = args.data_parallel_size, replica_argv(argv)
    devs = gpus(args.device)
    replicas = [Replica(i, rest, gpu=devs[i % len(devs)] if devs else None) for i in range(n)]
    for r in replicas:
        r.start()
    try:
        with ThreadPoolExecutor(n) as ex:
            list(ex.map(lambda r: r.wait(REPLICA_STARTUP_S), replicas))
    except Exception as e:  # noqa: BLE001 - any replica that did not start stops them all, and says why
        log.error("%s", e)
        for r in replicas:
            r.stop(timeout_s=5)
        return 1
    for r in replicas:
        log.info("replica %d: %s (GPU %s), log %s", r.index, r.url, r.gpu or "-", r.log_path)
    app = create_router_app(ReplicaPool(replicas, args.router))
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level or args.log_level,
                            access_log=False)  # fmt: skip
    server = uvicorn.Server(config)
    print(f"data-parallel server: {n} replicas behind a {args.router} router on http://{args.host}:{args.port}",
          flush=True)  # fmt: skip
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied request otherwise
    try:
        server.run()
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the signal it caught, after its graceful shutdown: the replicas drain next
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second signal must not cut the replicas' drain short
        with ThreadPoolExecutor(n) as ex:
            list(ex.map(lambda r: r.stop(args.drain_timeout + 5), replicas))
    return 0
