"""OpenTelemetry's SDK behind ``Tracer``: the one module that imports it (the ``otel``
extra; ``_tracing.open_tracer`` imports this module only when tracing is asked for).

The rules:

1. **Configuration** is OpenTelemetry's own, read by the SDK from the environment: the
   exporter's ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT``, ``_HEADERS``, ``_TIMEOUT``; the
   resource's ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (``service.name``
   defaults to nnrp-vllm-gateway rather than the SDK's unknown_service); the sampler's
   ``OTEL_TRACES_SAMPLER(_ARG)``; the queue's ``OTEL_BSP_MAX_QUEUE_SIZE``,
   ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` and ``OTEL_BSP_SCHEDULE_DELAY``. The protocol
   (``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL``) is http/protobuf unless it says grpc, which
   needs opentelemetry-exporter-otlp-proto-grpc; anything else is a ``ConfigError``.
2. **Spans are built, not recorded live**: ``_spans.build_spans`` turns the observation
   record into ``SpanData``, and this module into the SDK's ``ReadableSpan`` (what every
   exporter takes), so the span cannot disagree with the log line. The ids come from the
   SDK's id generator; the sampler is asked through its public ``should_sample``.
3. **Export never blocks the event path.** The trio thread only appends to a bounded
   queue (``SpanQueue``); one export thread takes batches from it. A full queue drops the
   spans that do not fit (``queue_full``), a batch the exporter could not deliver is
   dropped (``export_failed``: the OTLP exporter has retried it within its timeout), and
   what is still queued when the gateway stops after the close timeout is dropped
   (``shutdown``); each counts in ``nnrp_gateway_trace_spans_dropped_total{reason}``.
   The SDK's own BatchSpanProcessor is not used: when full it drops its *oldest* span and
   logs a warning per span, and counts neither where the gateway's metrics can see it.
4. **Exporter failures are logged at most once a minute** (``FailureLog``), with the
   exporter's last reason and how many batches and spans failed since the last line; the
   exporter's own per-attempt log records are kept off the console.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

import attrs
import structlog
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

import gateway
from gateway.errors import ConfigError
from gateway.server import GatewaySpan

from ._spans import SCOPE, SpanData, build_spans, span_parent

if TYPE_CHECKING:
    from gateway.nnrp import TraceInfo

    from ._record import ObservationRecord

log = structlog.get_logger("gateway.observe.traces")

#: The span name the sampler is asked about (it may sample by name).
SAMPLED_NAME = "nnrp.operation"
#: Rule 4: one log line per this many seconds at most.
FAILURE_LOG_INTERVAL = 60.0
#: The exporters' loggers (every OTLP exporter's and their HTTP client's are below it),
#: whose records ``FailureLog`` takes instead of the console.
EXPORTER_LOGGERS = ("opentelemetry.exporter",)
_KINDS = {"server": trace_api.SpanKind.SERVER, "client": trace_api.SpanKind.CLIENT}
_SAMPLED = trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED)


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if value < 1:
        raise ConfigError(f"{name}={raw!r} must be at least 1")
    return value


@attrs.frozen
class ExportSettings:
    """Rule 1's settings that the gateway reads itself (the exporter reads the rest)."""

    protocol: str
    endpoint: str
    max_queue: int
    batch_size: int
    delay: float

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> ExportSettings:
        named = next((name for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                                        "OTEL_EXPORTER_OTLP_PROTOCOL") if env.get(name)), None)
        protocol = (env[named] if named else "http/protobuf").strip()
        if protocol not in ("http/protobuf", "grpc"):
            raise ConfigError(f"{named}={protocol!r}: the gateway exports traces over "
                              "http/protobuf or grpc")
        endpoint = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                    or ("http://localhost:4317" if protocol == "grpc"
                        else "http://localhost:4318"))
        return cls(protocol, endpoint,
                   max_queue=_env_int(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048),
                   batch_size=_env_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
                   delay=_env_int(env, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000)

    def exporter(self) -> SpanExporter:
        if self.protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )

            return OTLPSpanExporter()
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )
        except ImportError:
            raise ConfigError("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc needs "
                              "opentelemetry-exporter-otlp-proto-grpc installed "
                              "(or use http/protobuf)") from None
        return cast(SpanExporter, GrpcSpanExporter())


def check_environment(env: Mapping[str, str]) -> None:
    """Raise ``ConfigError`` for an OTEL_* setting the gateway cannot use (before serving:
    the CLI says it as one ``error:`` line)."""
    ExportSettings.from_environment(env).exporter().shutdown()


class FailureLog(logging.Handler):
    """Rule 4. It is also the handler of the exporters' loggers, to learn their reason."""

    def __init__(self, endpoint: str, interval: float = FAILURE_LOG_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(logging.DEBUG)
        self.endpoint = endpoint
        self.interval = interval
        self.clock = clock
        self.last_reason: str | None = None
        self.logged_at: float | None = None
        self.batches = 0
        self.spans = 0
        self.lines = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.last_reason = record.getMessage()[:300]

    def failed(self, spans: int, reason: str | None = None) -> None:
        self.batches += 1
        self.spans += spans
        now = self.clock()
        if self.logged_at is not None and now - self.logged_at < self.interval:
            return
        log.warning("trace export failed", endpoint=self.endpoint,
                    reason=reason or self.last_reason or "the exporter gave no reason",
                    failed_batches=self.batches, dropped_spans=self.spans,
                    next_report_after_s=self.interval)
        self.logged_at, self.batches, self.spans = now, 0, 0
        self.lines += 1


class SpanQueue:
    """Rule 3: a bounded queue from the trio thread to one export thread."""

    def __init__(self, exporter: SpanExporter, *, max_queue: int, batch_size: int,
                 delay: float, dropped: Callable[[str, int], None],
                 exported: Callable[[int], None], failures: FailureLog) -> None:
        self.exporter = exporter
        self.max_queue = max_queue
        self.batch_size = min(batch_size, max_queue)
        self.delay = delay
        self.dropped = dropped
        self.exported = exported
        self.failures = failures
        # Only the trio thread appends and only the export thread pops: the room seen by
        # ``put`` can only grow before it appends, so the bound holds without a lock.
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        #: Set once ``close`` stopped waiting: a batch still exporting is the last.
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, name="nnrp-gateway-trace-export",
                                        daemon=True)

    def __len__(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._thread.start()

    def put(self, spans: Sequence[ReadableSpan]) -> None:
        """Never blocks: what does not fit is dropped and counted."""
        room = self.max_queue - len(self._queue)
        if self._stopping:
            room = 0
        if room < len(spans):
            self.dropped("queue_full" if not self._stopping else "shutdown",
                         len(spans) - max(room, 0))
            spans = spans[:max(room, 0)]
        self._queue.extend(spans)
        if len(self._queue) >= self.batch_size:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.delay)
            self._wake.clear()
            stopping = self._stopping
            while self._queue and not (stopping and self._abandoned):
                count = min(self.batch_size, len(self._queue))
                self._export([self._queue.popleft() for _ in range(count)])
                if not stopping and len(self._queue) < self.batch_size:
                    break  # a partial batch waits for the next delay
            if stopping:
                return

    def _export(self, batch: list[ReadableSpan]) -> None:
        reason = None
        try:
            ok = self.exporter.export(batch) is SpanExportResult.SUCCESS
        except Exception as exc:  # an exporter bug must not end the thread
            ok, reason = False, f"{type(exc).__name__}: {exc}"[:300]
        if ok:
            self.exported(len(batch))
        else:
            self.dropped("export_failed", len(batch))
            self.failures.failed(len(batch), reason)

    def close(self, timeout: float) -> None:
        """Export what is queued within ``timeout``; the rest is dropped (``shutdown``)."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._abandoned = True
        left = len(self._queue)
        self._queue.clear()
        if left:
            self.dropped("shutdown", left)
        self.exporter.shutdown()


class OtelTracer:
    """``Tracer`` over OpenTelemetry's SDK (rules 1-4)."""

    def __init__(self, *, exporter: SpanExporter, provider: TracerProvider, vllm_url: str,
                 dropped: Callable[[str, int], None], exported: Callable[[int], None],
                 max_queue: int = 2048, batch_size: int = 512, delay: float = 5.0,
                 endpoint: str = "") -> None:
        self.sampler = provider.sampler
        self.ids = provider.id_generator
        self.resource = provider.resource
        self.scope = InstrumentationScope(SCOPE, gateway.__version__)
        upstream = urlsplit(vllm_url)
        self.server_address = upstream.hostname or ""
        self.server_port = upstream.port or (443 if upstream.scheme == "https" else 80)
        self.failures = FailureLog(endpoint)
        self.queue = SpanQueue(exporter, max_queue=max_queue, batch_size=batch_size,
                               delay=delay, dropped=dropped, exported=exported,
                               failures=self.failures)

    @classmethod
    def from_environment(cls, *, vllm_url: str, dropped: Callable[[str, int], None],
                         exported: Callable[[int], None],
                         env: Mapping[str, str] | None = None) -> OtelTracer:
        env = os.environ if env is None else env
        settings = ExportSettings.from_environment(env)
        resource = Resource.create({})
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "nnrp-vllm-gateway"}))
        resource = resource.merge(Resource({"service.version": gateway.__version__}))
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        tracer = cls(exporter=settings.exporter(), provider=provider, vllm_url=vllm_url,
                     dropped=dropped, exported=exported, max_queue=settings.max_queue,
                     batch_size=settings.batch_size, delay=settings.delay,
                     endpoint=settings.endpoint)
        tracer.take_exporter_logs()
        return tracer

    def decide(self, trace: TraceInfo | None) -> GatewaySpan:
        """``_spans`` rules 2 and 3: the client's NNRP span as parent when eligible,
        else a new trace; the sampler decides."""
        span_id = self.ids.generate_span_id()
        parent = span_parent(trace)
        if parent is None:
            trace_id, parent_span_id, context = self.ids.generate_trace_id(), None, None
        else:
            trace_id, parent_span_id, sampled = parent
            context = trace_api.set_span_in_context(trace_api.NonRecordingSpan(
                trace_api.SpanContext(trace_id, parent_span_id, is_remote=True,
                                      trace_flags=trace_api.TraceFlags(int(sampled)))))
        result = self.sampler.should_sample(context, trace_id, SAMPLED_NAME,
                                            trace_api.SpanKind.SERVER)
        return GatewaySpan(trace_id, span_id, parent_span_id,
                           result.decision is Decision.RECORD_AND_SAMPLE)

    def export(self, record: ObservationRecord) -> None:
        spans = build_spans(record, upstream_span_id=self.ids.generate_span_id(),
                            server_address=self.server_address, server_port=self.server_port)
        if spans:
            self.queue.put([self._readable(span) for span in spans])

    def _readable(self, span: SpanData) -> ReadableSpan:
        parent = None
        if span.parent_span_id is not None:
            parent = trace_api.SpanContext(span.trace_id, span.parent_span_id,
                                           is_remote=span.remote_parent, trace_flags=_SAMPLED)
        status = (trace_api.Status(trace_api.StatusCode.ERROR, span.error)
                  if span.error is not None else trace_api.Status(trace_api.StatusCode.UNSET))
        return ReadableSpan(
            name=span.name,
            context=trace_api.SpanContext(span.trace_id, span.span_id, is_remote=False,
                                          trace_flags=_SAMPLED),
            parent=parent, resource=self.resource, attributes=dict(span.attributes),
            events=tuple(Event(event.name, dict(event.attributes), event.at_ns)
                         for event in span.events),
            kind=_KINDS[span.kind], status=status, start_time=span.start_ns,
            end_time=span.end_ns, instrumentation_scope=self.scope)

    def take_exporter_logs(self) -> None:
        """Rule 4: the exporters' records go to ``FailureLog`` (for their reason), not to
        the console once per attempt."""
        for name in EXPORTER_LOGGERS:
            logger = logging.getLogger(name)
            logger.addHandler(self.failures)
            logger.propagate = False

    def start(self) -> None:
        self.queue.start()

    def close(self, timeout: float) -> None:
        self.queue.close(timeout)
        for name in EXPORTER_LOGGERS:
            logger = logging.getLogger(name)
            logger.removeHandler(self.failures)
            logger.propagate = True
