"""The two ceilings every roofline here is drawn against, measured in the same run as the study.

- copy bandwidth: a large device-to-device copy, counting bytes read + bytes written;
- matmul rate: a large dense bf16 (fp32 on CPU) matrix product on random data (never zeros: they run faster).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from servelab.measure.timing import Timing, time_fn


@dataclass(frozen=True)
class Ceilings:
    copy_gb_s: float  # bytes read + written per second, 1e9
    matmul_tflop_s: float  # dense matmul, 1e12 FLOP/s
    matmul_dtype: str
    copy_bytes: int
    matmul_n: int
    copy_timing: Timing
    matmul_timing: Timing

    def as_dict(self) -> dict:
        d = asdict(self)
        d["copy_timing"] = asdict(self.copy_timing)
        d["matmul_timing"] = asdict(self.matmul_timing)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Ceilings:
        """The ceilings a run recorded (``as_dict``, as ``run.json`` holds them): the reporting path's copy."""
        fields = {k: d[k] for k in ("copy_gb_s", "matmul_tflop_s", "matmul_dtype", "copy_bytes", "matmul_n")}
        return cls(**fields, copy_timing=Timing(**d["copy_timing"]), matmul_timing=Timing(**d["matmul_timing"]))

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound on this device."""
        return self.matmul_tflop_s * 1e12 / (self.copy_gb_s * 1e9)


def _time_copy(dev, copy_mib: int, repeats: int, gen):
    """Time a device-to-device copy of ``copy_mib`` MiB; returns the timing and the bytes moved (read + write).
    Its own function so the buffers are freed on return, before the matmul allocates its own."""
    import torch

    src = torch.rand(copy_mib * 2**20 // 4, device=dev, dtype=torch.float32, generator=gen)
    dst = torch.empty_like(src)
    return time_fn(lambda: dst.copy_(src), warmup=3, repeats=repeats, device=dev), 2 * src.numel() * src.element_size()


def _time_matmul(dev, n: int, dtype, repeats: int, gen):
    """Time an n×n×n product on random inputs (zeros run faster and would flatter the GPU)."""
    import torch

    a = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
    c = torch.empty(n, n, device=dev, dtype=dtype)
    return time_fn(lambda: torch.matmul(a, b, out=c), warmup=5, repeats=repeats, device=dev)


def measure_ceilings(
    device=None, *, copy_mib: int | None = None, matmul_n: int | None = None, repeats: int = 20
) -> Ceilings:
    """Measure the copy and matmul ceilings on ``device``.

    Defaults are sized for the device: on a GPU a 2 GiB copy (many times the L2) and an 8192³ bf16
    product; on a CPU small sizes that finish in a second.
    """
    import torch

    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev.type == "cuda"
    copy_mib = copy_mib or (2048 if cuda else 64)
    matmul_n = matmul_n or (8192 if cuda else 512)
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator(device=dev).manual_seed(0)

    copy_t, copy_bytes = _time_copy(dev, copy_mib, repeats, gen)
    mm_t = _time_matmul(dev, matmul_n, dtype, repeats, gen)
    flops = 2 * matmul_n**3
    return Ceilings(
        copy_gb_s=copy_bytes / (copy_t.median_ms * 1e-3) / 1e9,
        matmul_tflop_s=flops / (mm_t.median_ms * 1e-3) / 1e12,
        matmul_dtype=str(dtype).replace("torch.", ""),
        copy_bytes=copy_bytes,
        matmul_n=matmul_n,
        copy_timing=copy_t,
        matmul_timing=mm_t,
    )
