"""Engine settings, validated when the engine is built."""

from __future__ import annotations

from dataclasses import dataclass

from servelab.errors import ParameterError

ATTENTION_BACKENDS = ("auto", "gather", "triton", "reference")


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16  # tokens per KV block
    max_num_seqs: int = 256  # running sequences at once (also the largest decode graph)
    max_num_batched_tokens: int = 8192  # tokens per step (prefill chunks + decodes)
    max_model_len: int | None = None  # prompt + output tokens per request; None: min(model's, 4096)
    memory_fraction: float = 0.9  # of the GPU's memory the engine may fill (weights, activations, KV)
    num_blocks: int | None = None  # fix the KV pool size instead (required sense on CPU: default 4096)
    cuda_graphs: bool = True  # capture decode steps (CUDA only)
    attention_backend: str = "auto"  # "auto": triton where it imports on CUDA, else gather
    decode_steps: int = 1  # decode steps run back to back per scheduling round (multi-step)
    # torch.compile the blocks' elementwise work (checked against eager first); "auto": on CUDA, off on a CPU
    compile: bool | str = "auto"
    graph_batch_sizes: tuple[int, ...] | None = None  # decode batch buckets to capture; None: 1, 2, 4, … max_num_seqs
    # whole prefill and mixed steps captured as CUDA graphs at token-count buckets (CUDA with Triton only)
    step_graphs: bool = True
    step_graph_sizes: tuple[int, ...] | None = None  # token buckets; None: a ladder up to max_num_batched_tokens
    scheduler: str = "chunked_prefill"  # scheduling policy, a name in servelab.engine.policies.POLICIES
    prefix_caching: bool = False  # share the KV blocks of cached prefixes between requests
    prefix_eviction: str = "lru"  # which unreferenced cached block to recycle first: "lru" or "lfu"
    # read a step's sampled tokens during the next step, so the host's work overlaps the GPU's (engine/inflight.py)
    async_scheduling: bool = True
    # RoPE and the KV-cache write in one Triton kernel per layer (kernels/rope_kv_write.py) instead of RoPE in the
    # blocks' compiled code plus an index_copy_ into the pool. "auto": on where the kernel runs (CUDA, Triton) and the
    # model has the path (Llama/Qwen2), off elsewhere; True refuses a place it cannot run (TRITON_INTERPRET=1 runs it
    # on a CPU). The default since issue 29: compiled under the first-blocks check it was the faster decode step at 1
    # and 8 rows on the H100 (bench rows decode_ms_b*_unfused_rope_kv keep the other path beside it)
    fused_rope_kv_write: bool | str = "auto"
    # one-row steps' blocks through kernels/small_linear (models/small_batch.py: five launches a layer, the residual
    # add, RMSNorm, SiLU·up, RoPE and the KV write folded into the matmuls). "auto": on where fused_rope_kv_write is
    # on and the model runs whole in this process (not a tensor-parallel shard); True refuses where it cannot run.
    # The default since issue 29: a one-row Qwen2-0.5B step took 0.716-0.753 ms against 1.040-1.082 on the H100
    small_batch: bool | str = "auto"
    # programmatic dependent launch for the Triton kernels of a step (kernels/pdl.py: small_linear's and decode
    # attention's): each may start while the launch before it drains, reading its weights before it waits. "auto": on
    # where it runs (a Hopper or later GPU, compiled Triton), off elsewhere; True refuses a place it cannot run. The
    # default since issue 29: on the H100 a one-row Qwen2-0.5B decode step took 0.658 ms with it, 0.728 without
    # (the same bits; data/dev/nvidia-h100/2026-12-08/small_batch_step_pdl_*.csv)
    pdl: bool | str = "auto"
    # split-KV inside the ragged kernel of whole-step graphs (kernels/ragged.py ``plan_splits``): a long context in a
    # mixed step is walked by several programs and merged, instead of one program the whole step waits for. Off by
    # default: exact under the interpreter and compiled for sm90 on a CPU, but its cross-program merge has not run on
    # a GPU yet (tests/test_gpu_engine.py and scripts/bench_ragged_split.py are the checks to run first)
    ragged_split_kv: bool = False

    def __post_init__(self):
        self._check_sizes()
        self._check_graph_sizes()
        self._check_switches()
        if not isinstance(self.memory_fraction, (int, float)) or not 0 < self.memory_fraction <= 1:
            raise ParameterError(f"memory_fraction must be in (0, 1], got {self.memory_fraction!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ParameterError(
                f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}"
            )
        from servelab.kv.prefix_cache import EVICTION_POLICIES

        if self.prefix_eviction not in EVICTION_POLICIES:
            raise ParameterError(f"prefix_eviction must be one of {EVICTION_POLICIES}, got {self.prefix_eviction!r}")
        from servelab.engine.policies import policy_class

        policy_class(self.scheduler)  # a ParameterError naming the known policies

    def _check_sizes(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "decode_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParameterError(f"{name} must be a positive integer, got {v!r}")
        for name in ("max_model_len", "num_blocks"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ParameterError(f"{name} must be a positive integer or None, got {v!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ParameterError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): every running sequence must be able to decode each step"
            )

    def _check_graph_sizes(self) -> None:
        """Bucket lists: integers in range, stored sorted and unique."""
        for name, limit, what in (
            ("graph_batch_sizes", self.max_num_seqs, "max_num_seqs"),
            ("step_graph_sizes", self.max_num_batched_tokens, "max_num_batched_tokens"),
        ):
            sizes = getattr(self, name)
            if sizes is None:
                continue
            sizes = tuple(sizes)
            if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= limit for b in sizes):
                raise ParameterError(f"{name} must be integers in [1, {what}], got {sizes!r}")
            object.__setattr__(self, name, tuple(sorted(set(sizes))))

    def _check_switches(self) -> None:
        for name in (
            "cuda_graphs",
            "step_graphs",
            "prefix_caching",
            "async_scheduling",
            "ragged_split_kv",
        ):
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise ParameterError(f"{name} must be True or False, got {v!r}")
        for name in ("compile", "fused_rope_kv_write", "small_batch", "pdl"):
            v = getattr(self, name)
            if not (isinstance(v, bool) or v == "auto"):
                raise ParameterError(f"{name} must be True, False or 'auto', got {v!r}")
