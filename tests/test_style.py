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
