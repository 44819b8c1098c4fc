"""The book's command line: ``python -m servelab_book prepare`` before the build, ``check DIR`` after it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from servelab.errors import ParameterError
from servelab_book.findings import BOOK_DEVICE, FindingsError
from servelab_book.findings_table import FindingsMismatch
from servelab_book.mathjax import MathJaxMissing
from servelab_book.studies import PageConflict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab_book", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "prepare",
        help="check the study pages; generate the findings table and other includes; copy MathJax into book/_static",
    )
    p.add_argument(
        "--root",
        type=Path,
        default=None,
        help="the checkout whose book to prepare (default: the one this package is installed from)",
    )
    p.add_argument(
        "--results", type=Path, default=None, help="results root (default: $SERVELAB_RESULTS or <root>/data/results)"
    )
    p.add_argument(
        "--device",
        default=BOOK_DEVICE,
        help=f"only runs whose device slug contains this count as the book's (default {BOOK_DEVICE!r})",
    )
    r = sub.add_parser("render", help="render every study page and the simulator page from the committed data")
    r.add_argument("pages", nargs="*", help="notebook stems to render (default: all), e.g. 02_gpu_costs")
    r.add_argument("--jobs", type=int, default=None, help="kernels at a time (default: one per core)")
    c = sub.add_parser("check", help="check a built book: pages, findings table, offline assets, internal links")
    c.add_argument("html_dir", type=Path, help="the built HTML, e.g. _build/html")
    args = parser.parse_args(argv)

    if args.command == "prepare":
        from servelab.paths import REPO_ROOT
        from servelab_book.prepare import prepare, prepare_checkout

        try:
            if args.root is None or args.root.resolve() == REPO_ROOT:
                report = prepare(args.results, device=args.device)
            else:
                report = prepare_checkout(args.root, args.results, device=args.device)
            print(report.summary())
        except (PageConflict, FindingsError, FindingsMismatch, MathJaxMissing, ValueError) as e:
            print(f"servelab_book prepare: {e}", file=sys.stderr)
            return 1
        return 0

    if args.command == "render":
        from servelab_book.render import render_all

        try:
            times = render_all(only=args.pages or None, jobs=args.jobs)
        except ParameterError as e:
            print(f"servelab_book render: {e}", file=sys.stderr)
            return 2
        for page, seconds in times.items():
            print(f"rendered {page} in {seconds:.1f} s")
        return 0

    from servelab_book.check import check_book

    report = check_book(args.html_dir)
    print(report.summary(), file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
