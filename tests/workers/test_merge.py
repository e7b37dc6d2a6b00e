"""The workers' /metrics merged into the pod's, by ``COMBINE``'s rules."""

from __future__ import annotations

from typing import cast

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.observe import GatewayMetrics
from gateway.server import ServerStats
from gateway.upstream import LoadMonitor, LoadPolicy, LoadSample, UpstreamConfig, VllmClient
from gateway.upstream._client import PoolFigures
from gateway.workers import COMBINE
from gateway.workers._merge import merged_exposition


def worker_text(requests: int, ready: bool, inflight: int, seconds: list[float],
                created: float) -> str:
    registry = CollectorRegistry()
    counter = Counter("nnrp_gateway_requests", "Operations.", ["outcome"], registry=registry)
    counter.labels("ok").inc(requests)
    counter.labels("error").inc(1)
    Gauge("nnrp_gateway_upstream_ready", "Ready.", registry=registry).set(1 if ready else 0)
    Gauge("nnrp_gateway_ready", "Ready.", registry=registry).set(1 if ready else 0)
    Gauge("nnrp_gateway_inflight_operations", "In flight.", registry=registry).set(inflight)
    Gauge("nnrp_gateway_build_info", "Build.", ["version"],
          registry=registry).labels("1.2.3").set(1)
    histogram = Histogram("nnrp_gateway_first_event_seconds", "First event.",
                          buckets=(0.01, 0.1), registry=registry)
    for value in seconds:
        histogram.observe(value)
    text = generate_latest(registry).decode()
    # Each process stamps its own creation time; make them differ.
    return "\n".join(
        f"{line.rsplit(' ', 1)[0]} {created}" if "_created" in line and not line.startswith("#")
        else line for line in text.splitlines()) + "\n"


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples}


def test_series_combine_by_the_table() -> None:
    merged = samples(merged_exposition([
        worker_text(3, True, 2, [0.005, 0.05], created=100.0),
        worker_text(4, False, 1, [0.5], created=50.0),
    ]))
    assert merged[("nnrp_gateway_requests_total", (("outcome", "ok"),))] == 7
    assert merged[("nnrp_gateway_requests_total", (("outcome", "error"),))] == 2
    # A creation time is not passed on, as a worker's own /metrics has none.
    assert not [name for name, _ in merged if name.endswith("_created")]
    assert merged[("nnrp_gateway_inflight_operations", ())] == 3
    assert merged[("nnrp_gateway_upstream_ready", ())] == 0  # one worker does not see vLLM
    assert merged[("nnrp_gateway_ready", ())] == 0  # so that worker is not ready
    assert merged[("nnrp_gateway_build_info", (("version", "1.2.3"),))] == 1
    bucket = "nnrp_gateway_first_event_seconds_bucket"
    assert [merged[(bucket, (("le", le),))] for le in ("0.01", "0.1", "+Inf")] == [1, 2, 3]
    assert merged[("nnrp_gateway_first_event_seconds_count", ())] == 3
    assert merged[("nnrp_gateway_first_event_seconds_sum", ())] == pytest.approx(0.555)


def test_the_upstream_pool_is_the_sum_of_the_workers() -> None:
    """Each worker has its own slots: the pod's pool is the workers' together."""

    class Pool:  # a worker's client, as far as the pool's collector reads it
        def __init__(self, figures: PoolFigures) -> None:
            self.figures = figures

        def pool_figures(self) -> PoolFigures:
            return self.figures

    texts = []
    for figures in (PoolFigures(size=8, in_use=3, idle=5, waiting=0, wait_timeouts=1,
                                given_way=2),
                    PoolFigures(size=8, in_use=8, idle=0, waiting=2, wait_timeouts=5)):
        metrics = GatewayMetrics()
        metrics.attach_pool(cast(VllmClient, Pool(figures)))
        texts.append(generate_latest(metrics.registry).decode())
    merged = samples(merged_exposition(texts))
    assert {name.removeprefix("nnrp_gateway_upstream_pool_"): value
            for (name, _), value in merged.items()
            if name.startswith("nnrp_gateway_upstream_pool_")} == {
        "size": 16, "in_use": 11, "idle": 5, "waiting": 2, "wait_timeouts_total": 6,
        "given_way_total": 2}


def test_the_table_names_families_that_exist() -> None:
    # A renamed metric must not silently fall back to "sum".
    metrics = GatewayMetrics()
    metrics.attach(ServerStats(), lambda: True)
    metrics.attach_readiness(list)
    monitor = LoadMonitor(VllmClient(UpstreamConfig("http://127.0.0.1:9")), LoadPolicy(),
                          clock=lambda: 5.0)
    monitor.sample = LoadSample(4.0, 3, 1, 0.5)
    metrics.attach_load(monitor)
    exported = {family.name for family in metrics.registry.collect()}
    assert set(COMBINE) <= exported


def test_nothing_merged_is_nothing_but_the_supervisors_own() -> None:
    own = CollectorRegistry()
    Gauge("nnrp_gateway_workers_running", "Running.", registry=own).set(2)
    assert samples(merged_exposition([], own)) == {("nnrp_gateway_workers_running", ()): 2}
