"""``python -m servelab_book check _build/html``: checks on the built book that Sphinx cannot make.

- every page of the table of contents was built, one per study among them;
- the landing page holds the findings table with one row per seed claim, in order (and so does the
  findings page, across its per-study tables);
- no page loads anything from the network (scripts, styles, images, frames, fonts in CSS);
- every internal link resolves: the file exists, and so does the ``#anchor`` in it;
- no MyST source leaked into a page unrendered (a takeaway box printed as ``:::{admonition}`` text);
- MathJax is served locally.

Warnings (printed, not failures), for a study page built from an executed notebook: it shows no figure
(usually: the notebook ran with a non-inline matplotlib backend and lost its plots); it has no
"Findings" section for the findings table to link to; it lacks a section of the study-page structure
(findings, seed vs H200, limitations, how to re-run).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from bs4 import BeautifulSoup

from servelab_book.findings_table import TABLE_CLASS
from servelab_book.seed_claims import SEED_CLAIMS_CSV, load_seed_claims
from servelab_book.studies import STUDIES

BOOK_PAGES = ("book/intro", "book/methodology", "book/findings", "book/engine", "book/simulator", "book/bibliography")
LANDING = "book/intro.html"
FINDINGS = "book/findings.html"
REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)
CSS_URL = re.compile(r"(?:@import\s+|url\()\s*['\"]?((?:https?:)?//[^'\")\s]+)", re.IGNORECASE)
UNRENDERED = re.compile(r":::\s*\{[a-z-]+\}|```\s*\{[a-z-]+\}|\{(?:admonition|note|tip|warning)\}`?")
# Sphinx's own generated pages and search machinery are not the book's pages.
SKIP_LINK_TARGETS = ("genindex.html", "search.html", "_sources/", "_static/", "_images/")


@dataclass
class CheckReport:
    pages: int = 0
    links: int = 0
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = f"checked {self.pages} pages and {self.links} internal links"
        warn = "".join(f"\n  warning: {w}" for w in self.warnings)
        if self.ok:
            return head + ": all good" + warn
        return head + f": {len(self.problems)} problem(s)\n  " + "\n  ".join(self.problems) + warn


def findings_row_ids(soup: BeautifulSoup) -> list[str]:
    """The claim id of every body row of every findings table on a page, in order."""
    ids = []
    for table in soup.select(f"table.{TABLE_CLASS}"):
        for tr in table.select("tbody tr"):
            cell = tr.find("td")
            ids.append(cell.get_text(" ", strip=True) if cell else "")
    return ids


def remote_resources(soup: BeautifulSoup) -> list[str]:
    """URLs of things the page would fetch from the network (links to other sites are fine)."""
    found = []
    for tag, attr in (
        ("script", "src"),
        ("img", "src"),
        ("iframe", "src"),
        ("source", "src"),
        ("video", "src"),
        ("audio", "src"),
        ("embed", "src"),
        ("object", "data"),
    ):
        found += [t[attr] for t in soup.find_all(tag) if t.get(attr) and REMOTE.match(t[attr])]
    for link in soup.find_all("link"):
        rel = {r.lower() for r in link.get("rel", [])}
        if (
            link.get("href")
            and REMOTE.match(link["href"])
            and rel & {"stylesheet", "preload", "icon", "modulepreload", "prefetch", "manifest", "preconnect"}
        ):
            found.append(link["href"])
    for style in soup.find_all("style"):
        found += CSS_URL.findall(style.get_text())
    return found


# The sections every study page has (methodology, "The structure of a study page"), as heading patterns.
STUDY_SECTIONS = {
    "Findings": r"findings",
    "Seed vs H200": r"seed vs",
    "Limitations": r"limitation",
    "How to re-run": r"re-?run|reproduc",
}


def missing_sections(soup: BeautifulSoup) -> list[str]:
    """Which of the study page's required sections no heading of the page names."""
    headings = " | ".join(h.get_text(" ", strip=True).lower() for h in soup.select("main h2, main h3"))
    return [name for name, pattern in STUDY_SECTIONS.items() if not re.search(pattern, headings)]


def rendered_text(soup: BeautifulSoup) -> str:
    """The page's text as rendered for reading: code a reader is shown as code (notebook inputs, code
    blocks, inline literals) left out, cell outputs kept, since MyST source in an output is a defect."""
    main = BeautifulSoup(str(soup.find("main") or soup), "html.parser")
    for el in main.select(".cell_input, code.literal"):
        el.decompose()
    for el in main.select("div[class*='highlight-']"):
        if not el.find_parent(class_="cell_output"):
            el.decompose()
    return main.get_text(" ")


def _ids(soup: BeautifulSoup) -> set[str]:
    return {t["id"] for t in soup.find_all(id=True)} | {t["name"] for t in soup.find_all("a", attrs={"name": True})}


def check_book(html_dir: Path, seed_csv: Path = SEED_CLAIMS_CSV) -> CheckReport:
    """Run every check on a built book; the report lists each problem with its page."""
    html_dir = Path(html_dir)
    report = CheckReport()
    if not (html_dir / LANDING).is_file():
        report.problems.append(f"{html_dir / LANDING} not found: is {html_dir} a built book?")
        return report
    expected = [f"{p}.html" for p in BOOK_PAGES] + [s.html_path for s in STUDIES]
    report.problems += [f"page missing: {p}" for p in expected if not (html_dir / p).is_file()]

    pages = sorted(p for p in html_dir.rglob("*.html") if not p.relative_to(html_dir).as_posix().startswith("_"))
    soups = {
        p.relative_to(html_dir).as_posix(): BeautifulSoup(p.read_text(encoding="utf-8"), "html.parser") for p in pages
    }
    report.pages = len(soups)
    ids_cache: dict[str, set[str]] = {}

    for rel, soup in soups.items():
        for url in remote_resources(soup):
            report.problems.append(f"{rel}: loads {url} from the network")
        text = rendered_text(soup)
        if UNRENDERED.search(text):
            report.problems.append(f"{rel}: unrendered MyST in the page: {UNRENDERED.search(text).group(0)!r}")
        for a in soup.find_all("a", href=True):
            href = a["href"]
            if REMOTE.match(href) or href.startswith(("mailto:", "javascript:", "data:")):
                continue
            parts = urlsplit(href)
            if parts.scheme:
                continue
            target = (Path(rel).parent / unquote(parts.path)).as_posix() if parts.path else rel
            target = _normalise(target)
            if target is None or target.startswith(SKIP_LINK_TARGETS):
                continue
            report.links += 1
            if not (html_dir / target).exists():
                report.problems.append(f"{rel}: link to missing {target} ({href})")
                continue
            if parts.fragment and target.endswith(".html"):
                if target not in ids_cache:
                    ids_cache[target] = (
                        _ids(soups[target])
                        if target in soups
                        else _ids(BeautifulSoup((html_dir / target).read_text(encoding="utf-8"), "html.parser"))
                    )
                if unquote(parts.fragment) not in ids_cache[target]:
                    report.problems.append(f"{rel}: link to missing anchor {target}#{parts.fragment}")

    claims = load_seed_claims(seed_csv)["id"].tolist()
    for page in (LANDING, FINDINGS):
        if page in soups:
            got = findings_row_ids(soups[page])
            if got != claims:
                report.problems.append(
                    f"{page}: findings table rows {got or 'absent'} != the {len(claims)} seed claims {claims}"
                )

    for s in STUDIES:
        executed = (html_dir / "_sources" / f"{s.docname}.ipynb").exists()
        soup = soups.get(s.html_path)
        if not executed or soup is None:
            continue
        if not (soup.find("main") or soup).find("img"):
            report.warnings.append(
                f"{s.html_path}: executed notebook with no figure (was matplotlib's backend inline when it ran?)"
            )
        if not soup.find(id=re.compile(r"^findings")):
            report.warnings.append(
                f"{s.html_path}: no section titled 'Findings…'; the findings table links to the page's top instead"
            )
        missing = missing_sections(soup)
        if missing:
            report.warnings.append(f"{s.html_path}: the study-page structure lacks a section on {', '.join(missing)}")

    css = sorted((html_dir / "_static").rglob("*.css")) if (html_dir / "_static").is_dir() else []
    for path in css:
        for url in CSS_URL.findall(path.read_text(encoding="utf-8", errors="replace")):
            report.problems.append(f"{path.relative_to(html_dir)}: loads {url} from the network")
    if not (html_dir / "_static" / "mathjax" / "tex-chtml.js").is_file():
        report.problems.append("_static/mathjax/tex-chtml.js missing: MathJax is not served locally")
    return report


def _normalise(path: str) -> str | None:
    """Resolve ``..`` in a relative path; None if it leaves the site."""
    out: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                return None
            out.pop()
        else:
            out.append(part)
    return "/".join(out)
