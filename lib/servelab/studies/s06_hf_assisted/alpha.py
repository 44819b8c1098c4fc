"""α of each real draft on SmolLM2-135M-Instruct, from Study 6's per-prompt agreement: its own page's table, and the
grey bands of Study 3's controlled curves (``s03_speculative.measured_alpha``), which read it here rather than through
this study's whole report, so that the two pages agree by construction and neither imports the other's page."""

from __future__ import annotations

import numpy as np
import pandas as pd

from servelab.studies.common.runs import RunSet

REAL_ALPHA_COLUMNS = ("pair", "alpha", "ci_low", "ci_high", "prompts", "draft", "target", "kind", "positions", "gamma",
                      "tokens_per_round", "alpha_rounds")  # fmt: skip  # = s03_speculative.real_acceptance.COLUMNS
REAL_ALPHA_SEED = 0  # the bootstrap's resampling seed: the interval is a function of the data alone


def real_alpha(runs: RunSet) -> pd.DataFrame:
    """α per real draft → target with its bootstrap 95% interval over held-out prompts (every repeat's prompts
    together): the columns ``s03_speculative.measured_alpha`` expects (pair, alpha, ci_low, ci_high, prompts, …).
    Computed from the runs' per-prompt agreement (``alpha_hits.csv``); empty where none was recorded (the legacy
    run measured α on its timed pairs only, ``alpha.csv``)."""
    h = runs.table("alpha_hits", dtype={"hits": str}) if runs.measured else pd.DataFrame()
    if h.empty:
        return pd.DataFrame(columns=list(REAL_ALPHA_COLUMNS))
    from servelab.studies.s03_speculative.real_acceptance import summarize  # imports torch: only with data

    h = h.sort_values(["draft", "repeat", "prompt"], kind="stable")
    out = []
    for target, g in h.groupby("target", sort=False):
        order = list(dict.fromkeys(g["draft"]))
        hits = {d: [np.array([c == "1" for c in s], bool) for s in g.loc[g["draft"] == d, "hits"]] for d in order}
        kinds = dict(zip(g["draft"], g["kind"], strict=False))
        gamma = int(runs.params.get("own_gamma", 4))
        out.append(summarize(hits, target=str(target), kinds=kinds, gamma=gamma, seed=REAL_ALPHA_SEED))
    return pd.concat(out, ignore_index=True)
