"""Where a model's GPU terms come from, in a reader's words, for the calibration table and the capacity setup."""

from __future__ import annotations

import re


def gpu_source_words(model: str, source: str) -> str:
    """Where ``model``'s GPU terms come from, in words: ``sources.gpu_cost_model`` names Study 2's fit by its file
    stem ("Study 2: cost_model_config_qwen2-0.5b_engine (fitted from its steps)"), and that text stays as written
    because ``sources.py`` is hashed by the simulator's freeze; the model spec and Study 2's mode stay, so a reader
    can time the same steps again."""
    source = re.sub(r"fitted on (\d{4,}) steps", lambda m: f"fitted on {int(m[1]):,} steps", source)
    stem = model.replace(":", "_").replace("/", "_")
    head = re.match(rf"Study 2: cost_model_{re.escape(stem)}_(\S+) \(fitted from its steps\)", source)
    if head is None:
        return source
    return f"fitted to Study 2's timed steps of {model} ({head[1]} mode)" + source[head.end() :]
