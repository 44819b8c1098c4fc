"""Study 1: FCFS vs EagerContBatch vs ChunkedPrefill in the real HTTP server, under a streaming load.

- ``params.py``: the profiles' parameters and their validation;
- ``serving.py``: ``PolicyServer``, one model served over HTTP (its engine in a process of its own by default),
  its policy switched, then warmed up, between runs;
- ``capacity_probe.py``: a short probe that places the rate sweep (and its roofline floors);
- ``sizing.py``: each point's window (sized to complete ``min_requests``), the ``parts`` a run selects;
- ``sweep.py``: the measurement loop (probe, rate sweep, budget sweep) under a time budget;
- ``stall.py``: the worst stall as a statistic (p99 of per-request maximum ITL, bootstrap interval);
- ``gpu_time.py``: the full profile's GPU time from a committed run, grouped into GPU runs;
- ``merge.py``: the parts of one commit joined into one result;
- ``capacity.py``: capacity at an ITL SLO (Sarathi-Serve's definition);
- ``verdicts.py``: F1.1–F1.3 from the data;
- ``plots.py``: the figures.

The policies themselves are ``servelab.engine.policies``; the server ``servelab.server``; the load
generator ``servelab.loadgen``.
"""
