"""Supervisor rules that need no process: exit statuses, listener groups, and the pod's
metrics staying monotonic when a worker comes and goes."""

from __future__ import annotations

import errno
import signal
import socket

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.transport import ListenError, bind_shared
from gateway.workers import PodMetrics
from gateway.workers._supervisor import exit_status


def test_exit_statuses_follow_the_shells_convention() -> None:
    assert exit_status(3) == 3
    assert exit_status(-signal.SIGKILL) == 128 + 9
    assert exit_status(-signal.SIGTERM) == 143
    assert exit_status(0) == 1  # exited before it served: still a failure


async def test_a_port_in_use_is_an_error_with_workers_too() -> None:
    group = await bind_shared("tcp://127.0.0.1:0", 2)
    port = group.per_worker[0][0].getsockname()[1]
    try:
        # Each of these would join the group silently with SO_REUSEPORT alone.
        for clash in (f"tcp://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/nnrp"):
            with pytest.raises(ListenError, match="in use") as raised:
                await bind_shared(clash, 2)
            assert str(raised.value).startswith(f"cannot listen on {clash}: ")
            assert isinstance(raised.value.__cause__, OSError)
            assert raised.value.__cause__.errno == errno.EADDRINUSE
    finally:
        group.close()
    # Closed, the port is free again (TIME_WAIT or not).
    again = await bind_shared(f"tcp://127.0.0.1:{port}", 2)
    again.close()


async def test_each_worker_has_its_own_socket_in_one_group_and_a_released_one_renews(
        ) -> None:
    group = await bind_shared("tcp://127.0.0.1:0", 3)
    try:
        ports = {sockets[0].getsockname()[1] for sockets in group.per_worker}
        assert len(ports) == 1 and len({id(s[0]) for s in group.per_worker}) == 3
        old = group.per_worker[1][0]
        group.release(1)
        assert old.fileno() == -1
        group.renew(1)
        assert group.per_worker[1][0].getsockname()[1] in ports
        # The renewed socket is in the group: a client connects and it can accept.
        with socket.create_connection(("127.0.0.1", ports.pop()), timeout=2):
            pass
    finally:
        group.close()
    quic = await bind_shared("quic://127.0.0.1:0", 2)
    try:
        kept = quic.per_worker[0][0]
        quic.release(0)  # QUIC sockets stay: the hash must not move established flows
        assert kept.fileno() != -1
        buffer = kept.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        assert buffer > 256 * 1024  # the listener's own receive buffer, as one process
    finally:
        quic.close()
    unix_group = await bind_shared("unix:///tmp/nnrp-test-shared.sock", 2)
    try:
        assert unix_group.per_worker[0] is unix_group.per_worker[1]
    finally:
        unix_group.close()


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

