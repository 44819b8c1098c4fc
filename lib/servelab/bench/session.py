"""One run of the benchmark: its plan, clock, device ceilings, the model under test and the tables it fills.

Every section (``decode_rows``, ``offline_rows``, ``prefill_rows``, ``latency_rows``, ``exactness_rows``)
takes the session, appends its rows and calls ``flush()``, so a run cut short still leaves its tables.
"""

from __future__ import annotations

import gc

import pandas as pd

from servelab.bench.plan import BenchPlan, Clock
from servelab.bench.rows import bench_row


class BenchSession:
    def __init__(self, plan: BenchPlan, *, write: bool = True, progress: bool = True, log=print):
        import torch

        from servelab.measure import Roofline, device_record, measure_ceilings
        from servelab.measure.results import StudyResults
        from servelab.models import ModelShape

        self.plan, self.progress, self.log = plan, progress, log
        self.clock = Clock(plan.time_budget_s)
        self.dev = device_record(plan.device)
        self.cuda = self.dev.kind == "cuda"
        log(self.dev.summary())
        self.ceil = ceil = measure_ceilings(plan.device)
        self.roof = Roofline.from_ceilings(ceil)
        matmul = f"matmul {ceil.matmul_tflop_s:,.1f} TFLOP/s ({ceil.matmul_dtype})"
        log(f"ceilings: copy {ceil.copy_gb_s:,.0f} GB/s, {matmul}")
        self.rows, self.decode_rows, self.offline_rows, self.latency_rows, self.exact = [], [], [], [], []
        self.results = StudyResults("engine", self.dev, dict(plan.__dict__), ceil) if write else None
        self.dtype_bytes = torch.empty(0, dtype=getattr(torch, plan.dtype)).element_size()
        self.hf = self.load(plan.model)
        self.shape = ModelShape.from_config(self.hf.config)
        self.default_engine = None  # the default-configuration engine on ``hf``, shared by the sections that use it

    def load(self, spec: str):
        """A model the loader accepts, in the plan's dtype on its device."""
        from servelab.models import load_model

        p = self.plan
        return load_model(spec, dtype=p.dtype, device=p.device, seed=p.seed, load_tokenizer=False).model

    def add(self, metric: str, value, unit: str, bound=None, note: str = "", low=None, high=None) -> None:
        self.rows.append(bench_row(metric, value, unit, bound, note, low, high))

    def free(self) -> None:
        """Give cached GPU memory back between measurements."""
        import torch

        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()

    def tables(self) -> dict[str, pd.DataFrame]:
        return {
            "bench": pd.DataFrame(self.rows),
            "decode": pd.DataFrame(self.decode_rows),
            "offline": pd.DataFrame(self.offline_rows),
            "latency": pd.DataFrame(self.latency_rows),
            "exactness": pd.concat(self.exact, ignore_index=True) if self.exact else pd.DataFrame(),
        }

    def flush(self) -> dict[str, pd.DataFrame]:
        """Write what is measured so far: a run cut short by an outer time limit still leaves its tables."""
        tables = self.tables()
        if self.results is not None:
            for name, df in tables.items():
                if len(df):
                    self.results.write(name, df)
        return tables

    def close(self, wall_s: float) -> dict[str, pd.DataFrame]:
        self.default_engine = self.hf = None
        self.free()
        tables = self.flush()
        if self.results is not None:
            from servelab.bench.jobs import stamp

            # the fingerprint of what measured it, as a study's run.json has: `make gpu-plan` lists the benchmark
            # again once the engine's code moves (servelab.bench.jobs)
            self.results.finish(wall_s=wall_s, **stamp("servelab.bench.run"))
            self.log(f"wrote {', '.join(self.results.files)} under {self.results.dir}")
        return tables
