"""Training one model within a wall-time budget: its config, the optimiser, the learning-rate schedule, the loop.

Training is bounded by wall time, not by a token count: a few probe steps measure the step time, and the
schedule (linear warm-up, cosine decay) is laid out over the steps that fit the budget. Tokens seen, throughput
(tokens/s, TFLOP/s by 6·N·T) and held-out loss are recorded.
"""

from __future__ import annotations

import contextlib
import math
import time

import numpy as np

from servelab.errors import ParameterError
from servelab.studies.common.family.data import TokenStream
from servelab.studies.common.family.recipe import FamilyRecipe, ModelRecipe


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


def _optimizer(model, lr: float, cuda: bool):
    """AdamW, weight decay 0.1 on matrices only (not on norms and biases), fused on CUDA."""
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        **({"fused": True} if cuda else {}),
    )


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
    that fit the budget, and the schedule (warm-up, cosine decay) is laid over that plan. A hard stop at 1.2× the
    budget guards against a slowdown after planning.
    """
    import torch
    from tqdm import tqdm  # not tqdm.auto: it warns (TqdmWarning) on import where ipywidgets is missing
    from transformers import AutoModelForCausalLM

    cuda = torch.device(device).type == "cuda"
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    n_params, n_matmul = count_params(model), matmul_params(model)
    opt = _optimizer(model, recipe.lr, cuda)
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


@contextlib.contextmanager
def threads_for(rec: FamilyRecipe, device):
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
