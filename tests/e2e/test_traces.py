"""OpenTelemetry traces through the whole stack (issue 24): a real NNRP client, the replay
vLLM and a real OTLP/HTTP receiver on loopback that decodes what the gateway exports with
OpenTelemetry's own protobufs (tests.support.otlp); and the other exporters
(``OTEL_TRACES_EXPORTER``): console, spans printed among a real ``serve``'s log lines, and
none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from gateway import nnrp
from gateway.tools.client import connect
from gateway.tools.replay import ReplayServer
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.processes import (
    ReplayThread,
    free_port,
    served_endpoints,
    stop_gateway,
)
from tests.support.stack import (
    Stack,
    chat,
    envelope,
    metric_samples,
    records_of,
    run_operation,
    start_stack,
)
from tests.support.waits import until, wait_for

NNRP_TRACE, NNRP_SPAN = 0xABCDEF0123456789, 0x1122334455667788


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def otel_env(monkeypatch: pytest.MonkeyPatch, endpoint: str, **more: str) -> None:
    """The standard variables only; a batch leaves every 20 ms (OTEL_BSP_SCHEDULE_DELAY)."""
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
                 "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_PROTOCOL",
                 "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    for name, value in more.items():
        monkeypatch.setenv(name, value)


async def traced_stack(nursery: trio.Nursery, socket_dir: Path) -> Stack:
    return await start_stack(nursery, socket_dir, otel_traces=True,
                             replay=ReplayServer(speed=50.0))


def operation_span(receiver: OtlpReceiver, request_id: str) -> ReceivedSpan | None:
    return next((span for span in receiver.taken() if span.span.kind == Span.SPAN_KIND_SERVER
                 and span.attributes.get("nnrp.request_id") == request_id), None)


async def span_of(receiver: OtlpReceiver, request_id: str) -> ReceivedSpan:
    with trio.fail_after(10):
        await until(lambda: operation_span(receiver, request_id))
    span = operation_span(receiver, request_id)
    assert span is not None
    return span


def traceparents(stack: Stack) -> dict[str, str | None]:
    return {r.headers["x-request-id"]: r.headers.get("traceparent")
            for r in stack.replay.requests if r.method == "POST"}


async def test_a_streamed_request_with_a_client_trace_context_is_one_child_span(
        nursery: trio.Nursery, socket_dir: Path, receiver: OtlpReceiver,
        monkeypatch: pytest.MonkeyPatch) -> None:
    otel_env(monkeypatch, receiver.endpoint, OTEL_SERVICE_NAME="gw-under-test")
    stack = await traced_stack(nursery, socket_dir)
    records = records_of(stack)
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        await session.trace_context(trace_id=NNRP_TRACE, span_id=NNRP_SPAN, trace_flags=0x3,
                                    attributes=b"tenant=blue")
        outcome = await run_operation(session, envelope(chat(stream=True, max_tokens=3),
                                                        request_id="otel-1"))
    assert outcome.final is not None and outcome.final["type"] == "response.completed"
    span = await span_of(receiver, "otel-1")
    # The traceparent vLLM saw is today's, byte for byte: it names the NNRP span.
    assert traceparents(stack)["otel-1"] == (
        "00-0000000000000000abcdef0123456789-1122334455667788-01")
    # The gateway's span: the same trace (zero-extended), a child of the NNRP span.
    assert span.trace_id == f"{NNRP_TRACE:032x}"
    assert span.parent_span_id == f"{NNRP_SPAN:016x}"
    assert span.span.flags & 0x200  # the parent is remote (OTLP's is-remote bit)
    assert span.name == "chat.completions.create example-model"
    assert span.resource["service.name"] == "gw-under-test"
    assert span.scope == "nnrp-vllm-gateway"
    attributes = span.attributes
    completed = outcome.final["body"]
    # The SERVER span is the protocol's: GenAI's and server.* belong to the CLIENT span.
    assert attributes["nnrp.request.model"] == "example-model"
    assert not [name for name in attributes if name.startswith(("gen_ai.", "server."))]
    assert attributes["nnrp.transport"] == "tcp"
    assert attributes["nnrp.outcome"] == "ok"
    assert attributes["nnrp.stream"] is True
    assert attributes["nnrp.trace.attribute_bytes"] == len(b"tenant=blue")
    assert [name for name, _ in span.events] == ["nnrp.first_token"]
    assert span.span.status.code == Status.STATUS_CODE_UNSET
    assert span.span.end_time_unix_nano > span.span.start_time_unix_nano
    # Its upstream child: the HTTP request to vLLM, inside the operation's time.
    with trio.fail_after(10):
        await until(lambda: [s for s in receiver.taken() if s.parent_span_id == span.span_id])
    (upstream,) = [s for s in receiver.taken() if s.parent_span_id == span.span_id]
    assert upstream.span.kind == Span.SPAN_KIND_CLIENT
    assert upstream.name == "chat example-model"  # GenAI's inference span
    assert upstream.trace_id == span.trace_id
    attributes = upstream.attributes
    assert attributes["http.response.status_code"] == 200
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "vllm"
    assert attributes["gen_ai.request.model"] == "example-model"
    assert attributes["gen_ai.response.model"] == completed["model"]
    assert attributes["gen_ai.response.id"] == completed["id"]
    assert attributes["gen_ai.response.finish_reasons"] == tuple(
        choice["finish_reason"] for choice in completed["choices"])
    assert attributes["gen_ai.usage.input_tokens"] == completed["usage"]["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == completed["usage"]["completion_tokens"]
    port = int(stack.gateway.config.vllm_url.rsplit(":", 1)[1])
    assert (attributes["server.address"], attributes["server.port"]) == ("127.0.0.1", port)
    assert attributes["url.full"] == f"http://127.0.0.1:{port}/v1/chat/completions"
    assert span.span.start_time_unix_nano <= upstream.span.start_time_unix_nano
    assert upstream.span.end_time_unix_nano <= span.span.end_time_unix_nano
    # The log line joins the trace: the same ids, in OpenTelemetry's format.
    (record,) = [r for r in records if r.request_id == "otel-1"]
    assert (record.trace_id, record.span_id, record.parent_span_id) == (
        span.trace_id, span.span_id, f"{NNRP_SPAN:016x}")
    assert len(list(receiver.named(span.name))) == 1  # one span per operation


async def test_without_a_client_context_the_gateway_starts_the_trace_and_names_its_span(
        nursery: trio.Nursery, socket_dir: Path, receiver: OtlpReceiver,
        monkeypatch: pytest.MonkeyPatch) -> None:
    otel_env(monkeypatch, receiver.endpoint)
    stack = await traced_stack(nursery, socket_dir)
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        await run_operation(session, envelope(chat(), request_id="otel-root"))
    span = await span_of(receiver, "otel-root")
    assert span.parent_span_id == ""  # a root span
    assert span.resource["service.name"] == "nnrp-vllm-gateway"
    with trio.fail_after(10):
        await until(lambda: [s for s in receiver.taken() if s.parent_span_id == span.span_id])
    (upstream,) = [s for s in receiver.taken() if s.parent_span_id == span.span_id]
    # vLLM's parent is the gateway's request to it, so vLLM's spans sit under "chat ...".
    assert traceparents(stack)["otel-root"] == f"00-{span.trace_id}-{upstream.span_id}-01"


async def test_the_sampler_decides_and_an_unsampled_client_is_respected(
        nursery: trio.Nursery, socket_dir: Path, receiver: OtlpReceiver,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # parentbased_always_off: a root is never sampled, a sampled client parent is.
    otel_env(monkeypatch, receiver.endpoint, OTEL_TRACES_SAMPLER="parentbased_always_off")
    stack = await traced_stack(nursery, socket_dir)
    async with connect(stack.uri()) as client:
        plain = await client.open_session()
        await run_operation(plain, envelope(chat(), request_id="otel-unsampled-root"))
        unsampled = await client.open_session()
        await unsampled.trace_context(trace_id=7, span_id=8, trace_flags=0)
        await run_operation(unsampled, envelope(chat(), request_id="otel-unsampled-client"))
        sampled = await client.open_session()
        await sampled.trace_context(trace_id=9, span_id=10, trace_flags=1)
        await run_operation(sampled, envelope(chat(), request_id="otel-sampled-client"))
    await span_of(receiver, "otel-sampled-client")
    # Exported in order: the two before it were never built.
    assert operation_span(receiver, "otel-unsampled-root") is None
    assert operation_span(receiver, "otel-unsampled-client") is None
    parents = traceparents(stack)
    assert parents["otel-unsampled-root"] is None  # no trace started, none sent
    assert parents["otel-unsampled-client"] == f"00-{7:032x}-{8:016x}-00"  # as today


async def test_a_cancelled_and_a_failed_operation_carry_their_outcome(
        nursery: trio.Nursery, socket_dir: Path, receiver: OtlpReceiver,
        monkeypatch: pytest.MonkeyPatch) -> None:
    otel_env(monkeypatch, receiver.endpoint)
    stack = await traced_stack(nursery, socket_dir)
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        operation = await session.submit(envelope(chat(stream=True),
                                                  request_id="replay:long_stream:otel-cancel"))
        async for event in operation.events():
            if isinstance(event, nnrp.PartialReceived):
                await operation.cancel(reason=3)
                break
        failed = await run_operation(session, envelope(chat("no-such-model"),
                                                       request_id="otel-failed"))
    assert failed.status == 404
    cancelled = await span_of(receiver, "replay:long_stream:otel-cancel")
    assert cancelled.attributes["nnrp.outcome"] == "cancelled"
    assert cancelled.attributes["nnrp.cancel.source"] == "cancel"
    assert cancelled.attributes["nnrp.upstream.aborted"] is True
    assert ("nnrp.cancel", {"nnrp.cancel.source": "cancel", "nnrp.cancel.reason": 3}
            ) in cancelled.events
    assert cancelled.span.status.code == Status.STATUS_CODE_UNSET  # the client's choice
    span = await span_of(receiver, "otel-failed")
    assert span.attributes["nnrp.outcome"] == "upstream_error"
    assert span.attributes["nnrp.end_cause"] == "unsupported_model"
    # The client named a model vLLM does not serve: the caller's 4xx, not the gateway's
    # error (_spans rule 7); the CLIENT span below is where vLLM's 404 is an error.
    assert "error.type" not in span.attributes
    assert span.span.status.code == Status.STATUS_CODE_UNSET
    with trio.fail_after(10):
        await until(lambda: [s for s in receiver.taken() if s.parent_span_id == span.span_id])
    (upstream,) = [s for s in receiver.taken() if s.parent_span_id == span.span_id]
    assert upstream.attributes["http.response.status_code"] == 404
    assert upstream.attributes["error.type"] == "unsupported_model"
    assert upstream.span.status.code == Status.STATUS_CODE_ERROR


def dropped(stack: Stack, reason: str) -> float:
    return metric_samples(stack.gateway.metrics.registry)[
        ("nnrp_gateway_trace_spans_dropped_total", (("reason", reason),))]


async def test_a_stalled_collector_never_holds_a_stream_and_drops_are_counted(
        nursery: trio.Nursery, socket_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stalled = threading.Event()
    with OtlpReceiver(hold=stalled) as receiver:
        # The exporter waits for the held collector longer than the test takes, so the
        # first batch stays in flight and the queue is all the room there is.
        otel_env(monkeypatch, receiver.endpoint, OTEL_BSP_MAX_QUEUE_SIZE="4",
                 OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2", OTEL_EXPORTER_OTLP_TIMEOUT="60")
        stack = await traced_stack(nursery, socket_dir)
        try:
            async with connect(stack.uri()) as client:
                session = await client.open_session()
                first = await run_operation(session, envelope(chat(stream=True, max_tokens=3),
                                                              request_id="stall-0"))
                assert first.final is not None
                with trio.fail_after(10):  # the first batch is out, and held by the collector
                    await until(lambda: receiver.requests >= 1)
                # Streams go on while the export thread waits: each one's two spans queue
                # (four fit) and the rest are dropped, none of it waiting for the collector.
                for n in range(1, 6):
                    outcome = await run_operation(session, envelope(
                        chat(stream=True, max_tokens=3), request_id=f"stall-{n}"))
                    assert outcome.final is not None
                    assert outcome.final["type"] == "response.completed"
            assert receiver.taken() == []  # the collector has taken nothing yet
            with trio.fail_after(10):
                await until(lambda: dropped(stack, "queue_full") >= 6)
        finally:
            stalled.set()


async def test_a_collector_that_is_down_costs_nothing_but_counted_drops_and_one_log_line(
        nursery: trio.Nursery, socket_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    otel_env(monkeypatch, f"http://127.0.0.1:{free_port()}/v1/traces",
             OTEL_EXPORTER_OTLP_TIMEOUT="1")
    with structlog.testing.capture_logs() as logs:
        stack = await traced_stack(nursery, socket_dir)
        # Said at start, before any request (not only when the first export fails).
        with trio.fail_after(5):
            await until(lambda: [line for line in logs
                                 if line["event"] == "trace collector unreachable"])
        async with connect(stack.uri()) as client:
            session = await client.open_session()
            for n in range(3):
                outcome = await run_operation(session, envelope(
                    chat(stream=True, max_tokens=3), request_id=f"down-{n}"))
                assert outcome.final is not None
                assert outcome.final["type"] == "response.completed"
        with trio.fail_after(20):
            await until(lambda: dropped(stack, "export_failed") >= 2)
        with trio.fail_after(20):  # every span is accounted for: failed or still queued
            await until(lambda: dropped(stack, "export_failed")
                        + len(stack.gateway.tracer.queue) >= 6)  # type: ignore[union-attr]
    failures = [line for line in logs if line["event"] == "trace export failed"]
    assert len(failures) == 1, failures  # at most once a minute
    assert failures[0]["log_level"] == "warning"
    assert "127.0.0.1" in json.dumps(failures[0])
    (unreachable,) = [line for line in logs if line["event"] == "trace collector unreachable"]
    assert unreachable["endpoint"] == failures[0]["endpoint"] == os.environ[
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    assert "OTEL_TRACES_EXPORTER=console" in unreachable["hint"] == failures[0]["hint"]


async def test_exporter_none_decides_spans_and_exports_none(
        nursery: trio.Nursery, socket_dir: Path, receiver: OtlpReceiver,
        monkeypatch: pytest.MonkeyPatch) -> None:
    otel_env(monkeypatch, receiver.endpoint, OTEL_TRACES_EXPORTER="none")
    stack = await traced_stack(nursery, socket_dir)
    records = records_of(stack)
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(chat(), request_id="otel-none"))
    assert outcome.final is not None and outcome.final["type"] == "response.completed"
    (record,) = [r for r in records if r.request_id == "otel-none"]
    # Tracing is on: the gateway started a trace, its log line and vLLM's traceparent
    # name it ...
    assert record.span is not None and record.trace_id == f"{record.span.trace_id:032x}"
    assert traceparents(stack)["otel-none"] == (
        f"00-{record.span.trace_id:032x}-{record.span.upstream_span_id:016x}-01")
    # ... and nothing is exported: the collector is never asked, nothing counts.
    await trio.sleep(0.3)  # fifteen export delays
    assert receiver.requests == 0
    samples = metric_samples(stack.gateway.metrics.registry)
    assert samples[("nnrp_gateway_trace_spans_exported_total", ())] == 0
    assert dropped(stack, "export_failed") == dropped(stack, "queue_full") == 0


def test_console_prints_a_real_requests_spans_among_the_json_log_lines(tmp_path: Path) -> None:
    """``serve`` as an operator runs it: its stdout stays JSON lines, one span a line."""
    exe = str(Path(sys.executable).parent / "nnrp-gateway")
    log = tmp_path / "gateway.log"
    env = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    env.update(OTEL_TRACES_EXPORTER="console", OTEL_BSP_SCHEDULE_DELAY="20")

    def lines() -> list[dict[str, Any]]:
        text = log.read_text()
        return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]

    def spans() -> list[dict[str, Any]]:
        return [line for line in lines() if "context" in line]

    with ReplayThread(speed=50.0) as replay, log.open("wb") as sink:
        process = subprocess.Popen(
            [exe, "serve", "--otel-traces", "--vllm-url", replay.url,
             "--listen", "tcp://127.0.0.1:0"], stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            wait_for(lambda: any(line.get("event") == "vLLM ready" for line in lines())
                     or process.poll() is not None, what="vLLM ready")
            assert process.poll() is None, log.read_text()
            (tcp,) = served_endpoints(log.read_text())

            async def one_stream() -> None:
                with trio.fail_after(20):
                    async with connect(tcp) as client:
                        session = await client.open_session()
                        outcome = await run_operation(session, envelope(
                            chat(stream=True, max_tokens=3), request_id="console-1"))
                        assert outcome.final is not None
                        assert outcome.final["type"] == "response.completed"

            trio.run(one_stream)
            wait_for(lambda: len(spans()) >= 2, what="the operation's two spans")
        finally:
            stop_gateway(process)
    assert process.returncode == 0, log.read_text()
    every = lines()  # every line of stdout is one JSON object (json.loads would fail)
    assert len(every) == len(log.read_text().splitlines())
    (started,) = [line for line in every if line.get("event") == "tracing on"]
    assert (started["exporter"], started["endpoint"]) == ("console", "stdout")
    assert started["service_name"] == "nnrp-vllm-gateway"
    server, client = spans()
    assert (server["kind"], client["kind"]) == ("SpanKind.SERVER", "SpanKind.CLIENT")
    assert server["name"] == "chat.completions.create example-model"
    assert server["attributes"]["nnrp.request_id"] == "console-1"
    assert client["parent_id"] == server["context"]["span_id"]
    # The operation's log line names the span printed, so logs and spans join.
    (operation,) = [line for line in every if line.get("event") == "operation"]
    assert "0x" + operation["trace_id"] == server["context"]["trace_id"]
    assert "0x" + operation["span_id"] == server["context"]["span_id"]
