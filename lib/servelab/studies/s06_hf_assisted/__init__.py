"""Study 6: Hugging Face's ``generate(assistant_model=...)`` and prompt-lookup decoding, timed.

- :mod:`clock` — a streamer that timestamps every batch of new tokens (CUDA events, or ``perf_counter``
  on the CPU), so one generate run gives the time to reach every output length;
- :mod:`runs` — one timed greedy generate (plain, assisted, prompt lookup) and the jobs of one prompt;
  :mod:`own` — the project's own speculative decoder (``servelab.spec``) on the same pairs;
- :mod:`sweep` — the passes over the prompts (short, long, spread), cheapest first, within a wall-time
  budget, with a row and a reason for every run that did not happen;
- :mod:`study` — the whole study from its parameters, on one wall-time budget (``studies.common.budget``);
  :mod:`report` — its tables and takeaways; :mod:`seed_costs` — HF's cost ratio at the seed's shapes;
- :mod:`attention_backend` — the SDPA kernels of the HF runs, and what a first call at a new length costs;
- :mod:`models` — SmolLM2-135M-Instruct and its distilled drafts, or hub ids / model directories;
- :mod:`acceptance` — the draft's greedy agreement with the target (α), teacher-forced;
- :mod:`analysis` — speedups against plain generate, cost ratios, output match rates, what ran;
- :mod:`verdicts` — F6.1 and F6.2 from the data; :mod:`plots` — the figures;
- :mod:`params` — the notebook's parameters, their validation, and the pairs they imply.
"""
