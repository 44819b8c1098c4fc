"""``python -m servelab_book check _build/html``: checks on the built book that Sphinx cannot make.

- every page of the table of contents was built, one per study among them;
- the landing page holds the findings table with one row per seed claim, in order (and so does the
  findings page, across its per-study tables);
- no page loads anything from the network (scripts, styles, images, frames, fonts in CSS);
- every internal link resolves: the file exists, and so does the ``#anchor`` in it;
- no MyST source leaked into a page unrendered (a takeaway box printed as ``:::{admonition}`` text);
- MathJax is served locally;
- the book-reader checks, on every rendered page (the studies, the simulator): its evidence banner (what its data
  is, fresh or stale: ``studies.common.page.evidence_banner``); code hidden (no cell input shown); clean outputs (no
  warning, progress bar, traceback or file path) and sharp figures (SVG or retina PNGs) (``output_checks``); and on a
  study page, findings first (the "Findings" section starts within the first quarter of the page) and an "Against
  published results" section with its table. A page whose data is stale is held to the same layout: it is
  rendered from the data like any other.

Warnings (printed, not failures), for a study page: it shows no figure; it lacks a section of the study-page
structure (method, limitations, how to re-run).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from bs4 import BeautifulSoup

from servelab.studies.common.markdown import TABLE_CLASS
from servelab_book.output_checks import figure_problems, output_problems
from servelab_book.seed_claims import SEED_CLAIMS_CSV, load_seed_claims
from servelab_book.studies import STUDIES

BOOK_PAGES = (
    "book/intro",
    "book/methodology",
    "book/speculative_controlled",
    "book/findings",
    "book/engine",
    "book/simulator",
    "book/bibliography",
    "book/beyond_one_gpu",
)
LANDING = "book/intro.html"
FINDINGS = "book/findings.html"
REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)
CSS_URL = re.compile(r"(?:@import\s+|url\()\s*['\"]?((?:https?:)?//[^'\")\s]+)", re.IGNORECASE)
UNRENDERED = re.compile(r":::\s*\{[a-z-]+\}|```\s*\{[a-z-]+\}|\{(?:admonition|note|tip|warning)\}`?")
# The pages rendered from notebooks, and the evidence banner each one shows first (studies.common.page).
EXECUTED_DOCS = tuple(s.docname for s in STUDIES) + ("book/simulator",)
EVIDENCE = re.compile(r"Measured on |Not measured")
FINDINGS_WITHIN = 0.25  # of the page's text, where "Findings" must start
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
    "Method": r"method",
    "Limitations": r"limitation",
    "Against published results": r"against published",
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
    links = LinkChecker(html_dir, soups, report)
    for rel, soup in soups.items():
        report.problems += [f"{rel}: loads {url} from the network" for url in remote_resources(soup)]
        unrendered = UNRENDERED.search(rendered_text(soup))
        if unrendered:
            report.problems.append(f"{rel}: unrendered MyST in the page: {unrendered.group(0)!r}")
        links.check_page(rel, soup)
    _check_findings_tables(soups, seed_csv, report)
    _check_executed_pages(html_dir, soups, report)
    _check_assets(html_dir, report)
    return report


class LinkChecker:
    """Every internal link of the site resolves: the file exists, and so does its ``#anchor``."""

    def __init__(self, html_dir: Path, soups: dict[str, BeautifulSoup], report: CheckReport):
        self.html_dir, self.soups, self.report = html_dir, soups, report
        self.ids: dict[str, set[str]] = {}

    def _anchors(self, target: str) -> set[str]:
        if target not in self.ids:
            soup = self.soups.get(target) or BeautifulSoup(
                (self.html_dir / target).read_text(encoding="utf-8"), "html.parser"
            )
            self.ids[target] = _ids(soup)
        return self.ids[target]

    def check_page(self, rel: str, soup: BeautifulSoup) -> None:
        for a in soup.find_all("a", href=True):
            href = a["href"]
            if REMOTE.match(href) or href.startswith(("mailto:", "javascript:", "data:")):
                continue
            parts = urlsplit(href)
            target = _normalise((Path(rel).parent / unquote(parts.path)).as_posix() if parts.path else rel)
            if parts.scheme or target is None or target.startswith(SKIP_LINK_TARGETS):
                continue
            self.report.links += 1
            if not (self.html_dir / target).exists():
                self.report.problems.append(f"{rel}: link to missing {target} ({href})")
            elif parts.fragment and target.endswith(".html") and unquote(parts.fragment) not in self._anchors(target):
                self.report.problems.append(f"{rel}: link to missing anchor {target}#{parts.fragment}")


def _check_findings_tables(soups: dict[str, BeautifulSoup], seed_csv: Path, report: CheckReport) -> None:
    """The landing and findings pages hold one findings row per seed claim, in order."""
    claims = load_seed_claims(seed_csv)["id"].tolist()
    for page in (LANDING, FINDINGS):
        if page in soups:
            got = findings_row_ids(soups[page])
            if got != claims:
                report.problems.append(
                    f"{page}: findings table rows {got or 'absent'} != the {len(claims)} seed claims {claims}"
                )


def _structure_warnings(rel: str, soup: BeautifulSoup) -> list[str]:
    """A study page's expected parts that are missing, other than those ``reader_problems`` enforces."""
    found = []
    if not (soup.find("main") or soup).find(["img", "svg"]):
        found.append(f"{rel}: a study page with no figure")
    missing = [m for m in missing_sections(soup) if m not in ("Findings", "Against published results")]
    if missing:
        found.append(f"{rel}: the study-page structure lacks a section on {', '.join(missing)}")
    return found


def findings_fraction(soup: BeautifulSoup) -> float | None:
    """Where the "Findings" section starts, as a fraction of the page's text (None: no such section)."""
    main = soup.find("main") or soup
    heading = next(
        (h for h in main.find_all(["h2", "h3"]) if re.match(r"findings\b", h.get_text(" ", strip=True), re.I)), None
    )
    if heading is None:
        return None
    total = len(main.get_text(" "))
    before = sum(len(t) for t in heading.find_all_previous(string=True) if main in t.parents)
    return before / total if total else None


def reader_problems(rel: str, soup: BeautifulSoup, study: bool) -> list[str]:
    """The book-reader checks on one rendered page: evidence banner, code hidden, and on a study page findings first
    and a published comparison."""
    found = []
    main = soup.find("main") or soup
    if not EVIDENCE.search(main.get_text(" ")):
        found.append(f"{rel}: no evidence banner (what its data is, fresh or stale)")
    shown = main.select(".cell_input")
    if shown:
        found.append(f"{rel}: {len(shown)} code cell(s) shown (tag them remove-input or remove-cell)")
    if study:
        at = findings_fraction(soup)
        if at is None:
            found.append(f"{rel}: no 'Findings' section")
        elif at >= FINDINGS_WITHIN:
            found.append(f"{rel}: 'Findings' starts {at:.0%} of the way down the page (must be < 25%)")
        has_table = main.select("table.servelab-published") or "No published number" in main.get_text(" ")
        if not soup.find(id=re.compile(r"^against-published")) or not has_table:
            found.append(f"{rel}: no 'Against published results' section with its table")
    return found


def _check_executed_pages(html_dir: Path, soups: dict[str, BeautifulSoup], report: CheckReport) -> None:
    """Rendered pages: the book-reader checks, clean outputs and sharp figures, on every one."""
    for docname in EXECUTED_DOCS:
        rel, soup = f"{docname}.html", soups.get(f"{docname}.html")
        if soup is None or not (html_dir / "_sources" / f"{docname}.ipynb").exists():
            continue
        study = docname.startswith("book/studies/")
        if study:
            report.warnings += _structure_warnings(rel, soup)
        report.problems += reader_problems(rel, soup, study)
        report.problems += [f"{rel}: {p}" for p in output_problems(soup) + figure_problems(soup, html_dir / rel)]


def _check_assets(html_dir: Path, report: CheckReport) -> None:
    """No stylesheet fetches from the network; MathJax is served from the site."""
    css = sorted((html_dir / "_static").rglob("*.css")) if (html_dir / "_static").is_dir() else []
    for path in css:
        for url in CSS_URL.findall(path.read_text(encoding="utf-8", errors="replace")):
            report.problems.append(f"{path.relative_to(html_dir)}: loads {url} from the network")
    if not (html_dir / "_static" / "mathjax" / "tex-chtml.js").is_file():
        report.problems.append("_static/mathjax/tex-chtml.js missing: MathJax is not served locally")


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
