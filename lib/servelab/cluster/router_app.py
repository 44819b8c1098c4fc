"""The data-parallel server's HTTP front: each OpenAI request proxied to one replica (``pool.ReplicaPool``).

- A replica that cannot be reached before it answered is taken out of rotation when its process has exited, and
  the request goes to another (it had not started anywhere); one that fails mid-response is taken out, and the
  client gets an OpenAI error (an error event, then ``[DONE]``, on a stream): the request was half served and is
  not replayed.
- ``/metrics``: the router's counters per replica (requests routed, open, failed, in rotation), then every live
  replica's own metrics with a ``replica`` label.
- ``/health``: 200 while any replica is in rotation, with each replica's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from servelab.cluster.pool import ReplicaPool
from servelab.server.errors import error_body

log = logging.getLogger("servelab.cluster")
MONITOR_S = 0.5  # how often the router checks that each replica's process runs
DONE = b"data: [DONE]\n\n"
# a sample line of the text exposition format: name, optional {labels}, the rest
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?(\s.*)$")


def upstream_error(message: str, code: str | None = None) -> dict:
    """An OpenAI error body for a replica's failure (HTTP 502 carries it; its type is the server's 500 type)."""
    return error_body(500, message, code=code)


def with_replica_label(text: str, index: int, keep_meta: bool) -> list[str]:
    """A replica's metrics with ``replica="index"`` on every sample (HELP/TYPE lines kept once: ``keep_meta``)."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            if keep_meta:
                out.append(line)
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = f'replica="{index}"' + (f",{m.group(3)}" if m.group(3) else "")
        out.append(f"{m.group(1)}{{{labels}}}{m.group(4)}")
    return out


class RouterMetrics:
    def __init__(self, router: str):
        self.registry = CollectorRegistry()
        kw = {"registry": self.registry, "labelnames": ["replica"]}
        self.routed = Counter("servelab_router_requests", f"requests routed to each replica ({router})", **kw)
        self.failed = Counter("servelab_router_failures", "requests a replica failed (it was taken out)", **kw)
        self.open = Gauge("servelab_router_open_requests", "routed and not finished", **kw)
        self.up = Gauge("servelab_router_replica_up", "1 while the replica is in rotation", **kw)


class Router:
    """The proxy: one shared HTTP client to the replicas, the pool's choice, and the router's metrics."""

    def __init__(self, pool: ReplicaPool, timeout_s: float | None = None):
        self.pool, self.timeout_s = pool, timeout_s
        self.metrics = RouterMetrics(pool.router_name)
        self.client: httpx.AsyncClient | None = None

    async def monitor(self) -> None:
        while True:
            for r in self.pool.replicas:
                was = not r.down
                self.metrics.up.labels(str(r.index)).set(1 if r.up else 0)
                if was and r.down:
                    log.error("replica %d left the rotation (process exit code %s)", r.index, r.proc.poll())
            await asyncio.sleep(MONITOR_S)

    def fail(self, r, why: str) -> None:
        r.failed += 1
        r.down = True
        self.metrics.failed.labels(str(r.index)).inc()
        self.metrics.up.labels(str(r.index)).set(0)
        log.error("replica %d failed (%s): taken out of rotation", r.index, why)

    def _open(self, r, delta: int) -> None:
        r.outstanding += delta
        self.metrics.open.labels(str(r.index)).inc(delta)

    async def proxy(self, request: Request, path: str) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}  # the replica answers malformed JSON with its own 400
        body = body if isinstance(body, dict) else {}
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        tried = set()
        while True:
            r = self.pool.choose(body)
            if r is None or r.index in tried:
                return JSONResponse(error_body(503, "no replica is serving"), status_code=503)
            tried.add(r.index)
            r.routed += 1
            self.metrics.routed.labels(str(r.index)).inc()
            self._open(r, 1)
            req = self.client.build_request("POST", f"{r.url}{path}", content=raw, headers=headers)
            try:
                resp = await self.client.send(req, stream=True)
            except httpx.TransportError as e:
                self._open(r, -1)
                if r.proc is not None and r.proc.poll() is None:  # alive but unreachable: say so, do not guess
                    return JSONResponse(upstream_error(f"replica {r.index} unreachable: {e}"), status_code=502)
                self.fail(r, f"not reachable: {type(e).__name__}")
                continue  # it had not started anywhere: another replica serves it
            return await self.relay(r, resp, body.get("stream") is True)

    async def relay(self, r, resp: httpx.Response, stream: bool) -> Response:
        hdrs = {"x-servelab-replica": str(r.index)}
        if not stream or resp.status_code != 200:
            try:
                content = await resp.aread()
            except httpx.TransportError as e:
                self.fail(r, f"failed mid-response: {type(e).__name__}")
                return JSONResponse(upstream_error(f"replica {r.index} failed: {e}"), 502, headers=hdrs)
            finally:
                self._open(r, -1)
                await resp.aclose()
            ctype = resp.headers.get("content-type", "application/json")
            return Response(content, status_code=resp.status_code, media_type=ctype, headers=hdrs)

        async def events():
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            except httpx.TransportError as e:
                self.fail(r, f"failed mid-stream: {type(e).__name__}")
                err = upstream_error(f"replica {r.index} failed while serving this request", code="replica_failed")
                yield f"data: {json.dumps(err, separators=(',', ':'))}\n\n".encode() + DONE
            finally:
                self._open(r, -1)
                await resp.aclose()

        return StreamingResponse(events(), media_type="text/event-stream", headers=hdrs)

    async def models(self, request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        for r in self.pool.up():
            with contextlib.suppress(httpx.TransportError):
                resp = await self.client.get(f"{r.url}/v1/models", headers=headers)
                return Response(resp.content, resp.status_code, media_type="application/json")
        return JSONResponse(error_body(503, "no replica is serving"), status_code=503)

    def health(self) -> Response:
        reps = [r.describe() for r in self.pool.replicas]
        ok = any(x["up"] for x in reps)
        return JSONResponse({"router": self.pool.router_name, "replicas": reps}, status_code=200 if ok else 503)

    async def prometheus(self) -> Response:
        for r in self.pool.replicas:
            self.metrics.up.labels(str(r.index)).set(1 if r.up else 0)
        lines = generate_latest(self.metrics.registry).decode().splitlines()
        first = True
        for r in self.pool.up():
            with contextlib.suppress(httpx.TransportError):
                text = (await self.client.get(f"{r.url}/metrics", timeout=5.0)).text
                lines += with_replica_label(text, r.index, keep_meta=first)
                first = False
        return Response("\n".join(lines) + "\n", media_type=CONTENT_TYPE_LATEST)


def create_router_app(pool: ReplicaPool, *, timeout_s: float | None = None) -> FastAPI:
    router = Router(pool, timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        router.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0))
        task = asyncio.create_task(router.monitor())
        yield
        task.cancel()
        await router.client.aclose()

    app = FastAPI(title="servelab data-parallel router", lifespan=lifespan)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await router.proxy(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await router.proxy(request, "/v1/chat/completions")

    app.get("/v1/models")(router.models)
    app.get("/health")(router.health)
    app.get("/metrics")(router.prometheus)
    app.state.router = router
    return app
