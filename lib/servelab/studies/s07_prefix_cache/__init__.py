"""Study 7: prefix caching. The cache itself lives in the engine (``servelab.kv.prefix_cache``); here are the policy
simulator and the study's measurements.

Measuring path (``measure.py``, the GPU's): ``params`` (profiles), ``study`` (the engine measured), ``first_token``
(timing requests with the cache primed or off), ``prefix_length`` (F7.1), ``multi_turn`` (F7.2), ``batch_sharing``
(F7.3), ``serving`` (a prefix-repetition workload over HTTP, caching off and on), and the policy simulator (F7.4):
``workload`` (Zipf streams), ``policies`` (LRU, LFU), ``radix`` (radix-tree LRU), ``optimum`` (static top-k,
Belady's MIN), ``simulate`` (``hit_rates``).
Reporting path (``report.py``, the CPU's, from the runs' files): ``derive`` (speedups, breakevens), ``cost_fit``
(straight-line cost models), ``verdicts`` (F7.1–F7.4), ``plots`` (the figures).

This file imports nothing, so that importing the measuring path does not pull in the reporting one.
"""
