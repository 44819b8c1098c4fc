"""Study 3: speculative decoding with the project's own loop (``servelab.spec``), measured.

- ``pair.py``: a target and its drafts, as HF models and as ``PagedLM``s;
- ``cost_ratio.py``: the cost ratio c = T_draft / T_target in three execution modes;
- ``study.py``: acceptance and speedup per draft × γ × temperature, beside Leviathan's prediction;
- ``params.py``, ``verdicts.py`` (F3.1–F3.3), ``plots.py``.
"""
