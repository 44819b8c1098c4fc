"""Every seed number a study's rules use is the seed's, as ``data/seed/claims.csv`` states it.

The rules compare H200 numbers with the RTX 2070's (``SEED_*`` constants in each study's ``verdicts``): a constant
mistyped there would move a verdict with no data changed. Each is checked against the numbers of its claim's
``rtx2070_value``, so the seed's file stays the one place the seed's values are written.
"""

import re

import pandas as pd
import pytest

from servelab.paths import DATA_DIR
from servelab.studies.s01_scheduling import verdicts as s01
from servelab.studies.s02_gpu_costs import verdicts as s02
from servelab.studies.s03_speculative import verdicts as s03
from servelab.studies.s04_kv_cache import verdicts as s04
from servelab.studies.s05_attention import verdicts as s05
from servelab.studies.s06_hf_assisted import verdicts as s06
from servelab.studies.s07_prefix_cache import verdicts as s07

SEED = pd.read_csv(DATA_DIR / "seed" / "claims.csv", dtype=str, keep_default_na=False).set_index("id")


def numbers(claim: str) -> list[float]:
    """The numbers of a claim's RTX 2070 value, in order ("5,300–10,800 µs/token" -> [5300, 10800])."""
    return [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", SEED.loc[claim, "rtx2070_value"])]


@pytest.mark.parametrize(
    "claim, constants",
    [
        ("F1.1", [s01.SEED_STALL_EAGER_MS, s01.SEED_STALL_CHUNKED_MS]),
        ("F2.1", [float(x) for x in s02.CLAIMS["F2.1"][1].split("–")]),
        ("F2.2", [float(x.replace(",", "")) for x in s02.CLAIMS["F2.2"][1].split("–")]),
        ("F3.3", [s03.SEED_TARGET_OVER_DRAFT]),
        ("F4.1", [s04.SEED_BYTES_PER_TOKEN / 1024]),  # "36 KB/token": KiB, as the formula gives for GPT-2 fp16
        ("F4.2", [s04.SEED_DECODE_VARIATION_PCT]),
        ("F4.3", list(s04.SEED_COMPACTION_GB_S)),
        ("F4.4", [100 * (s04.SEED_COMPACTION_SPEEDUP - 1)]),  # "30% faster"
        ("F5.1", [s05.SEED_SPEEDUP]),
        ("F5.2", [s05.SEED_MEMORY_GROWTH["naive"], s05.SEED_MEMORY_GROWTH["sdpa_default"]]),
        ("F6.1", [s06.SEED_BEST_SPEEDUP]),
        ("F7.1", [s07.SEED_SPEEDUP_512]),
        ("F7.2", [s07.SEED_TURN_SPEEDUP]),
        ("F7.3", [s07.SEED_BREAKEVEN[512], s07.SEED_PREFIX, s07.SEED_BREAKEVEN[128], 128]),
        ("F7.4", [100 * s07.SEED_LFU_HIT]),
    ],
)
def test_a_rules_seed_constants_are_the_seeds_numbers(claim, constants):
    assert numbers(claim)[: len(constants)] == pytest.approx(constants), (claim, SEED.loc[claim, "rtx2070_value"])


def test_the_seed_numbers_parse():
    assert numbers("F2.2") == [5300, 10800] and numbers("F4.1")[:1] == [36]
