"""Small measurement helpers: timing loops, percentiles, RSS."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import attrs


@attrs.frozen
class Figure:
    """One measured figure with its goal and an optional side-by-side baseline."""

    name: str
    value: float
    unit: str
    goal: float | None = None
    higher_is_better: bool = False
    baseline: float | None = None
    baseline_name: str = ""
    spread: str = ""

    @property
    def goal_met(self) -> bool | None:
        if self.goal is None:
            return None
        return self.value >= self.goal if self.higher_is_better else self.value <= self.goal

    @property
    def ratio(self) -> float | None:
        if not self.baseline:
            return None
        return self.value / self.baseline

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "value": round(self.value, 3), "unit": self.unit,
                "goal": self.goal, "goal_met": self.goal_met, "baseline": self.baseline,
                "baseline_name": self.baseline_name,
                "ratio": None if self.ratio is None else round(self.ratio, 3),
                "spread": self.spread}


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


def rss_bytes() -> int:
    """Resident set size of this process (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
