"""The observation record, the metrics it feeds, and the admin listener, each alone."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import attrs
import httpx
import pytest
import structlog
import trio

from gateway.nnrp import CancelSource, TraceInfo
from gateway.observe import (
    AdminRoutes,
    AdminServer,
    GatewayMetrics,
    RecordNotes,
    RouteUnavailable,
    build_record,
    configure_logging,
    metrics_route,
)
from gateway.profile import EndCause, Outcome
from gateway.server import CancelInfo, Operation, ServerStats
from tests.support.ports import RecordingPort
from tests.support.stack import metric_samples


def ended(cause: EndCause, **notes: Any) -> Operation:
    op = Operation(RecordingPort(), connection_id=3, transport="ipc", session_id=2, operation_id=9,
                   frame_id=4, typed_body=None, body_error=None, header_trace_id=0,
                   trace=TraceInfo(0xAB, 0xCD, 0, 1, 12), deadline_unix_ms=None,
                   deadline_drop_reason=0, notes=RecordNotes)
    for key, value in notes.items():
        setattr(op.notes, key, value)
    op.notes.started_at = op.notes.received_at + 0.001
    op.end_cause = cause
    op.terminal_at = op.notes.received_at + 0.010
    return op


async def test_a_completed_operation_records_ids_timings_and_usage() -> None:
    op = ended(EndCause.COMPLETED, model="tiny", request_id="r1", stream=True,
               usage={"prompt_tokens": 3, "completion_tokens": 5}, upstream_status=200,
               upstream_started=0.0, upstream_closed=0.5)
    record = build_record(op)
    assert (record.outcome, record.error_code, record.transport) == (Outcome.OK, None, "ipc")
    assert (record.session_id, record.operation_id, record.frame_id) == (2, 9, 4)
    assert record.duration_ms == pytest.approx(10.0)
    assert record.upstream_ms == 500.0
    assert not record.upstream_aborted
    # OpenTelemetry's format (logs join traces): the NNRP id zero-extended to 128 bits.
    assert (record.trace_id, record.span_id, record.trace_attribute_bytes) == (
        f"{0xAB:032x}", "00000000000000cd", 12)
    assert record.parent_span_id is None
    assert record.log_level == "info"
    line = record.as_dict()
    assert "end_cause" not in line and "cancel_source" not in line  # Nones and the key
    assert line["usage"] == {"prompt_tokens": 3, "completion_tokens": 5}


async def test_an_error_is_named_and_leveled_by_the_outcome_table() -> None:
    record = build_record(ended(EndCause.BACKEND_AUTH_FAILED, upstream_status=401))
    assert (record.outcome, record.error_code, record.log_level) == (
        Outcome.UPSTREAM_ERROR, "backend_auth_failed", "error")
    assert record.upstream_error


async def test_a_cancel_after_dispatch_records_the_upstream_abort() -> None:
    op = ended(EndCause.PEER_CANCELLED, upstream_started=1.0, upstream_closed=2.5)
    op.cancel_info = CancelInfo(CancelSource.CANCEL, 1, b"", at=2.0)
    record = build_record(op)
    assert (record.outcome, record.error_code) == (Outcome.CANCELLED, None)
    assert record.upstream_aborted
    assert record.upstream_abort_ms == 500.0
    assert (record.cancel_source, record.cancel_reason) == ("cancel", 1)


async def test_a_drained_operation_names_its_end_cause() -> None:
    record = build_record(ended(EndCause.SHUTDOWN, upstream_started=1.0))
    assert (record.outcome, record.cancel_source, record.upstream_aborted) == (
        Outcome.SHUTDOWN, "shutdown", True)


async def test_the_record_can_be_built_for_the_terminal_about_to_go_out() -> None:
    op = ended(EndCause.COMPLETED)
    op.end_cause = None  # still running: the diagnostics event is built before the terminal
    assert build_record(op, EndCause.REQUEST_TIMEOUT).error_code == "request_timeout"


async def test_metrics_from_records_with_bounded_labels() -> None:
    metrics = GatewayMetrics()
    metrics.known_models = frozenset({"tiny"})
    metrics.observe(build_record(ended(EndCause.COMPLETED, model="tiny",
                                       usage={"prompt_tokens": 3, "completion_tokens": 5})))
    metrics.observe(build_record(ended(EndCause.BACKEND_ERROR, model="someone-elses")))
    metrics.observe(build_record(ended(EndCause.INVALID_BODY)))
    got = metric_samples(metrics.registry)
    prefix = "nnrp_gateway"
    assert got[(f"{prefix}_requests_total",
                (("model_name", "tiny"), ("outcome", "ok"), ("transport", "ipc")))] == 1
    # An unknown model name is "other": label values never come from clients.
    assert got[(f"{prefix}_requests_total",
                (("model_name", "other"), ("outcome", "upstream_error"),
                 ("transport", "ipc")))] == 1
    assert got[(f"{prefix}_requests_total",
                (("model_name", "none"), ("outcome", "invalid_request"),
                 ("transport", "ipc")))] == 1
    # By model too, so a model's error ratio can leave out the client's mistakes.
    assert got[(f"{prefix}_upstream_errors_total",
                (("kind", "backend_error"), ("model_name", "other")))] == 1
    assert not any(name == f"{prefix}_upstream_errors_total" and ("kind", "invalid_body")
                   in labels for name, labels in got)
    assert got[(f"{prefix}_tokens_total", (("kind", "completion"), ("model_name", "tiny")))] == 5


def test_connection_counters_are_exported_at_scrape_time() -> None:
    metrics = GatewayMetrics()
    stats = ServerStats()
    ready = [False]
    metrics.attach(stats, lambda: ready[0])
    stats.connections_active, stats.inflight, stats.bytes_out = 2, 5, 1234
    ready[0] = True
    got = metric_samples(metrics.registry)
    assert got[("nnrp_gateway_connections_active", ())] == 2
    assert got[("nnrp_gateway_inflight_operations", ())] == 5
    assert got[("nnrp_gateway_bytes_total", (("direction", "out"),))] == 1234
    assert got[("nnrp_gateway_upstream_ready", ())] == 1


def test_readiness_is_a_gauge_of_what_readyz_answers() -> None:
    metrics = GatewayMetrics()
    reasons = ["vLLM has not answered the probe yet"]
    metrics.attach_readiness(lambda: reasons)
    assert metric_samples(metrics.registry)[("nnrp_gateway_ready", ())] == 0
    reasons.clear()
    assert metric_samples(metrics.registry)[("nnrp_gateway_ready", ())] == 1


def test_quic_listener_counters_are_exported_summed_over_listeners() -> None:
    from gateway.observe._metrics import QUIC_COUNTERS
    from gateway.transport.quic import QuicStats

    metrics = GatewayMetrics()
    listeners: list[Any] = []
    metrics.attach_quic(lambda: listeners)
    assert not any(name.startswith("nnrp_gateway_quic") for name, _ in metric_samples(
        metrics.registry))  # no quic:// listener, no series
    first = QuicStats(datagrams_in=10, datagrams_out=7, garbage=3, retries=2,
                      refused_initials=1, handshake_timeouts=1, refused_streams=4,
                      connections_total=5)
    second = QuicStats(datagrams_in=5, garbage=1, invalid_tokens=6, send_errors=2,
                       version_negotiations=1, connections_total=1)
    listeners += [SimpleNamespace(stats=first, connections_open=2, handshakes_in_progress=1),
                  SimpleNamespace(stats=second, connections_open=1, handshakes_in_progress=0)]
    got = metric_samples(metrics.registry)
    prefix = "nnrp_gateway_quic"
    assert got[(f"{prefix}_datagrams_total", (("direction", "in"),))] == 15
    assert got[(f"{prefix}_datagrams_total", (("direction", "out"),))] == 7
    assert got[(f"{prefix}_dropped_datagrams_total", (("reason", "garbage"),))] == 4
    assert got[(f"{prefix}_dropped_datagrams_total", (("reason", "invalid_token"),))] == 6
    assert got[(f"{prefix}_dropped_datagrams_total", (("reason", "refused_initial"),))] == 1
    assert got[(f"{prefix}_retries_total", ())] == 2
    assert got[(f"{prefix}_version_negotiations_total", ())] == 1
    assert got[(f"{prefix}_handshake_timeouts_total", ())] == 1
    assert got[(f"{prefix}_refused_streams_total", ())] == 4
    assert got[(f"{prefix}_send_errors_total", ())] == 2
    assert got[(f"{prefix}_connections_total", ())] == 6
    assert got[(f"{prefix}_connections_open", ())] == 3
    assert got[(f"{prefix}_handshakes_in_progress", ())] == 1
    # Every counter the listener keeps is exported (a new one must be declared).
    assert set(QUIC_COUNTERS) == {field.name for field in attrs.fields(QuicStats)}
    labels = {label for (name, pairs) in got if name.startswith(prefix) for label in pairs}
    assert labels == {("direction", "in"), ("direction", "out"), ("reason", "garbage"),
                      ("reason", "invalid_token"), ("reason", "refused_initial")}


async def test_admin_routes(nursery: trio.Nursery) -> None:
    reasons: list[str] = ["vLLM has not been probed yet"]
    metrics = GatewayMetrics()
    admin = AdminServer(AdminRoutes(lambda: reasons, lambda: {"profile": "openai-compatible"},
                                    metrics_route(metrics.registry)))
    port = await nursery.start(admin.serve, "127.0.0.1", 0)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        not_ready = await http.get("/readyz")
        assert (not_ready.status_code, not_ready.json()["reasons"]) == (503, reasons)
        reasons.clear()
        assert (await http.get("/readyz?verbose=1")).status_code == 200
        assert "nnrp_gateway_build_info" in (await http.get("/metrics")).text
        assert (await http.get("/capabilities")).json()["profile"] == "openai-compatible"
        assert (await http.get("/nope")).status_code == 404
        assert (await http.post("/healthz")).status_code == 405
        head = await http.head("/healthz")
        assert (head.status_code, head.content) == (200, b"")


async def test_admin_without_metrics_and_with_a_garbage_request(nursery: trio.Nursery) -> None:
    admin = AdminServer(AdminRoutes(lambda: [], dict))
    port = await nursery.start(admin.serve, "127.0.0.1", 0)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as http:
        assert (await http.get("/metrics")).status_code == 404
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"\x00\x01 not http\r\n\r\n")
    with trio.fail_after(2):
        assert await stream.receive_some(1024) == b""  # closed, nothing crashed
    await stream.aclose()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as http:
        assert (await http.get("/healthz")).status_code == 200


async def test_a_failing_route_is_an_answer_not_the_end_of_the_listener(
        nursery: trio.Nursery) -> None:
    def broken() -> list[str]:
        raise KeyError("reasons")

    async def unavailable() -> dict[str, Any]:
        raise RouteUnavailable("no worker is serving")

    admin = AdminServer(AdminRoutes(broken, unavailable))
    port = await nursery.start(admin.serve, "127.0.0.1", 0)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as http:
        assert (await http.get("/readyz")).status_code == 500
        answer = await http.get("/capabilities")
        assert (answer.status_code, answer.json()) == (503, {"error": "no worker is serving"})
        assert (await http.get("/healthz")).status_code == 200  # still serving


def test_every_resume_counter_is_exported() -> None:
    from gateway.nnrp import ResumeStats
    from gateway.observe._metrics import RESUME_COUNTERS, RESUME_LABELLED
    from gateway.server import SessionRegistry

    assert set(RESUME_COUNTERS) | RESUME_LABELLED == {
        field.name for field in attrs.fields(ResumeStats)}
    metrics = GatewayMetrics()
    registry = SessionRegistry()
    registry.stats.resumed_total = 3
    registry.stats.not_granted["client_cap"] = 2
    registry.budget.held = 1234
    metrics.attach_resume(registry)
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    assert "nnrp_gateway_resume_resumed_total 3.0" in text
    assert "nnrp_gateway_resume_held_bytes 1234.0" in text
    assert 'nnrp_gateway_resume_not_granted_total{reason="client_cap"} 2.0' in text
    assert 'nnrp_gateway_resume_sessions{state="detached"} 0.0' in text


def test_a_logged_traceback_names_frames_but_carries_no_locals(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A frame's locals hold resume tokens, credentials and prompts: a traceback in the
    log says where it failed, never what the frame held."""
    configure_logging(json_lines=True)
    token = "resume-token-" + "s3cret" * 4
    try:
        raise RuntimeError(f"failed with {len(token)} bytes")
    except RuntimeError:
        structlog.get_logger().exception("failed")
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (trace,) = line["exception"]
    assert trace["exc_type"] == "RuntimeError"
    assert trace["frames"][0]["name"] == "test_a_logged_traceback_names_frames_but_carries_no_locals"
    assert "s3cret" not in json.dumps(line)
