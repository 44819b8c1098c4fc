"""Study 1: FCFS vs EagerContBatch vs ChunkedPrefill in the real HTTP server, under a streaming load.

- ``params.py``: the profiles' parameters and their validation;
- ``serving.py``: ``PolicyServer``, one model served over HTTP (its engine in a process of its own by default),
  its policy switched, then warmed up, between runs;
- ``capacity_probe.py``: a short probe that places the rate sweep (and its roofline floors);
- ``sizing.py``: how long each point runs so that it completes ``min_requests``; ``gpu_time.py``: the full
  profile's GPU time and its split into parts; ``merge.py``: parts measured at one commit combined;
- ``sweep.py``: the measurement loop (probe, rate sweep, budget sweep) under a time budget; ``run.py``: the study;
- ``stall.py``: the p99 of each request's worst inter-token gap, with its interval;
- ``capacity.py``: capacity at an ITL SLO (Sarathi-Serve's definition); ``step_costs.py``: the step log by kind;
- ``verdicts.py``: F1.1–F1.3 from the data; ``report.py``: the page's takeaways; ``plots.py``: the figures.

The policies themselves are ``servelab.engine.policies``; the server ``servelab.server``; the load
generator ``servelab.loadgen``.
"""
