"""The book's figure style: one colour per policy, kernel and mode, the same on every page; sharp output; type
readable at page width.

A notebook calls ``use_book_style()`` once, before its first figure. It sets matplotlib's defaults (type sizes,
legend frame, grid, a figure size that fills the page's text column) and asks the inline backend for SVG, so a
figure stays sharp at any zoom (``set_matplotlib_formats``, the ``%config InlineBackend.figure_formats`` of a
notebook). ``color(name)`` gives the colour of a named thing (a scheduling policy, an attention kernel, an
execution mode, a cache policy), so that "ChunkedPrefill" or "flash" is one colour across the book; ``palette``
gives a seaborn ``palette=`` mapping for several. The colours are the Okabe–Ito set and its neighbours, chosen to
stay distinct for readers with colour-vision deficiencies.

Nothing here imports the book's tooling (``servelab_book``): a study's plots use it on their own.
"""

from __future__ import annotations

from collections.abc import Iterable

from servelab.errors import ParameterError

# Okabe–Ito (2008), colour-blind safe, then two darker neighbours for the larger families.
OKABE_ITO = {
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
    "black": "#000000",
    "grey": "#999999",
    "brown": "#8C510A",
    "teal": "#01665E",
}
_C = OKABE_ITO

# One colour per named thing. Names are those the studies' data use (lower case, as in the CSVs).
COLORS: dict[str, str] = {
    # scheduling policies (Study 1, the simulator)
    "fcfs": _C["grey"],
    "eagercontbatch": _C["vermillion"],
    "chunkedprefill": _C["blue"],
    # attention kernels (Studies 2, 4, 5, 6)
    "naive": _C["grey"],
    "math": _C["brown"],
    "sdpa_math": _C["brown"],
    "sdpa": _C["sky"],
    "sdpa_default": _C["sky"],
    "flash": _C["orange"],
    "sdpa_flash": _C["orange"],
    "efficient": _C["green"],
    "sdpa_efficient": _C["green"],
    "cudnn": _C["purple"],
    "sdpa_cudnn": _C["purple"],
    "flex": _C["teal"],
    "triton": _C["blue"],
    "gather": _C["yellow"],
    "sliding_window": _C["vermillion"],
    "gqa": _C["black"],
    "sdpa_repeat_kv": _C["black"],
    # execution modes (Studies 2, 3, the engine)
    "hf_eager": _C["grey"],
    "hf_cuda_graph": _C["sky"],
    "engine_eager": _C["orange"],
    "engine": _C["blue"],
    "engine_process": _C["teal"],
    # cache policies (Study 7)
    "lru": _C["orange"],
    "lfu": _C["green"],
    "radix": _C["blue"],
    "fifo": _C["grey"],
    # reference marks: the seed's value, a measured ceiling, a model's prediction
    "seed": _C["grey"],
    "ceiling": _C["black"],
    "model": _C["vermillion"],
}

RC = {
    "figure.figsize": (7.5, 4.2),  # inches: about the book's text column at 100% zoom
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 9.5,
    "legend.frameon": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "none",  # text stays text in the SVG: searchable, and sized by the page
    # the same figure gives the same bytes (its element ids come from this salt, not a random one), so a page
    # re-rendered from the same data equals the committed one (checked by nbval)
    "svg.hashsalt": "servelab",
    "savefig.bbox": "tight",
}
FIGURE_FORMATS = ("svg",)


def _key(name: str) -> str:
    return str(name).strip().lower().replace("-", "_").replace(" ", "")


def color(name: str) -> str:
    """The book's colour for a policy, kernel, mode or cache policy (case and dashes ignored)."""
    try:
        return COLORS[_key(name)]
    except KeyError:
        raise ParameterError(f"no book colour for {name!r}; the named ones are {sorted(COLORS)}") from None


def palette(names: Iterable[str]) -> dict[str, str]:
    """A seaborn ``palette=`` for ``names``, keyed by the names as given."""
    return {n: color(n) for n in names}


def whole_numbers(df):
    """``df`` with each float column whose values are all whole numbers (no missing value) as integers: a count or a
    byte size reads "1209", not "1209.0" (pandas keeps a column float once any step made it so, a median or a round)."""
    import numpy as np

    out = df.copy()
    for col in out.columns:
        v = out[col]
        if v.dtype.kind == "f" and len(v) and v.notna().all() and np.isfinite(v).all() and (v == v.round()).all():
            out[col] = v.astype("int64")
    return out


def book_table(df):
    """A table as the book shows it: one header row where the columns have one level (a pivot's index becomes its
    first columns, and the columns' name, which pandas prints as a header row of its own, goes), and whole-number
    columns as integers. A table whose columns have two levels keeps them: there the levels carry meaning."""
    out = df.copy()
    if out.columns.nlevels == 1:
        named = [n for n in out.index.names if n is not None]
        if named and not set(named) & set(out.columns):  # an index level named as a column stays the index
            out = out.reset_index()
        out.columns.name = None
    return whole_numbers(out)


MISSING_CELL = "—"  # a cell with no value (a point not run, a column that does not apply), where pandas prints NaN


def book_html(df) -> str:
    """``book_table``'s HTML, without the row numbers pandas prints for an unnamed integer index (0, 1, 2, ...,
    or what a filter left of them): they label nothing, and a reader takes the first column for data. A missing
    value reads as a dash, not NaN."""
    out = book_table(df)
    numbered = out.index.nlevels == 1 and out.index.name is None and out.index.dtype.kind in "iu"
    return out.to_html(index=not numbered, border=1, notebook=True, na_rep=MISSING_CELL)


def _show_tables_as_the_book_does() -> None:
    """Every DataFrame a page displays, through ``book_table``: the notebooks display tables both through ``show``
    and with IPython's ``display``, and the rule is one for all of them."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None:
        return
    import pandas as pd

    formatters = ip.display_formatter.formatters
    formatters["text/html"].for_type(pd.DataFrame, book_html)
    formatters["text/plain"].for_type(pd.DataFrame, lambda df, p, cycle: p.text(repr(book_table(df))))


def use_book_style(formats: tuple[str, ...] = FIGURE_FORMATS) -> None:
    """Set the book's matplotlib defaults, the inline backend's output format (SVG; "retina" for a 2× PNG), and
    tables shown whole, with one header row and whole numbers as integers (``book_table``)."""
    import os

    import matplotlib as mpl
    import pandas as pd

    mpl.rcParams.update(RC)
    # a table's cells reach the reader whole: pandas cuts text at 50 characters by default, and a capacity that read
    # "1.56 req/s (median; the repeats bracket it dif..." hid what the repeats did
    pd.set_option("display.max_colwidth", None)
    _show_tables_as_the_book_does()
    os.environ.setdefault("SOURCE_DATE_EPOCH", "0")  # the SVG's date: none that changes between renders
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:  # no IPython kernel here (a script): figures are saved by the caller
        return
    set_matplotlib_formats(*formats)
