"""One choice's text as its tokens arrive: incremental decoding, stop strings, and what may be sent yet.

Stop strings are matched on text, not tokens (a stop string can span tokens, or end inside one). The
text sent to a streaming client must never contain a stop string, not even its first characters, so
the last ``len(longest stop) - 1`` characters are held back until more text shows they do not begin
one (vLLM does the same). The text returned is cut just before the stop string.
"""

from __future__ import annotations

from servelab.server.tokenizer import IncrementalDecoder


class OutputText:
    def __init__(self, decoder: IncrementalDecoder, stop_strings: list[str] = ()):
        if any(not s for s in stop_strings):
            raise ValueError("stop strings must be non-empty")
        self.decoder = decoder
        self.stops = list(stop_strings)
        self.hold = max((len(s) for s in self.stops), default=1) - 1  # characters withheld while streaming
        self.text = ""
        self.sent = 0  # characters of ``text`` already handed out
        self.stopped = False  # a stop string was found; ``text`` ends before it

    def push(self, token_id: int) -> str:
        """Add a generated token; the text that may be sent now (possibly empty)."""
        if self.stopped:
            return ""
        return self._add(self.decoder.push(token_id))

    def finish(self) -> str:
        """The request ended (length, EOS, stop token): whatever text is still held back."""
        if self.stopped:
            return ""
        delta = self._add(self.decoder.flush())
        if not self.stopped:
            delta += self.text[self.sent :]
            self.sent = len(self.text)
        return delta

    def _add(self, new: str) -> str:
        if not new:
            return ""
        search_from = max(0, len(self.text) - self.hold)  # a stop string may begin in text already seen
        self.text += new
        hits = [i for i in (self.text.find(s, search_from) for s in self.stops) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
            delta, self.sent = self.text[self.sent :], len(self.text)
            return delta
        safe = len(self.text) - self.hold
        if safe > self.sent:
            delta, self.sent = self.text[self.sent : safe], safe
            return delta
        return ""
