"""Study 5: attention kernels — every variant behind one call signature, checked against a float64 reference, swept
over prefill and decode shapes, and judged against the measured ceilings.

Measuring path (``measure.py``, the GPU's): ``shapes``/``masks``/``variants``/``backends``/``reference``, what is
computed and by whom; ``point``/``sweep``/``memory``, measuring it; ``params``, its profiles.
Reporting path (``report.py``, the CPU's, from the runs' files): ``derived`` (roofline columns against the run's
ceilings), ``tables`` and ``recommend`` (the page's tables), ``verdicts`` (F5.1–F5.3), ``plots`` (the figures).

    attn = VARIANTS["sdpa_flash"].build(AttentionShape.prefill(arch, 4096), "cuda")
    out = attn(q, k, v)

This file imports nothing, so that importing the measuring path does not pull in the reporting one.
"""
