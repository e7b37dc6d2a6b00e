"""Trace spans alone: the sans-IO builder (record -> SpanData), vLLM's traceparent with a
gateway span, and the OpenTelemetry adapter's sampler, queue and failure log with a
recording exporter in place of the network."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import structlog
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

from gateway.errors import ConfigError
from gateway.nnrp import CancelSource, TraceInfo
from gateway.observe import build_record, build_spans
from gateway.observe._otel import ExportSettings, FailureLog, OtelTracer, SpanQueue
from gateway.pipeline import traceparent, upstream_traceparent
from gateway.profile import EndCause
from gateway.server import CancelInfo, GatewaySpan, Operation
from tests.support.ports import RecordingPort

TRACE = TraceInfo(0xAB, 0xCD, 0, 1, 12)
SPAN = GatewaySpan(trace_id=0xAB, span_id=0xEF, parent_span_id=0xCD, sampled=True)


def ended(cause: EndCause, *, trace: TraceInfo | None = TRACE,
          span: GatewaySpan | None = SPAN, **notes: Any) -> Operation:
    op = Operation(RecordingPort(), connection_id=3, transport="ipc", session_id=2,
                   operation_id=9, frame_id=4, typed_body=None, body_error=None,
                   header_trace_id=0, trace=trace, deadline_unix_ms=None,
                   deadline_drop_reason=0)
    op.notes.span = span
    for key, value in notes.items():
        setattr(op.notes, key, value)
    op.received_unix_ns = 1_000_000_000
    op.started_at = op.received_at + 0.001
    op.end_cause = cause
    op.terminal_at = op.received_at + 0.010
    return op


def spans_of(op: Operation) -> tuple[Any, ...]:
    return build_spans(build_record(op), upstream_span_id=0x99, server_address="127.0.0.1",
                       server_port=8000)


async def test_a_completed_stream_is_an_operation_span_and_its_upstream_child() -> None:
    op = ended(EndCause.COMPLETED, model="tiny", operation="chat.completions.create",
               request_id="r1", stream=True, usage={"prompt_tokens": 3, "completion_tokens": 5},
               upstream_status=200, response_model="tiny-1", response_id="chatcmpl-1",
               finish_reasons=("stop",))
    op.notes.upstream_started, op.notes.upstream_closed = (op.received_at + 0.002,
                                                           op.received_at + 0.008)
    op.first_event_at, op.events_sent = op.received_at + 0.004, 3
    operation, upstream = spans_of(op)
    assert (operation.name, operation.kind) == ("chat tiny", "server")
    assert (operation.trace_id, operation.span_id, operation.parent_span_id) == (0xAB, 0xEF, 0xCD)
    assert operation.remote_parent
    assert (operation.start_ns, operation.end_ns) == (1_000_000_000, 1_010_000_000)
    assert operation.attributes == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "tiny", "gen_ai.response.model": "tiny-1",
        "gen_ai.response.id": "chatcmpl-1", "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 3, "gen_ai.usage.output_tokens": 5,
        "nnrp.transport": "ipc", "nnrp.connection.id": 3, "nnrp.session.id": 2,
        "nnrp.operation.id": 9, "nnrp.operation.name": "chat.completions.create",
        "nnrp.request_id": "r1", "nnrp.stream": True, "nnrp.outcome": "ok",
        "nnrp.end_cause": "completed", "nnrp.events": 3, "nnrp.event_bytes": 0,
        "nnrp.trace.attribute_bytes": 12, "server.address": "127.0.0.1", "server.port": 8000}
    assert [(e.name, e.at_ns) for e in operation.events] == [("nnrp.first_token", 1_004_000_000)]
    assert operation.error is None
    assert (upstream.name, upstream.kind, upstream.span_id, upstream.parent_span_id) == (
        "POST", "client", 0x99, 0xEF)
    assert not upstream.remote_parent
    assert (upstream.start_ns, upstream.end_ns) == (1_002_000_000, 1_008_000_000)
    assert upstream.attributes["http.response.status_code"] == 200


async def test_an_unsampled_or_undecided_span_builds_nothing() -> None:
    assert spans_of(ended(EndCause.COMPLETED, span=attrs.evolve(SPAN, sampled=False))) == ()
    assert spans_of(ended(EndCause.COMPLETED, span=None)) == ()


@pytest.mark.parametrize(("cause", "error", "event"), [
    (EndCause.BACKEND_ERROR, "backend_error", None),
    (EndCause.INVALID_BODY, None, None),  # the client's mistake: not the server's error
    (EndCause.DEADLINE_EXPIRED, "deadline", "nnrp.deadline"),
    (EndCause.EXPIRED_AT, "deadline", "nnrp.deadline"),
    (EndCause.SUPERSEDED, None, "nnrp.supersede"),
    (EndCause.SHUTDOWN, None, None),
])
async def test_the_status_and_end_events_follow_the_outcome(cause: EndCause, error: str | None,
                                                      event: str | None) -> None:
    (operation,) = spans_of(ended(cause))
    assert operation.error == error
    assert [e.name for e in operation.events] == ([event] if event else [])
    if event:
        assert operation.events[0].at_ns == operation.end_ns


async def test_a_cancel_and_a_resume_are_events_at_their_time() -> None:
    op = ended(EndCause.PEER_CANCELLED)
    op.cancel_info = CancelInfo(CancelSource.ABORT, 4, b"SECRET words", at=op.received_at + 0.006)
    op.reattached, op.reattached_at = 1, [op.received_at + 0.003]
    (operation,) = spans_of(op)
    assert [(e.name, e.at_ns, dict(e.attributes)) for e in operation.events] == [
        ("nnrp.resume", 1_003_000_000, {}),
        ("nnrp.cancel", 1_006_000_000, {"nnrp.cancel.source": "abort",
                                       "nnrp.cancel.reason": 4})]
    assert operation.attributes["nnrp.resumed"] == 1
    assert "SECRET" not in repr(operation)  # the cancel's diagnostic is the client's words


async def test_the_record_names_the_gateway_span_for_the_log_line() -> None:
    record = build_record(ended(EndCause.COMPLETED))
    assert (record.trace_id, record.span_id, record.parent_span_id) == (
        f"{0xAB:032x}", f"{0xEF:016x}", f"{0xCD:016x}")
    line = record.as_dict()
    assert "span" not in line and "received_unix_ns" not in line  # the span's alone
    unsampled = build_record(ended(EndCause.COMPLETED, span=attrs.evolve(SPAN, sampled=False)))
    assert (unsampled.span_id, unsampled.parent_span_id) == (f"{0xCD:016x}", None)


async def test_vllm_traceparent_is_todays_with_a_client_context_else_the_gateway_span() -> None:
    assert upstream_traceparent(TRACE, SPAN) == traceparent(TRACE)
    unsampled_client = TraceInfo(0xAB, 0xCD, 0, 0, 0)
    assert upstream_traceparent(unsampled_client, SPAN) == traceparent(unsampled_client)
    root = GatewaySpan(trace_id=0x0123456789ABCDEF0123456789ABCDEF, span_id=0x42,
                       parent_span_id=None, sampled=True)
    assert upstream_traceparent(None, root) == (
        "00-0123456789abcdef0123456789abcdef-0000000000000042-01")
    assert upstream_traceparent(None, attrs.evolve(root, sampled=False)) is None
    assert upstream_traceparent(None, None) is None


# --------------------------------------------------------------------------- the adapter


class RecordingExporter(SpanExporter):
    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS) -> None:
        self.result = result
        self.batches: list[list[str]] = []
        self.shut = False
        self.gate: threading.Event | None = None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.gate is not None:
            self.gate.wait(10)
        self.batches.append([span.name for span in spans])
        return self.result

    def shutdown(self) -> None:
        self.shut = True


def tracer(exporter: SpanExporter, drops: list[tuple[str, int]], *, sampler: Any = None,
           **queue: Any) -> OtelTracer:
    provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
    return OtelTracer(exporter=exporter, provider=provider, vllm_url="http://127.0.0.1:8000",
                      dropped=lambda reason, n: drops.append((reason, n)), exported=lambda n: None,
                      **{"max_queue": 8, "batch_size": 4, "delay": 0.01, **queue})


async def test_decide_makes_the_client_span_the_parent_and_asks_the_sampler() -> None:
    drops: list[tuple[str, int]] = []
    default = tracer(RecordingExporter(), drops)
    child = default.decide(TRACE)
    assert (child.trace_id, child.parent_span_id, child.sampled) == (0xAB, 0xCD, True)
    assert not default.decide(TraceInfo(0xAB, 0xCD, 0, 0, 0)).sampled  # the client's bit
    root = default.decide(None)
    assert root.parent_span_id is None and root.sampled and root.trace_id > 0
    assert root.span_id != default.decide(None).span_id
    off = tracer(RecordingExporter(), drops, sampler=ParentBased(ALWAYS_OFF))
    assert not off.decide(None).sampled and off.decide(TRACE).sampled
    never = tracer(RecordingExporter(), drops, sampler=TraceIdRatioBased(0.0))
    assert not never.decide(None).sampled


async def test_export_hands_readable_spans_to_the_exporter_in_batches() -> None:
    exporter, drops = RecordingExporter(), []
    traces = tracer(exporter, drops)
    traces.start()
    op = ended(EndCause.COMPLETED, model="tiny", operation="chat.completions.create")
    traces.export(build_record(op))
    traces.close(5)
    assert exporter.batches == [["chat tiny"]] and exporter.shut
    assert drops == []


async def test_a_full_queue_drops_and_counts_and_shutdown_counts_what_is_left() -> None:
    exporter, drops = RecordingExporter(), []
    exporter.gate = threading.Event()
    queue = SpanQueue(exporter, max_queue=3, batch_size=2, delay=10.0,
                      dropped=lambda reason, n: drops.append((reason, n)),
                      exported=lambda n: None, failures=FailureLog("x"))
    spans = [ReadableSpan(name=f"s{n}") for n in range(5)]
    queue.put(spans[:2])  # a whole batch: the thread would wake (not started yet)
    queue.put(spans[2:])  # one fits, two do not
    assert drops == [("queue_full", 2)]
    assert len(queue) == 3
    queue.close(0.0)  # never started: nothing was exported
    assert drops == [("queue_full", 2), ("shutdown", 3)]
    queue.put(spans[:1])
    assert drops[-1] == ("shutdown", 1)  # after close, nothing is taken


async def test_failed_batches_are_dropped_and_logged_at_most_once_a_minute() -> None:
    now = [0.0]
    failures = FailureLog("http://collector:4318", clock=lambda: now[0])
    with structlog.testing.capture_logs() as logs:
        failures.failed(2)
        failures.failed(3)
        now[0] = 59.0
        failures.failed(1)
        now[0] = 60.5
        failures.failed(4)
    lines = [line for line in logs if line["event"] == "trace export failed"]
    assert [(line["failed_batches"], line["dropped_spans"]) for line in lines] == [(1, 2), (3, 8)]
    assert lines[0]["endpoint"] == "http://collector:4318"
    exporter, drops = RecordingExporter(SpanExportResult.FAILURE), []
    traces = tracer(exporter, drops)
    traces.start()
    traces.export(build_record(ended(EndCause.COMPLETED)))
    traces.close(5)
    assert drops == [("export_failed", 1)]


async def test_the_environment_is_opentelemetrys() -> None:
    settings = ExportSettings.from_environment({"OTEL_BSP_MAX_QUEUE_SIZE": "10",
                                                "OTEL_BSP_SCHEDULE_DELAY": "250"})
    assert (settings.protocol, settings.max_queue, settings.batch_size, settings.delay) == (
        "http/protobuf", 10, 512, 0.25)
    assert settings.endpoint == "http://localhost:4318"
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"):
        ExportSettings.from_environment({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(ConfigError, match="OTEL_BSP_MAX_QUEUE_SIZE"):
        ExportSettings.from_environment({"OTEL_BSP_MAX_QUEUE_SIZE": "lots"})
