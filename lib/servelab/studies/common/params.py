"""Notebook profiles and parameter validation.

``profile="auto"`` means ``full`` when a CUDA device exists and ``smoke`` otherwise; ``smoke`` uses
tiny configs and sizes for CI's two CPU cores.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from servelab.errors import ParameterError

__all__ = [
    "PROFILES",
    "REPLAY",
    "RUN_PLACE",
    "ParameterError",
    "resolve_profile",
    "resolve",
    "overrides_from",
    "check_choice",
    "check_positive_ints",
    "check_int_range",
]

PROFILES = ("auto", "full", "smoke")
REPLAY = "replay"  # a page's profile that measures nothing: it renders the committed runs (``common.study.page``)
# Where a measured run goes among its study's runs (``measure.results.StudyResults``): which part of the study it
# measures ("all", or one of the parts a long study is split into) and its repeat index (None: the next free one).
RUN_PLACE = {"part": "all", "repeat": None}


def resolve_profile(profile: str) -> str:
    if profile == REPLAY:
        raise ParameterError('profile "replay" measures nothing; it has no parameters to resolve')
    if profile not in PROFILES:
        raise ParameterError(f"profile must be one of {PROFILES}, got {profile!r}")
    if profile != "auto":
        return profile
    import torch

    return "full" if torch.cuda.is_available() else "smoke"


def resolve(defaults: Mapping[str, Mapping], profile: str, overrides: Mapping) -> dict:
    """The profile's defaults with every non-None override applied, and ``profile`` resolved (never "auto").

    Every study's ``study_params`` starts here; an override whose name is not a parameter is refused, so a
    misspelt papermill ``-p`` never runs silently with the default.
    """
    prof = resolve_profile(profile)
    p = {k: (list(v) if isinstance(v, list) else v) for k, v in defaults[prof].items()}
    for k, v in RUN_PLACE.items():
        p.setdefault(k, v)
    unknown = set(overrides) - set(p)
    if unknown:
        raise ParameterError(f"unknown parameters {sorted(unknown)}; known: {sorted(p)}")
    p.update({k: v for k, v in overrides.items() if v is not None})
    p["profile"] = prof
    return p


def overrides_from(namespace: Mapping, defaults: Mapping[str, Mapping]) -> dict:
    """The study parameters a notebook's namespace sets: its parameters cell, or papermill's injected cell.

    A notebook passes ``globals()``; only names that are parameters of the study count, so its parameters cell
    is the one place a parameter is written in the notebook (``None`` there means the profile's default).
    """
    names = set().union(*(d.keys() for d in defaults.values()), RUN_PLACE)
    return {k: namespace[k] for k in names if k in namespace}


def check_choice(name: str, value, choices: Iterable) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ParameterError(f"{name} must be one of {choices}, got {value!r}")


def check_positive_ints(name: str, values, *, maximum: int | None = None) -> list[int]:
    """A non-empty list of positive ints (optionally ≤ maximum), returned sorted and de-duplicated."""
    if isinstance(values, (int,)) and not isinstance(values, bool):
        values = [values]
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise ParameterError(f"{name} must be a list of positive integers, got {values!r}")
    values = list(values)
    if not values:
        raise ParameterError(f"{name} must not be empty")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ParameterError(f"{name} must hold positive integers, got {v!r}")
        if maximum is not None and v > maximum:
            raise ParameterError(f"{name} values must be <= {maximum}, got {v}")
    return sorted(set(values))


def check_int_range(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ParameterError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return value
