"""A trained family on disk: where it is cached, how it is read back, and what it holds.

A family is cached under ``cache_dir`` (default ``$SERVELAB_TRAINED``, else a directory in the system's temp dir)
by a hash of the recipe and the corpus manifest: a second call with the same recipe on the same corpus loads it
instead of training (notebook 03 trains, notebook 06 loads).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.errors import ParameterError
from servelab.studies.common.family.corpus import heldout_prompts
from servelab.studies.common.family.data import load_heldout
from servelab.studies.common.family.recipe import FAMILY_FORMAT

HELDOUT_FILE = "heldout_tokens.npz"


@dataclass
class Family:
    """A trained (or loaded) family: directories of HF models sharing one tokenizer."""

    dir: Path
    tokenizer_dir: Path
    target: Path
    drafts: dict[str, Path]
    params: dict[str, int]  # model name -> parameter count (tied embeddings counted once)
    loss: pd.DataFrame  # model, step, tokens, train_loss, eval_loss
    training: pd.DataFrame  # per model: steps, tokens, seconds, tokens/s, TFLOP/s, final losses
    manifest: dict  # the corpus manifest
    recipe: dict
    timings: dict = field(default_factory=dict)  # wall seconds: corpus_s, tokenizer_s, encode_s, total_s
    cached: bool = False  # loaded from the cache rather than trained in this call
    _heldout: list[np.ndarray] | None = field(default=None, repr=False)

    @property
    def target_name(self) -> str:
        return self.target.name

    @property
    def models(self) -> dict[str, Path]:
        """Target first, then the drafts from smallest to largest."""
        return {self.target.name: self.target, **self.drafts}

    def heldout_tokens(self) -> list[np.ndarray]:
        """Token ids of each held-out file (never trained on)."""
        if self._heldout is None:
            self._heldout = load_heldout(self.dir / HELDOUT_FILE)
        return self._heldout

    def eval_prompts(self, n: int, length_tokens: int, seed: int = 0) -> list[list[int]]:
        """``n`` prompts of ``length_tokens`` token ids from held-out files (one file each where possible)."""
        return heldout_prompts([t.tolist() for t in self.heldout_tokens()], n, length_tokens, seed)

    def summary(self) -> pd.DataFrame:
        """One row per model: role, parameters, layers, width and its training record."""
        rows = []
        for name, d in self.models.items():
            cfg = json.loads((d / "config.json").read_text())
            rows.append(
                dict(
                    model=name,
                    role="target" if d == self.target else "draft",
                    params=self.params[name],
                    layers=cfg["num_hidden_layers"],
                    hidden_size=cfg["hidden_size"],
                )
            )
        return pd.DataFrame(rows).merge(self.training.drop(columns=["params"], errors="ignore"), on="model", how="left")


@contextlib.contextmanager
def quiet_transformers():
    """No "Writing model shards" / "Loading weights" progress bars per model in a notebook's output."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def default_cache_dir() -> Path:
    return Path(os.environ.get("SERVELAB_TRAINED") or Path(tempfile.gettempdir()) / "servelab-trained")


def load_family(path: Path, cached: bool = True) -> Family:
    """Read a family written by :func:`train_family`."""
    path = Path(path)
    meta_path = path / "family.json"
    if not meta_path.exists():
        raise ParameterError(f"{path} holds no trained family (no family.json)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FAMILY_FORMAT:
        raise ParameterError(f"{path} has family format {meta.get('format')}, this code reads {FAMILY_FORMAT}")
    drafts = sorted(meta["drafts"], key=lambda n: meta["params"][n])
    return Family(
        dir=path,
        tokenizer_dir=path / "tokenizer",
        target=path / meta["target"],
        drafts={n: path / n for n in drafts},
        params=meta["params"],
        loss=pd.read_csv(path / "loss.csv"),
        training=pd.read_csv(path / "training.csv"),
        manifest=meta["manifest"],
        recipe=meta["recipe"],
        timings=meta.get("timings", {}),
        cached=cached,
    )
