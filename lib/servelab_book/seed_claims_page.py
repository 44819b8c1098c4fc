"""The seed's claims of one study as a MyST include for its "not yet measured" placeholder page.

Each claim gets a labelled section (``claim-f1-1``) that the findings table links to. The values are
the RTX 2070's, from ``data/seed/claims.csv``; nothing of the H200 appears here.
"""

from __future__ import annotations

import pandas as pd

from servelab.studies.common.markdown import md_text
from servelab_book.seed_claims import claim_anchor


def render_seed_claims(seed: pd.DataFrame, study: str) -> str:
    """One ``###`` section per claim of ``study``: the claim and its RTX 2070 value."""
    part = seed[seed["study"] == study]
    if part.empty:
        raise ValueError(f"no seed claims for study {study!r}")
    out = []
    for r in part.itertuples():
        out.append(
            f"({claim_anchor(r.id)})=\n### {r.id}: {md_text(r.claim)}\n\n"
            f"On the seed's RTX 2070: **{md_text(r.rtx2070_value)}**. On the H200: not yet measured.\n"
        )
    return "\n".join(out)
