"""One replica of a data-parallel server: a ``python -m servelab.server`` child on a loopback port.

Every process started here runs with NVLink multicast off (``NO_MULTICAST``): the machines this project runs on
forbid it, and NCCL, torch's symmetric memory and NVSHMEM would otherwise try it on a multi-GPU host.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from servelab.server.launch import LIB_DIR, ServerStartError, free_port, log_tail, wait_healthy

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# the router's own flags and the address, which each replica gets afresh; every other flag is the replicas'
ROUTER_FLAGS = ("--data-parallel-size", "-dp", "--router", "--host", "--port")


def replica_argv(argv: list[str]) -> list[str]:
    """``argv`` without the router's flags (``--flag value`` and ``--flag=value`` spellings)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ROUTER_FLAGS:
            skip = True
            continue
        if any(a.startswith(f + "=") for f in ROUTER_FLAGS):
            continue
        out.append(a)
    return out


def child_env(gpu: str | None) -> dict:
    env = dict(os.environ, **NO_MULTICAST)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(LIB_DIR), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


@dataclass
class Replica:
    """A replica server process and what the router knows of it: requests routed, still open, failed."""

    index: int
    argv: list[str]
    gpu: str | None = None  # the CUDA_VISIBLE_DEVICES it runs with (None: inherited)
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    outstanding: int = 0  # routed and not finished: what least_outstanding and prefix affinity read
    routed: int = 0
    failed: int = 0
    down: bool = False  # taken out of rotation
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def up(self) -> bool:
        """In rotation: started, its process running, not taken out."""
        if self.down or self.proc is None:
            return False
        if self.proc.poll() is not None:
            self.down = True
            return False
        return True

    def start(self, python: str = sys.executable) -> None:
        """Launch the process (returns at once; ``wait`` for it to answer ``/health``)."""
        fd, path = tempfile.mkstemp(prefix=f"servelab-replica{self.index}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(path)
        cmd = [python, "-m", "servelab.server", *self.argv, "--host", self.host, "--port", str(self.port)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(self.gpu),
                                         stdin=subprocess.DEVNULL)  # fmt: skip

    def wait(self, timeout_s: float) -> None:
        try:
            wait_healthy(self.url, timeout_s, alive=lambda: self.proc is not None and self.proc.poll() is None)
        except (ServerStartError, TimeoutError) as e:
            self.stop(timeout_s=5)
            raise ServerStartError(
                f"replica {self.index}: {e}\n--- log tail ({self.log_path}) ---\n{log_tail(self.log_path)}"
            ) from None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGINT (the server drains), then SIGKILL after ``timeout_s``."""
        self.down = True
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def describe(self) -> dict:
        return {
            "replica": self.index,
            "up": self.up,
            "url": self.url,
            "pid": self.proc.pid if self.proc else None,
            "gpu": self.gpu,
            "outstanding": self.outstanding,
            "routed": self.routed,
            "failed": self.failed,
        }
