"""The simulator's validation (notebook 08): ``servelab.sim`` replayed against the studies' real runs.

- ``study1_runs.py``: Study 1's runs and what replaying them faithfully needs; ``validation.py``: real vs simulated;
- ``context_reads.py``: what a step pays to read cached context, fitted from Study 2's steps;
- ``ablation.py``: the validation with each GPU cost term left out;
- ``study7_runs.py``: Study 7's server runs replayed with the prefix cache;
- ``prefix_routing.py``: routers over replicas that keep prefix caches;
- ``speed.py``: simulated requests per second of wall time;
- ``freeze.py``, ``ledger.py``, ``heldout.py``: the frozen cost model and fresh runs each evaluated once;
- ``page.py``: the page's sections, one call each; ``takeaways.py``: its takeaway sentences; ``source_words.py``:
  where a model's GPU terms come from, in words;
- ``params.py``, ``verdicts.py`` (F2.3), ``plots.py``.
"""
