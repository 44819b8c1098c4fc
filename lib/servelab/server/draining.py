"""uvicorn with the README's shutdown: the first signal drains while the socket still answers, the second stops.

uvicorn's own first signal closes the listening socket at once, so a client arriving during the drain is refused
at the socket; and its second cancels the open responses' tasks (``CancelledError`` tracebacks in the log, streams
cut without an error event). Here:

- first SIGINT/SIGTERM: ``on_shutdown`` (the engine refuses new requests: they get 503 with ``Retry-After``);
  the server keeps accepting connections while running requests finish. When none is left, or after
  ``drain_timeout_s`` (then ``on_force`` ends the rest, each stream with an error event), uvicorn's graceful
  shutdown begins (the socket closes, finished responses flush, the app's lifespan ends);
- second: ``on_force`` now: the engine stops, every open request ends with an error (an error event on a
  stream), and the responses get ``FORCE_GRACE_S`` to write it before uvicorn's graceful shutdown cancels them;
- a third: uvicorn's force exit.
"""

from __future__ import annotations

import time

import uvicorn

FORCE_GRACE_S = 3.0  # after a second signal: time for the open responses to write their error events


class DrainingServer(uvicorn.Server):
    def __init__(self, config, *, on_shutdown, on_force, num_open, drain_timeout_s: float):
        """``num_open()``: requests the engine has not finished (the drain ends at 0)."""
        super().__init__(config)
        self.on_shutdown, self.on_force, self.num_open = on_shutdown, on_force, num_open
        self.drain_timeout_s = drain_timeout_s
        self.signals = 0
        self.drain_deadline: float | None = None

    def handle_exit(self, sig, frame) -> None:
        """Runs in the signal handler: set flags, start nothing that waits for a lock."""
        self.signals += 1
        if self.signals == 1:
            self.drain_deadline = time.monotonic() + self.drain_timeout_s
            self.on_shutdown()
        elif self.signals == 2:
            self.on_force()
            self.config.timeout_graceful_shutdown = FORCE_GRACE_S
            self.should_exit = True
        else:
            self.should_exit = self.force_exit = True

    def begin_drain(self) -> None:
        """What the first signal does, for a server run outside the main thread (``ServerThread``)."""
        if self.signals == 0:
            self.handle_exit(None, None)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and not self.should_exit:
            if self.num_open() == 0:
                self.should_exit = True
            elif time.monotonic() > self.drain_deadline:
                self.on_force()  # past --drain-timeout: the rest end with an error, then the server stops
                self.config.timeout_graceful_shutdown = FORCE_GRACE_S
                self.should_exit = True
        return await super().on_tick(counter)
