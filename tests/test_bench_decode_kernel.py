"""``scripts/bench_decode_kernel.py --sweep-splits``'s reading, on a CPU: which forced split count was fastest at each
point, and how far each rule's pick (the engine's decode graphs', FlashAttention-2's) lands from it."""

import importlib.util

import pandas as pd
import pytest
from interpreted import ROOT


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_decode_kernel", ROOT / "scripts" / "bench_decode_kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_rules_pick_is_read_against_the_fastest_split(bench):
    times = {
        (64, 512): {1: 0.30, 2: 0.33, 3: 0.34, 4: 0.35, 8: 0.36},
        (1, 4096): {1: 2.0, 2: 1.0, 3: 0.7, 4: 0.5, 8: 0.3},
    }
    picks = {(64, 512): (3, 2, 1), (1, 4096): (16, 16, 8)}  # engine full width, exact width, FA2
    rows = pd.DataFrame(
        [
            {
                "batch": b,
                "context": c,
                "splits": s,
                "ms": ms,
                "engine_full_width": picks[b, c][0],
                "exact_width": picks[b, c][1],
                "flash_attention_2": picks[b, c][2],
            }  # fmt: skip
            for (b, c), by in times.items()
            for s, ms in by.items()
        ]
    )
    loss = bench.pick_losses(rows).set_index(["batch", "context"])
    assert loss.loc[(64, 512), "fastest"] == 1 and loss.loc[(64, 512), "fastest_ms"] == 0.30
    assert loss.loc[(64, 512), "engine_full_width_loss"] == pytest.approx(0.34 / 0.30)
    assert loss.loc[(64, 512), "flash_attention_2_loss"] == 1.0
    assert loss.loc[(1, 4096), "fastest"] == 8 and loss.loc[(1, 4096), "flash_attention_2_loss"] == 1.0
    assert pd.isna(loss.loc[(1, 4096), "engine_full_width_loss"])  # 16 splits were not timed: no loss is read


def test_flash_attention_2s_heuristic(bench):
    fa2 = bench.flash_attention_splits
    assert fa2(128, 132, 8) == 1 and fa2(106, 132, 64) == 1  # the programs fill 80% of the SMs: no split
    assert fa2(64, 132, 16) == 2  # two waves of 64 on 132 SMs: 97% efficient
    assert fa2(2, 132, 1024) == 57  # the fewest splits within 85% of the best wave efficiency (64 splits: 97%)
    # 53-63 splits would leave as many key blocks per split as one fewer (256 blocks: 5 each, or 4 at 64): not taken
    assert fa2(2, 132, 256) == 64
    assert fa2(2, 132, 8) == 8  # never more splits than key blocks
