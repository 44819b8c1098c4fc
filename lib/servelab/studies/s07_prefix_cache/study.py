"""Study 7's engine: one engine, prefix caching switched per measurement, sized by the study's parameters."""

from __future__ import annotations

from servelab.engine import Engine, EngineConfig


def study_config(P: dict) -> EngineConfig:
    """The engine settings of every measurement: a fixed KV pool (``num_blocks``; the rest of the GPU is left
    free), decode batches up to ``max_num_seqs`` captured as CUDA graphs (powers of two), caching on."""
    sizes, b = [], 1
    while b < P["max_num_seqs"]:
        sizes.append(b)
        b *= 2
    return EngineConfig(
        block_size=P["block_size"],
        num_blocks=P["num_blocks"],
        max_num_seqs=P["max_num_seqs"],
        max_num_batched_tokens=P["max_num_batched_tokens"],
        max_model_len=P["max_model_len"],
        scheduler=P["scheduler"],
        graph_batch_sizes=tuple(sizes + [P["max_num_seqs"]]),
        prefix_caching=True,
        prefix_eviction=P["eviction"],
    )


def build_engine(P: dict, device: str) -> Engine:
    """Load ``P['model']`` (random weights for a ``config:`` spec) and build the study's engine."""
    return Engine.from_spec(P["model"], dtype=P["dtype"], device=device, config=study_config(P), seed=P["seed"])
