"""A real OTLP/HTTP trace receiver on loopback, what a collector is to the gateway:
``POST /v1/traces`` with an ``ExportTraceServiceRequest`` protobuf, decoded with
OpenTelemetry's own generated classes (opentelemetry-proto).

It runs in threads (http.server), so a gateway in another process or in the test's trio
loop sends to it alike. ``hold`` stalls each answer until the test releases it (a slow
collector); ``status`` makes it refuse (a collector that fails).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def value_of(any_value: Any) -> Any:
    """An OTLP ``AnyValue`` as Python."""
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(value_of(v) for v in any_value.array_value.values)
    return getattr(any_value, kind) if kind else None


@attrs.frozen
class ReceivedSpan:
    span: Span
    resource: dict[str, Any]
    scope: str

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_span_id(self) -> str:
        return self.span.parent_span_id.hex()

    @property
    def attributes(self) -> dict[str, Any]:
        return {kv.key: value_of(kv.value) for kv in self.span.attributes}

    @property
    def events(self) -> list[tuple[str, dict[str, Any]]]:
        return [(event.name, {kv.key: value_of(kv.value) for kv in event.attributes})
                for event in self.span.events]

    def as_text(self) -> str:
        """Everything exported about it (for the secret scan)."""
        return repr((MessageToDict(self.span), self.resource, self.scope))


class OtlpReceiver:
    def __init__(self, *, hold: threading.Event | None = None, status: int = 200) -> None:
        #: While set and not yet released, every answer waits for it (a stalled collector).
        self.hold = hold
        self.status = status
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver.lock:
                    receiver.requests += 1
                if receiver.hold is not None:
                    receiver.hold.wait(30)
                if receiver.status != 200 or self.path != "/v1/traces":
                    self.send_response(receiver.status if receiver.status != 200 else 404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest.FromString(body)
                received = [
                    ReceivedSpan(span, {kv.key: value_of(kv.value)
                                        for kv in resource_spans.resource.attributes},
                                 scope_spans.scope.name)
                    for resource_spans in request.resource_spans
                    for scope_spans in resource_spans.scope_spans
                    for span in scope_spans.spans]
                with receiver.lock:
                    receiver.spans.extend(received)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/v1/traces"

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def taken(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)

    def named(self, name: str) -> Iterator[ReceivedSpan]:
        return (span for span in self.taken() if span.name == name)
