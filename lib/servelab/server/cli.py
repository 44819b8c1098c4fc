"""The ``servelab`` console script: ``servelab serve MODEL [flags]``, as ``vllm serve`` is spelt (the same
as ``python -m servelab.server MODEL [flags]``). The flags live in ``flags.py``, serving in ``serve.py``."""

from __future__ import annotations

import sys

from servelab.server.flags import engine_config_from_args, engine_from_args, parse_args
from servelab.server.serve import main

__all__ = ["console_main", "engine_config_from_args", "engine_from_args", "parse_args"]

CONSOLE_USAGE = """usage: servelab serve [MODEL] [flags]   (servelab serve --help for the flags)

  serve   an OpenAI-compatible server on the servelab engine (vLLM's `vllm serve`)"""


def console_main(argv=None) -> int:
    """The ``servelab`` console script: ``servelab serve MODEL [flags]``, as ``vllm serve`` is spelt."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(CONSOLE_USAGE)
        return 0 if argv else 2
    if argv[0] != "serve":
        print(f"servelab: unknown command {argv[0]!r}\n{CONSOLE_USAGE}", file=sys.stderr)
        return 2
    return main(argv[1:], prog="servelab serve")
