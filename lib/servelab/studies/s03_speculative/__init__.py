"""Study 3: speculative decoding with the project's own loop (``servelab.spec``), measured.

- ``pair.py``: a target and its drafts, as HF models and as ``PagedLM``s;
- ``cost_ratio.py``: the cost ratio c = T_draft / T_target in three execution modes;
- ``study.py``: acceptance and speedup per draft × γ × temperature, beside Leviathan's prediction;
- ``controlled.py``: controlled acceptance at the seed's shapes (α set, every cost real), break-even α;
- ``real_acceptance.py``: α of real drafts of SmolLM2-135M-Instruct, with bootstrap intervals;
- ``lookup_speed.py``: prompt lookup's tokens/s in the batched loop beside plain decoding, at the draft models' batches;
- ``part.py``: one part of the study run on its own (controlled acceptance, lookup speed), its table beside the rest;
- ``measured_alpha.py``: Study 6's α of real drafts on the same device, read for the controlled curves;
- ``run.py``: the study; ``params.py``, ``verdicts.py`` (F3.1–F3.3), ``report.py``, ``plots.py``.
"""
