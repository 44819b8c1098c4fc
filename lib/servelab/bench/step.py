"""One engine step as a timed callable, with the contract of ``servelab.bench.hf_modes``:

    fn, before_each = engine_step(hf_model, batch, new_tokens, context, decodes=0, decode_context=0)

The step is one of the kinds a server runs:

- **decode** (``new_tokens=1``, ``context >= 1``): ``batch`` sequences of ``context`` cached tokens each
  compute one token (a CUDA-graph replay on a GPU, input copies included);
- **prefill** (``context=0``): ``batch`` fresh prompts of ``new_tokens`` tokens;
- **prefill with context** (``new_tokens > 1``, ``context > 0``): each of ``batch`` sequences holds ``context``
  cached tokens and computes ``new_tokens`` more. With one sequence this is a chunk of chunked prefill: the
  engine prefills the first ``context`` tokens of a ``context + new_tokens`` prompt under a token budget of
  ``context`` (``_token_budget``), and the prompt's next chunk is the timed step. Chunked prefill never has two
  sequences mid-prompt, so with ``batch > 1`` the context comes from the prefix cache instead, as when several
  requests share cached prefixes: each sequence's first ``context`` tokens (a multiple of the block size) are
  computed and cached by a request that then finishes, and ``batch`` requests that extend those prefixes are
  admitted together, each starting after its cached prefix;
- **mixed** (``decodes >= 1``, ``batch=1``): ``decodes`` sequences at ``decode_context`` cached tokens decode one
  token each, and one prompt computes a chunk of ``new_tokens`` tokens after ``context`` cached ones, in one step,
  as chunked prefill schedules them (decodes first, then the chunk).

Whatever the kind, the timed step is what the engine's own scheduler schedules next; ``prepared_step`` checks
its composition. ``fn()`` runs the model forward of that step and returns its logits; scheduling and sampling
are not in it (``Engine.step`` times those). Repeated calls write the same slots, so every call does the same
work. ``graphs=False`` gives the same engine without any CUDA graph (the ``engine_eager`` mode): every kernel
launched from Python, which is what the graphs save.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from servelab.engine.config import EngineConfig
from servelab.engine.engine import Engine
from servelab.engine.scheduler import ScheduledBatch
from servelab.engine.sequence import SamplingParams
from servelab.errors import ParameterError


def step_kind(batch: int, new_tokens: int, context: int, decodes: int = 0, decode_context: int = 0) -> str:
    """``"decode"``, ``"prefill"`` or ``"mixed"``; a ParameterError for a step the engine cannot be set up to run."""
    for name, v, low in (
        ("batch", batch, 1),
        ("new_tokens", new_tokens, 1),
        ("context", context, 0),
        ("decodes", decodes, 0),
        ("decode_context", decode_context, 0),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ParameterError(f"{name} must be an integer >= {low}, got {v!r}")
    if decodes:
        if batch != 1:
            raise ParameterError(f"a mixed step holds one prefill chunk (batch=1), got batch={batch}")
        if decode_context < (2 if context else 1):  # with a cached chunk context, preparing decodes once more
            raise ParameterError(
                f"the decodes of this mixed step need decode_context >= {2 if context else 1}, got {decode_context}"
            )
        return "mixed"
    if decode_context:
        raise ParameterError(f"decode_context={decode_context} without decodes: only a mixed step has both")
    return "decode" if new_tokens == 1 and context > 0 else "prefill"


def timed_tokens(batch: int, new_tokens: int, decodes: int = 0) -> int:
    """Tokens the timed step computes: ``batch · new_tokens`` (decodes are ``new_tokens=1``), plus a mixed step's
    decodes."""
    return batch * new_tokens + decodes


@contextmanager
def _token_budget(engine: Engine, tokens: int):
    """Run preparing steps under a smaller per-step token budget of ``tokens`` (the scheduler's own limit), then
    restore it.

    Chunked prefill cuts a prompt where the budget ends, so the budget places the cut: the preparing step
    computes exactly ``context`` tokens, and the timed step (under the engine's configured budget) the rest.
    """
    scheduler = engine.scheduler
    configured = scheduler.max_num_batched_tokens
    if tokens > configured:
        raise RuntimeError(f"a preparing step of {tokens} tokens exceeds the engine's budget ({configured})")
    scheduler.max_num_batched_tokens = tokens
    try:
        yield
    finally:
        scheduler.max_num_batched_tokens = configured


def _run_until(engine: Engine, done, what: str, max_steps: int = 10_000) -> None:
    for _ in range(max_steps):
        if done():
            return
        engine.step()
    raise RuntimeError(f"preparing the step: {what} not reached after {max_steps} engine steps")


def _request(engine: Engine, g: torch.Generator, prompt_len: int, max_tokens: int | None = None):
    """A request of ``prompt_len`` random tokens that may run up to ``max_tokens`` (default: to max_model_len)."""
    ids = torch.randint(0, engine.model.shape.vocab, (prompt_len,), generator=g).tolist()
    limit = engine.max_model_len - prompt_len
    return engine.add_request(ids, SamplingParams(max_tokens=min(max_tokens or limit, limit), ignore_eos=True))


def _prepare_decode(engine, g, batch, new_tokens, context, decodes, decode_context):
    """One prefill of every prompt: each ends with ``context`` cached tokens and one sampled."""
    seqs = [_request(engine, g, context) for _ in range(batch)]
    _run_until(engine, lambda: all(s.num_computed_tokens >= context for s in seqs), f"context {context}")
    return [(context, 1)] * batch


def _prepare_fresh(engine, g, batch, new_tokens, context, decodes, decode_context):
    for _ in range(batch):
        _request(engine, g, new_tokens)
    return [(0, new_tokens)] * batch


def _prepare_chunk(engine, g, batch, new_tokens, context, decodes, decode_context):
    """A chunk after earlier chunks of the same prompt."""
    seq = _request(engine, g, context + new_tokens)
    with _token_budget(engine, context):
        engine.step()
    if seq.num_computed_tokens != context:
        raise RuntimeError(f"the preparing chunk computed {seq.num_computed_tokens} tokens, not {context}")
    return [(context, new_tokens)]


def _prepare_cached_prefixes(engine, g, batch, new_tokens, context, decodes, decode_context):
    """Several chunks after cached prefixes."""
    block = engine.config.block_size
    if not engine.config.prefix_caching or context % block:
        raise ParameterError(
            f"a prefill of {batch} sequences after cached context needs prefix caching and a "
            f"context that is a multiple of the block size ({block}), got {context}"
        )
    vocab = engine.model.shape.vocab
    prefixes = [torch.randint(0, vocab, (context,), generator=g).tolist() for _ in range(batch)]
    warm = [engine.add_request(p, SamplingParams(max_tokens=1, ignore_eos=True)) for p in prefixes]
    _run_until(engine, lambda: all(s.is_finished for s in warm), "cached prefixes")
    for p in prefixes:
        tail = torch.randint(0, vocab, (new_tokens,), generator=g).tolist()
        engine.add_request(
            p + tail, SamplingParams(max_tokens=engine.max_model_len - context - new_tokens, ignore_eos=True)
        )
    return [(context, new_tokens)] * batch


def _prepare_mixed(engine, g, batch, new_tokens, context, decodes, decode_context):
    """Decodes at ``decode_context``, then one chunk of ``new_tokens`` after ``context``.

    With a cached context the chunk's first part is computed in a step that also decodes every sequence once,
    so the decodes start one token short to end the preparation at exactly ``decode_context``.
    """
    prompt = decode_context - 1 if context else decode_context
    seqs = [_request(engine, g, prompt) for _ in range(decodes)]
    _run_until(engine, lambda: all(s.num_computed_tokens >= prompt for s in seqs), f"context {prompt}")
    chunked = _request(engine, g, context + new_tokens)
    if context:
        with _token_budget(engine, decodes + context):
            engine.step()
        if chunked.num_computed_tokens != context or any(s.num_computed_tokens != decode_context for s in seqs):
            raise RuntimeError("the preparing step did not end at the step's contexts")
    return [(decode_context, 1)] * decodes + [(context, new_tokens)]


def _preparation(kind: str, batch: int, context: int):
    if kind == "decode":
        return _prepare_decode
    if kind == "mixed":
        return _prepare_mixed
    if context == 0:
        return _prepare_fresh
    return _prepare_chunk if batch == 1 else _prepare_cached_prefixes


def prepared_step(
    engine: Engine,
    batch: int,
    new_tokens: int,
    context: int,
    *,
    decodes: int = 0,
    decode_context: int = 0,
    seed: int = 0,
) -> ScheduledBatch:
    """Add requests to ``engine``, bring them to the step's cached contexts, return the next scheduled batch.

    ``engine`` must be fresh and sized for the step (``step_engine_config``). Raises RuntimeError if the
    scheduler's next batch is not the step asked for (a budget or a pool too small, or a policy that
    schedules it otherwise).
    """
    kind = step_kind(batch, new_tokens, context, decodes, decode_context)
    g = torch.Generator().manual_seed(seed)
    prepare = _preparation(kind, batch, context)
    expected = prepare(engine, g, batch, new_tokens, context, decodes, decode_context)
    engine.synchronize()  # the last preparing step's tokens on the host: the timed step's inputs are all known
    step = engine.scheduler.schedule()
    got = sorted((it.start, it.num_tokens) for it in step.items)
    if got != sorted(expected):
        raise RuntimeError(
            f"the scheduler's next step is not the {kind} step asked for: {len(step.items)} items, "
            f"{step.num_tokens} tokens (expected {len(expected)} items, "
            f"{sum(n for _, n in expected)} tokens); raise max_num_batched_tokens / max_num_seqs"
        )
    return step


def step_engine_config(
    batch: int,
    new_tokens: int,
    context: int,
    *,
    decodes: int = 0,
    decode_context: int = 0,
    block_size: int = 16,
    attention_backend: str = "auto",
    compile: bool = False,
    graphs: bool = True,
    fused_rope_kv_write: bool | str = "auto",
    small_batch: bool | str = "auto",
    pdl: bool | str = "auto",
) -> EngineConfig:
    """The smallest engine that holds the step and its preparation, with CUDA graphs for exactly this step.

    With ``graphs``, a decode step gets one decode graph (its batch) and a prefill or mixed step one whole-step
    graph at its token count, so the timed step replays a graph and nothing else is captured; without, no graph.
    """
    kind = step_kind(batch, new_tokens, context, decodes, decode_context)
    cached_prefixes = kind == "prefill" and context > 0 and batch > 1
    if cached_prefixes and context % block_size:
        raise ParameterError(
            f"a prefill of {batch} sequences after cached context reuses cached prefixes: the context "
            f"must be a multiple of the block size ({block_size}), got {context}"
        )
    tokens = timed_tokens(batch, new_tokens, decodes)
    # room for each sequence's tokens up to the timed step: a decode's prompt, the token its prefill sampled and the
    # timed one; a chunk's whole prompt and the token it samples; a mixed step's decodes may decode once more
    max_len = context + 2 if kind == "decode" else max(context + new_tokens + 1, decode_context + 2 if decodes else 0)
    seqs = batch + decodes
    # the largest preparing step: decoding sequences are prefilled in one step, so that all of them reach their
    # context together; a chunk's context is computed in one step (beside a mixed step's decodes)
    if kind == "decode":
        prepare = batch * context
    elif kind == "mixed":
        prepare = max(decodes * decode_context, decodes + context)
    else:
        prepare = context if batch == 1 else 0
    return EngineConfig(
        block_size=block_size,
        max_num_seqs=seqs,
        max_num_batched_tokens=max(tokens, prepare, seqs),
        max_model_len=max_len,
        num_blocks=seqs * -(-max_len // block_size) + 1,
        cuda_graphs=graphs and kind == "decode",
        graph_batch_sizes=(batch,),
        step_graphs=graphs and kind != "decode",
        step_graph_sizes=(tokens,) if graphs and kind != "decode" else None,
        scheduler="chunked_prefill",
        prefix_caching=cached_prefixes,
        attention_backend=attention_backend,
        compile=compile,
        fused_rope_kv_write=fused_rope_kv_write,
        small_batch=small_batch,
        pdl=pdl,
    )


def engine_step(
    model,
    batch: int,
    new_tokens: int,
    context: int,
    *,
    decodes: int = 0,
    decode_context: int = 0,
    seed: int = 0,
    attention_backend: str = "auto",
    compile: bool = False,
    graphs: bool = True,
    fused_rope_kv_write: bool | str = "auto",
    small_batch: bool | str = "auto",
    pdl: bool | str = "auto",
):
    """``(fn, None)``: ``fn()`` runs the project's engine forward for the step (see the module docstring)."""
    cfg = step_engine_config(
        batch,
        new_tokens,
        context,
        decodes=decodes,
        decode_context=decode_context,
        attention_backend=attention_backend,
        compile=compile,
        graphs=graphs,
        fused_rope_kv_write=fused_rope_kv_write,
        small_batch=small_batch,
        pdl=pdl,
    )
    engine = Engine.from_hf(model, cfg)
    step = prepared_step(engine, batch, new_tokens, context, decodes=decodes, decode_context=decode_context, seed=seed)
    runner = engine.runner

    def counters():
        return runner.graph_steps, getattr(runner, "step_graph_steps", 0), runner.eager_steps

    before = counters()  # the preparing steps ran too: count only what the timed calls add

    def fn():
        return runner.logits(step)[0]

    def path() -> str:
        """How the timed calls ran: ``decode graph``, ``step graph`` or ``eager`` (several, comma-separated)."""
        names = ("decode graph", "step graph", "eager")
        ran = [name for name, a, b in zip(names, before, counters(), strict=True) if b > a]
        return ", ".join(ran) or "not run"

    fn.engine, fn.step, fn.path = engine, step, path  # for the caller's records (backend, graphs) and checks
    return fn, None


def engine_eager_step(model, batch: int, new_tokens: int, context: int, **kw):
    """The same engine step with no CUDA graph: each kernel launched from Python (the ``engine_eager`` mode).

    A prefill or mixed step runs the padded ragged step that its whole-step graph replays, uncaptured
    (``enable_step_graphs(capture=False)``), so that the kernels are the graph's and the difference from the
    ``engine`` mode is the launches alone: without it the step took the unbucketed path's prefill attention and a
    gather, other kernels (a 4096-token prefill ran 8% faster so on the H200 than in its graph, which read as a
    negative launch overhead). Its ``path()`` says ``ragged step, uncaptured``."""
    fn, extra = engine_step(model, batch, new_tokens, context, graphs=False, **kw)
    decodes = kw.get("decodes", 0)
    if step_kind(batch, new_tokens, context, decodes, kw.get("decode_context", 0)) != "decode":
        fn.engine.runner.enable_step_graphs((timed_tokens(batch, new_tokens, decodes),), capture=False)
        counted = fn.path
        fn.path = lambda: counted().replace("step graph", "ragged step, uncaptured")
    return fn, extra
