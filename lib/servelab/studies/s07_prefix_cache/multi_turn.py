"""F7.2: a multi-turn chat, its history growing every turn; how much does the cache save per turn?

The conversation is generated once (greedy): turn t's prompt is the system prompt, every earlier user
message and reply, and a new user message. Each turn is then timed in both modes: cached (the cache holds
the conversation up to the previous reply, as a server that just answered it would) and uncached (the whole
history is prefilled again). Two times per turn: the time to the first token (``ttft``) and to the whole
reply (``turn``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm import tqdm  # not tqdm.auto: it warns (TqdmWarning) on import where ipywidgets is missing

from servelab.engine import Engine, SamplingParams
from servelab.studies.common.budget import SKIPPED, Budget
from servelab.studies.s07_prefix_cache.first_token import MODES, failure_status, random_tokens, recover, time_requests


def build_conversation(
    engine: Engine, turns: int, system_tokens: int, user_tokens: int, reply_tokens: int, seed: int = 0
) -> list[dict]:
    """``turns`` turns of random user messages and the engine's greedy replies: per turn its ``prompt`` (token
    ids), ``reply`` and ``history`` (what a server has computed before this turn: the previous prompt + reply)."""
    rng = np.random.default_rng(seed)
    vocab = engine.model.shape.vocab
    engine.set_prefix_caching(True)
    params = SamplingParams(max_tokens=reply_tokens, ignore_eos=True)
    history, out = random_tokens(rng, system_tokens, vocab), []
    previous = None
    for t in range(turns):
        prompt = history + random_tokens(rng, user_tokens, vocab)
        reply = engine.generate([prompt], params)[0]
        out.append({"turn": t + 1, "prompt": prompt, "reply": reply, "history": previous})
        previous = prompt + reply
        history = previous
    return out


def multi_turn_sweep(
    engine: Engine,
    conversation: list[dict],
    reply_tokens: int,
    *,
    warmup: int = 2,
    repeats: int = 7,
    turn_repeats: int = 2,
    budget: Budget | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per (turn, mode, metric): ``metric`` "ttft" (max_tokens 1) or "turn" (the whole reply), timing
    fields (ms), tokens computed and served from the cache, ``status``."""
    rows = []
    points = [(c, m) for c in conversation for m in MODES]
    for conv, mode in tqdm(points, desc="F7.2 turns", disable=not progress):
        base = {
            "turn": conv["turn"],
            "prompt_tokens": len(conv["prompt"]),
            "history_tokens": len(conv["history"]) if conv["history"] else 0,
            "mode": mode,
        }
        for metric, max_tokens, w, r in (("ttft", 1, warmup, repeats), ("turn", reply_tokens, 0, turn_repeats)):
            row = {**base, "metric": metric, "output_tokens": max_tokens}
            if budget is not None and budget.spent():
                rows.append({**row, "status": SKIPPED})
                continue
            try:
                row.update(
                    time_requests(
                        engine,
                        [conv["prompt"]],
                        mode,
                        primer=conv["history"],
                        max_tokens=max_tokens,
                        warmup=w,
                        repeats=r,
                    )
                )
                row["status"] = "ok"
            except Exception as e:  # noqa: BLE001
                recover(engine)
                row["status"] = failure_status(e)
            rows.append(row)
    return pd.DataFrame(rows)
