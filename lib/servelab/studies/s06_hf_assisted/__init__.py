"""Study 6: Hugging Face's ``generate(assistant_model=...)`` and prompt-lookup decoding, timed.

Measuring path (``measure.py``, the GPU's): ``models.py``, SmolLM2-135M-Instruct and its distilled drafts (or hub
specs); ``clock.py``, a streamer timestamping every batch of new tokens; ``runs.py``, one timed greedy generate
and the jobs of one prompt; ``own_engine.py``, the project's own speculative decoding (the engine's speculative
mode); ``sweep.py``, the passes over the prompts within a wall-time budget; ``acceptance.py``, teacher-forced α;
``seed_costs.py``, HF's cost ratio at the seed's shapes; ``attention_backend.py``, the SDPA kernels;
``params.py``, its profiles.
Reporting path (``report.py``, the CPU's, from the runs' files): ``analysis.py``, speedups, cost ratios, match
rates; ``verdicts.py``, F6.1–F6.2; ``plots.py``, the figures.

This file imports nothing, so that importing the measuring path does not pull in the reporting one.
"""
