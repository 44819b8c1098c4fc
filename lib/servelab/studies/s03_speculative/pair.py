"""The models of a speculative study: a target and its drafts, as HF models and as ``PagedLM``s.

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
from servelab.spec.paged_lm import PagedLM


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


def paged_models(
    ms: ModelSet, max_model_len: int, max_gamma: int, *, targets=None, cuda_graphs: bool = True
) -> dict[str, PagedLM]:
    """A ``PagedLM`` per model: a target (``ms.target`` and any in ``targets``) steps up to γ_max + 1 rows (the
    verify), a draft only up to 2 (its catch-up)."""
    targets = set(targets or ()) | {ms.target}
    out = {}
    for name, model in ms.hf.items():
        rows = max_gamma + 1 if name in targets else 2
        out[name] = PagedLM.from_hf(model, max_model_len, rows, name=name, cuda_graphs=cuda_graphs)
    return out


class SpeculativePair:
    """The public entry point for other studies: a draft → target pair on the engine, ready to generate.

    pair = SpeculativePair.from_hf(target_hf, draft_hf, max_model_len=1024, gamma=4)
    gen = pair.generate(prompt_ids, SamplingParams(max_tokens=128, ignore_eos=True))   # speculative
    ref = pair.autoregressive(prompt_ids, SamplingParams(max_tokens=128, ignore_eos=True))  # target alone
    gen.tokens, gen.accepted, gen.proposed, gen.rounds, gen.seconds
    """

    def __init__(self, target: PagedLM, draft: PagedLM, gamma=4):
        from servelab.spec.decoder import SpeculativeDecoder

        self.target, self.draft = target, draft
        self.decoder = SpeculativeDecoder(target, draft, gamma=gamma)

    @classmethod
    def from_hf(cls, target_hf, draft_hf, *, max_model_len: int, gamma=4, cuda_graphs: bool = True) -> SpeculativePair:
        from servelab.spec.gamma import gamma_policy

        gmax = gamma_policy(gamma).max_gamma
        target = PagedLM.from_hf(target_hf, max_model_len, gmax + 1, name="target", cuda_graphs=cuda_graphs)
        draft = PagedLM.from_hf(draft_hf, max_model_len, 2, name="draft", cuda_graphs=cuda_graphs)
        return cls(target, draft, gamma)

    def generate(self, prompt: list[int], params=None):
        try:
            return self.decoder.generate(prompt, params)
        finally:
            self.decoder.release()

    def autoregressive(self, prompt: list[int], params=None):
        from servelab.spec.decoder import autoregressive

        try:
            return autoregressive(self.target, prompt, params)
        finally:
            self.target.reset()
