"""Study 4: what a KV cache costs, measured on the engine's paged cache (``servelab.kv``).

Measuring path (``measure.py``, the GPU's): ``bytes_per_token`` (F4.1), ``capacity``, ``decode_scaling`` (F4.2, timed
by Study 2's sweep), ``compaction_bench`` (F4.3), ``overlap`` and ``overlap_probes`` (F4.4); ``params``, its profiles.
Reporting path (``report.py``, the CPU's, from the runs' files): ``derived`` (the variation over context, the overlap's
summary, mover ratios), ``verdicts`` (F4.1–F4.4), ``plots``.

This file imports nothing, so that importing the measuring path does not pull in the reporting one.
"""
