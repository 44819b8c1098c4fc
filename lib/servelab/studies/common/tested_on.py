"""What a verdict was measured on, in words for the findings' ``tested_on`` column.

A model spec ``config:<name>`` is a shipped, architecture-exact config with random initial weights (the
engine's times depend on shapes, not on weight values); any other spec loads trained weights.
"""

from __future__ import annotations

from servelab.models.loader import CONFIG_PREFIX


def weights(spec: str) -> str:
    """``random weights`` for a ``config:`` spec, ``trained weights`` otherwise."""
    return "random weights (architecture-exact config)" if spec.startswith(CONFIG_PREFIX) else "trained weights"


def model_tested_on(spec: str, dtype: str | None = None) -> str:
    """One model as a verdict's ``tested_on``: its name, dtype and whether its weights were random or trained."""
    name = spec[len(CONFIG_PREFIX) :] if spec.startswith(CONFIG_PREFIX) else spec
    return f"{name}{f' ({dtype})' if dtype else ''}, {weights(spec)}"


def models_tested_on(specs, dtype: str | None = None) -> str:
    """Several models, '; '-joined in the order given (duplicates dropped)."""
    return "; ".join(model_tested_on(s, dtype) for s in dict.fromkeys(specs))
