"""The gateway's cost against its goals, row by row: each row's figure under a name that
says what it measures, so its numbers can be followed across runs of ``bench run`` and
``bench live``.

Rules:

1. A row's name says what it measures, with the load it is measured under (``Row.name``),
   and it keeps that name across runs; its goal and unit are beside it. A scenario's own
   figure keeps its own name beside it (the row is made from it, never renames it).
2. ``RUN_ROWS`` says, for each row ``bench run`` measures, which scenario's figures make
   it and how: ``as is``, ``minus`` (one figure less another of the same run) or
   ``over`` (one figure as a multiple of another of the same run). A row is reported
   only when every figure it needs is in the run (``--quick`` runs 32 and 64 streams,
   not 256, and a ``--scenario`` run has only its scenarios): never a stand-in.
3. A row made from figures that are differences of two noisy measurements (the added
   latencies) carries their noise (``stats.Noise``): ``as is`` keeps the figure's,
   ``minus`` and ``over`` take the larger floor of the two, and the row is judged by the
   bench's one verdict rule (``stats``, rules 2-4): a difference (for ``over``, either
   difference) within the floor is "not measurable here", never met, and a row is met
   only with a margin to its goal above the floor.
4. ``LIVE_RATIO`` is ``bench live --streams N``'s row (``live_cost``): the gateway's CPU
   per streamed event over vLLM's API-server CPU per SSE chunk, both from the kernel's
   per-process CPU clocks in the same run.
"""

from __future__ import annotations

from typing import Literal

import attrs

from .stats import Figure, Noise

#: ``bench run``'s section (and results key) holding the rows.
SECTION = "gateway cost against goals"


@attrs.frozen
class Row:
    """One row of the table (rule 1)."""

    name: str
    unit: str
    goal: float
    higher_is_better: bool = False


OWN_WORK = Row("gateway's own work per event at 1 stream: added p50 minus the null relay's "
               "added p50, same run", "us", 40)
CPU_PACED = Row("gateway CPU per paced event, 256 streams", "us", 20)
CPU_COALESCED = Row("gateway CPU per coalesced event, 256 streams", "us", 10)
EVENTS_PER_S = Row("events/s, instant backend, 256 streams, one worker", "events/s", 50_000,
                   higher_is_better=True)
UNARY_ADDED = Row("non-streaming added p50", "us", 150)
P99_MULTIPLE = Row("added p99 at 256 streams x 100 ev/s, as a multiple of the null relay's "
                   "added p99 in the same run", "x", 1.25)
LIVE_RATIO = Row("gateway CPU per streamed event / vLLM API-server CPU per SSE chunk, same "
                 "run, real vLLM, 8-64 streams", "x", 0.5)
#: Every row, in the table's order.
ROWS = (OWN_WORK, CPU_PACED, CPU_COALESCED, EVENTS_PER_S, UNARY_ADDED, P99_MULTIPLE,
        LIVE_RATIO)


@attrs.frozen
class FromRun:
    """How ``bench run`` makes a row (rule 2): ``figure`` of ``scenario``, as is, minus
    ``other`` or over ``other`` (both of the same run)."""

    row: Row
    scenario: str
    figure: str
    combine: Literal["as is", "minus", "over"] = "as is"
    other: str = ""


RUN_ROWS = (
    FromRun(OWN_WORK, "latency", "added event latency p50, 1 stream(s)", "minus",
            "added by the hop (null relay) p50, 1 stream(s)"),
    FromRun(CPU_PACED, "cost", "gateway CPU per event, 256 stream(s), paced"),
    FromRun(CPU_COALESCED, "cost", "gateway CPU per event, 256 stream(s), coalesced"),
    FromRun(EVENTS_PER_S, "throughput", "events/s through the gateway, 256 stream(s)"),
    FromRun(UNARY_ADDED, "unary", "non-streaming added latency p50"),
    FromRun(P99_MULTIPLE, "latency", "added event latency p99, 256 stream(s)", "over",
            "added by the hop (null relay) p99, 256 stream(s)"),
)


def row_figure(row: Row, value: float, spread: str, noise: Noise | None = None) -> Figure:
    """A row's figure: its name, unit and goal (rule 1), and its noise (rule 3)."""
    return Figure(row.name, value, row.unit, goal=row.goal,
                  higher_is_better=row.higher_is_better, spread=spread, noise=noise)


def _noise(rule: FromRun, first: Figure, second: Figure) -> Noise | None:
    """Rule 3: the noise of ``first`` combined with ``second``, when either has one."""
    floors = [f.noise.floor for f in (first, second) if f.noise is not None]
    if not floors:
        return None
    return Noise(first.value, second.value, max(floors), (rule.figure, rule.other),
                 how="the larger noise floor of the two figures",
                 combine="over" if rule.combine == "over" else "minus",
                 unit=first.unit if rule.combine == "over" else "")


def _made(rule: FromRun, figures: dict[str, Figure]) -> Figure | None:
    first = figures.get(rule.figure)
    if first is None:
        return None
    if rule.combine == "as is":
        return row_figure(rule.row, first.value, f"{rule.scenario}: {rule.figure}",
                          first.noise)
    second = figures.get(rule.other)
    if second is None:
        return None
    scale, unit = (1000.0, "ms") if rule.row.unit == "x" else (1.0, first.unit)
    if rule.combine == "minus":
        value = first.value - second.value
        how = f"{first.value:.0f} - {second.value:.0f} = {value:.0f} {unit}"
    else:
        value = first.value / second.value if second.value else float("inf")
        how = (f"{first.value / scale:.1f} / {second.value / scale:.1f} {unit} = "
               f"{value:.2f}x")
    return row_figure(rule.row, value,
                      f"{how} ({rule.scenario}: {rule.figure} {rule.combine} {rule.other})",
                      _noise(rule, first, second))


def run_rows(results: dict[str, list[Figure]]) -> list[Figure]:
    """The rows that ``results`` (a ``bench run``) measured, in the table's order
    (rule 2)."""
    rows = []
    for rule in RUN_ROWS:
        figures = {figure.name: figure for figure in results.get(rule.scenario, ())}
        made = _made(rule, figures)
        if made is not None:
            rows.append(made)
    return rows
