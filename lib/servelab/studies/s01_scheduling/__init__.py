"""Study 1: FCFS vs EagerContBatch vs ChunkedPrefill in the real HTTP server, under a streaming load.

Measuring path (``measure.py``, the GPU's): ``params.py``, the profiles; ``serving.py``, ``PolicyServer`` (one model
served over HTTP, its policy switched between runs); ``capacity_probe.py``, the probe that places the rates;
``sizing.py``, how long each point runs and which points a part selects; ``sweep.py``, the measurement loop (rate
sweep, budget sweep, capacity search) under a time budget; ``step_costs.py``, the step log by kind.
Reporting path (``report.py``, the CPU's, from the runs' files): ``stall.py``, the p99 of each request's worst
inter-token gap with its interval; ``capacity.py``, capacity at an ITL SLO; ``verdicts.py``, F1.1–F1.3;
``plots.py``, the figures; ``gpu_time.py``, each part's expected GPU time from a committed run.

This file imports nothing, so that importing the measuring path does not pull in the reporting one.
"""
