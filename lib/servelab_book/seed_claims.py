"""The seed's 22 claims (F1.1 … F7.4) with their RTX 2070 values, from ``data/seed/claims.csv``.

These are the seed's numbers, typed once from its summaries; the H200 values come from the studies'
``findings.csv`` files (see ``servelab_book.findings``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from servelab.paths import REPO_ROOT
from servelab_book.studies import STUDIES

SEED_CLAIMS_CSV = REPO_ROOT / "data" / "seed" / "claims.csv"
SEED_COLUMNS = ["id", "study", "claim", "rtx2070_value"]
CLAIM_ID = re.compile(r"^F(\d)\.(\d+)$")
N_CLAIMS = 22


def claim_sort_key(claim_id: str) -> tuple[int, int]:
    """F2.10 sorts after F2.9: (study number, claim number)."""
    m = CLAIM_ID.match(claim_id)
    if not m:
        raise ValueError(f"not a claim id (F<study>.<n>): {claim_id!r}")
    return int(m.group(1)), int(m.group(2))


def claim_anchor(claim_id: str) -> str:
    """The label of a claim on its placeholder page: F2.1 -> claim-f2-1."""
    study, n = claim_sort_key(claim_id)
    return f"claim-f{study}-{n}"


def load_seed_claims(path: Path = SEED_CLAIMS_CSV) -> pd.DataFrame:
    """Read and validate the seed's claims: 22 unique ids, each in the study its number names."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in SEED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}; expected {SEED_COLUMNS}")
    problems = []
    slugs = {s.number: s.slug for s in STUDIES}
    for row in df.itertuples():
        m = CLAIM_ID.match(row.id)
        if not m:
            problems.append(f"bad claim id {row.id!r}")
        elif slugs.get(int(m.group(1))) != row.study:
            problems.append(
                f"{row.id} is listed under study {row.study!r}, but its number says "
                f"{slugs.get(int(m.group(1)), 'no study')!r}"
            )
        if not row.claim.strip() or not row.rtx2070_value.strip():
            problems.append(f"{row.id}: empty claim or RTX 2070 value")
    if df["id"].duplicated().any():
        problems.append(f"duplicate ids {df.loc[df['id'].duplicated(), 'id'].tolist()}")
    if len(df) != N_CLAIMS:
        problems.append(f"{len(df)} claims, expected {N_CLAIMS}")
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    order = sorted(df["id"], key=claim_sort_key)
    return df.set_index("id").loc[order].reset_index()[SEED_COLUMNS]
