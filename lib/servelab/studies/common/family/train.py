"""A family of small language models trained offline, for the speculative-decoding studies (3 and 6).

Acceptance depends on how well a draft predicts its target, so random weights will not do. This module
trains, on the Python source already on disk (:mod:`servelab.studies.common.family.corpus`):

- a byte-level BPE tokenizer (``tokenizers``), saved as a ``PreTrainedTokenizerFast`` so that
  ``AutoTokenizer.from_pretrained(dir)`` works;
- one target (≈124M parameters in the full profile) and three drafts (≈6M, 13M, 26M), Llama
  architecture, all with that tokenizer, saved with ``save_pretrained`` so that
  ``servelab.models.load_model(dir)``, HF ``generate`` and ``assistant_model`` work on them.

Training is bounded by wall time, not by a token count: each model gets a budget in seconds, a few
probe steps measure its step time, and the learning-rate schedule (linear warm-up, cosine decay) is laid
out over the steps that fit. Tokens seen, throughput (tokens/s, TFLOP/s by 6·N·T) and held-out loss are
recorded. Seeds are fixed; the step count depends on the machine's speed, which the record shows.

A family is cached under ``cache_dir`` (default ``$SERVELAB_TRAINED``, else a directory in the system's
temp dir) by a hash of the recipe and the corpus manifest: a second call with the same recipe on the same
corpus loads it instead of training (notebook 03 trains, notebook 06 loads).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.studies.common.family.corpus import Corpus, build_corpus, heldout_prompts
from servelab.studies.common.params import ParameterError, resolve_profile

EOS = "<|endoftext|>"  # separates files in the token stream; also BOS
PAD = "<|pad|>"
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
            with np.load(self.dir / "heldout_tokens.npz") as z:
                flat, offsets = z["tokens"], z["offsets"]
            self._heldout = [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
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


# ---------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE (GPT-2's pre-tokenisation) on ``texts``; returns a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise ParameterError(f"vocab_size must be at least 300 (256 bytes + specials + merges), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with tokenizers_parallel():
        tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )


def encode_files(tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Token ids of each text (batched and parallel in the Rust tokenizer), as int32 arrays."""
    backend = tokenizer.backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # no offsets: faster
    with tokenizers_parallel():
        return [np.asarray(e.ids, dtype=np.int32) for e in encode(texts, add_special_tokens=False)]


@contextlib.contextmanager
def tokenizers_parallel():
    """Let the Rust tokenizer use every core here, even where ``TOKENIZERS_PARALLELISM=false`` is set for the
    process (run scripts set it to silence the fork warning): on one core, encoding the full corpus would take
    a good part of the training budget. The Rust side reads the variable at each call; the old value returns."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def _sample_for_tokenizer(texts: list[str], max_bytes: int) -> list[str]:
    """Every k-th file, so the tokenizer sees all packages, not the first few, within ``max_bytes``."""
    total = sum(len(t) for t in texts)
    step = max(1, math.ceil(total / max_bytes))
    return texts[::step]


# ---------------------------------------------------------------------------------------------- models


def model_config(recipe: ModelRecipe, vocab_size: int, seq_len: int, eos_id: int, pad_id: int):
    from transformers import LlamaConfig

    if recipe.hidden_size % recipe.heads or recipe.heads % recipe.kv_heads:
        raise ParameterError(f"{recipe.name}: hidden_size must divide by heads and heads by kv_heads")
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.kv_heads,
        max_position_embeddings=max(2048, 2 * seq_len),
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=recipe.tie_embeddings,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )


def count_params(model) -> int:
    """Parameters, tied embeddings counted once (``parameters()`` de-duplicates shared tensors)."""
    return int(sum(p.numel() for p in model.parameters()))


def matmul_params(model) -> int:
    """Parameters that take part in matmuls per token (all but the input embedding lookup), for 6·N·T."""
    n = count_params(model)
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and out.weight is emb
    return n if tied else n - emb.numel()


class TokenStream:
    """Random training windows from one long token stream (files joined by EOS), on the device."""

    def __init__(self, tokens: np.ndarray, seq_len: int, device, seed: int):
        import torch

        if len(tokens) < seq_len + 2:
            raise ParameterError(f"corpus too small: {len(tokens)} tokens for windows of {seq_len + 1}")
        self.tokens = torch.as_tensor(tokens.astype(np.int64), device=device)
        self.seq_len = seq_len
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.offsets = torch.arange(seq_len + 1, device=device)

    def batch(self, batch_size: int):
        import torch

        starts = torch.randint(
            0, len(self.tokens) - self.seq_len - 1, (batch_size, 1), generator=self.gen, device=self.tokens.device
        )
        w = self.tokens[starts + self.offsets]
        return w[:, :-1], w[:, 1:]


def _eval_windows(heldout: list[np.ndarray], seq_len: int, n: int, eos_id: int) -> np.ndarray:
    """Up to ``n`` non-overlapping windows of seq_len+1 tokens from the held-out stream."""
    stream = np.concatenate([np.append(t, eos_id) for t in heldout]).astype(np.int64)
    k = min(n, (len(stream) - 1) // (seq_len + 1))
    if k < 1:
        raise ParameterError(f"held-out split too small: {len(stream)} tokens for one window of {seq_len + 1}")
    return stream[: k * (seq_len + 1)].reshape(k, seq_len + 1)


def _autocast(device):
    import torch

    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _loss(model, x, y):
    import torch.nn.functional as F

    logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def eval_loss(model, windows, device, batch_size: int) -> float:
    """Mean next-token cross-entropy (nats) over the held-out windows."""
    import torch

    model.eval()
    total, n = 0.0, 0
    with torch.no_grad(), _autocast(device):
        w = torch.as_tensor(windows, device=device)
        for i in range(0, len(w), batch_size):
            chunk = w[i : i + batch_size]
            total += float(_loss(model, chunk[:, :-1], chunk[:, 1:])) * len(chunk)
            n += len(chunk)
    model.train()
    return total / n


def lr_at(step: int, planned: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up to ``peak``, then cosine decay to ``floor``·peak at step ``planned``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, planned - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))


def train_model(
    recipe: ModelRecipe,
    config,
    stream: TokenStream,
    eval_windows: np.ndarray,
    *,
    device,
    seed: int,
    evals: int,
    log_every: int,
    progress: bool = True,
    settle_steps: int = 3,
):
    """Train one model within its wall-time budget; returns (model, loss rows, training record).

    The first ``settle_steps`` steps pay for allocation, lazy initialisation and kernel selection and
    are not used to estimate speed. From then on, at the first logged step and at every logged step
    during the first third of the budget, the step time measured so far re-plans the number of steps
    that fit the budget, and the schedule (warm-up, cosine decay) is laid over that plan. A hard stop at 1.2× the budget guards
    against a slowdown after planning.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    cuda = torch.device(device).type == "cuda"
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    n_params, n_matmul = count_params(model), matmul_params(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        **({"fused": True} if cuda else {}),
    )
    tokens_per_step = recipe.batch_size * stream.seq_len
    rows: list[dict] = []

    def plan(n: int) -> tuple[int, set[int]]:
        n = max(1, min(recipe.max_steps, n))
        return n, {max(1, round(n * (i + 1) / evals)) for i in range(evals)}

    planned, eval_at = plan(recipe.max_steps)
    bar = tqdm(total=planned, desc=recipe.name, disable=not progress, leave=False)
    loss_sum = torch.zeros((), device=device)
    loss_n = 0
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t_start = time.perf_counter()
    t_settled = None
    diverged = replanned = False
    step = 0
    while step < planned:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, planned, recipe.lr, recipe.warmup_steps)
        x, y = stream.batch(recipe.batch_size)
        with _autocast(device):
            loss = _loss(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_sum += loss.detach()
        loss_n += 1
        step += 1
        bar.update(1)
        if step == settle_steps:
            sync()
            t_settled = time.perf_counter()

        if step % log_every == 0 or step >= planned or step in eval_at:
            train_loss = float(loss_sum) / loss_n  # synchronises: the clock below is the device's
            now = time.perf_counter()
            elapsed = now - t_start
            if t_settled is not None and step > settle_steps and (elapsed < recipe.budget_s / 3 or not replanned):
                step_s = (now - t_settled) / (step - settle_steps)
                planned, eval_at = plan(step + int((recipe.budget_s - elapsed) / step_s))
                planned = max(planned, step)
                replanned = True
                bar.total = planned
                bar.refresh()
            elif elapsed > 1.2 * recipe.budget_s:
                planned = step  # slower than planned: stop here, with a final eval
            if not math.isfinite(train_loss):
                diverged, planned = True, step  # no point going on; the record says so
            row = dict(
                model=recipe.name,
                step=step,
                tokens=step * tokens_per_step,
                train_loss=train_loss,
                eval_loss=np.nan,
                elapsed_s=elapsed,
            )
            loss_sum.zero_()
            loss_n = 0
            if step in eval_at or step >= planned:
                row["eval_loss"] = eval_loss(model, eval_windows, device, recipe.batch_size)
            rows.append(row)
    sync()
    seconds = time.perf_counter() - t_start
    bar.close()
    tokens = step * tokens_per_step
    final = [r for r in rows if not np.isnan(r["eval_loss"])][-1]
    record = dict(
        model=recipe.name,
        params=n_params,
        steps=step,
        tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / seconds,
        tflop_s=6 * n_matmul * tokens / seconds / 1e12,
        final_train_loss=rows[-1]["train_loss"],
        final_eval_loss=final["eval_loss"],
        final_lr=lr_at(step - 1, planned, recipe.lr, recipe.warmup_steps),
        diverged=diverged,
    )
    return model.eval(), rows, record


# ---------------------------------------------------------------------------------------------- the family


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


def _recipe_for(profile: str, recipe: FamilyRecipe | None) -> FamilyRecipe:
    if recipe is not None:
        return recipe
    prof = resolve_profile(profile)
    return RECIPES[prof]


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

    rec = _recipe_for(profile, recipe)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ParameterError(f"seed must be a non-negative int, got {seed!r}")
    names = [m.name for m in rec.models]
    if len(rec.drafts) < 1 or len(set(names)) != len(names):
        raise ParameterError(f"a family needs a target and at least one draft with distinct names, got {names}")
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
        timings = {"corpus_s": time.perf_counter() - t0}
        t = time.perf_counter()
        train_texts = corpus.texts("train")
        tok = train_tokenizer(_sample_for_tokenizer(train_texts, rec.tokenizer_sample_bytes), rec.vocab_size)
        tok.save_pretrained(work / "tokenizer")
        timings["tokenizer_s"] = time.perf_counter() - t
        t = time.perf_counter()
        eos_id, pad_id = tok.convert_tokens_to_ids(EOS), tok.convert_tokens_to_ids(PAD)
        train_ids = encode_files(tok, train_texts)
        heldout_ids = encode_files(tok, corpus.texts("heldout"))
        flat = np.concatenate([np.append(t_, eos_id) for t_ in train_ids]).astype(np.int32)
        offsets = np.cumsum([0] + [len(t_) for t_ in heldout_ids])
        np.savez(work / "heldout_tokens.npz", tokens=np.concatenate(heldout_ids).astype(np.int32), offsets=offsets)
        timings["encode_s"] = time.perf_counter() - t
        stream = TokenStream(flat, rec.seq_len, device, seed)
        windows = _eval_windows(heldout_ids, rec.seq_len, rec.eval_windows, eos_id)

        with _threads_for(rec, device):
            loss_rows, records = _train_all(rec, tok, stream, windows, device, seed, progress, work)
        params = {r["model"]: r["params"] for r in records}
        del stream
        timings["total_s"] = time.perf_counter() - t0
        pd.DataFrame(loss_rows).to_csv(work / "loss.csv", index=False)
        pd.DataFrame(records).to_csv(work / "training.csv", index=False)
        meta = dict(
            format=FAMILY_FORMAT,
            key=key,
            seed=seed,
            recipe=asdict(rec),
            target=rec.target.name,
            drafts=[d.name for d in rec.drafts],
            params=params,
            manifest=corpus.manifest,
            device=str(device),
            timings=timings,
            train_tokens=int(len(flat)),
            heldout_tokens=int(offsets[-1]),
            vocab_size=len(tok),
        )
        (work / "family.json").write_text(json.dumps(meta, indent=2) + "\n")
        if final.exists():  # another process finished the same family first: keep theirs
            shutil.rmtree(work, ignore_errors=True)
        else:
            os.replace(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return load_family(final, cached=False)


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


@contextlib.contextmanager
def _threads_for(rec: FamilyRecipe, device):
    """Tiny models on the CPU (smoke, CI) train faster on one thread: a second one costs more in hand-offs than it
    computes, and on a busy machine it stalls. Restores the thread count afterwards."""
    import torch

    tiny = max(m.hidden_size for m in rec.models) <= 256
    if torch.device(device).type != "cpu" or not tiny:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


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
