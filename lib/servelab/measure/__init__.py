"""Measurement core: how every number in the book is taken.

- ``timing.py``: CUDA-event timing (``perf_counter`` on a CPU), warm-up, repeats, medians with spread;
- ``device.py``: the device record (GPU, versions, clocks at start and end, host CPU) stored with every result;
- ``ceilings.py``: the copy and matmul ceilings, measured in the same run as the study;
- ``roofline.py``: floor times from FLOPs and bytes; ``kernel_profile.py``: kernels, GPU-busy share, CPU per launch;
- ``results.py``: tidy CSVs and the ``run.json`` sidecar under ``data/results/<device>/<study>/``, ``findings.csv``.
"""

from servelab.measure.ceilings import Ceilings, measure_ceilings
from servelab.measure.device import DeviceRecord, device_record
from servelab.measure.roofline import Roofline
from servelab.measure.timing import Timing, summarize, time_fn

__all__ = [
    "Timing",
    "time_fn",
    "summarize",
    "DeviceRecord",
    "device_record",
    "Ceilings",
    "measure_ceilings",
    "Roofline",
]
