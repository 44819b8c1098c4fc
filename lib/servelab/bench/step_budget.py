"""``python -m servelab.bench.step_budget``: where one engine step's time goes, by kernel class, beside each floor.

    python -m servelab.bench.step_budget --model config:qwen2-0.5b --out data/results/nvidia-h200/engine  # a GPU
    python -m servelab.bench.step_budget --model config:tiny-qwen2 --device cpu --dtype float32 --out /tmp/sb

Step kinds (``GPU_KINDS``): decode at batch 1 / context 128, at batch 64 / context 512 and at batch 1 / context
16384; a mixed step (63 decodes at context 512 and a 512-token chunk, the benchmark's ``mixed_step``), and two with
the decode contexts of Study 1's server (3 and 24 decodes at about 2,400 keys beside a 512-token chunk); a
4096-token prefill. For each, ``step_budget_kind.measure_kind`` builds the engine's default configuration for the
step, times it, profiles it with ``torch.profiler`` and splits its kernels into classes (GEMM, attention, norm and
elementwise, sampling, copies, other) beside each class's floor at the ceilings measured in the same run.

Written into ``--out`` (default ``<results>/<device>/engine``): ``step_budget.csv``, one row per step kind and class,
the step's own figures (step, wall, span, idle gaps, host time, floors) repeated on each of its rows, rewritten after
every step kind so a run cut short keeps what it measured; ``step_kernels.csv``, one row per step kind and distinct
kernel (class, launches and busy ms per step, one launch's mean µs), rewritten with it; and
``step_budget.run.json`` (commit, device and versions, ceilings, parameters, ``complete`` once every kind ran or was
skipped). Not ``run.json``: the benchmark's own sidecar sits in the same folder.

``--device cpu`` is for the tests: the step kinds shrink (``CPU_KINDS``), and with no GPU the "kernels" are the
outermost aten operators, so its numbers say nothing about a GPU. On the H200 its five first kinds took 50 s
(2026-12-05), most of it building, compiling and capturing one engine per step kind; ``--time-budget`` skips the
kinds that would start after it.
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from servelab.bench.cli_args import bench_parser
from servelab.bench.step_budget_kind import KERNEL_COLUMNS, StepKind, failed_rows, measure_kind
from servelab.errors import ParameterError

CSV = "step_budget.csv"
KERNELS_CSV = "step_kernels.csv"
SIDECAR = "step_budget.run.json"
GPU_KINDS = (
    StepKind(1, 1, 128),
    StepKind(64, 1, 512),
    StepKind(1, 1, 16384),
    StepKind(1, 512, 0, decodes=63, decode_context=512),
    # the mixed steps Study 1's server runs (qwen2-0.5b, chunked prefill at 512, repeat 0 at 94c0bf13c028): a first
    # chunk beside 3 decodes of ~2,460 keys took 7.78 ms on the device (median), the same chunk alone 3.03 ms and a
    # decode step of 2 sequences 1.30 ms; a typical one (23 decodes of ~2,340 keys) 10.95 ms, against 3.43 ms for
    # the kind above. These two isolate what decodes of server-length contexts cost inside a mixed step
    StepKind(1, 512, 0, decodes=3, decode_context=2432),
    StepKind(1, 512, 0, decodes=24, decode_context=2304),
    StepKind(1, 4096, 0),
)
CPU_KINDS = (  # the same kinds, small enough for a tiny model on a CPU in seconds
    StepKind(1, 1, 16),
    StepKind(4, 1, 32),
    StepKind(1, 1, 256),
    StepKind(1, 16, 0, decodes=3, decode_context=16),
    StepKind(1, 16, 0, decodes=1, decode_context=64),
    StepKind(1, 16, 0, decodes=4, decode_context=64),
    StepKind(1, 128, 0),
)


@dataclass(frozen=True)
class BudgetPlan:
    model: str
    dtype: str
    device: str
    kinds: tuple[StepKind, ...]
    repeats: int
    profiled_calls: int
    seed: int
    time_budget_s: float  # step kinds not started by then are skipped (and say so)


class BudgetSession:
    """One run's device, ceilings and model, and what each step kind needs of them."""

    def __init__(self, plan: BudgetPlan, log=print):
        import torch

        from servelab.measure import Roofline, device_record, measure_ceilings
        from servelab.models import ModelShape, load_model

        self.plan, self.log = plan, log
        self.dev = device_record(plan.device)
        self.cuda = self.dev.kind == "cuda"
        log(self.dev.summary())
        self.ceilings = measure_ceilings(plan.device)
        self.roof = Roofline.from_ceilings(self.ceilings)
        log(f"ceilings: copy {self.ceilings.copy_gb_s:,.0f} GB/s, matmul {self.ceilings.matmul_tflop_s:,.1f} TFLOP/s")
        self.dtype_bytes = torch.empty(0, dtype=getattr(torch, plan.dtype)).element_size()
        lm = load_model(plan.model, dtype=plan.dtype, device=plan.device, seed=plan.seed, load_tokenizer=False)
        self.model = lm.model
        self.shape = ModelShape.from_config(self.model.config)

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()

    def free(self) -> None:
        """Give cached GPU memory back between step kinds (each builds an engine of its own)."""
        import torch

        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


def versions() -> dict:
    """Versions of what ran the step beyond the device record's (torch, transformers, CUDA): Triton's."""
    try:
        import triton

        return {"triton": triton.__version__}
    except ImportError:
        return {"triton": None}


def write_sidecar(out: Path, session: BudgetSession, started: str, t0: float, complete: bool) -> Path:
    from servelab.bench.jobs import stamp
    from servelab.measure.results import git_commit

    side = {
        "study": "engine",
        "what": "step_budget",
        "git_commit": git_commit(),
        "started_utc": started,
        "written_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - t0, 1),
        "device": session.dev.as_dict(),
        "versions": versions(),
        "ceilings": session.ceilings.as_dict(),
        "params": asdict(session.plan) | {"kinds": [k.name for k in session.plan.kinds]},
        "files": [CSV, KERNELS_CSV],
        "complete": complete,
        **stamp("servelab.bench.step_budget"),  # `make gpu-plan` lists the job again once this moves
    }
    path = out / SIDECAR
    path.write_text(json.dumps(side, indent=2, default=str) + "\n")
    return path


def run_budget(plan: BudgetPlan, out: Path | None = None, log=print) -> pd.DataFrame:
    """Measure every step kind the time budget allows; write the CSV after each, and the sidecar."""
    t0, started = time.monotonic(), _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    session = BudgetSession(plan, log)
    if out is None:
        from servelab.measure.results import results_root

        out = results_root() / session.dev.slug / "engine"
    out.mkdir(parents=True, exist_ok=True)
    write_sidecar(out, session, started, t0, complete=False)
    rows, kernels = [], []
    for kind in plan.kinds:
        if time.monotonic() - t0 > plan.time_budget_s:
            rows += failed_rows(kind, "skipped: time budget")
            log(f"{kind.name}: skipped (time budget)")
            continue
        try:
            rows += measure_kind(session, kind, kernels)
            log(f"{kind.name}: step {rows[-1]['step_ms']:.3f} ms ({rows[-1]['path']}, {rows[-1]['profile_source']})")
        except Exception as e:  # record and go on: one step kind that fails must not cost the others
            rows += failed_rows(kind, f"error: {type(e).__name__}: {e}"[:300])
            log(f"{kind.name}: {type(e).__name__}: {e}")
        session.free()
        pd.DataFrame(rows).to_csv(out / CSV, index=False)
        pd.DataFrame(kernels, columns=KERNEL_COLUMNS).to_csv(out / KERNELS_CSV, index=False)
    session.dev.close()  # the clocks at the end, beside those at the start (a study's StudyResults.finish does it)
    write_sidecar(out, session, started, t0, complete=True)
    log(f"wrote {CSV}, {KERNELS_CSV} and {SIDECAR} under {out}")
    return pd.DataFrame(rows)


def parse_args(argv=None):
    p = bench_parser("python -m servelab.bench.step_budget", __doc__)
    p.add_argument("--out", type=Path, default=None, help="folder for the CSV (default <results>/<device>/engine)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per step (default 30 on CUDA, 5 on a CPU)")
    p.add_argument("--profiled-calls", type=int, default=None, help="calls profiled per step (default 5; 2 on a CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-budget", type=float, default=420.0, help="seconds; step kinds after it are skipped")
    args = p.parse_args(argv)
    for name in ("repeats", "profiled_calls"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ParameterError(f"--{name.replace('_', '-')} must be >= 1")
    return args


def make_plan(args) -> BudgetPlan:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    return BudgetPlan(
        model=args.model,
        dtype=args.dtype,
        device=device,
        kinds=GPU_KINDS if cuda else CPU_KINDS,
        repeats=args.repeats or (30 if cuda else 5),
        profiled_calls=args.profiled_calls or (5 if cuda else 2),
        seed=args.seed,
        time_budget_s=args.time_budget,
    )


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except ParameterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    table = run_budget(make_plan(args), args.out)
    shown = ["step", "class", "kernels", "busy_ms", "floor_ms", "step_ms", "idle_gap_ms", "host_ms", "status"]
    with pd.option_context("display.width", 200):
        print(table[[c for c in shown if c in table.columns]].to_string(index=False, float_format="{:.4f}".format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
