"""Attention over a paged KV cache for a flat, ragged batch of tokens.

- ``attention.py``: ``PagedAttention``, the layer the models call, which picks a kernel per step;
- ``prefill.py``, ``context_prefill.py``, ``decode.py``: PyTorch paths (references, and the CPU's kernels);
- ``ragged.py``: the tile layout of a ragged step, written once, with its PyTorch reference;
- ``triton_decode.py``, ``triton_ragged.py``: the Triton kernels (tested under Triton's interpreter on a CPU).
"""
