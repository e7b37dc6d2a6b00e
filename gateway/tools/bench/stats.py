"""Small measurement helpers: timing loops, percentiles, RSS, and the verdict rule.

The verdict rule, one for every bench that prints figures against goals (``bench run``,
``live``, ``wire``, ``codec``, ``media``; ``judge`` applies it, ``Noise`` carries what it
needs):

1. A figure made of noisy measurements of the same run (one path's percentile less
   another's: an "added" figure; or a path's figure against its control's) carries its
   noise (``Noise.floor``): how far the same measurement moved over the run's repeats (its
   rounds, or the halves of its rounds), or the control's spread between its rounds.
2. A difference (``combine="minus"``: the figure is ``first`` less ``second``) at or below
   its noise, a negative one always, is "not measurable here": it says nothing about the
   gateway, so it is never "met" nor "not met", with a goal or without. So is a figure
   whose noise the run could not measure (one round: NaN).
3. A ratio of two differences (``"over"``) is measurable when each difference is above
   the noise; a ratio of a path's figure to its control's (``"ratio"``) when the goal's
   bound stands further than the noise from the control (the run can tell the bound from
   "no change").
4. A measurable figure is "met" only when it is on the goal's side by a margin above the
   noise (``Noise.margin``: its distance from the goal, in the measurements' unit);
   otherwise "not met": a figure within the noise of its goal has not shown it meets it.
5. A figure without noise (one measurement: a CPU clock, a rate, a size) is "met" or "not
   met" against its goal as it stands; a figure without a goal has no verdict, unless
   rule 2 or 3 makes it not measurable.
6. A time figure also reads as so many of the same run's bare trio wake-ups
   (``against_wake``; ``wake.yardstick`` measures one, once a run), and a rate (a unit
   per second) as so many in one wake-up's time: what a wake-up costs depends on the
   machine more than on the gateway, so the ratio is what compares runs on different
   machines and days.
7. A bench's report ends with one line (``verdict``): the goals met, not met and not
   measurable here.
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
    """What a figure made of noisy measurements of one run was made from (rule 1):
    ``first`` less ``second`` (``combine="minus"``), ``first`` over ``second`` where each
    is itself such a difference (``"over"``), or a path's ``first`` over its control's
    ``second`` (``"ratio"``); and ``floor``, how far the run's own repeated measurements
    moved (``how`` says which)."""

    first: float
    second: float
    floor: float
    names: tuple[str, str] = ("", "")
    how: str = ""
    combine: Literal["minus", "over", "ratio"] = "minus"
    #: The unit of ``first``, ``second`` and ``floor`` when not the figure's (``"over"``,
    #: ``"ratio"``).
    unit: str = ""

    def measurable(self, goal: float | None = None) -> bool:
        """Rules 2 and 3: above the floor; a floor the run could not measure never is,
        and a ``"ratio"`` without a goal has no bound to tell from its control."""
        if not math.isfinite(self.floor):
            return False
        floor = max(self.floor, 0.0)
        if self.combine == "minus":
            return self.first - self.second > floor
        if self.combine == "over":
            return self.first > floor and self.second > floor
        # The goal's bound on ``first`` against "no change", ``first`` equal to ``second``.
        return goal is not None and abs(goal - 1) * self.second > floor

    def margin(self, goal: float, higher_is_better: bool = False) -> float:
        """Rule 4: how far the figure is on its goal's side (negative: beyond it), in the
        measurements' unit: the bound on ``first`` the goal sets, less ``first``."""
        bound = self.second + goal if self.combine == "minus" else goal * self.second
        return self.first - bound if higher_is_better else bound - self.first

    def raw(self, unit: str, margin: float | None = None) -> str:
        """The two measurements and the floor (and the margin to the goal, when given),
        as the report prints them beside the figure."""
        first, second = self.names
        unit = self.unit or unit
        said = (f"{first} {printed(self.first)} {unit}, {second} {printed(self.second)} {unit}; "
                f"this run's noise {printed(self.floor)} {unit}")
        return said if margin is None else f"{said}, margin to the goal {printed(margin)} {unit}"

    def as_dict(self, unit: str, goal: float | None = None,
                higher_is_better: bool = False) -> dict[str, object]:
        """``unit``: the figure's, for a noise that does not name its own."""
        margin = None if goal is None else _finite(self.margin(goal, higher_is_better))
        return {"first": _finite(self.first), "second": _finite(self.second),
                "names": list(self.names), "combine": self.combine,
                "floor": _finite(self.floor), "unit": self.unit or unit, "how": self.how,
                "measurable": self.measurable(goal), "margin": margin}


def judge(value: float, goal: float | None, *, higher_is_better: bool = False,
          noise: Noise | None = None) -> Status | None:
    """The verdict rule (the module's rules 2-5)."""
    if noise is not None and not noise.measurable(goal):
        return "not measurable"  # rules 2 and 3
    if goal is None:
        return None
    if noise is not None:  # rule 4
        return "met" if noise.margin(goal, higher_is_better) > max(noise.floor, 0.0) \
            else "not met"
    met = value >= goal if higher_is_better else value <= goal  # rule 5
    return "met" if met else "not met"


#: Rule 6: the time units a figure can be in, as microseconds (a bare wake-up's unit).
MICROSECONDS = {"us": 1.0, "ms": 1e3, "s": 1e6}


@attrs.frozen
class Figure:
    """One measured figure with its goal and an optional side-by-side baseline;
    ``noise`` when it is made of noisy measurements (rule 1); ``wake``, the same run's
    bare trio wake-up in microseconds (rule 6)."""

    name: str
    value: float
    unit: str
    goal: float | None = None
    higher_is_better: bool = False
    baseline: float | None = None
    baseline_name: str = ""
    spread: str = ""
    noise: Noise | None = None
    wake: float | None = None

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

    @property
    def margin(self) -> float | None:
        """Rule 4's margin, in the noise's unit; None without noise or goal."""
        if self.noise is None or self.goal is None:
            return None
        return self.noise.margin(self.goal, self.higher_is_better)

    @property
    def is_rate(self) -> bool:
        """Rule 6: a figure in some unit per second."""
        return self.unit.endswith("/s")

    @property
    def wakes(self) -> float | None:
        """Rule 6: the figure in bare trio wake-ups (a time), or per wake-up's time (a
        rate); None for a figure that is neither, or a run without the yardstick."""
        if not self.wake:
            return None
        if self.is_rate:
            return self.value * self.wake / 1e6
        scale = MICROSECONDS.get(self.unit)
        return None if scale is None else self.value * scale / self.wake

    @property
    def in_wakes(self) -> str:
        """Rule 6 as a report prints it: ``12.3`` wake-ups, ``0.41 per`` wake-up."""
        wakes = self.wakes
        if wakes is None:
            return ""
        return f"{printed(wakes)} per" if self.is_rate else printed(wakes)

    def as_dict(self) -> dict[str, object]:
        wakes, wake = self.wakes, self.wake
        return {"name": self.name, "value": _finite(self.value), "unit": self.unit,
                "goal": self.goal, "status": self.status, "goal_met": self.goal_met,
                "noise": None if self.noise is None else self.noise.as_dict(
                    self.unit, self.goal, self.higher_is_better),
                "baseline": self.baseline, "baseline_name": self.baseline_name,
                "ratio": None if self.ratio is None else _finite(self.ratio),
                "wake_us": None if wakes is None or wake is None else _finite(wake),
                "wakes": None if wakes is None else _finite(wakes),
                # Rule 6: a time's wake-ups, or a rate's count in one wake-up's time.
                "wakes_are": None if wakes is None else (
                    "per wake-up" if self.is_rate else "wake-ups"),
                "spread": self.spread}


def against_wake(figures: Iterable[Figure], wake_us: float) -> list[Figure]:
    """``figures``, each carrying the run's bare trio wake-up (rule 6)."""
    return [attrs.evolve(figure, wake=wake_us) for figure in figures]


def printed(value: float) -> str:
    """``value`` as a report prints a measurement beside another: three significant
    digits, whole numbers (with thousands separators) from 100 up."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


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
