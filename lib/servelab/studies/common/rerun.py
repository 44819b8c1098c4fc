"""How a page is re-executed: the one papermill command line and the notebook's ``parameters`` cell.

Both the study pages' re-run sections (``studies.common.page.rerun_recipe``) and the book's methodology page
(``servelab_book.reproduce``) build their command here, so the two cannot drift apart. It lives beside the studies,
not in the book: the book imports the studies, never the other way round.
"""

from __future__ import annotations

from pathlib import Path

from servelab.errors import ParameterError

# the pages that sit outside book/studies/: the simulator's stands beside Study 1 in the book's contents, not among the
# seed's seven studies (the book's renderer, servelab_book.render, writes every page to page_path)
PAGES_ELSEWHERE = {"08_simulator": "book/simulator.ipynb"}


def page_path(slug: str) -> str:
    """Where the book keeps the rendered page of ``notebooks/<slug>.ipynb``, from the repository root."""
    return PAGES_ELSEWHERE.get(slug, f"book/studies/{slug}.ipynb")


def papermill_command(slug: str, *, out: str | None = None, profile: str = "full") -> str:
    """The one-line command that re-executes ``notebooks/<slug>.ipynb`` into ``out`` (default: the book's page,
    ``page_path(slug)``), run from the repository root."""
    if not slug or "/" in slug or slug.endswith(".ipynb"):
        raise ParameterError(f"a notebook's slug is its name without folder or suffix (01_scheduling), got {slug!r}")
    out = out or page_path(slug)
    return f"papermill --cwd notebooks notebooks/{slug}.ipynb {out} -p profile {profile}"


def parameters_source(notebook: Path) -> str:
    """The source of the notebook's cell tagged ``parameters``; ValueError if it has none."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            return cell.source.strip()
    raise ValueError(f"{notebook}: no code cell tagged 'parameters' (papermill needs one)")


def rerun_section(slug: str, notebooks_dir: Path | None = None) -> str:
    """A study page's re-run section, as markdown: how to render the page from the data, how to measure it again
    (the campaign's jobs, or papermill with ``profile="full"``), and the notebook's ``parameters`` cell."""
    from servelab.paths import REPO_ROOT

    replay = papermill_command(slug, profile="replay")  # a bad slug is refused before any file is read
    nb = Path(notebooks_dir or REPO_ROOT / "notebooks") / f"{slug}.ipynb"
    source = parameters_source(nb)
    try:
        from servelab.studies.common.campaign import parts_of

        parts = list(parts_of(slug))
    except ImportError:  # a study without a measuring module
        parts = ["all"]
    job = f"scripts/gpu_run.sh {slug}:{parts[0]}:0"
    which = f"part {parts[0]!r} of repeat 0; its parts: {', '.join(parts)}"
    return (
        "Render this page from the committed data (no GPU), or measure it again on a GPU and render that:\n\n"
        f"```bash\n{replay}\n"
        f"make gpu-plan                      # the GPU jobs missing at today's fingerprint, packed into runs\n"
        f"{job}    # one job: {which}\n"
        f"{papermill_command(slug, out='out.ipynb')}\n```\n\n"
        "Parameters, from the notebook's `parameters` cell (pass any with `-p name value`; `None` is the profile's "
        f"default):\n\n```python\n{source}\n```\n"
    )
