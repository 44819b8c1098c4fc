"""The seven studies of the book, and where each one's page comes from.

A study's page is ``book/studies/<slug>.ipynb`` once papermill has executed its notebook on the H200,
and the committed placeholder ``book/studies/<slug>.md`` ("not yet measured") until then. Never both:
Sphinx would see two sources for one page.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servelab.paths import REPO_ROOT

BOOK_DIR = REPO_ROOT / "book"
STUDIES_DIR = BOOK_DIR / "studies"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"


@dataclass(frozen=True)
class Study:
    number: int
    slug: str  # NN_name: notebook, results folder and page name
    title: str
    issue: int | None  # the issue that measures it on the H200; None while none is filed

    @property
    def docname(self) -> str:
        """The Sphinx document name of the study's page."""
        return f"book/studies/{self.slug}"

    @property
    def html_path(self) -> str:
        """Where the page lands in the built HTML, relative to its root."""
        return f"{self.docname}.html"


STUDIES: tuple[Study, ...] = (
    Study(1, "01_scheduling", "Scheduling: FCFS, EagerContBatch and ChunkedPrefill", 6),
    Study(2, "02_gpu_costs", "What prefill and decode cost on the GPU", 2),
    Study(3, "03_speculative", "Speculative decoding: Qwen2-0.5B drafting for Qwen2-1.5B", 8),
    Study(4, "04_kv_cache", "KV cache costs and the paged KV cache", 4),
    Study(5, "05_attention", "Attention kernels", 3),
    Study(6, "06_hf_assisted", "HuggingFace assisted generation", 8),
    Study(7, "07_prefix_cache", "Prefix caching", 9),
)


def study_by_slug(slug: str) -> Study:
    for s in STUDIES:
        if s.slug == slug:
            return s
    raise KeyError(f"no study {slug!r}; the studies are {[s.slug for s in STUDIES]}")


def _shown(path: Path) -> str:
    """A path relative to the repository when it is inside it (for messages)."""
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


class PageConflict(RuntimeError):
    """A study has both an executed notebook and a placeholder page, or neither."""


@dataclass(frozen=True)
class StudyPage:
    study: Study
    source: Path  # the .ipynb or .md the book renders

    @property
    def measured(self) -> bool:
        """True when the page is an executed notebook, False for the "not yet measured" placeholder."""
        return self.source.suffix == ".ipynb"

    @property
    def title(self) -> str:
        """The page's own title (its first ``# `` heading), so other pages name it as it names itself."""
        return page_title(self.source) or f"Study {self.study.number}: {self.study.title}"


def page_title(source: Path) -> str | None:
    """The first level-1 heading of a MyST page or of a notebook's markdown cells, without the ``# ``."""
    if source.suffix == ".ipynb":
        import nbformat

        texts = [c.source for c in nbformat.read(source, as_version=4).cells if c.cell_type == "markdown"]
    else:
        texts = [source.read_text(encoding="utf-8")]
    for text in texts:
        for line in text.splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return None


def study_pages(studies_dir: Path = STUDIES_DIR) -> list[StudyPage]:
    """The source of every study's page; raises PageConflict with the fix when one is ambiguous or missing."""
    pages, problems = [], []
    for s in STUDIES:
        nb, md = studies_dir / f"{s.slug}.ipynb", studies_dir / f"{s.slug}.md"
        if nb.exists() and md.exists():
            problems.append(
                f"{s.slug}: both {nb.name} (executed notebook) and {md.name} (placeholder) exist; "
                f"the study is measured now, so delete the placeholder: git rm {_shown(md)}"
            )
        elif not nb.exists() and not md.exists():
            problems.append(
                f"{s.slug}: neither {nb.name} nor {md.name} exists in {studies_dir}; "
                f"restore the placeholder page or add the executed notebook"
            )
        else:
            pages.append(StudyPage(s, nb if nb.exists() else md))
    if problems:
        raise PageConflict("study pages are inconsistent:\n  " + "\n  ".join(problems))
    return pages
