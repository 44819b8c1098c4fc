"""The book's figure style: one colour per name across the book, SVG inline output, readable type."""

from __future__ import annotations

import pytest

from servelab.errors import ParameterError
from servelab.studies.common import style


def test_each_family_has_distinct_colours():
    families = [
        ["FCFS", "EagerContBatch", "ChunkedPrefill"],
        ["naive", "sdpa_math", "sdpa_default", "flash", "efficient", "cudnn", "flex"],
        ["hf_eager", "hf_cuda_graph", "engine_eager", "engine"],
        ["lru", "lfu", "radix", "fifo"],
    ]
    for names in families:
        colours = [style.color(n) for n in names]
        assert len(set(colours)) == len(colours), names


def test_names_are_matched_loosely_and_unknown_ones_refused():
    assert style.color("ChunkedPrefill") == style.color("chunkedprefill")
    assert style.color("sdpa-flash") == style.color("sdpa_flash") == style.color("flash")
    assert style.palette(["FCFS", "engine"]) == {"FCFS": style.color("fcfs"), "engine": style.color("engine")}
    with pytest.raises(ParameterError, match="no book colour for 'bogus'"):
        style.color("bogus")


def test_book_style_sets_svg_output_and_readable_type():
    """In a notebook's shell, a figure is displayed as SVG and not as a PNG."""
    import matplotlib as mpl
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib.figure import Figure

    shell = InteractiveShell.instance()
    try:
        with mpl.rc_context():
            style.use_book_style()
            assert mpl.rcParams["font.size"] >= 10 and mpl.rcParams["legend.fontsize"] >= 9
            assert mpl.rcParams["svg.fonttype"] == "none"
        formatters = shell.display_formatter.formatters
        assert Figure in formatters["image/svg+xml"].type_printers
        assert Figure not in formatters["image/png"].type_printers
    finally:
        InteractiveShell.clear_instance()


def test_whole_numbers_turns_only_whole_float_columns_into_integers():
    import pandas as pd

    df = pd.DataFrame({"n": [32.0, 48.0], "x": [0.5, 2.0], "gap": [1.0, float("nan")], "s": ["a", "b"]})
    out = style.whole_numbers(df)
    assert out.n.dtype.kind == "i" and out.x.dtype.kind == "f" and out.gap.dtype.kind == "f"
    assert df.n.dtype.kind == "f"  # the caller's frame is left as it was


def test_a_book_table_has_one_header_row_unless_its_columns_have_two_levels():
    import pandas as pd

    long = pd.DataFrame({"variant": ["a", "a", "b"], "len": [1.0, 2.0, 1.0], "ms": [0.5, 0.7, 0.9]})
    pivot = long.pivot_table(index="variant", columns="len", values="ms")  # index and columns both named
    shown = style.book_table(pivot)
    assert list(shown.columns) == ["variant", 1.0, 2.0] and shown.columns.name is None
    assert "<tr" in shown._repr_html_() and shown._repr_html_().split("</thead>")[0].count("<tr") == 1
    two = long.pivot_table(index="variant", columns=["len"], values=["ms"])  # two column levels: kept
    assert style.book_table(two).columns.nlevels == 2
    clash = long.set_index("len").rename(columns={"variant": "len"})  # an index level named as a column
    assert style.book_table(clash).index.name == "len"


def test_a_book_table_shows_no_row_numbers_but_keeps_a_labelling_index():
    import pandas as pd

    df = pd.DataFrame({"draft": ["2L", "6L", "self"], "alpha": [0.4, 0.38, 0.05]})
    body = style.book_html(df[df.alpha > 0.1]).split("<tbody>")[1]  # a filter leaves 0, 1: still row numbers
    assert "<th" not in body and body.count("<tr") == 2 and "<td>2L</td>" in body
    labelled = style.book_html(df.set_index("draft").rename_axis(None)).split("<tbody>")[1]  # labels, unnamed
    assert "<th>2L</th>" in labelled
    gap = style.book_html(pd.DataFrame({"ms": [1.5, float("nan")]})).split("<tbody>")[1]
    assert "NaN" not in gap and f"<td>{style.MISSING_CELL}</td>" in gap
