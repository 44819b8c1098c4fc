"""The engine's benchmarks: what ``python -m servelab.bench`` runs and ``bench.csv`` records.

- ``run.py``: the command line and the order of the sections; ``plan.py``: what a run measures;
  ``session.py``: one run's device, ceilings, model and tables; ``rows.py``: a row and its goal;
- the sections, one file each: ``decode_rows.py``, ``offline_rows.py``, ``latency_rows.py`` (mixed step,
  end-to-end latency), ``prefill_rows.py``, ``exactness_rows.py``;
- ``workload.py``: the standard offline workload (random prompts, lengths uniform in a range);
- ``step.py``: one engine step (decode, prefill, a chunk after cached context, or mixed) as a timed callable,
  like ``servelab.bench.hf_modes``;
- ``offline.py``: offline throughput of the engine, and the roofline bound for the same workload;
- ``hf_baseline.py``: HF ``generate`` with static batching on the same workload;
- ``exactness.py``: greedy agreement and logit error against HF on the same weights.
"""
