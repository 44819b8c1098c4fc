"""A part of Study 3 run on its own writes its raw rows to its own folder and its table beside the study's."""

import json

import pandas as pd

from servelab.studies.s03_speculative.part import run_part


def test_a_part_writes_raw_rows_apart_and_its_table_beside_the_study(scratch_results):
    seen = []

    def measure(device):
        seen.append(device)
        return pd.DataFrame({"x": [1.0, 2.0, 3.0]})

    table, wall_s = run_part(
        "03_speculative_demo", "demo_raw", "demo", {"profile": "smoke"}, measure, lambda raw: raw.assign(y=2 * raw.x)
    )
    assert seen == ["cpu"] and wall_s >= 0
    (device_dir,) = [p for p in scratch_results.iterdir() if p.is_dir()]
    raw = pd.read_csv(device_dir / "03_speculative_demo" / "demo_raw.csv")
    assert raw.x.tolist() == [1.0, 2.0, 3.0]
    assert pd.read_csv(device_dir / "03_speculative" / "demo.csv").y.tolist() == table.y.tolist() == [2.0, 4.0, 6.0]
    side = json.loads((device_dir / "03_speculative_demo" / "run.json").read_text())
    assert side["params"]["profile"] == "smoke"
