"""The models of Study 6: the trained family (default), or hub ids / specs given by a reader with a network.

Prompts always come from held-out files of the source corpus, tokenized with the models' tokenizer, so
acceptance is never measured on text a trained model has memorised.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.errors import ParameterError
from servelab.models import load_model
from servelab.studies.s06_hf_assisted.params import model_name

HUB_PROMPT_CORPUS_BYTES = 8 * 2**20  # enough held-out files for a few prompts with any tokenizer


@dataclass
class StudyModels:
    target: str
    drafts: list[str]  # smallest first
    hf: dict[str, object]  # name -> HF model, eval mode
    source: str  # "trained family" or "specs"
    tokenizer: object = None
    family: object = None
    pad_token_id: int | None = None
    _heldout: list | None = field(default=None, repr=False)

    def params(self) -> dict[str, int]:
        return {n: sum(p.numel() for p in m.parameters()) for n, m in self.hf.items()}

    def prompts(self, n: int, length: int, seed: int = 0) -> list[list[int]]:
        if self.family is not None:
            return self.family.eval_prompts(n, length, seed=seed)
        from servelab.studies.common.family.corpus import build_corpus, heldout_prompts
        from servelab.studies.common.family.train import encode_files

        if self._heldout is None:
            corpus = build_corpus(HUB_PROMPT_CORPUS_BYTES)
            self._heldout = [t.tolist() for t in encode_files(self.tokenizer, corpus.texts("heldout"))]
        return heldout_prompts(self._heldout, n, length, seed)


def load_study_models(
    target: str | None,
    drafts: list[str] | None,
    *,
    profile: str,
    dtype: str,
    device: str,
    cache_dir=None,
    progress: bool = True,
) -> StudyModels:
    """``target``/``drafts`` None: the trained family of ``profile`` (trained or loaded from the cache)."""
    from servelab.studies.common.family.train import quiet_transformers

    with quiet_transformers():
        return _load(
            target, drafts, profile=profile, dtype=dtype, device=device, cache_dir=cache_dir, progress=progress
        )


def _load(
    target: str | None,
    drafts: list[str] | None,
    *,
    profile: str,
    dtype: str,
    device: str,
    cache_dir=None,
    progress: bool = True,
) -> StudyModels:
    if target is None:
        from servelab.studies.common.family.train import train_family

        fam = train_family(profile, cache_dir=cache_dir, progress=progress)
        hf = {
            n: load_model(str(p), dtype=dtype, device=device, load_tokenizer=False).model for n, p in fam.models.items()
        }
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(fam.tokenizer_dir)
        return StudyModels(fam.target_name, list(fam.drafts), hf, "trained family", tok, fam, tok.pad_token_id)
    lm = load_model(target, dtype=dtype, device=device)
    if lm.tokenizer is None:
        raise ParameterError(
            f"{target!r} comes without a tokenizer; Study 6 needs real text prompts "
            "(a hub id or a trained model directory)"
        )
    hf = {model_name(target): lm.model}
    for d in drafts:
        name = model_name(d)
        if name in hf:
            raise ParameterError(f"two models are both named {name!r}")
        hf[name] = load_model(d, dtype=dtype, device=device, load_tokenizer=False).model
    vocab = {n: m.config.vocab_size for n, m in hf.items()}
    order = sorted((n for n in hf if n != model_name(target)), key=lambda n: sum(p.numel() for p in hf[n].parameters()))
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.tokenizer.eos_token_id
    if len(set(vocab.values())) != 1:
        # HF's assistant needs one tokenizer unless both are given (universal assisted decoding): say so early
        raise ParameterError(f"draft and target vocabularies differ: {vocab}")
    return StudyModels(model_name(target), order, hf, "specs", lm.tokenizer, None, pad)
