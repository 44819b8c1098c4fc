"""One finding from independent repeats of a claim's measurement: median, an interval from the repeats, and
"inconclusive" where the repeats' verdicts disagree.

A repeat is one run of the claim's whole measurement in a fresh process, with its own seeds and traces; each gives a
``Finding`` with its own verdict. ``combine_repeats`` turns three or more of them into the finding the book shows:

- the headline value is the **median over repeats**: of each repeat's ``headline`` (the one number its verdict was
  decided on) where every repeat has one, else of ``measured_value`` read as a number;
- its interval is **distribution-free, from order statistics**: the k-th smallest and k-th largest repeat, with k
  the largest for which the binomial(n, 1/2) tail leaves at least 95% coverage of the true median. Fewer than six
  repeats cannot reach 95%: the interval is then the **min–max**, which covers the median with probability
  1 − 2·0.5ⁿ (75% for 3 repeats, 87.5% for 4), and the note says so;
- ``repeats`` is the count and ``repeat_verdicts`` each repeat's verdict, ";"-joined in run order;
- the verdict is the repeats' verdict when all agree, else ``inconclusive``;
- a claim judged on each model on its own (``Finding.headline_parts``) has an interval **per model**: its headline,
  the median over models, decides nothing, and its interval mixed the models (F1.1's read -361% to 69% while each
  model's verdict stood on its own number). ``spread`` then reads "per model: a 91.5–92.6; b -815 to 56.3", and the
  note gives each model's median and interval.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from servelab.errors import ParameterError
from servelab.studies.common.findings import Finding

MIN_REPEATS = 3
COVERAGE = 0.95  # the interval's target coverage of the median
INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class MedianInterval:
    """The median of n repeats and an order-statistic interval around it (units: the measurement's)."""

    median: float
    low: float
    high: float
    n: int
    coverage: float  # the probability that [low, high] covers the true median (exact, distribution-free)

    @property
    def is_min_max(self) -> bool:
        return self.coverage < COVERAGE

    def describe(self, unit: str = "") -> str:
        """How the note says it: "median 5.33 ×, 5.1–8.1 × over 3 repeats (min–max: a 75% interval for the median)".
        The unit is given whole once, after the median, and by its symbol alone after the interval ("median 1.1 ×
        speedup of the best configuration, 1.07–1.15 × over 3 repeats"); a qualifier after a comma goes in
        parentheses ("median 6.5 µs/token (prefill at ≥ 4096 tokens, median over 2 models), 6.3–6.6 µs/token"):
        written whole twice, a long unit's commas ran into the interval's."""
        head, comma, qualifier = unit.partition(", ")
        u = f" {head}" if head else ""
        said = f" ({qualifier})" if comma else ""
        symbol = f" {head.split()[0]}" if head.strip() else ""
        kind = (
            f"min–max: a {self.coverage:.0%} interval for the median"
            if self.is_min_max
            else f"{self.coverage:.0%} order-statistic interval for the median"
        )
        if _fmt(self.low) == _fmt(self.high):  # no interval to speak of: "100 % in each of the 3 repeats"
            return f"{_fmt(self.median)}{u}{said} in each of the {self.n} repeats"
        return f"median {_fmt(self.median)}{u}{said}, {self.range_text()}{symbol} over {self.n} repeats ({kind})"

    def range_text(self) -> str:
        """The interval as the tables print it: "5.1–8.1"; "-1 to -0.5" where a bound is negative (an en dash
        between minus signs reads as a subtraction); "all 2" where every repeat measured the same."""
        low, high = _fmt(self.low), _fmt(self.high)
        if low == high:
            return f"all {low}"
        return f"{low} to {high}" if min(self.low, self.high) < 0 else f"{low}–{high}"


def _fmt(x: float) -> str:
    """Four significant digits, as ``.4g`` keeps them, but never in scientific notation and with thousands
    separators, as the book writes numbers: 1881.2 -> "1,881", 12345 -> "12,340", 0.01234 -> "0.01234"."""
    if x == 0 or not math.isfinite(x):
        return f"{x:.4g}"
    decimals = 3 - math.floor(math.log10(abs(x)))
    x = round(x, decimals)
    if decimals <= 0:
        return f"{x:,.0f}"
    return f"{x:,.{decimals}f}".rstrip("0").rstrip(".")


def _coverage(n: int, k: int) -> float:
    """P(X_(k) <= median <= X_(n+1-k)) for n draws of a continuous distribution: 1 − 2·P(Binomial(n, ½) < k)."""
    tail = sum(math.comb(n, i) for i in range(k)) / 2**n
    return 1.0 - 2.0 * tail


def median_interval(values: Sequence[float]) -> MedianInterval:
    """The median of ``values`` and the narrowest order-statistic interval with ≥ 95% coverage (else min–max)."""
    xs = sorted(float(v) for v in values)
    if not xs or not all(math.isfinite(x) for x in xs):
        raise ParameterError(f"repeat values must be finite numbers, got {list(values)!r}")
    n, k = len(xs), 1
    while k + 1 <= (n + 1) // 2 and _coverage(n, k + 1) >= COVERAGE:
        k += 1
    return MedianInterval(statistics.median(xs), xs[k - 1], xs[n - k], n, _coverage(n, k))


def combined_verdict(verdicts: Sequence[str]) -> str:
    """The repeats' common verdict, or ``inconclusive`` when any two disagree."""
    return verdicts[0] if len(set(verdicts)) == 1 else INCONCLUSIVE


PER_PART = "per model: "  # how a spread of per-model intervals begins (the book shows them with the part's unit)


def part_intervals(findings: Sequence[Finding]) -> dict[str, MedianInterval]:
    """Each model's median and interval over the repeats that judged it, where the claim is judged per model
    (``headline_parts`` with two models or more); {} otherwise."""
    parts = [dict(f.headline_parts) for f in findings]
    names = list(dict.fromkeys(n for p in parts for n in p))
    if len(names) < 2:
        return {}
    return {n: median_interval([p[n] for p in parts if n in p]) for n in names}


def part_unit(headline_unit: str) -> str:
    """A model's unit from a headline's over the models: the text before the ";" that says how they were joined
    ("% cut in the p99 stall, median over rates; median over 2 models" -> "% cut in the p99 stall, median over
    rates")."""
    return headline_unit.split(";")[0].strip()


def spread_unit(spread: str, headline_unit: str) -> str:
    """The unit of the interval ``spread`` names: the headline's without its explanation, and a model's where the
    spread gives each model's (``PER_PART``)."""
    unit = split_unit(headline_unit)[0]
    return part_unit(unit) if str(spread).startswith(PER_PART) else unit


def spread_with_unit(spread: str, unit: str) -> str:
    """The interval as a reader sees it: with thousands separators, and where it gives each model's, the unit's
    symbol after each model's interval and the whole unit after the last ("per model: a 91.5–95.4 %; b -818 to
    44.7 % cut, median over rates"): with the unit at the end alone, it read as the last model's only."""
    from servelab.studies.common.markdown import format_value

    tail = f" {unit}" if unit else ""
    if not str(spread).startswith(PER_PART):
        return f"{format_value(spread)}{tail}"
    each = [format_value(p) for p in str(spread).removeprefix(PER_PART).split("; ")]
    head = unit.partition(", ")[0].split()
    symbol = f" {head[0]}" if head else ""
    return PER_PART + "; ".join(f"{p}{symbol}" for p in each[:-1]) + ("; " if len(each) > 1 else "") + each[-1] + tail


def _check(findings: Sequence[Finding], min_repeats: int) -> None:
    if len(findings) < min_repeats:
        raise ParameterError(
            f"a verdict needs at least {min_repeats} independent repeats, got {len(findings)}"
            + (f" for {findings[0].id}" if findings else "")
        )
    ids, units = {f.id for f in findings}, {f.unit for f in findings}
    if len(ids) != 1 or len(units) != 1:
        raise ParameterError(
            f"repeats must be of one claim in one unit, got ids {sorted(ids)} and units {sorted(units)}"
        )
    if any(f.repeats != 1 for f in findings):  # a repeat's own verdict may be inconclusive (data too thin)
        raise ParameterError(f"{findings[0].id}: each repeat is one run with its own verdict, not a combined finding")


def _measured_numbers(findings: Sequence[Finding]) -> list[float] | None:
    """Each ``measured_value`` read as a number; None where one is text."""
    try:
        return [float(f.measured_value.replace(",", "")) for f in findings]
    except ValueError:
        return None


def _numbers(findings: Sequence[Finding], values: Sequence[float] | None) -> tuple[list[float] | None, str]:
    """The repeats' numbers and where they came from: ``values`` when given ("values"), else each repeat's
    ``headline`` where all have one ("headline"), else each ``measured_value`` read as a number ("measured"); None
    when the measured values are text that all repeats share (nothing to take a median of)."""
    if values is not None:
        if len(values) != len(findings):
            raise ParameterError(f"{findings[0].id}: {len(values)} values for {len(findings)} repeats")
        return [float(v) for v in values], "values"
    if all(f.headline is not None for f in findings):
        return [f.headline for f in findings], "headline"
    nums = _measured_numbers(findings)
    if nums is not None or len({f.measured_value for f in findings}) == 1:
        return nums, "measured"
    raise ParameterError(
        f"{findings[0].id}: measured values {[f.measured_value for f in findings]} are not numbers and not every "
        "repeat has a headline; pass values= (one number per repeat) to take their median"
    )


def _median_repeat(findings: Sequence[Finding], spread: MedianInterval | None, source: str) -> Finding:
    """The repeat whose headline is nearest the median of the headlines (the first of a tie): its text and reasoning
    stand for the claim, so that the numbers a reader sees agree with the median beside them. The first repeat
    where the numbers are not headlines."""
    if spread is None or source != "headline":
        return findings[0]
    return min(findings, key=lambda f: abs(f.headline - spread.median))


def _measured(findings: Sequence[Finding], spread: MedianInterval | None, source: str) -> str:
    """The combined ``measured_value``: the median of the numbers where they are ``values`` or the measured values;
    where they are headlines, the measured values' own median if they are numbers, else the median repeat's
    text (``_median_repeat``)."""
    if spread is not None and source != "headline":
        return _fmt(spread.median)
    nums = _measured_numbers(findings)
    if nums is not None:
        return _fmt(statistics.median(nums))
    return _median_repeat(findings, spread, source).measured_value


def split_unit(unit: str) -> tuple[str, str]:
    """A headline's unit and what follows it, the rule or an explanation: "× TTFT speedup at a 512-token prefix
    (holds within ±25% of 2.41)" -> ("× TTFT speedup at a 512-token prefix", "holds within ±25% of 2.41"); "×
    the parameter ratio: eager HF's ..." -> ("× the parameter ratio", "eager HF's ...")."""
    head, colon, tail = unit.partition(":")
    short, paren, rule = head.partition(" (")
    if paren:
        rule = rule[:-1] if rule.endswith(")") and not colon else rule
        tail = f"{rule}{colon}{tail}"
    return short.strip(), tail.strip()


def combine_repeats(
    findings: Sequence[Finding], *, values: Sequence[float] | None = None, min_repeats: int = MIN_REPEATS
) -> Finding:
    """One ``Finding`` from ≥ ``min_repeats`` repeats of one claim (see the module's docstring for the rules).

    The median and interval are of ``values`` where given (one number per repeat), else of the repeats' headlines
    where every repeat has one, else of the measured values; the combined ``headline`` is that median (None where
    the numbers were the measured values). The text and note are the median repeat's (``_median_repeat``), with
    the median, the interval and its kind added; for an inconclusive claim the note names which repeats said what.
    """
    _check(findings, min_repeats)
    verdicts = [f.verdict for f in findings]
    verdict = combined_verdict(verdicts)
    nums, source = _numbers(findings, values)
    spread = median_interval(nums) if nums is not None else None
    first = _median_repeat(findings, spread, source)
    headline = spread is not None and source != "measured"
    unit = (first.headline_unit or first.unit) if headline else first.unit
    said = f"the {len(findings)} repeats say {'; '.join(verdicts)}" if verdict == INCONCLUSIVE else ""
    # the interval in the unit alone: "median 1.42 × TTFT speedup (holds within ±25% of 2.41)" beside a verdict of
    # changes read as if the value held; the rule follows, named as such
    short, rule = split_unit(unit)
    described = spread.describe(short) + (f"; the rule: {rule}" if rule else "") if spread else ""
    by_part = part_intervals(findings) if headline else {}
    interval = spread.range_text() if spread else ""
    if by_part:  # the median over models and its interval decide nothing: each model's do
        each = part_unit(short)
        described = PER_PART + "; ".join(f"{n} {mi.describe(each)}" for n, mi in by_part.items())
        described += f"; the rule: {rule}" if rule else ""
        interval = PER_PART + "; ".join(f"{n} {mi.range_text()}" for n, mi in by_part.items())
    parts = [p for p in (described, said) if p]
    note = first.note + (f" [{'; '.join(parts)}]" if parts else "")
    return replace(
        first,
        text_repeat=next(i for i, f in enumerate(findings) if f is first),
        measured_value=_measured(findings, spread, source),
        verdict=verdict,
        note=note,
        repeats=len(findings),
        repeat_verdicts=";".join(verdicts),
        spread=interval,
        headline=spread.median if headline else None,
        headline_unit=unit if headline else "",
    )
