"""The models of a speculative study: a target and its drafts, as HF models and as the engine's model code.

They come from the trained family (``servelab.studies.common.family.train.train_family``: one tokenizer,
held-out prompts), or from explicit specs (``config:<name>``, a directory or a hub id, e.g. ``Qwen/Qwen2-1.5B`` with
``Qwen/Qwen2-0.5B`` for a reader with a network).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from servelab.errors import ParameterError
from servelab.models import load_model
from servelab.models.shape import ModelShape


@dataclass
class ModelSet:
    target: str  # the target's name
    hf: dict[str, object]  # name -> HF model (target first)
    source: str  # "trained family", "specs"
    family: object = None  # the trained Family, if any
    prompt_source: str = ""
    _prompts: object = field(default=None, repr=False)

    @property
    def drafts(self) -> list[str]:
        return [n for n in self.hf if n != self.target]

    def pairs(self, middle_target: bool = True) -> list[tuple[str, str]]:
        """(draft, target) pairs: every draft for the target; with ``middle_target``, also every smaller draft for
        the largest draft (a second target, with a different cost ratio and acceptance)."""
        out = [(d, self.target) for d in self.drafts]
        if middle_target and len(self.drafts) >= 2:
            size = {d: ModelShape.from_config(self.hf[d].config).params for d in self.drafts}
            middle = max(self.drafts, key=size.get)
            out += [(d, middle) for d in self.drafts if size[d] < size[middle]]
        return out

    def prompts(self, n: int, length: int, seed: int = 0) -> list[list[int]]:
        """``n`` prompts of ``length`` tokens: held-out files of the family, else random ids (then α is meaningless
        for a trained pair, and says only that the code runs for random models)."""
        if self.family is not None:
            return self.family.eval_prompts(n, length, seed=seed)
        vocab = self.hf[self.target].config.vocab_size
        g = torch.Generator().manual_seed(seed)
        return [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(n)]


def _name(spec: str) -> str:
    return spec.rstrip("/").split("/")[-1].removeprefix("config:")


def load_model_set(
    target: str | None,
    drafts: list[str] | None,
    *,
    profile: str,
    dtype: str,
    device: str,
    cache_dir=None,
    progress: bool = True,
) -> ModelSet:
    """``target``/``drafts`` None: train (or load the cached) family of ``profile``; else load the specs given."""
    if (target is None) != (drafts is None):
        raise ParameterError("give both target and drafts (specs), or neither (the trained family)")
    if target is None:
        from servelab.studies.common.family.train import train_family

        fam = train_family(profile, cache_dir=cache_dir, progress=progress)
        specs = {fam.target_name: str(fam.target)} | {n: str(p) for n, p in fam.drafts.items()}
        hf = {n: load_model(s, dtype=dtype, device=device, load_tokenizer=False).model for n, s in specs.items()}
        return ModelSet(fam.target_name, hf, "trained family", fam, "held-out files of the training corpus")
    if not drafts:
        raise ParameterError("drafts must name at least one draft model")
    hf = {_name(target): load_model(target, dtype=dtype, device=device, load_tokenizer=False).model}
    for i, d in enumerate(drafts):
        name = _name(d)
        if name in hf:
            name = f"{name}#{i}"
        hf[name] = load_model(d, dtype=dtype, device=device, seed=i + 1, load_tokenizer=False).model
    vocabs = {n: m.config.vocab_size for n, m in hf.items()}
    if len(set(vocabs.values())) != 1:
        raise ParameterError(f"draft and target vocabularies differ: {vocabs}")
    return ModelSet(_name(target), hf, "specs", None, "random token ids")


def native_models(ms: ModelSet, max_model_len: int) -> dict[str, object]:
    """Each model of ``ms`` as the project's model code (``models.native``), for the engines that speculate with them
    (``sweep.SweepEngines``); the HF models stay for what runs through HF."""
    from servelab.models.native import native_from_hf

    return {name: native_from_hf(model, max_positions=max_model_len) for name, model in ms.hf.items()}
