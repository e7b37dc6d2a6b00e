"""Small measurement helpers: timing loops, percentiles, RSS, and the verdict rule.

The verdict rule (``judge``): a figure made of two noisy measurements of the same run,
one less the other (the gateway path's percentile less the direct path's), or one such
difference over another, is *measurable* only when each difference is above the run's
own noise floor (``Noise``): a difference at or below it (a negative one always is) says
nothing about the gateway, so it is "not measurable", never "met" nor "not met". A
measurable figure, and every figure that is not a difference, is "met" or "not met"
against its goal; a figure without a goal has no verdict, unless it is not measurable.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

import attrs

#: A figure's verdict (``judge``), in the JSON results and the printed report alike.
Status = Literal["met", "not met", "not measurable"]


@attrs.frozen
class Noise:
    """What a figure made of two noisy measurements of one run was made from: ``first``
    less ``second`` (``combine="minus"``), or ``first`` over ``second`` where each is
    itself such a difference (``"over"``), and ``floor``, how far the run's own repeated
    measurements moved (``how`` says which): a difference must be above it to mean
    anything."""

    first: float
    second: float
    floor: float
    names: tuple[str, str] = ("", "")
    how: str = ""
    combine: Literal["minus", "over"] = "minus"
    #: The unit of ``first``, ``second`` and ``floor`` when not the figure's (``"over"``).
    unit: str = ""

    @property
    def measurable(self) -> bool:
        """The difference (each difference, for ``"over"``) is above the floor; a
        negative one never is, and neither is one whose floor could not be measured."""
        if not math.isfinite(self.floor):
            return False
        if self.combine == "minus":
            return self.first - self.second > max(self.floor, 0.0)
        return self.first > max(self.floor, 0.0) and self.second > max(self.floor, 0.0)

    def raw(self, unit: str) -> str:
        """The two measurements and the floor, as the report prints them beside the
        figure."""
        first, second = self.names
        unit = self.unit or unit
        return (f"{first} {self.first:,.0f} {unit}, {second} {self.second:,.0f} {unit}; "
                f"this run's noise {self.floor:,.0f} {unit}")

    def as_dict(self, unit: str) -> dict[str, object]:
        """``unit``: the figure's, for a noise that does not name its own."""
        return {"first": _finite(self.first), "second": _finite(self.second),
                "names": list(self.names), "combine": self.combine,
                "floor": _finite(self.floor), "unit": self.unit or unit, "how": self.how,
                "measurable": self.measurable}


def judge(value: float, goal: float | None, *, higher_is_better: bool = False,
          noise: Noise | None = None) -> Status | None:
    """The verdict rule (module docstring): "not measurable" for a difference at or below
    the run's noise, else "met" or "not met" against ``goal`` (None: no goal)."""
    if noise is not None and not noise.measurable:
        return "not measurable"
    if goal is None:
        return None
    met = value >= goal if higher_is_better else value <= goal
    return "met" if met else "not met"


@attrs.frozen
class Figure:
    """One measured figure with its goal and an optional side-by-side baseline;
    ``noise`` when it is a difference of two noisy measurements (``judge``)."""

    name: str
    value: float
    unit: str
    goal: float | None = None
    higher_is_better: bool = False
    baseline: float | None = None
    baseline_name: str = ""
    spread: str = ""
    noise: Noise | None = None

    @property
    def status(self) -> Status | None:
        return judge(self.value, self.goal, higher_is_better=self.higher_is_better,
                     noise=self.noise)

    @property
    def goal_met(self) -> bool | None:
        """True or False against the goal; None without a goal, or when the figure is
        not measurable (within the run's noise)."""
        status = self.status
        return None if status in (None, "not measurable") else status == "met"

    @property
    def ratio(self) -> float | None:
        if not self.baseline:
            return None
        return self.value / self.baseline

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "value": _finite(self.value), "unit": self.unit,
                "goal": self.goal, "status": self.status, "goal_met": self.goal_met,
                "noise": None if self.noise is None else self.noise.as_dict(self.unit),
                "baseline": self.baseline, "baseline_name": self.baseline_name,
                "ratio": None if self.ratio is None else _finite(self.ratio),
                "spread": self.spread}


def _finite(value: float) -> float | None:
    """``value`` rounded for the JSON results; None for NaN or infinity (not JSON)."""
    return round(value, 3) if math.isfinite(value) else None


def tally(figures: Iterable[Figure]) -> dict[str, int]:
    """The goals met, not met and not measurable, and the figures without a goal that
    were within the run's noise (``"no goal, not measurable"``)."""
    counts = {"met": 0, "not met": 0, "not measurable": 0, "no goal, not measurable": 0}
    for figure in figures:
        status = figure.status
        if status is None:
            continue
        counts["no goal, not measurable" if figure.goal is None else status] += 1
    return counts


def verdict(figures: Iterable[Figure]) -> str:
    """The one line that ends a run's report (``tally``)."""
    counts = tally(figures)
    line = (f"verdict: {counts['met']} goals met, {counts['not met']} not met, "
            f"{counts['not measurable']} not measurable here")
    if counts["no goal, not measurable"]:
        line += (f"; {counts['no goal, not measurable']} more figure(s) without a goal "
                 "within this run's noise")
    return line


def per_call_us(function: Callable[[], object], *, min_time: float = 0.3,
                repeats: int = 5) -> tuple[float, str]:
    """Best-of-``repeats`` microseconds per call, and the spread across repeats."""
    function()  # warm-up
    count = 1
    while True:
        start = time.perf_counter()
        for _ in range(count):
            function()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time / repeats:
            break
        count *= 2
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(count):
            function()
        samples.append((time.perf_counter() - start) / count * 1e6)
    return min(samples), f"min {min(samples):.2f} / median {statistics.median(samples):.2f} us"


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def round_spread(rounds: Sequence[Sequence[float]], fraction: float) -> float:
    """How far one percentile moved between repeated rounds of the same measurement in
    one run (largest less smallest); NaN with fewer than two rounds that have samples."""
    values = [percentile(samples, fraction) for samples in rounds if samples]
    if len(values) < 2:
        return float("nan")
    return max(values) - min(values)


def percentile_difference(first: Sequence[Sequence[float]],
                          second: Sequence[Sequence[float]], fraction: float,
                          names: tuple[str, str]) -> tuple[float, Noise]:
    """One path's percentile less another's, both over all their rounds, and its noise:
    the floor is the larger of the two paths' ``round_spread`` at that percentile (how far
    the same path moved between its own rounds of this run)."""
    a = percentile([value for samples in first for value in samples], fraction)
    b = percentile([value for samples in second for value in samples], fraction)
    spreads = (round_spread(first, fraction), round_spread(second, fraction))
    floor = max(spreads) if all(map(math.isfinite, spreads)) else float("nan")
    p = f"p{fraction * 100:g}"
    return a - b, Noise(a, b, floor, (f"{names[0]} {p}", f"{names[1]} {p}"),
                        how=f"the largest spread of {p} between two rounds of the same path "
                            "in this run")


def rss_bytes() -> int:
    """Resident set size of this process (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
