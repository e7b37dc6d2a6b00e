"""``bench value`` works (its figures come from a real vLLM, never from CI): against the
replay vLLM, every answer comes out whole both ways at each cut rate, the cuts fall
where asked, an HTTP client re-sends once per cut, an NNRP client never does, and the
fleet's resumes are timed on both paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from gateway.tools.bench.value import Phase, cut_points, parse_counters
from tests.support.processes import ReplayThread

runner = CliRunner()


def test_cuts_fall_evenly_through_the_answer() -> None:
    assert cut_points(60, 0) == []
    assert cut_points(60, 1) == [30]
    assert cut_points(60, 5) == [10, 20, 30, 40, 50]
    assert cut_points(3, 5) == [1, 1, 1, 2, 2]  # a short answer: the cuts still happen


METRICS = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} %s
vllm:prompt_tokens_total{engine="0",model_name="tiny"} %s
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 0.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} %s
vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"} 1.0
vllm:generation_tokens_created{engine="0",model_name="tiny"} 1.79e+09
"""


def test_the_figures_come_from_vllms_counter_deltas() -> None:
    before = parse_counters(METRICS % (100.0, 54.0, 1.0))
    after = parse_counters(METRICS % (100.0 + 2 * 128 + 64, 54.0 + 3 * 54, 3.0))
    assert before == {"generation_tokens": 100.0, "prompt_tokens": 54.0,
                      "prefix_cache_hits": 0.0, "finished_requests": 2.0}
    phase = Phase("http", 1, answers=2, tokens=128, prompt_tokens_per_request=54,
                  tokens_delivered=256,
                  vllm={key: after[key] - before[key] for key in before})
    # One answer was cut half way and re-sent: 64 tokens generated for nobody, one
    # prompt processed again, three requests started for two answers.
    assert phase.generated_per_delivered == 1.25
    assert phase.prompt_tokens_again == 54
    assert phase.vllm_requests == 3


@pytest.mark.slow
def test_bench_value_against_the_replay_vllm(tmp_path: Path) -> None:
    with ReplayThread(speed=1.0, token_interval_ms=5.0) as replay:
        result = runner.invoke(app, [
            "bench", "value", "--vllm-url", replay.url, "--model", "example-model",
            "--tokens", "40", "--answers", "2", "--cut-rates", "0,2",
            "--fleet-resumes", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "value.json").read_text())
    assert report["text_chunks"] > 4
    phases = {(p["way"], p["cuts_per_answer"]): p for p in report["phases"]}
    for (way, rate), phase in phases.items():
        assert phase["whole"] == 2, (way, rate)
        assert phase["cuts"] == 2 * rate, (way, rate)
    assert phases["http", 2]["attempts"] == 2 * 3  # each cut re-sent the request
    assert phases["http", 0]["attempts"] == 2
    fleet = report["fleet"]
    assert fleet["same_pod_p50_ms"] > 0 and fleet["other_pod_p50_ms"] > 0
    # Also in the run's bare trio wake-ups (stats rule 6); no goal, and the verdict says so.
    assert fleet["same_pod_p50_wakes"] == pytest.approx(
        fleet["same_pod_p50_ms"] * 1000 / report["wake_us"], abs=0.1)
    assert (tmp_path / "value.md").read_text().rstrip().endswith(
        "verdict: 0 goals met, 0 not met, 0 not measurable here")
    assert "| 2 | NNRP resume | 4 | 2/2 |" in (tmp_path / "value.md").read_text()
