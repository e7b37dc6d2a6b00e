"""The kept-object memory measurement runs and gives back what it reserved (its figure
lives in docs/media.md, not in an assertion)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.tools.bench.object_rss import measure, measure_cache


@pytest.mark.parametrize("how", [measure, measure_cache])
def test_the_measurement_reports_and_gives_back(
        how: Callable[[int, int], dict[str, float]]) -> None:
    figures = how(2, 1 << 20)
    assert figures["kept_mib"] == 2.0
    # RSS itself is the benchmark's figure, not an assertion: a small run may reuse pages
    # the process already holds and grow it by nothing.
    assert set(figures) == {"kept_mib", "rss_grown_mib", "rss_per_kept_byte",
                            "rss_left_after_clear_mib", "pool_used_after_clear"}
    assert figures["pool_used_after_clear"] == 0
