"""The device record: what a number was measured on, stored with every result."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field


def _smi(query: str) -> dict:
    """Read a few fields from ``nvidia-smi`` (driver, clocks, temperature, power); {} without it."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return {}
    # strict: nvidia-smi answers one value per queried field; a mismatch is a format we do not understand
    try:
        return dict(zip(query.split(","), [v.strip() for v in out.split(",")], strict=True))
    except ValueError:
        return {}


CLOCK_FIELDS = "clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw"
CPUINFO = "/proc/cpuinfo"


def cpu_model(cpuinfo: str = CPUINFO) -> str:
    """The host CPU's model name (``/proc/cpuinfo``'s first "model name"), else what ``platform`` says.

    ``platform.processor()`` gives only the architecture on Linux ("x86_64"); the model matters because the
    host's speed bounds everything the CPU does per step (launches, scheduling, Python).
    """
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_cores() -> int | None:
    """Logical CPU cores this process may run on (its affinity mask where the OS has one, as a container sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def read_clocks() -> dict:
    """SM/memory clocks (MHz), temperature (°C) and power (W) right now, stamped in UTC."""
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return {"utc": now, **_smi(CLOCK_FIELDS)}


def settle_sdpa(device=None) -> None:
    """One tiny SDPA call on a CUDA device, so torch's lazy reordering of the backends has happened.

    On sm90 torch moves cuDNN attention to the front of the priority order only at the first SDPA call;
    an order read before any call is not the order the study's kernels will see.
    """
    import torch
    import torch.nn.functional as F

    dev = torch.device(device) if device is not None else (torch.device("cuda") if torch.cuda.is_available() else None)
    if dev is None or dev.type != "cuda":
        return
    q = torch.randn(1, 2, 16, 64, device=dev, dtype=torch.bfloat16)
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.cuda.synchronize(dev)


def sdpa_priority_order() -> list[str]:
    """SDPA's backend priority order as this torch build will try them (after one settling call on CUDA)."""
    import torch

    settle_sdpa()
    try:
        order = torch._C._get_sdp_priority_order()
    except AttributeError:  # older torch: no public order, record that
        return ["unknown"]
    from torch.nn.attention import SDPBackend

    names = []
    for b in order:
        with contextlib.suppress(ValueError, TypeError):  # an unknown int keeps its number as its name
            b = SDPBackend(int(b)) if not hasattr(b, "name") else b
        name = getattr(b, "name", str(b))
        names.append(re.sub(r"^.*\.", "", name).lower())
    return names


@dataclass
class DeviceRecord:
    """Everything needed to say where and with what a result was measured."""

    name: str
    slug: str
    kind: str  # "cuda" or "cpu"
    sm_count: int | None
    memory_gib: float | None
    compute_capability: str | None
    driver: str | None
    cuda: str | None
    cudnn: int | None
    torch: str
    transformers: str | None
    python: str
    cpu: str  # the architecture, as platform reports it ("x86_64")
    sdpa_priority: list[str]
    cpu_model: str | None = None  # the host CPU's model name; None in records written before it was recorded
    cpu_cores: int | None = None  # logical cores the run could use
    clocks_start: dict = field(default_factory=dict)
    clocks_end: dict = field(default_factory=dict)

    def close(self) -> DeviceRecord:
        """Stamp the clocks at the end of the run (call when measuring is done)."""
        self.clocks_end = read_clocks() if self.kind == "cuda" else {}
        return self

    def as_dict(self) -> dict:
        return asdict(self)

    def host(self) -> str:
        """The host CPU: model and logical cores ("AMD EPYC 9654, 16 cores")."""
        cores = f", {self.cpu_cores} cores" if self.cpu_cores else ""
        return f"{self.cpu_model or self.cpu}{cores}"

    def summary(self) -> str:
        if self.kind == "cuda":
            return (
                f"{self.name} ({self.sm_count} SMs, {self.memory_gib:.0f} GiB, sm{self.compute_capability}), "
                f"driver {self.driver}, CUDA {self.cuda}, torch {self.torch}, transformers {self.transformers}; "
                f"SDPA order {' > '.join(self.sdpa_priority)}; host {self.host()}"
            )
        return f"CPU {self.host()}, torch {self.torch}, transformers {self.transformers}"


def slugify(name: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return s or "unknown"


def device_record(device=None) -> DeviceRecord:
    """Record the device that ``device`` (default: CUDA if present, else CPU) names."""
    import torch

    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cpu = platform.processor() or platform.machine()
    common = dict(
        torch=torch.__version__,
        transformers=tf_version,
        python=platform.python_version(),
        cpu=cpu,
        sdpa_priority=sdpa_priority_order(),
        cpu_model=cpu_model(),
        cpu_cores=cpu_cores(),
    )
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        smi = _smi("driver_version")
        return DeviceRecord(
            name=props.name,
            slug=slugify(props.name),
            kind="cuda",
            sm_count=props.multi_processor_count,
            memory_gib=props.total_memory / 2**30,
            compute_capability=f"{props.major}{props.minor}",
            driver=smi.get("driver_version"),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            clocks_start=read_clocks(),
            **common,
        )
    return DeviceRecord(
        name=f"cpu ({cpu})",
        slug="cpu",
        kind="cpu",
        sm_count=None,
        memory_gib=None,
        compute_capability=None,
        driver=None,
        cuda=None,
        cudnn=None,
        **common,
    )
