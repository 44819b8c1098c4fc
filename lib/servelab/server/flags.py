"""The server's flags, and the engine they describe (``servelab serve --help`` lists them).

    servelab serve HuggingFaceTB/SmolLM2-135M-Instruct --port 8000
    python -m servelab.server --model config:qwen2-0.5b --scheduler chunked_prefill \\
        --max-num-batched-tokens 512 --port 8000 --step-log steps.jsonl

vLLM's spellings work beside this project's: ``--enable-prefix-caching`` (``--prefix-caching``),
``--gpu-memory-utilization`` (``--memory-fraction``), ``--enforce-eager`` (``--no-cuda-graphs
--no-step-graphs``), ``--num-gpu-blocks-override`` (``--num-blocks``), and the model as the first argument.

All engine settings are turned into an engine in ONE place, ``engine_from_args``; a new engine option
(e.g. prefix caching, a draft model) adds its flag in ``add_engine_flags`` and its use there. vLLM's flags that
have no engine setting here are in ``vllm_flags.py``.

This module imports neither torch nor the engine at import time: ``--help`` answers at once, and a bad flag
fails before anything heavy loads (``engine_from_args`` imports them when it runs).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from servelab.errors import ParameterError
from servelab.server.vllm_flags import DTYPES, add_vllm_flags, check_vllm_flags

if TYPE_CHECKING:
    from servelab.engine import Engine, EngineConfig

# the scheduling policies' names (servelab.engine.policies.POLICIES, which imports the engine; a test keeps
# the two equal)
POLICY_NAMES = ("chunked_prefill", "eager_cont_batch", "fcfs")
# the data-parallel router's policies (servelab.sim.routers.ROUTERS; a test keeps the two equal)
ROUTER_NAMES = ("round_robin", "least_outstanding", "prefix_affinity")


def int_list(text: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` → (1, 2, 4, 8)."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


DEFAULT_MODEL = "config:tiny-llama"


class EnforceEager(argparse.Action):
    """vLLM's ``--enforce-eager``: no CUDA graphs of any kind."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.cuda_graphs = False
        namespace.step_graphs = False


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and engine")
    g.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL",
        help=f"model spec, as vLLM takes it: the same as --model (default {DEFAULT_MODEL})",
    )
    g.add_argument(
        "--model",
        default=None,
        help="model spec: config:<name> (random weights of a shipped config), a directory, a hub id, or "
        "HuggingFaceTB/SmolLM2-135M-Instruct (a trained model, offline)",
    )
    g.add_argument(
        "--dtype",
        default="auto",
        choices=sorted(DTYPES),
        help="weights and activations (vLLM's values: half = float16, float = float32); auto: bfloat16 on CUDA, "
        "float32 on CPU",
    )
    g.add_argument("--device", default="auto", help="cuda, cpu, cuda:1 ...; auto: cuda when available")
    g.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the sampling seed of requests that set none (as in vLLM: the engine's random generator starts from "
        "it, so a server's unseeded sampling repeats run to run), and of a config: model's random weights",
    )
    g.add_argument("--scheduler", default="chunked_prefill", choices=POLICY_NAMES, help="scheduling policy")
    g.add_argument("--max-num-seqs", type=positive_int, default=256, help="running sequences at once")
    g.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=8192,
        help="tokens per engine step (ChunkedPrefill's budget)",
    )
    g.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="prompt + output tokens per request (default: min(model's, 4096))",
    )
    g.add_argument("--block-size", type=positive_int, default=16, help="tokens per KV block")
    g.add_argument(
        "--num-blocks",
        "--num-gpu-blocks-override",
        type=positive_int,
        default=None,
        help="KV blocks in the pool (default: from --memory-fraction on CUDA, 4096 on CPU)",
    )
    g.add_argument(
        "--memory-fraction",
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="fraction of GPU memory for weights, activations and KV cache",
    )
    g.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="capture decode steps as CUDA graphs (CUDA only)",
    )
    g.add_argument(
        "--enforce-eager",
        action=EnforceEager,
        help="vLLM's spelling of --no-cuda-graphs --no-step-graphs: run every step eagerly",
    )
    g.add_argument(
        "--graph-batch-sizes",
        type=int_list,
        default=None,
        help="decode batch sizes to capture, e.g. 1,2,4,8,16,32,64 (default: powers of 2 to max-num-seqs)",
    )
    g.add_argument(
        "--step-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="capture whole prefill/mixed steps as CUDA graphs at token-count buckets (CUDA with Triton)",
    )
    g.add_argument("--attention-backend", default="auto", help="auto, triton, gather, reference")
    g.add_argument("--decode-steps", type=positive_int, default=1, help="decode steps per scheduling round")
    g.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run one short request before serving, so first-use costs (kernel tuning, allocator "
        "growth) do not land on the first client",
    )
    g.add_argument(
        "--draft-model",
        default=None,
        help="speculative decoding: a draft model spec sharing the target's tokenizer, or prompt-lookup (drafts "
        "copied from the context, no draft model); running requests draft up to --num-speculative-tokens "
        "tokens each step and one target step verifies them all, batched as in plain serving",
    )
    g.add_argument(
        "--speculative-config",
        default=None,
        metavar="JSON",
        help='vLLM\'s spelling: \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, '
        '"prompt_lookup_min": 1}\' (prompt lookup), or \'{"model": SPEC, "num_speculative_tokens": 4}\'',
    )
    g.add_argument(
        "--num-speculative-tokens",
        type=positive_int,
        default=4,
        help="tokens the draft proposes per round (gamma), with --draft-model",
    )
    g.add_argument(
        "--prefix-caching",
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="share the KV blocks of cached prompt prefixes between requests (hit rate in /metrics)",
    )
    g.add_argument(
        "--prefix-eviction",
        default="lru",
        choices=["lru", "lfu"],
        help="with --prefix-caching: which unreferenced cached block is recycled first",
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    from servelab.engine import EngineConfig

    return EngineConfig(
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        memory_fraction=args.memory_fraction,
        num_blocks=args.num_blocks,
        cuda_graphs=args.cuda_graphs,
        graph_batch_sizes=args.graph_batch_sizes,
        step_graphs=getattr(args, "step_graphs", True),
        attention_backend=args.attention_backend,
        decode_steps=args.decode_steps,
        scheduler=args.scheduler,
        prefix_caching=getattr(args, "prefix_caching", False),
        prefix_eviction=getattr(args, "prefix_eviction", "lru"),
    )


def resolve_device_dtype(args: argparse.Namespace) -> tuple[str, str]:
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dtype = DTYPES.get(args.dtype, args.dtype)
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


def engine_from_args(args: argparse.Namespace) -> Engine:
    """The engine the flags describe (the single place flags become an engine), warmed up if asked; the random
    generator that unseeded requests sample from then starts from ``--seed``."""
    import torch

    from servelab.engine.tp_engine import engine_from_spec

    device, dtype = resolve_device_dtype(args)
    spec = speculation_from_args(args)
    if spec is not None:  # the engine's speculative mode: requests speculate together, batched like plain ones
        from servelab.engine.speculative_engine import SpeculativeEngine

        engine = SpeculativeEngine.from_spec(
            args.model,
            speculative=spec,
            dtype=dtype,
            device=device,
            config=engine_config_from_args(args),
            seed=args.seed,
            draft_seed=args.seed + 1,  # config: drafts get their own random weights, not the target's
        )
    else:
        engine = engine_from_spec(
            args.model,
            dtype=dtype,
            device=device,
            config=engine_config_from_args(args),
            seed=args.seed,
            tensor_parallel_size=getattr(args, "tensor_parallel_size", 1),
        )
    if getattr(args, "warmup", False):
        warm_up(engine)
        if getattr(args, "prefix_caching", False) and hasattr(engine, "set_prefix_caching"):
            engine.set_prefix_caching(True)  # forget the warm-up request: the hit rate counts clients only
    torch.manual_seed(args.seed)  # after loading and warm-up, so that only the requests draw from it
    return engine


def speculation_from_args(args: argparse.Namespace):
    """The flags' ``SpeculativeConfig`` (``--draft-model`` or ``--speculative-config``), or None."""
    from servelab.speculative.config import speculative_config

    return speculative_config(
        getattr(args, "draft_model", None),
        getattr(args, "num_speculative_tokens", 4),
        getattr(args, "speculative_config", None),
    )


def warm_up(engine: Engine) -> None:
    """One request of a short prefill and a few decodes, run to completion; the engine ends empty."""
    from servelab.engine import SamplingParams

    cfg = engine.config
    n = max(1, min(256, engine.max_model_len - 8, cfg.max_num_batched_tokens - 8))
    prompt = [(7 * i + 11) % engine.model.shape.vocab for i in range(n)]  # not all-equal ids
    engine.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True))


def build_parser(prog: str = "python -m servelab.server") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="An OpenAI-compatible HTTP server on the servelab engine.")
    add_engine_flags(p)
    t = p.add_argument_group("tokenizer")
    t.add_argument(
        "--tokenizer",
        default=None,
        help="where the tokenizer loads from (a directory or hub id; default: the model's, else byte-level)",
    )
    t.add_argument(
        "--chat-template",
        default=None,
        metavar="PATH_OR_TEMPLATE",
        help="a Jinja chat template (a file, or the template itself) replacing the tokenizer's; with a config: "
        "model's byte-level tokenizer it enables /v1/chat/completions",
    )
    g = p.add_argument_group("HTTP")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    g.add_argument("--served-model-name", default=None, help="the model name clients use (default: --model)")
    g.add_argument(
        "--max-queue",
        type=positive_int,
        default=4096,
        help="requests that may wait beyond the free running slots (--max-num-seqs) before new ones get 429 + "
        "Retry-After (default: %(default)s)",
    )
    g.add_argument("--max-body-bytes", type=positive_int, default=1 << 20, help="larger request bodies get 413")
    g.add_argument(
        "--drain-timeout",
        type=float,
        default=120.0,
        help="seconds running requests get to finish at shutdown (SIGINT/SIGTERM)",
    )
    g.add_argument(
        "--step-log",
        default=None,
        metavar="PATH",
        help="write one JSON line per engine step (StepRecord; time.perf_counter seconds)",
    )
    g.add_argument(
        "--engine-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="step the engine in a process of its own, so HTTP work does not share its GIL "
        "(--no-engine-process: a thread of the HTTP process)",
    )
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    g.add_argument(
        "--uvicorn-log-level",
        default=None,
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="uvicorn's log level (default: --log-level)",
    )
    g = p.add_argument_group("data parallel (servelab.cluster)")
    g.add_argument(
        "--data-parallel-size",
        "-dp",
        type=positive_int,
        default=1,
        help="replicas, one engine each (on GPU i mod #GPUs), behind a router on --port",
    )
    g.add_argument(
        "--router",
        default="least_outstanding",
        choices=ROUTER_NAMES,
        help="which replica serves each request (the simulator's routers)",
    )
    add_vllm_flags(p)
    return p


def parse_args(argv=None, prog: str = "python -m servelab.server") -> argparse.Namespace:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.model_tag is not None and args.model is not None and args.model_tag != args.model:
        parser.error(f"the model is given twice: {args.model_tag!r} and --model {args.model!r}")
    args.model = args.model_tag or args.model or DEFAULT_MODEL
    if not 0 < args.memory_fraction <= 1:
        parser.error(f"--memory-fraction must be in (0, 1], got {args.memory_fraction}")
    if not 0 <= args.port < 65536:
        parser.error(f"--port must be in [0, 65535], got {args.port}")
    check_vllm_flags(args, parser)
    try:
        engine_config_from_args(args)  # bad combinations fail here, before the model loads
        speculation_from_args(args)
    except ParameterError as e:
        parser.error(str(e))
    return args
