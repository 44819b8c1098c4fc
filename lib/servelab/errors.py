"""Errors every layer of servelab shares.

``ParameterError`` is the one error for a wrong setting, from a CLI flag, an engine config, an HTTP body or a
notebook parameter: a ``ValueError`` whose message says which setting and what is allowed.
"""


class ParameterError(ValueError):
    """A parameter is wrong; the message says which and what is allowed."""
