"""The kept-object memory measurement runs and gives back what it reserved (its figure
lives in docs/media.md, not in an assertion)."""

from __future__ import annotations

from gateway.tools.bench.object_rss import measure


def test_the_measurement_reports_and_gives_back() -> None:
    figures = measure(2, 1 << 20)
    assert figures["kept_mib"] == 2.0
    assert figures["rss_grown_mib"] > 0
    assert figures["pool_used_after_clear"] == 0
