"""The bench's verdict rule (``stats``, rules 1-7): a figure that is one noisy measurement
less another is judged only when it is above the run's own noise, and met only with a
margin to its goal above that noise; every time figure also reads in the run's bare trio
wake-ups; the printed report and the JSON results say the same verdict for every
figure."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import trio
from typer.testing import CliRunner

from cli.bench import SAID, _report
from cli.main import app
from gateway.compiled import build, described
from gateway.tools.bench import rows
from gateway.tools.bench.stats import (
    Figure,
    Noise,
    against_wake,
    judge,
    percentile_difference,
    round_spread,
    tally,
    verdict,
)


def _added(first: float, second: float, floor: float, goal: float | None = 150.0,
           name: str = "added event latency p50, 1 stream(s)") -> Figure:
    """An added figure: the gateway path's ``first`` less the direct path's ``second``."""
    return Figure(name, first - second, "us", goal=goal, baseline=second,
                  baseline_name="direct HTTP/SSE",
                  noise=Noise(first, second, floor, ("gateway p50", "direct HTTP/SSE p50")))


@pytest.mark.parametrize(("first", "second", "floor", "goal", "expected"), [
    # The case: -878 us, two percentiles of noise subtracted, was printed as met.
    (1_690, 2_568, 100, 1_000, "not measurable"),
    (500, 500, 0, 150, "not measurable"),  # zero: nothing above any noise
    (900, 810, 120, 150, "not measurable"),  # 90 us, below this run's 120 us of noise
    (930, 810, 120, 150, "not measurable"),  # at the floor is within it
    (1_000, 810, 120, 150, "not met"),  # 190 us, above the noise and beyond the goal
    (850, 690, 20, 150, "not met"),  # 160 us: beyond the goal by less than the noise
    (850, 810, 20, 150, "met"),  # 40 us, 110 us within the goal: more than the noise
    (950, 810, 120, 150, "not met"),  # 140 us, within the goal by 10 us: inside the noise
    (950, 810, 120, None, None),  # measurable, but nothing to judge it against
    (700, 810, 120, None, "not measurable"),  # the null relay's negative p99 (issue 39)
    (950, 810, math.nan, 150, "not measurable"),  # a floor the run could not measure
])
def test_a_difference_is_judged_only_above_the_runs_noise(
        first: float, second: float, floor: float, goal: float | None,
        expected: str | None) -> None:
    figure = _added(first, second, floor, goal)
    assert judge(figure.value, goal, noise=figure.noise) == expected
    assert figure.status == expected
    assert figure.goal_met == {"met": True, "not met": False}.get(expected or "")


def test_a_figure_that_is_no_difference_is_judged_against_its_goal_alone() -> None:
    assert judge(-3.0, 10.0) == "met"  # a negative RSS growth is within a growth goal
    assert judge(11.0, 10.0) == "not met"
    assert judge(60_000, 50_000, higher_is_better=True) == "met"
    assert judge(40_000, 50_000, higher_is_better=True) == "not met"
    assert judge(5.0, None) is None


def test_a_ratio_of_two_differences_needs_both_above_the_noise() -> None:
    over = Noise(181_000, 96_000, 40_000, ("gateway p99", "relay p99"), combine="over")
    assert over.measurable()
    assert judge(181 / 96, 1.25, noise=over) == "not met"
    assert over.margin(1.25) == 1.25 * 96_000 - 181_000  # beyond the goal's bound
    clear = Noise(100_000, 96_000, 10_000, ("gateway p99", "relay p99"), combine="over")
    assert clear.margin(1.25) == 20_000 and judge(100 / 96, 1.25, noise=clear) == "met"
    close = Noise(110_000, 96_000, 10_000, ("gateway p99", "relay p99"), combine="over")
    assert judge(110 / 96, 1.25, noise=close) == "not met"  # 10,000 us short: the noise
    relay_in_noise = Noise(181_000, -2_300, 40_000, ("gateway p99", "relay p99"),
                           combine="over")
    assert judge(181_000 / -2_300, 1.25, noise=relay_in_noise) == "not measurable"
    gateway_in_noise = Noise(30_000, 96_000, 40_000, ("gateway p99", "relay p99"),
                             combine="over")
    assert judge(30 / 96, 1.25, noise=gateway_in_noise) == "not measurable"


@pytest.mark.parametrize(("with_load", "without", "floor", "expected"), [
    (11.2, 10.4, 0.4, "met"),  # the bound 13.0 ms stands 1.8 ms over it: above the noise
    (12.9, 10.4, 0.4, "not met"),  # 0.1 ms under the bound: within the noise of it
    (20.0, 10.4, 0.4, "not met"),  # beyond the bound
    (11.0, 10.0, 3.0, "not measurable"),  # the bound 2.5 ms from the control: noise 3 ms
    (9.0, 10.0, math.nan, "not measurable"),  # one round: no noise measured
])
def test_a_path_over_its_control_is_judged_where_the_run_can_tell_the_goals_bound(
        with_load: float, without: float, floor: float, expected: str) -> None:
    # bench media's stall: the gap p99 with big submits over the gap p99 without.
    noise = Noise(with_load, without, floor, ("gap p99 with", "gap p99 without"),
                  combine="ratio", unit="ms")
    assert judge(with_load / without, 1.25, noise=noise) == expected
    assert not noise.measurable()  # no goal: no bound to tell from the control


def test_a_higher_is_better_difference_is_met_only_by_more_than_the_noise() -> None:
    def saved(first: float, floor: float) -> str | None:
        return judge(first - 100, 50, higher_is_better=True,
                     noise=Noise(first, 100, floor, ("resent", "resumed")))

    assert saved(200, 20) == "met"  # 100 saved, 50 over the goal
    assert saved(160, 20) == "not met"  # 60 saved: 10 over the goal, inside the noise
    assert saved(140, 20) == "not met"
    assert saved(110, 20) == "not measurable"


def test_a_time_or_a_rate_reads_in_the_runs_bare_trio_wake_ups() -> None:
    """Rule 6: a time as so many wake-ups, a rate as so many in one wake-up's time."""
    figures = against_wake([
        Figure("per event", 120.0, "us"), Figure("cancel", 1.5, "ms"),
        Figure("start-up", 1.2, "s"), Figure("multiple", 1.9, "x"),
        Figure("rate", 27_500, "events/s"), Figure("size", 32, "KiB")], 60.0)
    assert [f.wakes for f in figures] == [2.0, 25.0, 20_000.0, None, 1.65, None]
    assert [f.in_wakes for f in figures] == ["2", "25", "20,000", "", "1.65 per", ""]
    assert figures[0].as_dict()["wakes"] == 2.0 and figures[0].as_dict()["wake_us"] == 60
    assert figures[3].as_dict()["wakes"] is None and figures[3].as_dict()["wake_us"] is None
    assert figures[4].as_dict()["wakes"] == 1.65
    assert (figures[0].as_dict()["wakes_are"], figures[4].as_dict()["wakes_are"],
            figures[3].as_dict()["wakes_are"]) == ("wake-ups", "per wake-up", None)
    assert Figure("per event", 120.0, "us").wakes is None  # no yardstick in the run
    assert Figure("rate", 27_500, "events/s").in_wakes == ""


def test_the_noise_floor_is_how_far_one_path_moved_between_its_own_rounds() -> None:
    assert round_spread([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]], 0.5) == 2.0
    assert math.isnan(round_spread([[1.0, 2.0, 3.0], []], 0.5))  # one round: no spread
    gateway = [[100.0, 110.0, 120.0], [105.0, 115.0, 125.0]]  # p50 110 and 115: 5 apart
    direct = [[50.0, 60.0, 70.0], [40.0, 50.0, 60.0]]  # p50 60 and 50: 10 apart
    added, noise = percentile_difference(gateway, direct, 0.5, ("gateway", "direct"))
    # Each figure over both rounds (six samples), the floor the larger round spread.
    assert (noise.first, noise.second, noise.floor) == (110.0, 50.0, 10.0)
    assert added == 60.0 and noise.measurable()
    assert noise.names == ("gateway p50", "direct p50")
    assert "two rounds of the same path" in noise.how
    _, unmeasured = percentile_difference(gateway, [direct[0], []], 0.5, ("a", "b"))
    assert math.isnan(unmeasured.floor) and not unmeasured.measurable()


def _latency(own: tuple[float, float, float], relay_p99: float) -> dict[str, list[Figure]]:
    """A run's latency figures: the gateway's and the relay's added p50 at one stream
    (each over direct), their floor, and the added p99s at 256 streams."""
    gateway, relay, floor = own
    return {"latency": [
        _added(gateway + 800, 800, floor),
        _added(relay + 800, 800, floor, None, "added by the hop (null relay) p50, 1 stream(s)"),
        _added(181_000 + 9_000, 9_000, 20_000, 5_000,
               "added event latency p99, 256 stream(s)"),
        _added(relay_p99 + 9_000, 9_000, 20_000, None,
               "added by the hop (null relay) p99, 256 stream(s)")]}


def test_the_goal_rows_carry_the_noise_of_the_figures_they_are_made_of() -> None:
    made = {f.name: f for f in rows.run_rows(_latency((326, 211, 50), 96_000))}
    own, multiple = made[rows.OWN_WORK.name], made[rows.P99_MULTIPLE.name]
    assert (own.value, own.status) == (115, "not met")
    assert own.noise is not None and own.noise.floor == 50
    assert multiple.status == "not met" and multiple.noise is not None
    assert multiple.noise.unit == "us"  # the differences' unit, not the ratio's
    # Within the noise: the gateway's own work 40 us against 50 us of noise, and a null
    # relay whose added p99 came out negative (issue 39's quiet-VM run).
    made = {f.name: f for f in rows.run_rows(_latency((251, 211, 50), -2_300))}
    assert made[rows.OWN_WORK.name].value == 40
    assert made[rows.OWN_WORK.name].status == "not measurable"
    assert made[rows.P99_MULTIPLE.name].status == "not measurable"
    assert made[rows.P99_MULTIPLE.name].goal_met is None
    unary = {"unary": [_added(900, 810, 120, 300, "non-streaming added latency p50")]}
    (row,) = rows.run_rows(unary)
    assert row.name == rows.UNARY_ADDED.name and row.status == "not measurable"


def _every_status() -> list[Figure]:
    return [
        _added(1_690, 2_568, 100, 1_000, "added event latency p99, 1 stream(s)"),
        _added(850, 810, 20, 150, "added event latency p50, 1 stream(s)"),
        _added(1_000, 810, 120, 150, "added event latency p50, 32 stream(s)"),
        _added(700, 810, 120, None, "added by the hop (null relay) p99, 1 stream(s)"),
        Figure("events/s through the gateway, 256 stream(s)", 27_600, "events/s",
               goal=50_000, higher_is_better=True),
        Figure("frames after the cancel's terminal", 0, "frames", goal=0),
        Figure("gateway CPU per event, 1 stream(s), paced", 142.6, "us")]


def test_the_verdict_line_counts_goals_and_noise_apart() -> None:
    figures = _every_status()
    assert tally(figures) == {"met": 2, "not met": 2, "not measurable": 1,
                              "no goal, not measurable": 1}
    assert verdict(figures) == ("verdict: 2 goals met, 2 not met, 1 not measurable here; "
                                "1 more figure(s) without a goal within this run's noise")
    assert verdict(figures[1:3]) == "verdict: 1 goals met, 1 not met, 0 not measurable here"


def _printed_statuses(text: str, figures: list[Figure]) -> dict[str, str]:
    """Each figure's verdict as the table prints it (the column after the goal)."""
    said = {}
    for line in text.splitlines():
        for figure in figures:
            if line.startswith(figure.name + " "):
                rest = line[len(figure.name):].split("  ")
                cells = [cell.strip() for cell in rest if cell.strip()]
                said[figure.name] = next((cell for cell in cells if cell in SAID.values()),
                                         "")
    return said


def test_the_printed_report_and_the_json_say_the_same(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    figures = _every_status()
    _report("latency", figures, False, tmp_path)
    text = capsys.readouterr().out
    document = json.loads((tmp_path / "latency.json").read_text())
    statuses = {f["name"]: f["status"] for f in document["figures"]}
    assert _printed_statuses(text, figures) == {name: SAID[status]
                                                for name, status in statuses.items()}
    assert statuses["added event latency p99, 1 stream(s)"] == "not measurable"
    assert document["verdict"]["line"] == text.splitlines()[-1] == verdict(figures)
    # Not measurable: no value to read as a result, the two raw figures beside it.
    (line,) = [line for line in text.splitlines()
               if line.startswith("added event latency p99, 1 stream(s)")]
    assert "-878" not in line and "met " not in line
    assert "gateway p50 1,690 us, direct HTTP/SSE p50 2,568 us; this run's noise 100 us" \
        in line
    noisy = next(f for f in document["figures"] if f["status"] == "not measurable")
    assert noisy["goal_met"] is None and noisy["noise"]["measurable"] is False
    assert (noisy["noise"]["first"], noisy["noise"]["second"]) == (1_690, 2_568)


def _bench_run(results: dict[str, list[Figure]], tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, dict[str, Any]]:
    """``bench run --quick`` as if it had measured ``results``: its printed report, its
    ``--json`` output, and the results.json its ``--out`` wrote."""
    from gateway.tools.bench import scenarios

    async def measured(names: list[str], quick: bool, progress: object
                       ) -> dict[str, list[Figure]]:
        await trio.lowlevel.checkpoint()
        return results

    monkeypatch.setattr(scenarios, "run_scenarios", measured)
    printed = CliRunner().invoke(app, ["bench", "run", "--quick", "--out", str(tmp_path)])
    assert printed.exit_code == 0, printed.output
    as_json = CliRunner().invoke(app, ["bench", "run", "--quick", "--json"])
    assert as_json.exit_code == 0, as_json.output
    return (printed.stdout, as_json.stdout,
            json.loads((tmp_path / "results.json").read_text()))


def test_bench_run_ends_with_the_verdict_its_results_json_carries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = {"latency": _every_status()[:4], "throughput": _every_status()[4:]}
    printed, as_json, document = _bench_run(results, tmp_path, monkeypatch)
    lines = printed.strip().splitlines()
    assert lines[-1] == document["verdict"]["line"] == (
        "verdict: 2 goals met, 2 not met, 1 not measurable here; 1 more figure(s) without "
        "a goal within this run's noise")
    every = [f for figures in results.values() for f in figures]
    said = _printed_statuses(printed, every)
    for name, figures in document["scenarios"].items():
        for figure in figures:
            assert said[figure["name"]] == SAID[figure["status"]], (name, figure["name"])
    summary = (tmp_path / "summary.md").read_text()
    assert summary.rstrip().endswith(document["verdict"]["line"])
    assert "| added event latency p99, 1 stream(s) | gateway p50 1,690 us" in summary
    assert "| not measurable here |" in summary
    assert {f["name"]: f["status"] for f in json.loads(as_json)["latency"]} == {
        f["name"]: f["status"] for f in document["scenarios"]["latency"]}


def test_a_negative_added_latency_is_never_met_in_any_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 39: `bench run --quick` printed -878 us of added latency as a met goal.
    negative = [
        _added(1_690, 2_568, 100, 1_000, "added event latency p99, 1 stream(s)"),
        _added(700, 810, 0.0, 150, "added event latency p50, 1 stream(s)"),  # no noise
        _added(700, 810, math.nan, 5_000, "added event latency p99, 32 stream(s)"),
        _added(700, 810, 40, None, "added by the hop (null relay) p50, 1 stream(s)")]
    clear = _added(850, 810, 20, 150, "added event latency p50, 32 stream(s)")
    run = {"latency": [*negative, clear],
           "unary": [_added(58_772, 59_210, 899, 300, "non-streaming added latency p50")]}
    run[rows.SECTION] = rows.run_rows(run)  # the row made from the negative unary figure
    results = {name: against_wake(figures, 60.0) for name, figures in run.items()}
    printed, as_json, document = _bench_run(results, tmp_path, monkeypatch)
    every = [f for figures in results.values() for f in figures]
    said = _printed_statuses(printed, every)
    for figures in (document["scenarios"], json.loads(as_json)):
        judged = [f for section in figures.values() for f in section]
        assert len(judged) == len(every)
        for figure in judged:
            if figure["value"] < 0:
                assert figure["status"] == "not measurable", figure["name"]
                assert figure["goal_met"] is None and not figure["noise"]["measurable"]
                assert said[figure["name"]] == "not measurable here"
    summary = (tmp_path / "summary.md").read_text()
    assert not [line for line in summary.splitlines() if "| -" in line and "| met |" in line]
    # The clear one is met, and every figure carries its noise, margin and wake-ups.
    (met,) = [f for f in document["scenarios"]["latency"] if f["status"] == "met"]
    assert met["name"] == clear.name and met["noise"]["margin"] == 110
    assert met["noise"]["floor"] == 20 and met["wakes"] == pytest.approx(40 / 60, abs=1e-3)
    assert document["wake"] == {"us": 60.0, "pacing": "back to back"}
    lines = printed.strip().splitlines()
    assert lines[:2] == [f"build: {described()}",  # what was measured: pure or compiled
                         "wake-ups: each time figure over this run's bare trio wake-up, back "
                         "to back, 60.0 us of CPU on this machine"]
    assert document["machine"]["build"] == build()
    (line,) = [line for line in lines if line.startswith(clear.name + " ")]
    assert " 0.667 " in line and "met" in line
    assert "this run's noise 20 us, margin to the goal 110 us" in printed
    assert lines[-1] == document["verdict"]["line"] == (
        "verdict: 1 goals met, 0 not met, 6 not measurable here; 1 more figure(s) without "
        "a goal within this run's noise")
    assert "| wake-ups |" in summary and "| 0.667 |" in summary


@pytest.mark.parametrize(("via", "direct", "expected"), [
    ([30.0, 30.0, 30.1, 30.1], [30.0] * 4, "met"),  # 0.8 ms under the bound, no noise
    ([40.0] * 4, [30.0] * 4, "not met"),  # beyond 1.03 x direct
    ([30.0, 30.0, 40.0, 40.0], [30.0] * 4, "not measurable"),  # moved 10 ms: the bound 0.9
    ([30.0], [30.0], "not measurable"),  # one round: no halves to compare
])
def test_bench_live_judges_a_path_over_direct_by_the_same_rule(
        via: list[float], direct: list[float], expected: str) -> None:
    from gateway.tools.bench.scenarios import LIVE_GOAL, live_figures

    milliseconds, ratio = live_figures("TTFT", via, direct)
    assert milliseconds.unit == "ms" and milliseconds.status is None  # read, not judged
    assert (ratio.goal, ratio.status) == (LIVE_GOAL, expected)
    assert ratio.noise is not None and ratio.noise.combine == "ratio"
