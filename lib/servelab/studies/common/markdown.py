"""Markdown for the pages: plain text made safe inside MyST, numbers formatted for reading, and the one table
renderer (a MyST list-table). The study pages and the book's generated includes both use these, so a value reads the
same wherever it is shown; it lives beside the studies because the book imports the studies, never the reverse.
"""

from __future__ import annotations

import math
import re
import string

TABLE_CLASS = "servelab-findings"  # the browser test and `check` find the table by this class
# marks with inline meaning in MyST (emphasis, code, links, roles, math, tables, HTML, entities)
_INLINE = set("\\`*_[]<>$" + "{}|~&")
_ORDERED_ITEM = re.compile(r"^(\d+)([.)])(\s)")
# a number of 4 or more digits before any decimals, standing on its own: not part of a decimal or an already
# separated number, nor of an identifier or setting name ("chunked_prefill@2048", "qwen-fcfs-chunked2048", a hash
# such as "10916fee"), nor a date's year ("2026-12-04"): a separator there read "chunked_prefill@2,048"
_LONG_NUMBER = re.compile(r"(?<![\w@#.,])(?<![A-Za-z_]-)(\d{4,})(\.\d+)?(?![\w@]|[.,]\d|-\d\d?-\d)")


def format_value(value: str) -> str:
    """A measured value for reading: 3 significant figures and thousands separators for a number;
    in text (a range such as "21923–47819"), thousands separators in numbers of 1,000 or more, their decimals kept,
    but never inside an identifier or setting name, nor in a date.

    >>> format_value("7.641234"), format_value("4223.1"), format_value("0.012345"), format_value("7.80")
    ('7.64', '4,223', '0.0123', '7.8')
    >>> format_value("21923–47819"), format_value("7.8 / 275.2"), format_value("n=2"), format_value("p50 36643.3 ms")
    ('21,923–47,819', '7.8 / 275.2', 'n=2', 'p50 36,643.3 ms')
    >>> format_value("926 vs 953 (chunked_prefill@2048)"), format_value("2026-12-04 01:04 UTC")
    ('926 vs 953 (chunked_prefill@2048)', '2026-12-04 01:04 UTC')
    """
    text = str(value).strip()
    try:
        x = float(text.replace(",", ""))
    except ValueError:
        return _LONG_NUMBER.sub(lambda m: f"{int(m.group(1)):,}{m.group(2) or ''}", text)
    if not math.isfinite(x):
        return text
    if x == 0:
        return "0"
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    shown = f"{x:,.{decimals}f}"
    return shown.rstrip("0").rstrip(".") if "." in shown else shown


def separated(df, columns, decimals: int | dict[str, int] = 0):
    """A table's ``columns`` as text with thousands separators ("8,192", "1,137.7"), as the pages' prose writes
    them; ``decimals``: every column's decimals, or a column's by name (0 for one not named). A missing value or a
    value already text stays as it is; a column the table lacks is passed over.

    >>> import pandas as pd
    >>> separated(pd.DataFrame({"n": [8192.0, None], "ms": [1137.71, 3.0]}), ["n", "ms"], {"ms": 1}).to_dict("list")
    {'n': ['8,192', nan], 'ms': ['1,137.7', '3.0']}
    """
    out = df.copy()
    for c in columns:
        if c not in out:
            continue
        d = decimals.get(c, 0) if isinstance(decimals, dict) else decimals
        out[c] = out[c].map(lambda x, d=d: x if isinstance(x, str) or _missing(x) else f"{x:,.{d}f}")
    return out


def _missing(x) -> bool:
    # None, NaN and pandas' NA (whose comparisons are NA, not False) without importing pandas here
    try:
        return x is None or bool(x != x)
    except TypeError:
        return True


def md_text(text: str) -> str:
    """Plain text safe inside MyST, on one line: marks with a meaning are backslash-escaped."""
    text = " ".join(str(text).split())
    # any punctuation opening the text could start a list, heading, comment, target or fence there
    out = "".join("\\" + c if c in _INLINE or (i == 0 and c in string.punctuation) else c for i, c in enumerate(text))
    return _ORDERED_ITEM.sub(r"\1\\\2\3", out)


def list_table(
    header: list[str], rows: list[list[str]], widths: list[int] | None = None, *, css: str = TABLE_CLASS
) -> str:
    """A MyST list-table of already formatted cells (the book's one table renderer)."""
    lines = [":::{list-table}", ":header-rows: 1", f":class: {css}"]
    if widths:
        lines.append(f":widths: {' '.join(map(str, widths))}")
    lines.append("")
    for cells in [header] + rows:
        lines.append(f"* - {cells[0]}")
        lines.extend(f"  - {c}" for c in cells[1:])
    lines.append(":::")
    return "\n".join(lines) + "\n"
