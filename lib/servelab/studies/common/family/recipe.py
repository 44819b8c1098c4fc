"""What determines a trained family: each model's shape and training budget, and the profiles' recipes.

A recipe, the corpus manifest's sha256 and the seed together name a family in the cache (``FamilyRecipe.digest``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from servelab.studies.common.params import resolve_profile

FAMILY_FORMAT = 1  # bump when the on-disk layout changes, so old caches are not read


@dataclass(frozen=True)
class ModelRecipe:
    """One Llama-architecture model and how long to train it.

    Training stops at ``budget_s`` seconds of wall time or ``max_steps`` steps, whichever comes first.
    """

    name: str
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int
    tie_embeddings: bool
    budget_s: float
    max_steps: int
    batch_size: int  # sequences per step
    lr: float  # peak learning rate
    warmup_steps: int


@dataclass(frozen=True)
class FamilyRecipe:
    """Everything that determines a trained family (with the corpus manifest and the seed)."""

    profile: str
    vocab_size: int
    seq_len: int  # training sequence length, tokens
    corpus_bytes: int  # bytes of source text read
    max_file_bytes: int
    heldout_fraction: float
    tokenizer_sample_bytes: int  # the tokenizer trains on about this many bytes of the train split
    eval_windows: int  # held-out windows of seq_len tokens for the eval loss
    evals: int  # eval-loss points per model, evenly spaced over its steps
    log_every: int  # steps between recorded train losses
    target: ModelRecipe
    drafts: tuple[ModelRecipe, ...]

    @property
    def models(self) -> tuple[ModelRecipe, ...]:
        return (self.target, *self.drafts)

    def digest(self, corpus_sha256: str, seed: int) -> str:
        blob = json.dumps(
            {"recipe": asdict(self), "corpus": corpus_sha256, "seed": seed, "format": FAMILY_FORMAT}, sort_keys=True
        )
        return hashlib.sha256(blob.encode()).hexdigest()


# Full profile: ≈150 s of H200 wall time for everything. The target gets most of the time. Decode of models this
# small in HF eager is bound by kernel launches, so a step costs about in proportion to the number of layers: the
# drafts' depths (2, 4, 6 against the target's 8) spread the cost ratio c = t_draft / t_target.
RECIPES = {
    "full": FamilyRecipe(
        profile="full",
        vocab_size=16384,
        seq_len=1024,
        corpus_bytes=40 * 2**20,
        max_file_bytes=256 * 1024,
        heldout_fraction=0.02,
        tokenizer_sample_bytes=8 * 2**20,
        eval_windows=64,
        evals=4,
        log_every=10,
        target=ModelRecipe(
            "target-124m",
            1024,
            8,
            16,
            4,
            2816,
            False,
            budget_s=76,
            max_steps=20000,
            batch_size=32,
            lr=1e-3,
            warmup_steps=60,
        ),
        drafts=(
            ModelRecipe(
                "draft-6m",
                256,
                2,
                4,
                2,
                704,
                True,
                budget_s=9,
                max_steps=20000,
                batch_size=32,
                lr=3e-3,
                warmup_steps=40,
            ),
            ModelRecipe(
                "draft-13m",
                384,
                4,
                6,
                2,
                1024,
                True,
                budget_s=12,
                max_steps=20000,
                batch_size=32,
                lr=3e-3,
                warmup_steps=40,
            ),
            ModelRecipe(
                "draft-26m",
                512,
                6,
                8,
                4,
                1408,
                True,
                budget_s=16,
                max_steps=20000,
                batch_size=32,
                lr=2e-3,
                warmup_steps=50,
            ),
        ),
    ),
    # Smoke profile: tiny models, a few steps on two CPU cores (CI), well under 30 s in all.
    "smoke": FamilyRecipe(
        profile="smoke",
        vocab_size=1024,
        seq_len=128,
        corpus_bytes=1 * 2**20,
        max_file_bytes=64 * 1024,
        heldout_fraction=0.05,
        tokenizer_sample_bytes=512 * 1024,
        eval_windows=8,
        evals=2,
        log_every=2,
        target=ModelRecipe(
            "target-tiny", 128, 3, 4, 2, 256, False, budget_s=6, max_steps=40, batch_size=8, lr=3e-3, warmup_steps=5
        ),
        drafts=(
            ModelRecipe(
                "draft-tiny-1l",
                64,
                1,
                2,
                1,
                128,
                True,
                budget_s=2.5,
                max_steps=30,
                batch_size=8,
                lr=5e-3,
                warmup_steps=3,
            ),
            ModelRecipe(
                "draft-tiny-2l",
                64,
                2,
                2,
                1,
                128,
                True,
                budget_s=2.5,
                max_steps=30,
                batch_size=8,
                lr=5e-3,
                warmup_steps=3,
            ),
            ModelRecipe(
                "draft-tiny-2l-wide",
                96,
                2,
                4,
                2,
                192,
                True,
                budget_s=2.5,
                max_steps=30,
                batch_size=8,
                lr=5e-3,
                warmup_steps=3,
            ),
        ),
    ),
}


def recipe_for(profile: str, recipe: FamilyRecipe | None = None) -> FamilyRecipe:
    """``recipe`` if given (tests use smaller ones), else the resolved profile's."""
    if recipe is not None:
        return recipe
    return RECIPES[resolve_profile(profile)]
