"""Attention over a paged KV cache for a flat, ragged batch of tokens, and the decode step's fused small linears.

- ``attention.py``: ``PagedAttention``, the layer the models call, which picks a kernel per step;
- ``prefill.py``, ``context_prefill.py``, ``decode.py``: PyTorch paths (references, and the CPU's kernels);
- ``ragged.py``: the tile layout of a ragged step (and which long tiles split), written once, with its PyTorch
  reference;
- ``split_kv.py``: split-KV (flash-decoding) for long contexts: how many splits, and the log-sum-exp merge;
- ``triton_decode.py``, ``triton_ragged.py``: the Triton kernels, any head size, both with split-KV (tested under
  Triton's interpreter on a CPU); ``triton_fold.py``: the key-folding step they share.
- ``rope_kv_write.py``: RoPE on q and k and the KV-pool write in one Triton kernel (``fused_rope_kv_write``).
- ``small_linear.py``: a decode step's linear layers at a small batch, each one Triton launch with the residual
  add, RMSNorm or SiLU·up fused in (``models/small_batch.py``, ``EngineConfig.small_batch``).
- ``triton_long_tiles.py``: long-tile prefill attention, flash-attention-2 style (``triton_ragged``'s long tiles);
  ``decode_launch.py``: the decode kernel's launch per device, chosen from committed timings (``data/tuning/``).
- ``pdl.py``: programmatic dependent launch for the Triton kernels of a step (``EngineConfig.pdl``).
"""
