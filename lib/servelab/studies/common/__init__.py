"""What every study shares, so that no study carries a copy.

- ``params.py``: profiles (full / smoke), ``resolve`` (defaults plus overrides) and the checks; ``overrides_from``
  reads a notebook's parameters cell;
- ``findings.py``: ``Finding``, one verdict on one seed claim; ``claim_finding.py``: a claim's ``Finding`` with its
  id and wording filled in; ``tested_on.py``: what it was measured on, in words;
- ``repeats.py``: ≥ 3 repeats of a claim combined (median, interval, ``inconclusive``); ``campaign.py``: the GPU
  jobs (study × part × repeat) run as fresh processes; ``rules.py``: the registry of verdict rules and their changes;
- ``page.py``: the findings-first parts of a study page; ``study_page.py``: the record every study's page fills;
  ``rerun.py``: the papermill command and parameters cell that re-run a page (the book's methodology page uses it
  too); ``style.py``: the book's figure style and colours;
  ``roofline_plot.py``: achieved FLOP/s against arithmetic intensity, under both measured ceilings;
  ``quiet.py``: silencing library chatter at its source; ``budget.py``: a study's wall-time budget;
- ``family/``: the small trained model family (Studies 3 and 6); ``drafts/``: drafts distilled from SmolLM2.
"""
