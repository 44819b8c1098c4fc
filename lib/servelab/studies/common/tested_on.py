"""What a verdict was measured on, in words, for a ``Finding``'s ``tested_on`` field: computed from the model specs
that ran, never typed per run.

A ``config:NAME`` spec is an architecture-exact model with random weights (``servelab.models.loader``); any other spec
is a checkpoint with trained weights.
"""

from __future__ import annotations

from collections.abc import Iterable

from servelab.models.loader import CONFIG_PREFIX


def weights(spec: str) -> str:
    """ "random weights" for a ``config:`` spec, "trained weights" for a checkpoint."""
    return "random weights" if spec.startswith(CONFIG_PREFIX) else "trained weights"


def model_name(spec: str) -> str:
    """The spec without its ``config:`` prefix: ``config:qwen2-0.5b`` → ``qwen2-0.5b``."""
    return spec[len(CONFIG_PREFIX) :] if spec.startswith(CONFIG_PREFIX) else spec


def tested_on(specs: Iterable[str], *, dtype: str | None = None, setting: str = "") -> str:
    """``"qwen2-0.5b, llama-3-8b (architecture-exact, random weights; bfloat16); <setting>"``.

    ``specs`` in the order they ran (duplicates dropped); ``dtype`` the weights' and KV cache's dtype where one dtype
    holds for all; ``setting`` what else the verdict rests on (a mode, a batch, a length). Empty if no model ran.
    """
    specs = list(dict.fromkeys(s for s in specs if isinstance(s, str) and s))
    if not specs:
        return ""
    groups = []
    for kind in ("random weights", "trained weights"):
        names = [model_name(s) for s in specs if weights(s) == kind]
        if names:
            what = "architecture-exact, random weights" if kind == "random weights" else "trained weights"
            groups.append(f"{', '.join(names)} ({what}{'; ' + dtype if dtype else ''})")
    return "; ".join(groups) + (f"; {setting}" if setting else "")
