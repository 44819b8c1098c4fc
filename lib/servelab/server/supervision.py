"""The engine process dies with the server that started it, whatever killed the server.

A parent killed by SIGKILL runs no cleanup, and an engine process left behind keeps its GPU memory, so
the next server cannot start. Three independent guards, each enough alone:

- ``PR_SET_PDEATHSIG`` (Linux): the kernel sends SIGKILL to the engine process when the thread that
  started it exits (``python -m servelab.server`` starts it from its main thread, first thing);
- a watchdog thread that polls ``os.getppid()``: an orphan is re-parented, so its parent id changes
  (any POSIX system; at most ``WATCHDOG_PERIOD_S`` late);
- the pipe: once the parent's end is closed, the engine process's next read fails, and it stops (with
  ``fork`` the child must close its inherited copy of the parent's end first: ``engine_process.py``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger("servelab.server")
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCHDOG_PERIOD_S = 0.25


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (thread) dies; whether it could."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except OSError:
        return False


def watch_parent(parent_pid: int, on_gone=None, period_s: float = WATCHDOG_PERIOD_S) -> threading.Thread:
    """A daemon thread that calls ``on_gone()`` (default: ``os._exit(1)``) once this process's parent is no
    longer ``parent_pid``."""

    def gone() -> None:
        log.error("the server process %d is gone; the engine process stops", parent_pid)
        os._exit(1)  # nothing is left to serve: free the GPU at once

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(period_s)
        (on_gone or gone)()

    t = threading.Thread(target=watch, name="parent-watchdog", daemon=True)
    t.start()
    return t


def die_with_parent(parent_pid: int) -> None:
    """Both guards of this process (the engine process), and the check for a parent that died before the
    death signal was armed (prctl only covers deaths after the call)."""
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)
    watch_parent(parent_pid)
