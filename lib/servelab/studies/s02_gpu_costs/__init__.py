"""Study 2: what prefill, decode and mixed steps cost on this GPU, against the roofline, and a fitted cost model.

Measuring path (``measure.py``, the GPU's): ``points.py``, the steps timed and their FLOPs and bytes; ``sweep.py``,
timed steps in each execution mode; ``params.py``, its profiles.
Reporting path (``report.py``, the CPU's, from the runs' files): ``launch_overhead.py``, what CUDA graphs save;
``verdicts.py``, F2.1–F2.3; ``plots.py``, the figures. The fitted cost model itself is the simulator's
(``servelab.sim.cost_fit``).

This file imports nothing, so that importing the measuring path does not pull in the reporting one.
"""
