"""The built book in a real browser: headless Chromium (Debian's package) opens every page.

For every page: no console errors, every image loaded, nothing fetched from outside the local server,
math typeset by the local MathJax. On the landing page: the findings table with one row per seed claim. On every
executed page: the note with its run's commit, on the first screen and a half.
Screenshots of the landing page and of one study page go to ``tests/_artifacts/``.

Runs from ``make test-book``, which builds the book and sets ``SERVELAB_BOOK_HTML``; without it (a plain
``pytest tests``) it is skipped, since there is no built book to open.
"""

from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

import pytest

from servelab.studies.common.markdown import TABLE_CLASS
from servelab_book.check import EXECUTED_DOCS, LANDING
from servelab_book.seed_claims import load_seed_claims
from servelab_book.studies import STUDIES

# the evidence banner every rendered page opens with (studies.common.page.evidence_banner)
BANNER = "//main//p[contains(., 'Measured on') or contains(., 'No run of this study')]"
HTML = os.environ.get("SERVELAB_BOOK_HTML")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[1] / "_artifacts"

pytestmark = pytest.mark.skipif(not HTML, reason="needs a built book: run `make test-book` (sets SERVELAB_BOOK_HTML)")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output to the test results
        pass


@pytest.fixture(scope="module")
def site():
    """The built book served on 127.0.0.1 at a free port, for the duration of the module."""
    root = Path(HTML).resolve()
    assert (root / LANDING).is_file(), f"no built book at {root}: run `make book` first"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium through Debian's chromedriver; no browser or driver is downloaded."""
    for exe in (CHROMIUM, CHROMEDRIVER):
        assert os.access(exe, os.X_OK), f"{exe} missing: `make test-book` installs chromium and chromium-driver"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,900",
        # any name other than the local server fails to resolve: a CDN fetch becomes an error
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


def book_pages(root: Path) -> list[str]:
    """Every HTML page of the site (Sphinx's own index and search pages too), relative to its root."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.html")
        if not p.relative_to(root).as_posix().startswith(("_static/", "_sources/", "_images/"))
    )


def open_page(driver, url: str) -> dict:
    """Load a page, wait for images and MathJax, and report what a reader would notice."""
    driver.get(url)
    return driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        (async () => {
          for (const img of document.images) { img.loading = 'eager'; }
          const t0 = Date.now();
          while ([...document.images].some(i => !i.complete) && Date.now() - t0 < 15000) {
            await new Promise(r => setTimeout(r, 100));
          }
          if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
          const origin = location.origin;
          const remote = performance.getEntriesByType('resource').map(e => e.name)
                           .filter(n => !n.startsWith(origin) && !n.startsWith('data:') && !n.startsWith('blob:'));
          done({
            broken: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
            images: document.images.length,
            remote: remote,
            math: document.querySelectorAll('.math').length,
            typeset: document.querySelectorAll('mjx-container').length,
            title: document.title,
          });
        })();
    """)


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_every_page_renders_offline(site, browser):
    root, base = site
    # the root redirect names no icon: a browser may ask for /favicon.ico before following it (html_extra_path)
    assert (root / "favicon.ico").is_file()
    pages = book_pages(root)
    assert len(pages) >= 3 + len(STUDIES), pages
    problems, images, typeset = [], 0, 0
    for page in pages:
        seen = open_page(browser, f"{base}/{page}")
        problems += [f"{page}: console error: {m}" for m in console_errors(browser)]
        problems += [f"{page}: image did not load: {src}" for src in seen["broken"]]
        problems += [f"{page}: fetched from outside: {url}" for url in seen["remote"]]
        if seen["math"] and not seen["typeset"]:
            problems.append(f"{page}: {seen['math']} math elements but MathJax typeset none")
        images += seen["images"]
        typeset += seen["typeset"]
    assert not problems, "\n".join(problems)
    assert typeset > 0, "no page had math typeset; the methodology page has equations"


def test_landing_page_shows_the_findings_table(site, browser):
    root, base = site
    open_page(browser, f"{base}/index.html")  # the root redirects to the landing page
    assert browser.current_url.endswith(LANDING), browser.current_url
    rows = browser.find_elements("css selector", f"table.{TABLE_CLASS} tbody tr")
    claims = load_seed_claims()["id"].tolist()
    assert len(rows) == len(claims) == 22
    assert [r.find_element("css selector", "td").text.strip() for r in rows] == claims
    # the first screen shows the table: its top is within the first viewport
    top = browser.execute_script(f"return document.querySelector('table.{TABLE_CLASS}').getBoundingClientRect().top")
    assert top < browser.execute_script("return window.innerHeight"), f"findings table starts at {top}px"
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "landing.png"))
    save_full_page(browser, ARTIFACTS / "landing_full.png")


def test_study_page_screenshot(site, browser):
    """One study page, an executed notebook if the book has one, else a placeholder."""
    root, base = site
    measured = [s for s in STUDIES if (root / "_sources" / f"{s.docname}.ipynb").exists()]
    study = (measured or [s for s in STUDIES if s.slug == "05_attention"])[0]
    seen = open_page(browser, f"{base}/{study.html_path}")
    assert f"Study {study.number}" in seen["title"], seen["title"]
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "study.png"))
    save_full_page(browser, ARTIFACTS / "study_full.png")


def test_rendered_pages_show_their_evidence_banner_near_the_top(site, browser):
    """Every rendered page shows what its data is (device, repeats, fingerprint, commit; stale or not measured) on
    its first screen; a screenshot of the first one's top is kept."""
    root, base = site
    rendered = [d for d in EXECUTED_DOCS if (root / "_sources" / f"{d}.ipynb").exists()]
    assert rendered, "no rendered page in the built book"
    problems = []
    for i, docname in enumerate(rendered):
        open_page(browser, f"{base}/{docname}.html")
        notes = browser.find_elements("xpath", BANNER)
        if not notes:
            problems.append(f"{docname}: no evidence banner")
            continue
        if "Measured on" in notes[0].text and "commit" not in notes[0].text:
            problems.append(f"{docname}: the banner names no commit: {notes[0].text[:80]!r}")
        top = browser.execute_script("return arguments[0].getBoundingClientRect().top", notes[0])
        if top > 1.5 * browser.execute_script("return window.innerHeight"):
            problems.append(f"{docname}: the banner starts at {top:.0f}px, below the first screen and a half")
        if i == 0:
            ARTIFACTS.mkdir(exist_ok=True)
            assert browser.save_screenshot(str(ARTIFACTS / "banner.png"))
    assert not problems, "\n".join(problems)


def save_full_page(driver, path: Path, max_height: int = 6000) -> None:
    """A screenshot of the whole page (up to ``max_height`` px) by resizing the window to fit it."""
    width, height = driver.get_window_size()["width"], driver.get_window_size()["height"]
    full = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(full + 150, max_height))
    try:
        assert driver.save_screenshot(str(path))
    finally:
        driver.set_window_size(width, height)
