"""Starting a server from Python: as a subprocess (``ServerProcess``) or in this process (``ServerThread``).

    with ServerProcess("config:qwen2-0.5b", scheduler="fcfs", extra_args=["--step-log", "steps.jsonl"]) as srv:
        run_load(srv.base_url, trace)            # http://127.0.0.1:<free port>
    # on exit: SIGINT, running requests drain, the process ends; srv.log_path keeps its log

``ServerThread`` runs uvicorn in a background thread on an engine you built (tests, notebooks on CPU).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

LIB_DIR = Path(__file__).resolve().parents[2]  # .../lib, so the subprocess imports this servelab
SHARED_GIL_SWITCH_INTERVAL_S = 0.0005


class ServerStartError(RuntimeError):
    """The server process died or did not become healthy in time; the message holds its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_healthy(base_url: str, timeout_s: float, alive=lambda: True, poll_s: float = 0.2) -> None:
    """Poll ``/health`` until it answers 200; ``TimeoutError`` after ``timeout_s``, ``ServerStartError``
    as soon as ``alive()`` turns false."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while True:
            if not alive():
                raise ServerStartError("the server stopped before it became healthy")
            try:
                if client.get(f"{base_url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{base_url}/health did not answer 200 within {timeout_s:.0f} s")
            time.sleep(poll_s)


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ServerProcess:
    """``python -m servelab.server`` as a child process, healthy on entry, drained and stopped on exit.

    ``model`` and ``scheduler`` become ``--model``/``--scheduler``; any other flag goes in ``extra_args``
    (e.g. ``["--max-num-batched-tokens", "512", "--graph-batch-sizes", "1,2,4,8,16,32,64"]``).
    ``port=None`` picks a free port. The log (stdout and stderr) goes to ``log_path`` (a temporary
    file unless given). ``startup_timeout_s`` covers model loading and CUDA-graph capture.
    """

    def __init__(
        self,
        model: str = "config:tiny-llama",
        *,
        scheduler: str = "chunked_prefill",
        port: int | None = None,
        host: str = "127.0.0.1",
        extra_args=(),
        env: dict | None = None,
        startup_timeout_s: float = 600.0,
        stop_timeout_s: float = 120.0,
        log_path: str | Path | None = None,
        python: str = sys.executable,
    ):
        self.model, self.scheduler, self.host = model, scheduler, host
        self.port = port or free_port(host)
        self.extra_args = [str(a) for a in extra_args]
        self.env = env
        self.startup_timeout_s, self.stop_timeout_s = startup_timeout_s, stop_timeout_s
        self.python = python
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="servelab-server-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port`` (the OpenAI client wants ``base_url + "/v1"``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def command(self) -> list[str]:
        return [
            self.python,
            "-m",
            "servelab.server",
            "--model",
            self.model,
            "--scheduler",
            self.scheduler,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def start(self) -> ServerProcess:
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(LIB_DIR), env.get("PYTHONPATH", "")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.log_path, "ab") as log:  # the child writes to its own copy of the descriptor
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
            )
        try:
            wait_healthy(self.base_url, self.startup_timeout_s, alive=lambda: self.proc.poll() is None)
        except (ServerStartError, TimeoutError) as e:
            self.stop()
            raise ServerStartError(
                f"{e}; exit code {self.returncode}; command: {' '.join(self.command)}\n"
                f"--- log tail ({self.log_path}) ---\n{log_tail(self.log_path)}"
            ) from None
        return self

    def stop(self) -> int | None:
        """SIGINT (uvicorn drains running requests), then SIGTERM, then SIGKILL if it will not end."""
        if self.proc is None:
            return None
        for sig, wait_s in ((signal.SIGINT, self.stop_timeout_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            self.proc.send_signal(sig)
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.returncode

    def log(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerThread:
    """uvicorn serving ``create_app(engine, codec, settings)`` in a daemon thread of this process.

    ``engine`` is an ``Engine`` (stepped by a thread of this process, sharing its GIL with HTTP), an
    ``EngineLoop`` built on one, or a launched ``EngineProcess`` (the engine in a child process, which then
    owns the step log):

        ep = EngineProcess(functools.partial(Engine.from_spec, spec, config=cfg), step_log_path="steps.jsonl")
        ep.launch()                       # before this process touches CUDA
        with ServerThread(ep) as srv:     # srv.state.loop is ep; ep.call(fn, *args) runs fn(loop, *args) there
            ...

    ``codec`` defaults to the byte-level tokenizer for the engine's vocabulary. ``stop()`` shuts uvicorn
    down the way a signal would: new requests get 503, running ones drain, then the engine stops.
    """

    def __init__(
        self,
        engine,
        codec=None,
        settings=None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        step_log=None,
        startup_timeout_s: float = 60.0,
    ):
        import uvicorn

        from servelab.server.app import ServerSettings, create_app
        from servelab.server.engine_loop import EngineLoop
        from servelab.server.engine_process import EngineProcess
        from servelab.server.tokenizer import ByteTokenizer, special_ids

        self.engine = engine
        if codec is None:
            if isinstance(engine, EngineProcess):
                codec = ByteTokenizer(engine.vocab, engine.info["special_ids"])
            else:
                model = (engine.engine if isinstance(engine, EngineLoop) else engine).model
                codec = ByteTokenizer(model.shape.vocab, special_ids(model.config))
        self.codec = codec
        self.settings = settings or ServerSettings(model_name="servelab")
        self.host, self.port = host, port or free_port(host)
        self.app = create_app(engine, self.codec, self.settings, step_log=step_log)
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=self.settings.drain_timeout_s,
        )
        self.server = uvicorn.Server(config)
        self.startup_timeout_s = startup_timeout_s
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def state(self):
        """The app's ``ServerState`` (engine loop, metrics)."""
        return self.app.state.server

    def start(self) -> ServerThread:
        from servelab.server.engine_loop import EngineLoop

        self._switch_interval_s = sys.getswitchinterval()
        if isinstance(self.state.loop, EngineLoop):
            # engine and HTTP threads share this process's GIL: a thread waiting for it waits up to the switch
            # interval (5 ms by default, longer than a GPU decode step) at every torch call; bound it at 0.5 ms
            sys.setswitchinterval(min(self._switch_interval_s, SHARED_GIL_SWITCH_INTERVAL_S))
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self._thread.start()
        wait_healthy(self.base_url, self.startup_timeout_s, alive=self._thread.is_alive, poll_s=0.05)
        return self

    def begin_shutdown(self) -> None:
        """What SIGTERM does: refuse new requests (503), let running ones finish, then exit."""
        self.state.loop.begin_drain()
        self.server.should_exit = True

    def stop(self, timeout_s: float = 60.0) -> None:
        self.begin_shutdown()
        if self._thread is not None:
            self._thread.join(timeout_s)
        sys.setswitchinterval(getattr(self, "_switch_interval_s", sys.getswitchinterval()))

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
