"""``bench media`` works (its figures come from a full run on a quiet machine, never from
CI): the quick run reports every figure, each a positive number, for each size, way and
delivery mode, and the stall's ratio against its goal."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from gateway.tools.bench.media import (
    ENVELOPE_MAX_MIB,
    QUICK_SIZES_MIB,
    STALL_GOAL,
    SizeResult,
    StallResult,
    stall_figures,
)

runner = CliRunner()


def test_the_base64_envelope_fits_a_packet_up_to_47_mib() -> None:
    assert ENVELOPE_MAX_MIB == 47  # 4/3 of it, and the JSON around it, under 64 MiB


def test_the_added_latency_carries_the_noise_of_its_halves() -> None:
    result = SizeResult(2, 4, latency_ms={"direct": [10.0, 10.0, 12.0, 12.0],
                                          "data_uri": [20.0, 20.0, 26.0, 26.0]})
    added, noise = result.added("data_uri")
    assert added == 23.0 - 11.0
    assert noise.floor == 6.0  # the gateway's p50 moved from 20 to 26 between halves
    assert noise.measurable()


def test_a_stall_within_the_runs_noise_is_not_measurable_never_met() -> None:
    steady = StallResult("data URI", "frames", 63, 32,
                         gaps={"without": [[10.0] * 100, [10.4] * 100],
                               "with": [[11.0] * 100, [11.2] * 100]})
    longest, figure = stall_figures(steady)
    assert longest.value == pytest.approx(11.2 / 10.4)
    assert figure.status == "met"
    assert figure.value == pytest.approx(11.2 / 10.4)
    noisy = StallResult("data URI", "frames", 63, 32,
                        gaps={"without": [[10.0] * 100, [40.0] * 100],
                              "with": [[11.0] * 100, [41.0] * 100]})
    assert stall_figures(noisy)[1].status == "not measurable"


@pytest.mark.slow
def test_bench_media_quick_reports_every_figure(tmp_path: Path) -> None:
    result = runner.invoke(app, ["bench", "media", "--quick", "--json", "--out",
                                 str(tmp_path)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document == json.loads((tmp_path / "media.json").read_text())
    assert any("PROTOCOL_MAX_PACKET" in note for note in document["notes"])
    figures = {figure["name"]: figure for figure in document["figures"]}
    ways = ("NNRP frames, data URI", "NNRP frames, media dir", "NNRP, base64 in the envelope")
    for mib in QUICK_SIZES_MIB:
        size = f"{mib} MiB"
        link = figures[f"bytes on the client's link per media byte, NNRP frames, data URI, "
                       f"{size}"]
        assert 1.0 <= link["value"] < 1.01  # the bytes and a few hundred more
        assert link["baseline"] == pytest.approx(4 / 3, rel=0.01)  # base64
        for way in ways:
            cpu = figures[f"gateway CPU per MiB, {way}, {size}"]
            assert cpu["value"] > 0
            # In the run's bare trio wake-ups too (stats rule 6), measured once.
            assert cpu["wakes"] == pytest.approx(cpu["value"] * 1000 / cpu["wake_us"],
                                                 rel=1e-3)
            assert cpu["wake_us"] == document["wake"]["us"] > 0
            latency = figures[f"added latency per MiB, {way}, {size}"]
            through, direct = latency["noise"]["first"], latency["noise"]["second"]
            assert through > 0
            assert direct > 0
        for mode in ways[:2]:
            assert figures[f"gateway peak RSS growth over the image's size, {mode}, "
                           f"{size}"]["value"] > 0
    details = document["details"]
    assert [size["mib"] for size in details["sizes"]] == list(QUICK_SIZES_MIB)
    stalls = details["stalls"]
    assert [stall["name"] for stall in stalls] == ["data URI", "media dir", "base64 envelope"]
    for stall in stalls:
        assert sum(stall["submits"]) >= 1  # the load ran beside the streams
        for condition in ("with", "without"):
            assert stall[f"gap_p99_ms_{condition}"] > 0
        figure = figures[f"stream gap p99 with {stall['load_mib']:g} MiB submits / without, "
                         f"{stall['name']}, 8 streams"]
        assert figure["goal"] == STALL_GOAL
        longest = figures[f"longest stream gap with {stall['load_mib']:g} MiB submits / "
                          f"without, {stall['name']}, 8 streams"]
        assert longest["value"] > 0
        assert figure["value"] > 0
        assert math.isfinite(figure["value"])
        # One round each way in --quick: the run cannot know its own noise.
        assert figure["status"] == "not measurable"
    assert (tmp_path / "logs" / "gateway-media_dir.log").exists()
