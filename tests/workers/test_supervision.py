"""Supervisor rules that need no process: exit statuses, and the pod's metrics staying
monotonic when a worker comes and goes. (The workers' shared listener groups are
tests/transport/test_listeners.py.)"""

from __future__ import annotations

import signal

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.workers import PodMetrics
from gateway.workers._supervisor import exit_status


def test_exit_statuses_follow_the_shells_convention() -> None:
    assert exit_status(3) == 3
    assert exit_status(-signal.SIGKILL) == 128 + 9
    assert exit_status(-signal.SIGTERM) == 143
    assert exit_status(0) == 1  # exited before it served: still a failure


def worker_text(requests: int, held: int) -> str:
    registry = CollectorRegistry()
    Counter("nnrp_gateway_requests", "Ops.", registry=registry).inc(requests)
    Gauge("nnrp_gateway_inflight_operations", "In flight.", registry=registry).set(held)
    return generate_latest(registry).decode()


def value(text: bytes, name: str) -> float:
    return next(s.value for f in text_string_to_metric_families(text.decode())
                for s in f.samples if s.name == name)


def test_the_pods_counters_never_step_back() -> None:
    pod = PodMetrics()
    pod.update(0, worker_text(1000, 3))
    pod.update(1, worker_text(1000, 2))
    assert value(pod.exposition(), "nnrp_gateway_requests_total") == 2000
    # Worker 0 misses a scrape: its last values still count.
    pod.update(1, worker_text(1010, 2))
    assert value(pod.exposition(), "nnrp_gateway_requests_total") == 2010
    # Worker 0 dies and is restarted from zero: its counters stay, its gauges go.
    pod.retire(0)
    pod.update(0, worker_text(5, 1))
    text = pod.exposition()
    assert value(text, "nnrp_gateway_requests_total") == 2015
    assert value(text, "nnrp_gateway_inflight_operations") == 3  # 2 + 1, not 3 + 2 + 1
    pod.retire(1)
    pod.retire(1)  # twice: nothing more to retire
    assert value(pod.exposition(), "nnrp_gateway_requests_total") == 2015

