"""Measurement core: how every number in the book is taken."""

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
