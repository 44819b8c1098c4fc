"""The first screen of a study page, built from the run's findings: the verdict table and the takeaway list.

A study notebook shows its verdicts before anything else (the question, the verdict table, three to five takeaway
sentences, the one figure), so these are markdown strings the notebook displays in one call each; every number in
them comes from the ``Finding`` records or tables the run computed, never from the notebook's cells.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping

from servelab.studies.common.findings import NOT_MEASURED, Finding, split_repeat_label
from servelab.studies.common.repeats import spread_unit, spread_with_unit

SEED_DEVICE = "RTX 2070"  # the seed's GPU: every seed value in shared/seed-studies.md was measured on it

# tqdm.auto, which huggingface_hub imports when a model loads, warns "IProgress not found" where ipywidgets is not
# installed. The pages run every sweep with its progress bar off, so the warning says nothing to a reader.
warnings.filterwarnings("ignore", message="IProgress not found")


def md_cell(text) -> str:
    """``text`` safe inside a markdown table cell: pipes escaped, line breaks flattened."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def verdict_table(findings: Iterable[Finding], device: str = "this run") -> str:
    """A markdown table, one row per claim: the claim, the seed's value, the measured value (the median over repeats)
    with its interval and the number of repeats, the verdict (with each repeat's where they disagree) and the
    models it was measured on.

    ``device``: the GPU the runs measured on (the column heading of the measured values).
    """
    head = f"| Claim | {SEED_DEVICE} (seed) | {md_cell(device)} | Unit | Repeats | Verdict | Tested on |"
    rows = [head, "|---|---|---|---|---|---|---|"]
    for f in findings:
        value = md_cell(f.measured_value)
        if f.spread:  # the spread is the headline's: name its unit where it is not the value's
            unit = headline_unit_short(f)
            shown = spread_with_unit(f.spread, unit if unit != f.unit else "")
            value += f" (repeats: {md_cell(shown)})"
        said = f" ({md_cell(f.repeat_verdicts.replace(';', ', '))})" if f.verdict == "inconclusive" else ""
        rows.append(
            f"| **{f.id}** {md_cell(f.claim)} | {md_cell(f.seed_value) or '—'} | {value} | "
            f"{md_cell(f.unit)} | {f.repeats} | **{f.verdict}**{said} | {md_cell(f.tested_on) or '—'} |"
        )
    return "\n".join(rows) + "\n"


def headline_unit_short(f: Finding) -> str:
    """The unit of the finding's interval: the headline's without its explanation ("× the parameter ratio: eager
    HF's ..." -> "× the parameter ratio"), a model's where the interval is each model's."""
    return spread_unit(f.spread, f.headline_unit)


def parts_line(runs) -> str:
    """Where a study measures in parts and some part has fewer repeats than another, or none yet: which parts ran
    how many times, and which wait for the GPU ("" where every part has the same repeats)."""
    from servelab.studies.common.campaign import parts_of
    from servelab.studies.common.runs import ALL_PARTS

    try:
        planned = list(parts_of(runs.study))
    except Exception:  # noqa: BLE001 - a study without a measuring module: nothing to compare with
        return ""
    have = {p: len(runs.part(p).repeats) for p in runs.parts}
    if ALL_PARTS in have or len(planned) < 2:
        return ""
    counts = [have.get(p, 0) for p in planned]
    if len(set(counts)) == 1:
        return ""
    ran = ", ".join(f"{md_cell(p)} ×{have[p]}" for p in planned if have.get(p))
    waiting = ", ".join(md_cell(p) for p in planned if not have.get(p))
    line = f" Parts measured: {ran}."
    return line + (f" Not measured yet: {waiting} (`make gpu-plan` lists the jobs)." if waiting else "")


def complete_repeats(runs) -> int:
    """The repeats in which every planned part of the study ran (all of them where the study has no parts): a
    repeat begun part by part is not yet one."""
    from servelab.studies.common.campaign import parts_of

    try:
        planned = list(parts_of(runs.study))
    except Exception:  # noqa: BLE001 - a study without a measuring module: every repeat counts
        return len(runs.repeats)
    return sum(1 for rep in runs.per_repeat() if rep.has_parts(planned))


def evidence_banner(runs) -> str:
    """The page's first line about its data (a ``common.runs.RunSet``): what it was measured on, how many repeats at
    which fingerprint, and whether that is today's measuring code; where it is not, an admonition naming the
    measuring files that changed since. Nothing measured: an admonition saying so."""
    if not runs.measured:
        return (
            ":::{admonition} Not measured\n:class: warning\nNo run of this study on the book's device is committed, so "
            "every verdict below reads inconclusive. `make gpu-plan` lists the GPU jobs that measure it.\n:::\n"
        )
    commits = sorted({r.commit[:7] for r in runs.runs if r.commit})
    n, begun = complete_repeats(runs), len(runs.repeats)
    fp = "runs from before fingerprints" if runs.fingerprint == "legacy" else f"fingerprint `{runs.fingerprint[:12]}`"
    # a repeat measured part by part is whole only once every part ran; each verdict counts the repeats that hold
    # the parts its rule reads (its own Repeats column), so the two numbers can differ
    whole = f"; {n} with every part, and each verdict counts the repeats holding the parts it reads" * (begun > n)
    line = (
        f"Measured on {md_cell(runs.device_name)}: {begun} repeat{'s' if begun != 1 else ''}{whole} "
        f"({len(runs.runs)} run{'s' if len(runs.runs) != 1 else ''}, {fp}, commit {', '.join(commits)})."
    )
    if runs.current:
        return line + " The measuring code is today's." + parts_line(runs) + "\n"
    more = len(runs.changed) - 12
    files = ", ".join(f"`{f}`" for f in runs.changed[:12]) + (f" and {more} more" if more > 0 else "")
    return (
        f":::{{admonition}} Stale: measured by older code\n:class: warning\n{line} Since then these measuring files "
        f"changed: {files or 'unknown'}. The verdicts are today's rules applied to that data; `make gpu-plan` lists "
        "the GPU jobs that measure it again.\n:::\n"
    )


def takeaway_list(sentences: Iterable[str]) -> str:
    """The page's takeaways as a markdown bullet list; empty sentences (a part that did not run) are left out."""
    items = [s.strip() for s in sentences if s and s.strip()]
    return "".join(f"- {s}\n" for s in items)


def show(*items) -> None:
    """Display markdown strings, tables and figures in order (the book renders markdown as MyST); empty strings and
    None are skipped, and a figure is closed once shown so that Jupyter does not show it a second time."""
    import matplotlib.pyplot as plt
    from IPython.display import Markdown, display

    for item in items:
        if item is None or (isinstance(item, str) and not item.strip()):
            continue
        if isinstance(item, str):
            display(Markdown(item))
        elif hasattr(item, "savefig"):
            display(item)
            plt.close(item)
        else:
            display(item)


def finding_sentence(f: Finding) -> str:
    """One takeaway per claim: ``**F2.1 changes.** <claim>: <this run's value> [unit].``

    The seed's value is in the verdict table beside it; the unit is added where the value is a bare number or range.
    """
    value = f.measured_value
    rest = split_repeat_label(value)[1]
    bare = rest[:1].isdigit() and rest[-1:].isdigit()
    unit = f" {f.unit}" if bare and f.unit else ""
    why = ""
    if value == NOT_MEASURED and f.note.startswith("Not measured: "):  # say why, where nothing stands for it
        why = f" ({f.note.removeprefix('Not measured: ').rstrip('.')})"
    return f"**{f.id} {f.verdict}.** {_sentence_start(f.claim)}: {value}{unit}{why}."


def finding_notes(findings: Iterable[Finding]) -> str:
    """Markdown: each claim's verdict with the rule's reasoning (its note), for the page's details section."""
    return "\n".join(
        f"- **{f.id} {f.verdict}.** {_sentence_start(f.claim)}. {SEED_DEVICE}: {f.seed_value}; measured here"
        f"{_over(f)}: {f.measured_value} ({f.unit}). {f.note}."
        for f in findings
    )


def _over(f: Finding) -> str:
    """The count of repeats a value stands for (their median, or the text of the repeat nearest it:
    ``repeats.combine_repeats``), in parentheses; "" for one run."""
    return f" ({f.repeats} repeats)" if f.repeats > 1 else ""


def _sentence_start(text: str) -> str:
    """A claim as the start of a sentence (the studies write theirs to follow a colon too: "the Leviathan ...")."""
    return text[:1].upper() + text[1:]


def rerun_recipe(slug: str, params: Mapping, *, out: str | None = None, extra: Iterable[str] = ()) -> str:
    """Markdown: the papermill command that re-runs a study (``studies.common.rerun.papermill_command``, the one the
    methodology page shows), the notebook's ``parameters`` cell as written (read from ``notebooks/<slug>.ipynb``),
    and the values this run resolved them to."""
    from servelab.paths import REPO_ROOT
    from servelab.studies.common.rerun import papermill_command, parameters_source

    cmd = papermill_command(slug, out=out)
    lines = [f"```bash\n{cmd}\n" + "".join(f"{e}\n" for e in extra) + "```\n"]
    nb = REPO_ROOT / "notebooks" / f"{slug}.ipynb"
    if nb.exists():
        lines.append("The notebook's parameters (pass any with `-p name value`; `None` is the profile's default):\n")
        lines.append(f"```python\n{parameters_source(nb)}\n```\n")
    resolved = ", ".join(f"`{k}={v!r}`" for k, v in params.items())
    lines.append(f"This run resolved them to: {resolved}.\n")
    return "\n".join(lines)
