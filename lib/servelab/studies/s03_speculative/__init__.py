"""Study 3: speculative decoding through the engine's speculative mode (``engine.speculative_engine``), measured.

Measuring path (``measure.py``, the GPU's, in parts: costs, real, lookup, controlled_*): ``pair.py``, a target and
its drafts; ``cost_ratio.py``, step costs (a pair's steps alternated), verify and rollback costs; ``sweep.py``, the
generation sweep per draft × γ × temperature; ``real_acceptance.py``, α of SmolLM2-135M-Instruct's proposers with
bootstrap intervals; ``controlled_engine.py``, controlled acceptance at the seed's shapes; ``lookup_speed.py``,
prompt lookup in the engine; ``params.py``, its profiles.
Reporting path (``report.py``, the CPU's, from the runs' files): ``tables.py``, the derived tables; ``verdicts.py``,
F3.1–F3.3; ``plots.py``, the figures; ``measured_alpha.py``, Study 6's α read from its runs.

This file imports nothing, so that importing the measuring path does not pull in the reporting one.
"""
