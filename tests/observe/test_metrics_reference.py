"""docs/metrics.md is the code's: every family /metrics serves, as the generator renders
it from a gateway with every feature on and the --workers supervisor."""

from __future__ import annotations

from pathlib import Path

from gateway.tools.metrics_reference import reference

PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_the_metrics_reference_is_current() -> None:
    assert PAGE.read_text() == reference(), (
        "regenerate: .venv/bin/python -m gateway.tools.metrics_reference > docs/metrics.md")


def test_it_names_the_families_of_every_feature() -> None:
    text = PAGE.read_text()
    for family in ("nnrp_gateway_requests_total", "nnrp_gateway_resume_resumed_total",
                   "nnrp_gateway_fleet_forwards_total", "nnrp_gateway_workers_running",
                   "nnrp_gateway_auth_failures_total"):
        assert f"`{family}`" in text, family
