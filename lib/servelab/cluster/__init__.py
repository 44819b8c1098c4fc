"""Data-parallel serving: N replicas of the server, one engine each, behind a router.

``servelab serve MODEL --data-parallel-size N [--router least_outstanding]`` (vLLM's flag) starts N replica
servers (``replica.py``: each a ``python -m servelab.server`` process on a loopback port, on GPU ``i mod
#GPUs``) and serves the OpenAI API on ``--port`` through a router (``router_app.py``) that proxies each request,
streamed or not, to one replica chosen by the same policies the simulator models (``servelab.sim.routers``:
round-robin, least outstanding requests, prefix affinity). This is the shape of SGLang's router in front of its
workers: the replicas are unchanged servers, so everything a single server does (batching, prefix caching,
metrics) each replica does.

A replica that dies is taken out of rotation; the requests it was serving get an error (an error event on a
stream) and the others keep serving. ``/metrics`` gives the router's own counters per replica and each live
replica's metrics with a ``replica`` label; ``/health`` lists the replicas.
"""
