"""Against published results: the field's numbers (``data/published/published.csv``) beside this book's H200 numbers.

Each published number carries its unit, the hardware it was measured on and its bibliography key
(``book/references.bib``). Its H200 counterpart is computed here from the committed results, never typed: one
function per study in ``OURS`` reads the study's CSVs and returns the value with a few words saying what it is.
``table(study)`` pairs them; ``render_published`` writes the MyST table the book shows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from servelab.measure.results import results_root
from servelab.paths import DATA_DIR
from servelab.studies.common.markdown import format_value, list_table, md_text

PUBLISHED_CSV = DATA_DIR / "published" / "published.csv"
COLUMNS = ["study", "metric", "value", "unit", "hardware", "source", "note"]
TABLE_COLUMNS = ["metric", "published", "hardware", "source", "h200", "h200_what", "note"]


def load_published(path: Path = PUBLISHED_CSV) -> pd.DataFrame:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    return df


def _folder(root: Path, study: str) -> Path:
    found = sorted(Path(root).glob(f"*h200*/{study}"))
    if not found:
        raise FileNotFoundError(f"no H200 results of {study}")
    return found[-1]


def _scheduling(d: Path) -> tuple[str, str]:
    cap = pd.read_csv(d / "capacity.csv")
    parts = []
    for model, g in cap.groupby("model", sort=False):
        best = g.loc[g["capacity_req_s"].idxmax()]
        eager = g.loc[g["scheduler"] == "eager_cont_batch"]
        e = float(eager["capacity_req_s"].max()) if len(eager) else float("nan")
        low = float(g["lowest_rate"].min())
        e_text = f"{format_value(str(e))} req/s" if e > 0 else f"below the lowest rate swept ({low:.3g} req/s)"
        parts.append(
            f"{model.split(':')[-1]}: {best['scheduler']}@{best['budget']} {best['capacity_req_s']:.3g} req/s, "
            f"EagerContBatch {e_text}"
        )
    return "; ".join(parts), "capacity at the ITL SLO (Study 1)"


def _gpu_costs(d: Path) -> tuple[str, str]:
    ev = sorted(d.parent.glob("08_simulator/f23_evidence.csv"))
    if not ev:
        raise FileNotFoundError("no simulator validation (08_simulator/f23_evidence.csv)")
    row = pd.read_csv(ev[-1]).iloc[0]
    return f"{format_value(str(row['measured_value']))} {row['unit']}", "held-out serving error of the simulator (F2.3)"


def _speculative(d: Path) -> tuple[str, str]:
    s = pd.read_csv(d / "speedup.csv")
    best = s.loc[s["speedup"].idxmax()]
    return f"{best['speedup']:.2f} ×", f"best speedup measured ({best['draft']} → {best['target']}, γ={best['gamma']})"


def _kv_cache(d: Path) -> tuple[str, str]:
    c = pd.read_csv(d / "capacity.csv")
    paged = c[(c["layout"] == "paged") & (c["phase"] == "complete") & (c["block_size"] == 16)]
    return f"{paged['fragmentation_pct'].median():.2g} %", "paged pool, 16-token blocks, median over trials"


def _attention(d: Path) -> tuple[str, str]:
    p = pd.read_csv(d / "prefill.csv")
    p = p[p["status"] == "ok"]
    best = p.loc[p["achieved_tflop_s"].idxmax()]
    kernel = best["backend"] if isinstance(best["backend"], str) and best["backend"] else best["variant"]
    what = f"best attention forward measured ({kernel}, {best['dtype']}, {best['q_len']} tokens)"
    return f"{best['achieved_tflop_s']:.0f} TFLOP/s", what


def _hf_assisted(d: Path) -> tuple[str, str]:
    s = pd.read_csv(d / "speedups.csv")
    s = s[s["method"] == "assisted"]
    best = s.loc[s["speedup_median"].idxmax()]
    return f"{best['speedup_median']:.2f} ×", f"best assisted pair ({best['pair']}, {best['length']} tokens)"


def _prefix_cache(d: Path) -> tuple[str, str]:
    s = pd.read_csv(d / "prefix_length_speedup.csv")
    best = s.loc[s["speedup"].idxmax()]
    return f"{best['speedup']:.2f} ×", f"prefill speedup with a cached {int(best['prefix_tokens'])}-token prefix"


OURS: dict[str, Callable[[Path], tuple[str, str]]] = {
    "01_scheduling": _scheduling,
    "02_gpu_costs": _gpu_costs,
    "03_speculative": _speculative,
    "04_kv_cache": _kv_cache,
    "05_attention": _attention,
    "06_hf_assisted": _hf_assisted,
    "07_prefix_cache": _prefix_cache,
}


def table(study: str, root: Path | None = None, published: pd.DataFrame | None = None) -> pd.DataFrame:
    """The published numbers of ``study`` beside the H200's (``h200``: "not measured" where no run exists)."""
    pub = load_published() if published is None else published
    rows = []
    for r in pub[pub["study"] == study].itertuples():
        try:
            ours, what = OURS[study](_folder(Path(root or results_root()), study))
        except (FileNotFoundError, KeyError) as e:
            ours, what = "not measured", str(e)
        rows.append(
            {
                "metric": r.metric,
                "published": f"{r.value} {r.unit}",
                "hardware": r.hardware,
                "source": r.source,
                "h200": ours,
                "h200_what": what,
                "note": r.note,
            }
        )
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def render_published(study: str, root: Path | None = None) -> str:
    """A MyST table of ``table(study)``, citing each source."""
    t = table(study, root)
    if t.empty:
        return "No published number is paired with this study yet.\n"
    header = ["Metric", "Published", "Measured on", "Source", "H200 (this book)", "Note"]
    rows = [
        [
            md_text(r.metric),
            md_text(r.published),
            md_text(r.hardware),
            f"{{cite:p}}`{r.source}`",
            md_text(f"{r.h200} ({r.h200_what})"),
            md_text(r.note),
        ]
        for r in t.itertuples()
    ]
    return list_table(header, rows, [18, 10, 18, 10, 24, 20], css="servelab-published")


def render_all_published(root: Path | None = None) -> str:
    """The findings page's section: one table per study that has a published comparison."""
    from servelab_book.studies import STUDIES

    pub = load_published()
    out = []
    for s in STUDIES:
        if (pub["study"] == s.slug).any():
            out.append(f"### Study {s.number}: {md_text(s.title)}\n\n{render_published(s.slug, root)}")
    return "\n".join(out)
