"""Drafts distilled from a real target's own generations, cached on disk.

1. **Data**: the target answers the training chat prompts (``prompts.py``): one greedy continuation each (what
   greedy speculative decoding must reproduce) and ``samples`` sampled ones (variety), as EAGLE and Medusa
   drafts are trained on their target's outputs rather than on the original corpus.
2. **Drafts**: a draft of k layers starts as the target's first k layers, final norm and head (a self-draft,
   ``servelab.speculative.self_draft``) and is trained to predict the target's tokens (cross-entropy on the answer
   positions). Embedding and tied head stay frozen (the target's own, as EAGLE keeps them), so a draft learns only
   what its k layers must do differently from the target's first k.
3. **Budgets**: each draft trains for ``train_steps`` optimizer steps (learning rate: warm-up, then cosine over the
   steps), capped at ``train_s`` seconds of wall time; the generations are not timed against it. A step count, not a
   time, fixes the draft: two runs of one recipe (the parts of one repeat, trained on different machines) train the
   same draft, up to the GPU's non-determinism. ``train_steps=None`` trains for ``train_s`` seconds instead. Nothing
   held out chooses a model: the last step's weights are the draft.

Everything lands under ``$SERVELAB_TRAINED`` (else the system's temp dir), keyed by a hash of the recipe, the
target and the prompts: generations in ``gen-<hash>/``, drafts in ``drafts-<hash>/``. A second call loads them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from servelab.errors import ParameterError
from servelab.studies.common.drafts.generate import continuations
from servelab.studies.common.drafts.prompts import chat_prompts, encode_chat

DISTILL_FORMAT = 1  # bump when the on-disk layout changes


@dataclass(frozen=True)
class DistillRecipe:
    profile: str
    draft_layers: tuple[int, ...]  # one draft per entry: its decoder layers
    train_prompts: int  # training chat prompts answered by the target
    gen_tokens: int  # longest answer generated, tokens
    samples: int  # sampled answers per prompt, besides the greedy one
    temperature: float  # of the sampled answers
    gen_batch: int
    train_s: float  # wall-time budget of each draft's training, seconds
    batch_size: int  # sequences per step
    lr: float
    warmup_steps: int
    seed: int = 0
    train_steps: int | None = None  # optimizer steps per draft (None: as many as fit in train_s)

    def gen_key(self, target: str) -> dict:
        """What fixes the generations: the target, the prompts themselves (their texts, hashed: a change of templates
        or topics must not load another prompt set's answers) and how they were generated (the batch too: bf16
        greedy answers of left-padded batches depend on it)."""
        return dict(
            target=target,
            prompts=self.train_prompts,
            texts=_digest(chat_prompts("train", self.train_prompts, seed=self.seed)),
            gen_batch=self.gen_batch,
            tokens=self.gen_tokens,
            samples=self.samples,
            temperature=self.temperature,
            seed=self.seed,
            format=DISTILL_FORMAT,
        )


RECIPES = {
    # H200: ~1,200 answers of ≤ 256 tokens (~1 min), then 60 s per draft
    # (1,500 steps: a guess at what fits in 60 s there; the cap is 120 s, and loss.csv records the steps and seconds)
    "full": DistillRecipe("full", (2, 6), 600, 256, 1, 0.8, 100, 120.0, 32, 3e-4, 20, train_steps=1500),
    # CPU, CI: a handful of short answers and a few steps, to exercise the path
    "smoke": DistillRecipe("smoke", (1, 2), 4, 8, 0, 0.8, 4, 30.0, 2, 3e-4, 2, train_steps=6),
}


@dataclass
class DistilledDrafts:
    target: str
    recipe: DistillRecipe
    dir: Path
    drafts: dict[str, Path]  # name -> HF model directory, smallest first
    loss: pd.DataFrame  # draft, step, seconds, tokens, loss
    timings: dict[str, float]  # generate_s, and train_s per draft
    data: dict  # answers, tokens, mean answer length
    cached: bool

    def summary(self) -> pd.DataFrame:
        """One row per draft: layers, training steps, tokens seen, seconds, the first and last 20 steps' loss."""
        rows = []
        for name, layers in zip(self.drafts, self.recipe.draft_layers, strict=True):
            g = self.loss[self.loss["draft"] == name]
            rows.append(
                dict(
                    draft=name,
                    layers=layers,
                    steps=int(g["step"].max()) if len(g) else 0,
                    tokens_seen=int(g["tokens"].max()) if len(g) else 0,
                    train_s=self.timings.get(f"train_{name}_s", float("nan")),
                    first_loss=float(g["loss"].head(20).mean()) if len(g) else float("nan"),
                    last_loss=float(g["loss"].tail(20).mean()) if len(g) else float("nan"),
                )
            )
        return pd.DataFrame(rows)


def draft_name(layers: int) -> str:
    return f"smollm2-draft-{layers}L"


def default_cache_dir() -> Path:
    return Path(os.environ.get("SERVELAB_TRAINED") or Path(tempfile.gettempdir()) / "servelab-trained")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def distill_drafts(
    target: str,
    profile: str,
    *,
    cache_dir: Path | None = None,
    device: str = "cpu",
    recipe: DistillRecipe | None = None,
    progress: bool = False,
) -> DistilledDrafts:
    """The drafts of ``recipe`` (default: the profile's) for the target ``target`` (a loader spec), trained now or
    loaded from the cache."""
    if recipe is None:
        if profile not in RECIPES:
            raise ParameterError(f"no distillation recipe for profile {profile!r}; known: {sorted(RECIPES)}")
        recipe = RECIPES[profile]
    root = Path(cache_dir or default_cache_dir()) / "smollm2-distill"
    out = root / f"drafts-{_digest(dict(asdict(recipe), target=target, data=recipe.gen_key(target)))}"
    if (out / "manifest.json").exists():
        return _load(out, target, recipe, cached=True)
    from servelab.models import load_model
    from servelab.studies.common.family.train import quiet_transformers

    with quiet_transformers():
        lm = load_model(target, dtype="bfloat16" if device == "cuda" else "float32", device=device)
        gen_dir = root / f"gen-{_digest(recipe.gen_key(target))}"
        data, gen_s = _generations(lm, recipe, gen_dir, progress)
        _train_all(lm.model, data, recipe, out, gen_s, progress)
    return _load(out, target, recipe, cached=False)


def _generations(lm, recipe: DistillRecipe, gen_dir: Path, progress: bool) -> tuple[list[dict], float]:
    """[{prompt, answer}] token ids, from the cache or generated now; and the seconds generating took (0 cached)."""
    path = gen_dir / "generations.json"
    if path.exists():
        return json.loads(path.read_text())["rows"], 0.0
    tok, model = lm.tokenizer, lm.model
    prompts = encode_chat(tok, chat_prompts("train", recipe.train_prompts, seed=recipe.seed))
    eos = eos_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    t0 = time.perf_counter()
    rows = []
    for k in range(1 + recipe.samples):
        answers = continuations(
            model,
            prompts,
            recipe.gen_tokens,
            eos_ids=eos,
            pad_id=pad,
            batch_size=recipe.gen_batch,
            temperature=0.0 if k == 0 else recipe.temperature,
            seed=recipe.seed + 1000 * k,
            progress=progress,
        )
        rows += [dict(prompt=p, answer=a, sampled=k > 0) for p, a in zip(prompts, answers, strict=True) if a]
    seconds = time.perf_counter() - t0
    _write_atomic(gen_dir, {"generations.json": json.dumps(dict(rows=rows, seconds=seconds))})
    return rows, seconds


def eos_ids(model, tokenizer) -> list[int]:
    """The ids that end an answer: the generation config's, and the tokenizer's end-of-turn token."""
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ParameterError("the target names no end-of-sequence token")
    return sorted(set(int(i) for i in ids))


def init_draft(target, layers: int):
    """A stand-alone copy of the target's first ``layers`` layers, final norm and head (embedding frozen)."""
    from servelab.speculative.self_draft import self_draft

    draft = copy.deepcopy(self_draft(target, layers)).float()
    draft.model.embed_tokens.weight.requires_grad_(False)  # tied to the head: both stay the target's
    return draft


def _train_all(target, data: list[dict], recipe: DistillRecipe, out: Path, gen_s: float, progress: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent if out.parent.exists() else None))
    try:
        timings, losses = {"generate_s": gen_s}, []
        for layers in recipe.draft_layers:
            name = draft_name(layers)
            draft, curve, seconds = train_draft(target, layers, data, recipe, progress=progress)
            draft.save_pretrained(tmp / name)
            timings[f"train_{name}_s"] = seconds
            losses += [dict(r, draft=name) for r in curve]
        answers = [len(r["answer"]) for r in data]
        manifest = dict(
            recipe=asdict(recipe),
            timings=timings,
            data=dict(answers=len(answers), tokens=sum(answers), mean_answer=sum(answers) / max(1, len(answers))),
        )
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        pd.DataFrame(losses).to_csv(tmp / "loss.csv", index=False)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():  # another process finished first: keep its drafts
            shutil.rmtree(tmp)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def lr_at(elapsed_s: float, budget_s: float, step: int, peak: float, warmup: int, steps: int | None = None) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from ``peak`` to 10% of it over ``steps`` (else over the
    wall-time budget)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, step / steps) if steps else min(1.0, elapsed_s / budget_s)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _batches(data: list[dict], batch_size: int, seed: int):
    """Endless shuffled batches: (input ids, attention mask, loss mask) with the answer's positions marked."""
    import torch

    g = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(data), generator=g).tolist()
        for s in range(0, len(order) - batch_size + 1, batch_size):
            rows = [data[i] for i in order[s : s + batch_size]]
            seqs = [r["prompt"] + r["answer"] for r in rows]
            width = max(len(x) for x in seqs)
            ids = torch.zeros(len(seqs), width, dtype=torch.long)
            att, tgt = torch.zeros_like(ids), torch.zeros_like(ids, dtype=torch.bool)
            for i, (r, x) in enumerate(zip(rows, seqs, strict=True)):
                ids[i, : len(x)] = torch.tensor(x)
                att[i, : len(x)] = 1
                tgt[i, len(r["prompt"]) : len(x)] = True  # positions whose token the draft must predict
            yield ids, att, tgt


def train_draft(target, layers: int, data: list[dict], recipe: DistillRecipe, *, progress: bool = False):
    """Train one draft for ``recipe.train_steps`` steps, at most ``recipe.train_s`` seconds; (the draft in eval mode,
    its loss curve, seconds taken)."""
    import torch
    from tqdm.auto import tqdm

    if not data:
        raise ParameterError("no generations to distil from")
    dev = target.device
    torch.manual_seed(recipe.seed + layers)
    draft = init_draft(target, layers).to(dev).train()
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0, fused=dev.type == "cuda")
    batches = _batches(data, min(recipe.batch_size, len(data)), recipe.seed + layers)
    curve, tokens, step = [], 0, 0
    bar = tqdm(desc=f"distil {draft_name(layers)}", disable=not progress, leave=False)
    t0 = time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < recipe.train_s and step < (recipe.train_steps or math.inf):
        ids, att, tgt = (x.to(dev) for x in next(batches))
        for group in opt.param_groups:
            group["lr"] = lr_at(elapsed, recipe.train_s, step, recipe.lr, recipe.warmup_steps, recipe.train_steps)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = draft(input_ids=ids, attention_mask=att).logits
        # the logit at position p predicts token p + 1
        loss = torch.nn.functional.cross_entropy(logits[:, :-1][tgt[:, 1:]].float(), ids[:, 1:][tgt[:, 1:]])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        tokens += int(tgt[:, 1:].sum())
        curve.append(dict(step=step, seconds=time.perf_counter() - t0, tokens=tokens, loss=float(loss.detach())))
        bar.update(1)
    bar.close()
    return draft.eval(), curve, time.perf_counter() - t0


def _write_atomic(folder: Path, files: dict[str, str]) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    for name, text in files.items():
        (tmp / name).write_text(text)
    if folder.exists():
        shutil.rmtree(tmp)
    else:
        tmp.rename(folder)


def _load(out: Path, target: str, recipe: DistillRecipe, cached: bool) -> DistilledDrafts:
    manifest = json.loads((out / "manifest.json").read_text())
    drafts = {draft_name(k): out / draft_name(k) for k in recipe.draft_layers}
    loss = pd.read_csv(out / "loss.csv")
    return DistilledDrafts(target, recipe, out, drafts, loss, manifest["timings"], manifest["data"], cached)
