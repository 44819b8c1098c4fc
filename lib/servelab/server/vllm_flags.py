"""vLLM's common ``vllm serve`` flags that have no engine setting of their own here: each is accepted with what it
means on this server (its help line), or refused with a clear message where honouring it is impossible.

``check_vllm_flags`` runs at parse time (before the model loads); ``vllm_flag_notes`` gives the one-line notes
the server logs at start for the flags that were given.
"""

from __future__ import annotations

import argparse

DTYPES = {"auto": "auto", "half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
          "float32": "float32"}  # fmt: skip
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")


def add_vllm_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM compatibility (accepted so that a vllm serve command line runs as it is)")
    g.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="accepted; this server runs its own model code for every model, never a model's remote code",
    )
    g.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=1,
        help="processes (one device each) the model's heads and MLP are split over (tensor parallelism); 1: one device",
    )
    g.add_argument(
        "--pipeline-parallel-size",
        "-pp",
        type=int,
        default=1,
        help="1 only: the engine runs on one device (a larger value is refused)",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=KV_CACHE_DTYPES,
        help="auto only: the KV cache is kept in the model's dtype (fp8 KV caches are refused)",
    )
    g.add_argument(
        "--generation-config",
        default="auto",
        metavar="{auto,vllm,FOLDER}",
        help="accepted; unset request fields take OpenAI's defaults, as with vLLM's 'vllm' (a model's "
        "generation_config.json is not read)",
    )
    g.add_argument(
        "--disable-log-requests",
        action="store_true",
        help="accepted; this server never logs request contents",
    )
    g.add_argument(
        "--enable-log-requests",
        action="store_true",
        help="accepted; this server never logs request contents (per-request times are in /metrics)",
    )


def check_vllm_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` (exit 2, before the model loads) for a value this server cannot honour."""
    if args.pipeline_parallel_size != 1:
        parser.error(
            f"--pipeline-parallel-size {args.pipeline_parallel_size}: the servelab engine splits a model by tensor "
            "parallelism only (--tensor-parallel-size); only 1 is supported"
        )
    tp = args.tensor_parallel_size
    if tp < 1:
        parser.error(f"--tensor-parallel-size must be a positive integer, got {tp}")
    if tp > 1 and (getattr(args, "draft_model", None) or getattr(args, "speculative_config", None)):
        parser.error(f"--tensor-parallel-size {tp}: speculative decoding runs on one device here; use 1")
    if tp > 1 and getattr(args, "data_parallel_size", 1) > 1:
        parser.error(f"--tensor-parallel-size {tp} with --data-parallel-size: replicas run on one device each here")
    if args.kv_cache_dtype != "auto":
        parser.error(
            f"--kv-cache-dtype {args.kv_cache_dtype}: the KV cache is kept in the model's dtype here; only "
            "'auto' is supported"
        )


def vllm_flag_notes(args: argparse.Namespace) -> list[str]:
    """One line per accepted-but-inert vLLM flag that was given, saying what it does here."""
    notes = []
    if args.trust_remote_code:
        notes.append("--trust-remote-code: accepted; servelab runs its own model code, never remote code")
    if args.generation_config != "auto" and args.generation_config != "vllm":
        notes.append(f"--generation-config {args.generation_config}: not read; requests take OpenAI's defaults")
    if args.disable_log_requests or args.enable_log_requests:
        notes.append("--disable-log-requests/--enable-log-requests: accepted; request contents are never logged")
    return notes
