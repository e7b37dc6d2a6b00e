"""Trace spans alone: the sans-IO builder (record -> SpanData), vLLM's traceparent with a
gateway span, and the OpenTelemetry adapter's sampler, queue and failure log with a
recording exporter in place of the network."""

from __future__ import annotations

import collections
import json
import logging
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import structlog
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

from gateway.errors import ConfigError
from gateway.nnrp import CancelSource, TraceInfo
from gateway.observe import GatewaySpan, RecordNotes, Upstream, build_record, build_spans
from gateway.observe._otel import (
    COLLECTOR_HINT,
    EXPORTER_LOGGERS,
    KNOWN_SAMPLERS,
    ExportSettings,
    FailureLog,
    OtelTracer,
    SpanQueue,
    check_environment,
    check_headers,
    check_sampler,
    collector_address,
    shown_url,
    traces_exporter,
    upstream_of,
)
from gateway.observe._spans import MAX_ATTRIBUTE_CHARS
from gateway.observe._tracing import open_tracer, tracing_disabled
from gateway.pipeline import traceparent, upstream_traceparent
from gateway.profile import EndCause
from gateway.server import CancelInfo, Operation
from tests.support.ports import RecordingPort
from tests.support.processes import free_port

TRACE = TraceInfo(0xAB, 0xCD, 0, 1, 12)
SPAN = GatewaySpan(trace_id=0xAB, span_id=0xEF, parent_span_id=0xCD, sampled=True,
                   upstream_span_id=0x99)
UPSTREAM = Upstream("127.0.0.1", 8000, "http://127.0.0.1:8000")


def ended(cause: EndCause, *, trace: TraceInfo | None = TRACE,
          span: GatewaySpan | None = SPAN, **notes: Any) -> Operation:
    op = Operation(RecordingPort(), connection_id=3, transport="ipc", session_id=2,
                   operation_id=9, frame_id=4, typed_body=None, body_error=None,
                   header_trace_id=0, trace=trace, deadline_unix_ms=None,
                   deadline_drop_reason=0, notes=RecordNotes)
    op.notes.span = span
    for key, value in notes.items():
        setattr(op.notes, key, value)
    op.notes.received_unix_ns = 1_000_000_000
    op.notes.started_at = op.notes.received_at + 0.001
    op.end_cause = cause
    op.terminal_at = op.notes.received_at + 0.010
    return op


def spans_of(op: Operation, known_models: frozenset[str] = frozenset({"tiny"})
             ) -> tuple[Any, ...]:
    return build_spans(build_record(op), upstream=UPSTREAM, known_models=known_models)


async def test_a_completed_stream_is_an_operation_span_and_its_upstream_child() -> None:
    op = ended(EndCause.COMPLETED, model="tiny", operation="chat.completions.create",
               request_id="r1", stream=True, usage={"prompt_tokens": 3, "completion_tokens": 5},
               upstream_status=200, response_model="tiny-1", response_id="chatcmpl-1",
               finish_reasons=("stop",))
    op.notes.upstream_started, op.notes.upstream_closed = (op.notes.received_at + 0.002,
                                                           op.notes.received_at + 0.008)
    op.notes.first_event_at, op.events_sent = op.notes.received_at + 0.004, 3
    operation, upstream = spans_of(op)
    assert (operation.name, operation.kind) == ("chat.completions.create tiny", "server")
    assert (operation.trace_id, operation.span_id, operation.parent_span_id) == (0xAB, 0xEF, 0xCD)
    assert operation.remote_parent
    assert (operation.start_ns, operation.end_ns) == (1_000_000_000, 1_010_000_000)
    # The SERVER span is the protocol's; server.* there would name the gateway itself.
    assert operation.attributes == {
        "nnrp.transport": "ipc", "nnrp.connection.id": 3, "nnrp.session.id": 2,
        "nnrp.operation.id": 9, "nnrp.operation.name": "chat.completions.create",
        "nnrp.request.model": "tiny",
        "nnrp.request_id": "r1", "nnrp.stream": True, "nnrp.outcome": "ok",
        "nnrp.end_cause": "completed", "nnrp.events": 3, "nnrp.event_bytes": 0,
        "nnrp.trace.attribute_bytes": 12}
    assert [(e.name, e.at_ns) for e in operation.events] == [("nnrp.first_token", 1_004_000_000)]
    assert operation.error is None
    # The CLIENT span is GenAI's inference span (the client conventions' kind and name).
    assert (upstream.name, upstream.kind, upstream.span_id, upstream.parent_span_id) == (
        "chat tiny", "client", 0x99, 0xEF)
    assert not upstream.remote_parent
    assert (upstream.start_ns, upstream.end_ns) == (1_002_000_000, 1_008_000_000)
    assert upstream.attributes == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "tiny", "gen_ai.response.model": "tiny-1",
        "gen_ai.response.id": "chatcmpl-1", "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 3, "gen_ai.usage.output_tokens": 5,
        "http.request.method": "POST", "http.response.status_code": 200,
        "server.address": "127.0.0.1", "server.port": 8000,
        "url.full": "http://127.0.0.1:8000/v1/chat/completions"}
    assert upstream.error is None


async def test_an_unsampled_or_undecided_span_builds_nothing() -> None:
    assert spans_of(ended(EndCause.COMPLETED, span=attrs.evolve(SPAN, sampled=False))) == ()
    assert spans_of(ended(EndCause.COMPLETED, span=None)) == ()


@pytest.mark.parametrize(("cause", "error", "event"), [
    (EndCause.BACKEND_ERROR, "backend_error", None),
    (EndCause.BACKEND_UNAVAILABLE, "backend_unavailable", None),
    (EndCause.REQUEST_TIMEOUT, "request_timeout", "nnrp.deadline"),  # the gateway's limit
    (EndCause.ADAPTER_RUNTIME_ERROR, "adapter_runtime_error", None),
    (EndCause.BACKEND_OVERLOAD, "backend_overload", None),  # refusals for load
    (EndCause.SCHEDULER_REJECTED, "scheduler_rejected", None),
    (EndCause.ADAPTER_OPERATION_LIMIT, "adapter_operation_limit", None),
    (EndCause.INVALID_BODY, None, None),  # the client's mistake: not the server's error
    (EndCause.UNSUPPORTED_MODEL, None, None),  # vLLM's 404 for the client's model
    (EndCause.INVALID_BACKEND_REQUEST, None, None),  # vLLM's 400 for the client's body
    (EndCause.SERVER_DRAINING, None, None),  # outcome shed, but a drain, not load
    (EndCause.SESSION_CLOSING, None, None),
    (EndCause.DEADLINE_EXPIRED, None, "nnrp.deadline"),  # the client's own time limit
    (EndCause.EXPIRED_AT, None, "nnrp.deadline"),
    (EndCause.SUPERSEDED, None, "nnrp.supersede"),
    (EndCause.SHUTDOWN, None, None),
])
async def test_the_status_and_end_events_follow_the_end_cause(cause: EndCause, error: str | None,
                                                        event: str | None) -> None:
    (operation,) = spans_of(ended(cause))
    assert operation.error == error
    assert operation.attributes.get("error.type") == error  # set only with ERROR
    assert [e.name for e in operation.events] == ([event] if event else [])
    if event:
        assert operation.events[0].at_ns == operation.end_ns


async def test_vllms_4xx_is_an_error_of_the_client_span_only() -> None:
    op = ended(EndCause.UNSUPPORTED_MODEL, model="nope", operation="chat.completions.create",
               upstream_status=404)
    op.notes.upstream_started, op.notes.upstream_closed = (op.notes.received_at + 0.002,
                                                           op.notes.received_at + 0.003)
    operation, upstream = spans_of(op)
    assert operation.error is None and "error.type" not in operation.attributes
    assert upstream.error == "unsupported_model"
    assert upstream.attributes["error.type"] == "unsupported_model"
    assert upstream.attributes["http.response.status_code"] == 404


async def test_a_cancel_and_a_resume_are_events_at_their_time() -> None:
    op = ended(EndCause.PEER_CANCELLED)
    op.cancel_info = CancelInfo(CancelSource.ABORT, 4, b"SECRET words",
                                at=op.notes.received_at + 0.006)
    op.notes.reattached_at = [op.notes.received_at + 0.003]
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
                       parent_span_id=None, sampled=True, upstream_span_id=0x43)
    # The gateway's request to vLLM (the CLIENT span) is vLLM's parent, not the operation.
    assert upstream_traceparent(None, root) == (
        "00-0123456789abcdef0123456789abcdef-0000000000000043-01")
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
    assert exporter.batches == [["chat.completions.create other"]] and exporter.shut
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


async def test_decide_names_the_upstream_span_before_it_exists() -> None:
    traces = tracer(RecordingExporter(), [])
    root = traces.decide(None)
    assert root.upstream_span_id not in (0, root.span_id)
    op = ended(EndCause.COMPLETED, span=root, model="tiny", operation="chat.completions.create")
    op.notes.upstream_started, op.notes.upstream_closed = (op.notes.received_at + 0.002,
                                                           op.notes.received_at + 0.003)
    operation, upstream = spans_of(op)
    assert (upstream.span_id, upstream.parent_span_id) == (root.upstream_span_id,
                                                           operation.span_id)
    assert upstream_traceparent(None, root) == (
        f"00-{root.trace_id:032x}-{root.upstream_span_id:016x}-01")


async def test_a_non_inference_operation_has_no_genai_attributes() -> None:
    op = ended(EndCause.COMPLETED, operation="gateway.capabilities")
    (operation,) = spans_of(op)
    assert operation.name == "gateway.capabilities"
    assert not [name for name in operation.attributes if name.startswith("gen_ai.")]
    assert "server.address" not in operation.attributes


async def test_a_clients_model_and_operation_strings_are_bounded() -> None:
    huge = "m" * 5000
    op = ended(EndCause.COMPLETED, model=huge, operation="chat.completions.create",
               request_id="r" * 5000, response_model="x" * 900, finish_reasons=("y" * 900,))
    op.notes.upstream_started, op.notes.upstream_closed = (op.notes.received_at + 0.002,
                                                           op.notes.received_at + 0.003)
    operation, upstream = spans_of(op)
    assert (operation.name, upstream.name) == ("chat.completions.create other", "chat other")
    for span in (operation, upstream):
        for value in span.attributes.values():
            for item in value if isinstance(value, tuple) else (value,):
                assert not isinstance(item, str) or len(item) <= MAX_ATTRIBUTE_CHARS
    assert upstream.attributes["gen_ai.request.model"] == "m" * MAX_ATTRIBUTE_CHARS
    # A known model is named; an operation nobody knows is not.
    assert spans_of(ended(EndCause.COMPLETED, model="tiny", operation="chat.completions.create"
                          ))[0].name == "chat.completions.create tiny"
    (unknown,) = spans_of(ended(EndCause.UNSUPPORTED_OPERATION, operation="x" * 300))
    assert unknown.name == "nnrp.operation"


async def test_url_full_never_carries_userinfo_or_a_query() -> None:
    upstream = upstream_of("https://user:s3cret@vllm.internal/base/?key=s3cret#frag")
    assert upstream == Upstream("vllm.internal", 443, "https://vllm.internal/base")
    assert upstream_of("http://[::1]:8001") == Upstream("::1", 8001, "http://[::1]:8001")


class EmptiedDeque(collections.deque[Any]):
    """The queue as ``close`` leaves it when it empties it from its own thread between the
    export thread's first and second pop (the interleaving made deterministic)."""

    def popleft(self) -> Any:
        item = super().popleft()
        self.clear()
        return item


async def test_close_emptying_the_queue_mid_batch_does_not_end_the_export_thread() -> None:
    exporter, drops, exported = RecordingExporter(), [], []
    queue = SpanQueue(exporter, max_queue=8, batch_size=4, delay=0.0,
                      dropped=lambda reason, n: drops.append((reason, n)),
                      exported=exported.append, failures=FailureLog("x"))
    queue._queue = EmptiedDeque(ReadableSpan(name=f"s{n}") for n in range(3))
    queue._stopping = True
    queue._run()  # raised IndexError (the thread died) when it counted before popping
    assert exporter.batches == [["s0"]] and exported == [1]


async def test_exporter_logs_stay_taken_while_the_export_thread_outlives_close() -> None:
    exporter, drops = RecordingExporter(), []
    exporter.gate = threading.Event()
    traces = tracer(exporter, drops, batch_size=1)
    traces.take_exporter_logs()
    traces.start()
    traces.export(build_record(ended(EndCause.COMPLETED)))
    loggers = [logging.getLogger(name) for name in EXPORTER_LOGGERS]
    try:
        traces.close(0.05)  # the export is stuck past the timeout
        assert traces.queue.running
        # Its exporter may still log; the console must not get it raw.
        assert all(not lg.propagate and traces.failures in lg.handlers for lg in loggers)
    finally:
        exporter.gate.set()
    traces.queue._thread.join(5)
    ended_tracer = tracer(RecordingExporter(), [])
    ended_tracer.take_exporter_logs()
    ended_tracer.start()
    ended_tracer.close(5)
    assert all(lg.propagate and ended_tracer.failures not in lg.handlers for lg in loggers)
    for lg in loggers:  # the stuck tracer's handler, left behind on purpose
        lg.removeHandler(traces.failures)
        lg.propagate = True


async def test_the_samplers_checked_are_the_ones_the_sdk_knows() -> None:
    from opentelemetry.sdk.trace import sampling

    assert frozenset(sampling._KNOWN_SAMPLERS) == KNOWN_SAMPLERS
    check_sampler({"OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio",
                   "OTEL_TRACES_SAMPLER_ARG": "0.25"})  # the SDK lower-cases the name
    check_sampler({"OTEL_TRACES_SAMPLER": "traceidratio"})  # no ratio: the SDK's 1.0
    check_sampler({"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "x"})
    with pytest.raises(ConfigError, match="needs a ratio"):
        check_sampler({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "nan"})
    check_headers({"OTEL_EXPORTER_OTLP_HEADERS": "a=1, b = two words ,c=",
                   "OTEL_EXPORTER_OTLP_TRACES_HEADERS": ""})
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_TRACES_HEADERS: entry 1"):
        check_headers({"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "=value"})


async def test_otel_sdk_disabled_opens_no_tracer_and_says_so_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    with structlog.testing.capture_logs() as logs:
        assert open_tracer(vllm_url="http://127.0.0.1:1", dropped=lambda reason, n: None,
                           exported=lambda n: None) is None
    assert [line["event"] for line in logs] == [
        "OTEL_SDK_DISABLED=true: --otel-traces is off, no span is exported"]
    monkeypatch.setenv("OTEL_SDK_DISABLED", "false")
    assert not tracing_disabled()


async def test_the_in_process_cost_goes_through_the_gateways_own_tracer() -> None:
    from gateway.observe import measure_tracing_cost
    from gateway.tools.bench._tracing import operation_record

    cost = measure_tracing_cost(operation_record(), TRACE, operations=50,
                                vllm_url="http://127.0.0.1:8001")
    assert (cost.operations, cost.spans) == (50, 100)
    assert cost.event_loop_us > 0 and cost.export_us > 0
    assert cost.encoded_bytes > 100 * len("chat.completions.create example-model")


def otel_environment(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    """Only these OTEL_* variables (the process's own removed)."""
    for name in [name for name in os.environ if name.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def opened(monkeypatch: pytest.MonkeyPatch, exported: list[int] | None = None,
           **env: str) -> OtelTracer:
    """The tracer ``serve --otel-traces`` opens under ``env``."""
    otel_environment(monkeypatch, **env)
    traces = open_tracer(vllm_url="http://127.0.0.1:8000", dropped=lambda reason, n: None,
                         exported=(exported if exported is not None else []).append)
    assert isinstance(traces, OtelTracer)
    return traces


def upstream_op() -> Operation:
    """An operation with a request to vLLM: two spans, SERVER and CLIENT."""
    op = ended(EndCause.COMPLETED, model="tiny", operation="chat.completions.create")
    op.notes.upstream_started, op.notes.upstream_closed = (op.notes.received_at + 0.002,
                                                           op.notes.received_at + 0.003)
    return op


async def test_otel_traces_exporter_is_otlp_console_or_none_and_nothing_else() -> None:
    assert traces_exporter({}) == traces_exporter({"OTEL_TRACES_EXPORTER": ""}) == "otlp"
    assert traces_exporter({"OTEL_TRACES_EXPORTER": " Console "}) == "console"
    assert traces_exporter({"OTEL_TRACES_EXPORTER": "NONE"}) == "none"
    for bad in ("zipkin", "otlp,console", "jaeger", "stdout"):
        with pytest.raises(ConfigError) as raised:
            check_environment({"OTEL_TRACES_EXPORTER": bad})
        assert str(raised.value).startswith(f"OTEL_TRACES_EXPORTER={bad!r}: "), raised.value
        assert "otlp (the default), console" in str(raised.value)
    console = ExportSettings.from_environment({"OTEL_TRACES_EXPORTER": "console"})
    assert isinstance(console.exporter(), ConsoleSpanExporter)
    assert ExportSettings.from_environment({"OTEL_TRACES_EXPORTER": "none"}).exporter() is None
    check_environment({"OTEL_TRACES_EXPORTER": "none"})


async def test_the_url_said_is_the_one_the_otlp_exporter_posts_to(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for env, url in (({}, "http://localhost:4318/v1/traces"),
                     ({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c.example:4318/"},
                      "https://c.example:4318/v1/traces"),
                     ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://d",
                       "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:1/custom"},
                      "http://c:1/custom")):
        otel_environment(monkeypatch, **env)
        settings = ExportSettings.from_environment(os.environ)
        exporter = settings.exporter()
        assert settings.url == url == exporter._endpoint  # type: ignore[union-attr]
    grpc = ExportSettings.from_environment({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert grpc.url == "http://localhost:4317"


async def test_an_otlp_http_endpoint_that_is_no_http_url_is_refused_unshown() -> None:
    for name, value in (("OTEL_EXPORTER_OTLP_ENDPOINT", "otel-collector:4318"),
                        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://c/v1/traces"),
                        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://u:s3cret@c:port/x"),
                        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http:///v1/traces")):
        with pytest.raises(ConfigError) as raised:
            ExportSettings.from_environment({name: value})
        assert str(raised.value).startswith(f"{name}="), raised.value
        assert "expected the collector's http:// or https:// URL" in str(raised.value)
        assert "s3cret" not in str(raised.value)
    # Neither the console nor none uses it: a stale one is no reason to refuse.
    ExportSettings.from_environment({"OTEL_TRACES_EXPORTER": "console",
                                     "OTEL_EXPORTER_OTLP_ENDPOINT": "otel-collector:4318"})
    assert shown_url("http://u:pw@h:1/p@q") == "http://***@h:1/p@q"
    assert shown_url("localhost:4317") == "localhost:4317"
    assert collector_address("localhost:4317") == ("localhost", 4317)  # gRPC's form
    assert collector_address("https://c.example/v1/traces") == ("c.example", 443)
    assert collector_address("http://[::1]:4318/v1/traces") == ("::1", 4318)
    assert collector_address("http://c:notaport") is None
    assert collector_address("grpc-host") is None


async def test_start_says_where_spans_go_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as collector:  # reachable: no warning
        port = collector.getsockname()[1]
        traces = opened(monkeypatch,
                        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://u:s3cret@127.0.0.1:{port}",
                        OTEL_SERVICE_NAME="gw-a", OTEL_TRACES_SAMPLER="parentbased_traceidratio",
                        OTEL_TRACES_SAMPLER_ARG="0.25")
        with structlog.testing.capture_logs() as logs:
            traces.start()
            assert traces.check_collector(("127.0.0.1", port))
            traces.close(5)
    assert logs == [{"event": "tracing on", "log_level": "info", "exporter": "otlp",
                     "endpoint": f"http://***@127.0.0.1:{port}/v1/traces",
                     "protocol": "http/protobuf", "sampler": "parentbased_traceidratio",
                     "sampler_ratio": 0.25, "service_name": "gw-a"}]
    lines = {}
    for env in ({"OTEL_TRACES_EXPORTER": "console"},
                {"OTEL_TRACES_EXPORTER": "none", "OTEL_TRACES_SAMPLER": "traceidratio"}):
        traces = opened(monkeypatch, **env)
        assert traces.collector is None  # nothing to reach
        with structlog.testing.capture_logs() as logs:
            traces.start()
            traces.close(5)
        (line,) = logs
        lines[env["OTEL_TRACES_EXPORTER"]] = line
    console, none = lines["console"], lines["none"]
    assert (console["event"], console["endpoint"], console["sampler"]) == (
        "tracing on", "stdout", "parentbased_always_on")
    assert "one span per line" in console["note"]
    assert "protocol" not in console and "sampler_ratio" not in console
    assert console["service_name"] == "nnrp-vllm-gateway"
    assert none["event"] == "tracing on" and "endpoint" not in none
    assert none["note"].startswith("OTEL_TRACES_EXPORTER=none:")
    assert "none is exported" in none["note"]
    assert none["sampler_ratio"] == 1.0  # the SDK's, without an argument


async def test_an_unreachable_collector_is_a_warning_with_what_to_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    traces = opened(monkeypatch,
                    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://127.0.0.1:{port}/v1/traces")
    assert traces.collector == ("127.0.0.1", port)
    with structlog.testing.capture_logs() as logs:
        assert not traces.check_collector(traces.collector, timeout=2.0)
    (line,) = logs
    assert (line["event"], line["log_level"]) == ("trace collector unreachable", "warning")
    assert line["endpoint"] == f"http://127.0.0.1:{port}/v1/traces"
    assert "refused" in line["reason"].lower()
    assert line["hint"] == COLLECTOR_HINT and "OTEL_TRACES_EXPORTER=console" in COLLECTOR_HINT
    # A failed export says the same (its first line comes at once, then once a minute).
    with structlog.testing.capture_logs() as logs:
        traces.failures.failed(2)
    assert logs[0]["hint"] == COLLECTOR_HINT
    traces.close(1)


async def test_console_prints_each_span_as_one_json_line_on_stdout(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    exported: list[int] = []
    traces = opened(monkeypatch, exported, OTEL_TRACES_EXPORTER="console",
                    OTEL_BSP_SCHEDULE_DELAY="10")
    with structlog.testing.capture_logs():
        traces.start()
    traces.export(build_record(upstream_op()))
    traces.close(5)
    out = capsys.readouterr().out
    spans = [json.loads(line) for line in out.splitlines()]
    assert [span["name"] for span in spans] == ["chat.completions.create other", "chat other"]
    assert spans[0]["context"]["span_id"] == f"0x{SPAN.span_id:016x}"
    assert spans[1]["parent_id"] == f"0x{SPAN.span_id:016x}"
    assert exported == [2]  # counted as exported, as a collector's would be


async def test_none_decides_spans_and_exports_none(monkeypatch: pytest.MonkeyPatch) -> None:
    exported: list[int] = []
    traces = opened(monkeypatch, exported, OTEL_TRACES_EXPORTER="none")
    assert not traces.exporting
    assert traces.decide(TRACE).sampled  # ids and the sampler's word, as ever
    with structlog.testing.capture_logs():
        traces.start()
    traces.export(build_record(upstream_op()))
    assert len(traces.queue) == 0 and not traces.queue.running  # no export thread
    traces.close(5)
    assert exported == []
