"""A family of small language models trained offline, for the speculative-decoding studies (3 and 6).

Acceptance depends on how well a draft predicts its target, so random weights will not do. ``train_family``
trains, on the Python source already on disk (:mod:`servelab.studies.common.family.corpus`):

- a byte-level BPE tokenizer (:mod:`~servelab.studies.common.family.tokenizer`);
- one target (≈124M parameters in the full profile) and three drafts (≈6M, 13M, 26M), Llama architecture, all
  with that tokenizer (:mod:`~servelab.studies.common.family.recipe`), each within a wall-time budget
  (:mod:`~servelab.studies.common.family.loop`) on windows of the token stream
  (:mod:`~servelab.studies.common.family.data`), saved with ``save_pretrained`` so that
  ``servelab.models.load_model(dir)``, HF ``generate`` and ``assistant_model`` work on them;
- and caches the whole family by a hash of the recipe, the corpus and the seed
  (:mod:`~servelab.studies.common.family.cache`).

Seeds are fixed; the step count depends on the machine's speed, which the record shows. The names other modules
import from here (``train_family``, ``encode_files``, ``quiet_transformers``, ``train_tokenizer``, …) stay here.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from servelab.errors import ParameterError
from servelab.studies.common.family.cache import (
    HELDOUT_FILE,
    Family,
    default_cache_dir,
    load_family,
    quiet_transformers,
)
from servelab.studies.common.family.corpus import Corpus, build_corpus
from servelab.studies.common.family.data import TokenStream, eval_windows, join_files, save_heldout
from servelab.studies.common.family.loop import lr_at, model_config, threads_for, train_model
from servelab.studies.common.family.recipe import FAMILY_FORMAT, RECIPES, FamilyRecipe, ModelRecipe, recipe_for
from servelab.studies.common.family.tokenizer import (
    EOS,
    PAD,
    encode_files,
    sample_for_tokenizer,
    tokenizers_parallel,
    train_tokenizer,
)

__all__ = [
    "EOS",
    "PAD",
    "RECIPES",
    "Family",
    "FamilyRecipe",
    "ModelRecipe",
    "encode_files",
    "load_family",
    "lr_at",
    "model_config",
    "quiet_transformers",
    "tokenizers_parallel",
    "train_family",
    "train_tokenizer",
]


def _check_family(rec: FamilyRecipe, seed) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ParameterError(f"seed must be a non-negative int, got {seed!r}")
    names = [m.name for m in rec.models]
    if len(rec.drafts) < 1 or len(set(names)) != len(names):
        raise ParameterError(f"a family needs a target and at least one draft with distinct names, got {names}")


def train_family(
    profile: str = "auto",
    cache_dir: Path | None = None,
    seed: int = 0,
    progress: bool = True,
    *,
    recipe: FamilyRecipe | None = None,
    device=None,
    corpus: Corpus | None = None,
) -> Family:
    """Train (or load from ``cache_dir``) the tokenizer, the target and the drafts of ``profile``'s recipe.

    ``recipe`` overrides the profile's recipe (tests use smaller ones); ``corpus`` a pre-built corpus.
    The cache key is a hash of the recipe, the corpus manifest's sha256 and the seed.
    """
    import torch

    rec = recipe_for(profile, recipe)
    _check_family(rec, seed)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    t0 = time.perf_counter()
    if corpus is None:
        corpus = build_corpus(rec.corpus_bytes, rec.heldout_fraction, max_file_bytes=rec.max_file_bytes)
    key = rec.digest(corpus.manifest["sha256"], seed)
    final = cache / f"family-{rec.profile}-{key[:16]}"
    if (final / "family.json").exists():
        return load_family(final, cached=True)

    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:8]}-", dir=cache))
    try:
        meta = _train_into(work, rec, corpus, seed, device, progress, t0)
        meta.update(format=FAMILY_FORMAT, key=key)
        (work / "family.json").write_text(json.dumps(meta, indent=2) + "\n")
        if final.exists():  # another process finished the same family first: keep theirs
            shutil.rmtree(work, ignore_errors=True)
        else:
            os.replace(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return load_family(final, cached=False)


def _train_into(work: Path, rec: FamilyRecipe, corpus: Corpus, seed: int, device, progress: bool, t0: float) -> dict:
    """Tokenizer, encoded data, every model and their records written into ``work``; returns the family's
    metadata (everything ``family.json`` holds but the format and the cache key)."""
    timings = {"corpus_s": time.perf_counter() - t0}
    t = time.perf_counter()
    train_texts = corpus.texts("train")
    tok = train_tokenizer(sample_for_tokenizer(train_texts, rec.tokenizer_sample_bytes), rec.vocab_size)
    tok.save_pretrained(work / "tokenizer")
    timings["tokenizer_s"] = time.perf_counter() - t
    t = time.perf_counter()
    eos_id = tok.convert_tokens_to_ids(EOS)
    flat = join_files(encode_files(tok, train_texts), eos_id)
    heldout_ids = encode_files(tok, corpus.texts("heldout"))
    heldout_tokens = save_heldout(work / HELDOUT_FILE, heldout_ids)
    timings["encode_s"] = time.perf_counter() - t
    stream = TokenStream(flat, rec.seq_len, device, seed)
    windows = eval_windows(heldout_ids, rec.seq_len, rec.eval_windows, eos_id)

    with threads_for(rec, device):
        loss_rows, records = _train_all(rec, tok, stream, windows, device, seed, progress, work)
    del stream
    timings["total_s"] = time.perf_counter() - t0
    pd.DataFrame(loss_rows).to_csv(work / "loss.csv", index=False)
    pd.DataFrame(records).to_csv(work / "training.csv", index=False)
    return dict(
        seed=seed,
        recipe=asdict(rec),
        target=rec.target.name,
        drafts=[d.name for d in rec.drafts],
        params={r["model"]: r["params"] for r in records},
        manifest=corpus.manifest,
        device=str(device),
        timings=timings,
        train_tokens=int(len(flat)),
        heldout_tokens=heldout_tokens,
        vocab_size=len(tok),
    )


def _train_all(
    rec: FamilyRecipe, tok, stream: TokenStream, windows, device, seed: int, progress: bool, work: Path
) -> tuple[list[dict], list[dict]]:
    """Train and save every model of the recipe in turn (target first), freeing each before the next;
    returns (loss rows, training records)."""
    import torch

    loss_rows, records = [], []
    eos_id, pad_id = tok.convert_tokens_to_ids(EOS), tok.convert_tokens_to_ids(PAD)
    for i, mr in enumerate(rec.models):
        cfg = model_config(mr, len(tok), rec.seq_len, eos_id, pad_id)
        model, rows, record = train_model(
            mr,
            cfg,
            stream,
            windows,
            device=device,
            seed=seed + 1000 * i,
            evals=rec.evals,
            log_every=rec.log_every,
            progress=progress,
        )
        model.generation_config.eos_token_id = eos_id
        model.generation_config.pad_token_id = pad_id
        model.generation_config.bos_token_id = eos_id
        with quiet_transformers():
            model.save_pretrained(work / mr.name)
        tok.save_pretrained(work / mr.name)  # so load_model(dir) returns the tokenizer too
        loss_rows += rows
        records.append(record)
        del model
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return loss_rows, records
