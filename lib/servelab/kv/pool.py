"""The KV pool: one preallocated tensor holding every layer's K and V in fixed-size blocks.

Layout: ``kv[2, layers, num_blocks, block_size, kv_heads, head_dim]``; ``k = kv[0]`` and ``v = kv[1]`` are views,
so ``pool.k[layer]`` is ``(num_blocks, block_size, kv_heads, head_dim)`` as the engine's kernels expect
(vLLM's per-layer layout). One tensor for everything lets compaction move a block in all layers, K and V,
with a single gather and a single scatter.

Which blocks belong to which sequence is the ``BlockManager``'s business; the pool only stores bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the pool needs only .layers/.kv_heads/.head_dim/.kv_bytes_per_token of a shape
    from servelab.models.shape import ModelShape

_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float64": "float64",
}


def as_torch_dtype(dtype):
    """Accept a ``torch.dtype`` or a name such as ``"bfloat16"``/``"fp16"``."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use a torch.dtype or one of {sorted(_DTYPES)}")
    return getattr(torch, _DTYPES[dtype])


class KVPool:
    """Preallocated paged K/V storage for ``layers`` layers, ``num_blocks`` blocks of ``block_size`` tokens."""

    def __init__(
        self,
        layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype="bfloat16",
        device="cpu",
    ):
        import torch

        for name, v in (
            ("layers", layers),
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("kv_heads", kv_heads),
            ("head_dim", head_dim),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.layers, self.num_blocks, self.block_size = layers, num_blocks, block_size
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.dtype = as_torch_dtype(dtype)
        self.device = torch.device(device)
        # uninitialised on purpose: a slot is always written before it is read, and a large pool would
        # otherwise cost a full memset at start-up
        self.kv = torch.empty(
            (2, layers, num_blocks, block_size, kv_heads, head_dim), dtype=self.dtype, device=self.device
        )
        self.k = self.kv[0]
        self.v = self.kv[1]

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    def for_model(cls, shape: ModelShape, num_blocks: int, block_size: int, dtype="bfloat16", device="cpu") -> KVPool:
        return cls(shape.layers, num_blocks, block_size, shape.kv_heads, shape.head_dim, dtype, device)

    @staticmethod
    def block_bytes(shape: ModelShape, block_size: int, dtype="bfloat16") -> int:
        """Bytes of one block across all layers, K and V: block_size × kv_bytes_per_token."""
        return block_size * shape.kv_bytes_per_token(as_torch_dtype(dtype).itemsize)

    @classmethod
    def blocks_for_budget(cls, shape: ModelShape, bytes_budget: int, block_size: int, dtype="bfloat16") -> int:
        """How many whole blocks fit in ``bytes_budget`` bytes (no allocation)."""
        if isinstance(bytes_budget, bool) or not isinstance(bytes_budget, int) or bytes_budget <= 0:
            raise ValueError(f"bytes_budget must be a positive integer number of bytes, got {bytes_budget!r}")
        return bytes_budget // cls.block_bytes(shape, block_size, dtype)

    @classmethod
    def from_memory(
        cls, shape: ModelShape, bytes_budget: int, block_size: int, dtype="bfloat16", device="cpu"
    ) -> KVPool:
        """The largest pool that fits in ``bytes_budget`` bytes."""
        n = cls.blocks_for_budget(shape, bytes_budget, block_size, dtype)
        if n == 0:
            raise ValueError(
                f"a budget of {bytes_budget} bytes holds no block of {cls.block_bytes(shape, block_size, dtype)} bytes"
            )
        return cls.for_model(shape, n, block_size, dtype, device)

    # ---- sizes ------------------------------------------------------------------------------------
    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block across all layers, K and V."""
        return 2 * self.layers * self.block_size * self.kv_heads * self.head_dim * self.dtype.itemsize

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block // self.block_size

    @property
    def nbytes(self) -> int:
        """Bytes the pool's storage actually occupies."""
        return self.kv.untyped_storage().nbytes()

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    # ---- access -----------------------------------------------------------------------------------
    def slot_view(self, layer: int):
        """``(k, v)`` of one layer viewed as ``[num_slots, kv_heads, head_dim]`` (no copy)."""
        shape = (self.num_slots, self.kv_heads, self.head_dim)
        return self.k[layer].view(shape), self.v[layer].view(shape)

    def write(self, layer: int, slots, k, v) -> None:
        """Write ``k``, ``v`` (each ``[T, kv_heads, head_dim]``) into the flat ``slots`` (LongTensor ``[T]``)."""
        ks, vs = self.slot_view(layer)
        if k.shape != v.shape or k.shape[1:] != ks.shape[1:] or k.shape[0] != slots.shape[0]:
            raise ValueError(
                f"k and v must be [T={slots.shape[0]}, {self.kv_heads}, {self.head_dim}], "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        ks.index_copy_(0, slots, k.to(self.dtype))
        vs.index_copy_(0, slots, v.to(self.dtype))

    def gather(self, layer: int, block_table, length: int):
        """Reference reader: a sequence's first ``length`` tokens, ``(k, v)`` each ``[length, kv_heads, head_dim]``."""
        import torch

        block_table = torch.as_tensor(block_table, dtype=torch.long, device=self.device)
        if length < 0 or length > block_table.numel() * self.block_size:
            raise ValueError(f"length {length} does not fit {block_table.numel()} blocks of {self.block_size}")
        shape = (-1, self.kv_heads, self.head_dim)
        k = self.k[layer].index_select(0, block_table).reshape(shape)[:length]
        v = self.v[layer].index_select(0, block_table).reshape(shape)[:length]
        return k, v

    def copy_blocks(self, pairs) -> None:
        """Copy whole blocks ``src → dst`` in every layer, K and V (the pairs of ``BlockManager.take_copies``)."""
        import torch

        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], dtype=torch.long, device=self.device)
        dst = torch.tensor([d for _, d in pairs], dtype=torch.long, device=self.device)
        self.kv.index_copy_(2, dst, self.kv.index_select(2, src))

    def fill_random(self, generator=None) -> KVPool:
        """Fill every slot with N(0, 1) values (benchmarks never time on zeros or uninitialised memory)."""
        self.kv.normal_(generator=generator)
        return self

    def __repr__(self) -> str:
        return (
            f"KVPool(layers={self.layers}, num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"kv_heads={self.kv_heads}, head_dim={self.head_dim}, dtype={self.dtype}, device={self.device}, "
            f"{self.nbytes / 2**20:.1f} MiB)"
        )
