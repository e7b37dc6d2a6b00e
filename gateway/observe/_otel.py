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
   needs opentelemetry-exporter-otlp-proto-grpc; anything else is a ``ConfigError``. So
   is every value the SDK would only warn about and replace with its default (a typo
   must not trace at a rate nobody chose, or send no key): a sampler it does not know,
   a ratio sampler's ``OTEL_TRACES_SAMPLER_ARG`` that is not a number in [0, 1], and
   ``OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`` entries that are not ``key=value`` (named by
   position, never shown: a value may be a key). ``OTEL_SDK_DISABLED=true`` is read
   before this module is imported (``_tracing.tracing_disabled``).
   ``OTEL_TRACES_EXPORTER`` picks the exporter: ``otlp`` (the default), ``console`` (the
   SDK's ConsoleSpanExporter, on stdout as the SDK has it, where the serving gateway
   logs too: one span per line, compact JSON, so the stream stays JSON lines; a span has
   ``context`` where a log line has ``event``) or ``none`` (tracing on, nothing exported:
   spans are still decided, so log lines carry trace ids and vLLM its traceparent).
   Anything else, a list included, is a ``ConfigError``; so is an OTLP/HTTP endpoint
   that is not an http(s) URL with a host.
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
5. **Where spans go is said at start** (``OtelTracer.start``): one ``tracing on`` line
   with the exporter, its endpoint and protocol, the sampler (and its ratio) and the
   service name. For OTLP, a thread of its own then tries one TCP connection to the
   collector (``PROBE_TIMEOUT``; never in start-up's way): one it cannot make is a
   warning now, ``trace collector unreachable``, not a failed export seconds after the
   first request. The first failed export is logged at once, with a hint, as ever.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, cast
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

from ._notes import GatewaySpan
from ._spans import SCOPE, SpanData, Upstream, build_spans, span_parent

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
#: Rule 5: how long the start-up check waits for the collector's TCP connection.
PROBE_TIMEOUT = 3.0
#: What to do about a collector that does not answer (rules 4 and 5).
COLLECTOR_HINT = ("is a collector listening there? OTEL_EXPORTER_OTLP_ENDPOINT names "
                  "it; OTEL_TRACES_EXPORTER=console prints spans to stdout instead")
#: ``OTEL_TRACES_EXPORTER``'s values the gateway honours, the SDK's names (rule 1).
EXPORTERS = ("otlp", "console", "none")
_KINDS = {"server": trace_api.SpanKind.SERVER, "client": trace_api.SpanKind.CLIENT}
_SAMPLED = trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED)


#: ``OTEL_TRACES_SAMPLER``'s values as the SDK reads them (lower-cased, unstripped:
#: ``opentelemetry.sdk.trace.sampling._get_from_env_or_default``), and those whose
#: ``OTEL_TRACES_SAMPLER_ARG`` is a ratio.
KNOWN_SAMPLERS = frozenset({"always_on", "always_off", "parentbased_always_on",
                            "parentbased_always_off", "traceidratio",
                            "parentbased_traceidratio"})
RATIO_SAMPLERS = frozenset({"traceidratio", "parentbased_traceidratio"})
HEADER_VARIABLES = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
#: One ``key=value`` of a headers variable, the grammar the OTLP/HTTP exporter accepts
#: (``opentelemetry.util.re``, its "liberal" form: a value may hold spaces).
_HEADER_ENTRY = re.compile(
    r"[ \t]*[\x21\x23-\x27\x2a\x2b\x2d\x2e\x30-\x39\x41-\x5a\x5e-\x7a\x7c\x7e]+"  # the key
    r"[ \t]*=[ \t]*[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*[ \t]*")  # = the value


def check_sampler(env: Mapping[str, str]) -> None:
    """Rule 1: a sampler the SDK knows, and a ratio it can use."""
    raw = env.get("OTEL_TRACES_SAMPLER")
    if not raw:
        return
    if raw.lower() not in KNOWN_SAMPLERS:
        raise ConfigError(f"OTEL_TRACES_SAMPLER={raw!r} is not a sampler OpenTelemetry's SDK "
                          f"knows (one of {', '.join(sorted(KNOWN_SAMPLERS))})")
    argument = env.get("OTEL_TRACES_SAMPLER_ARG", "")
    if raw.lower() not in RATIO_SAMPLERS or not argument:
        return  # the SDK's ratio is 1.0 without one, and other samplers take none
    try:
        ratio = float(argument)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:  # NaN fails this too
        raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG={argument!r}: {raw} needs a ratio "
                          "from 0 to 1")


def check_headers(env: Mapping[str, str]) -> None:
    """Rule 1: every entry of the headers variables is ``key=value``; the value is never
    repeated (it may be a backend's key)."""
    for name in HEADER_VARIABLES:
        for position, entry in enumerate(re.split(r"[ \t]*,[ \t]*", env.get(name, "")), 1):
            if entry and not _HEADER_ENTRY.fullmatch(entry):
                raise ConfigError(f"{name}: entry {position} is not key=value (a key of "
                                  "token characters, then =; its text is not shown)")


def traces_exporter(env: Mapping[str, str]) -> str:
    """Rule 1: ``OTEL_TRACES_EXPORTER`` as the gateway honours it (case-insensitive)."""
    raw = env.get("OTEL_TRACES_EXPORTER", "")
    name = raw.strip().lower() or "otlp"
    if name not in EXPORTERS:
        raise ConfigError(f"OTEL_TRACES_EXPORTER={raw!r}: the gateway exports spans with "
                          "one of otlp (the default), console (JSON lines on stdout) or "
                          "none (nothing exported)")
    return name


def shown_url(url: str) -> str:
    """``url`` fit for a log line: userinfo (which may hold a password) replaced."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}{separator}{authority}{slash}{path}"


def collector_address(url: str) -> tuple[str, int] | None:
    """The host and port a collector URL names (a gRPC one may lack its scheme), or None
    when it names none the start-up check can try (rule 5)."""
    try:
        parts = urlsplit(url if "://" in url else f"//{url}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    if port is None:
        port = {"http": 80, "https": 443}.get(parts.scheme)
    return None if port is None else (parts.hostname, port)


def _check_http_url(name: str, url: str) -> None:
    """Rule 1: an OTLP/HTTP endpoint is an http(s) URL with a host and a numeric port."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (it raises ValueError for a port that is not a number)
        good = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        good = False
    if not good:
        raise ConfigError(f"{name}={shown_url(url)!r}: expected the collector's http:// or "
                          "https:// URL (e.g. http://otel-collector:4318)")


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
    #: The endpoint as the variables give it (the base URL for OTEL_EXPORTER_OTLP_ENDPOINT).
    endpoint: str
    max_queue: int
    batch_size: int
    delay: float
    #: ``OTEL_TRACES_EXPORTER``: otlp, console or none.
    kind: str = "otlp"
    #: Where the OTLP exporter sends, as it resolves the variables (OTLP/HTTP adds
    #: ``/v1/traces`` to OTEL_EXPORTER_OTLP_ENDPOINT); empty: the endpoint as given.
    resolved_url: str = ""

    @property
    def url(self) -> str:
        return self.resolved_url or self.endpoint

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> ExportSettings:
        kind = traces_exporter(env)
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
        url = endpoint
        if protocol == "http/protobuf":
            # As opentelemetry.exporter.otlp.proto.http resolves it.
            if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
                if kind == "otlp":
                    _check_http_url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
            else:
                if kind == "otlp" and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
                    _check_http_url("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
                url = f"{endpoint.removesuffix('/')}/v1/traces"
        return cls(protocol, endpoint,
                   max_queue=_env_int(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048),
                   batch_size=_env_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
                   delay=_env_int(env, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000,
                   kind=kind, resolved_url=url)

    def exporter(self) -> SpanExporter | None:
        """The exporter ``kind`` names; None for ``none``."""
        if self.kind == "none":
            return None
        if self.kind == "console":
            return console_exporter()
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

    def where(self, env: Mapping[str, str], service_name: str) -> dict[str, object]:
        """Rule 5's start-up line: where spans go, and which are sampled."""
        fields: dict[str, object] = {"exporter": self.kind}
        if self.kind == "otlp":
            fields.update(endpoint=shown_url(self.url), protocol=self.protocol)
        elif self.kind == "console":
            fields.update(endpoint="stdout", note="one span per line, JSON, among the log "
                          "lines (a span has \"context\", a log line \"event\")")
        else:
            fields.update(note="OTEL_TRACES_EXPORTER=none: spans are sampled and their ids "
                          "logged and sent to vLLM, but none is exported")
        sampler = (env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").lower()
        fields["sampler"] = sampler
        if sampler in RATIO_SAMPLERS:  # the SDK's 1.0 without an argument (checked before)
            fields["sampler_ratio"] = float(env.get("OTEL_TRACES_SAMPLER_ARG") or 1.0)
        fields["service_name"] = service_name
        return fields


class _SpanLines:
    """The console exporter's stream: ``sys.stdout`` as it is at write time (as the log's
    ``_logging._CurrentStream``), flushed after each span's line, so a line is one write
    however large the batch (with ``--workers``, processes share stdout)."""

    def write(self, text: str) -> int:
        written = sys.stdout.write(text)
        sys.stdout.flush()
        return written

    def flush(self) -> None:
        sys.stdout.flush()


def _span_line(span: ReadableSpan) -> str:
    """One span as one line: the SDK's own JSON, without its indentation."""
    return str(span.to_json(indent=None)) + "\n"


def console_exporter() -> SpanExporter:
    """``OTEL_TRACES_EXPORTER=console``: the SDK's ConsoleSpanExporter, one line a span."""
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    return ConsoleSpanExporter(out=cast("IO[str]", _SpanLines()), formatter=_span_line)


def check_environment(env: Mapping[str, str]) -> None:
    """Raise ``ConfigError`` for an OTEL_* setting the gateway cannot use (before serving:
    the CLI says it as one ``error:`` line)."""
    check_sampler(env)
    check_headers(env)
    exporter = ExportSettings.from_environment(env).exporter()
    if exporter is not None:
        exporter.shutdown()


class FailureLog(logging.Handler):
    """Rule 4. It is also the handler of the exporters' loggers, to learn their reason."""

    def __init__(self, endpoint: str, interval: float = FAILURE_LOG_INTERVAL,
                 clock: Callable[[], float] = time.monotonic, hint: str | None = None
                 ) -> None:
        super().__init__(logging.DEBUG)
        self.endpoint = endpoint
        #: What to do about it, said on each line (the OTLP exporter's: ``COLLECTOR_HINT``).
        self.hint = hint
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
                    next_report_after_s=self.interval,
                    **({"hint": self.hint} if self.hint else {}))
        self.logged_at, self.batches, self.spans = now, 0, 0
        self.lines += 1


class _Discard(SpanExporter):
    """The queue's exporter when nothing exports (``OtelTracer.export`` queues nothing)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


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
        # Only the trio thread appends; the export thread pops, and so does ``close`` (the
        # rest, from its own thread, maybe while the export thread still takes a batch):
        # the room seen by ``put`` can only grow before it appends, so the bound holds
        # without a lock, and every pop is one that may find the queue empty.
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
            while not (stopping and self._abandoned):
                batch = self._take_batch()
                if not batch:
                    break
                self._export(batch)
                if not stopping and len(self._queue) < self.batch_size:
                    break  # a partial batch waits for the next delay
            if stopping:
                return

    def _take_batch(self) -> list[ReadableSpan]:
        """Up to a batch from the queue. ``close`` may empty it from its own thread at any
        moment (after its join timed out), so a length seen here is no promise: pop until
        a pop finds it empty, never count first."""
        batch: list[ReadableSpan] = []
        while len(batch) < self.batch_size:
            try:
                batch.append(self._queue.popleft())
            except IndexError:
                break
        return batch

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
        left = 0
        while True:  # popped one by one: the export thread may still be taking a batch
            try:
                self._queue.popleft()
            except IndexError:
                break
            left += 1
        if left:
            self.dropped("shutdown", left)
        self.exporter.shutdown()

    @property
    def running(self) -> bool:
        """The export thread is still alive (``close`` gave up waiting on it)."""
        return self._thread.is_alive()


def upstream_of(vllm_url: str) -> Upstream:
    """vLLM's place for the CLIENT span: never the URL's userinfo, query or fragment
    (``url.full`` must not carry a secret)."""
    url = urlsplit(vllm_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    host = url.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if url.port is not None:
        netloc += f":{url.port}"
    return Upstream(host, port, f"{url.scheme}://{netloc}{url.path.rstrip('/')}")


class OtelTracer:
    """``Tracer`` over OpenTelemetry's SDK (rules 1-5)."""

    def __init__(self, *, exporter: SpanExporter | None, provider: TracerProvider,
                 vllm_url: str, dropped: Callable[[str, int], None],
                 exported: Callable[[int], None], max_queue: int = 2048,
                 batch_size: int = 512, delay: float = 5.0, endpoint: str = "",
                 where: Mapping[str, object] | None = None,
                 collector: tuple[str, int] | None = None) -> None:
        """``exporter`` None: decide spans, export none (``OTEL_TRACES_EXPORTER=none``).
        ``where``: rule 5's start-up line; ``collector``: the address it checks."""
        self.sampler = provider.sampler
        self.ids = provider.id_generator
        self.resource = provider.resource
        self.scope = InstrumentationScope(SCOPE, gateway.__version__)
        self.upstream = upstream_of(vllm_url)
        #: The models vLLM serves (``_spans`` rule 5), kept current by the health loop.
        self.known_models: frozenset[str] = frozenset()
        self.exporting = exporter is not None
        self.where = dict(where) if where is not None else None
        self.collector = collector
        self.failures = FailureLog(endpoint, hint=COLLECTOR_HINT if collector else None)
        self.queue = SpanQueue(exporter or _Discard(), max_queue=max_queue,
                               batch_size=batch_size, delay=delay, dropped=dropped,
                               exported=exported, failures=self.failures)

    @classmethod
    def from_environment(cls, *, vllm_url: str, dropped: Callable[[str, int], None],
                         exported: Callable[[int], None],
                         env: Mapping[str, str] | None = None) -> OtelTracer:
        env = os.environ if env is None else env
        check_sampler(env)
        check_headers(env)
        settings = ExportSettings.from_environment(env)
        resource = Resource.create({})
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "nnrp-vllm-gateway"}))
        resource = resource.merge(Resource({"service.version": gateway.__version__}))
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        otlp = settings.kind == "otlp"
        tracer = cls(exporter=settings.exporter(), provider=provider, vllm_url=vllm_url,
                     dropped=dropped, exported=exported, max_queue=settings.max_queue,
                     batch_size=settings.batch_size, delay=settings.delay,
                     endpoint=shown_url(settings.url) if otlp else settings.kind,
                     where=settings.where(env, str(resource.attributes["service.name"])),
                     collector=collector_address(settings.url) if otlp else None)
        tracer.take_exporter_logs()
        return tracer

    def decide(self, trace: TraceInfo | None) -> GatewaySpan:
        """``_spans`` rules 2 and 3: the client's NNRP span as parent when eligible,
        else a new trace; the sampler decides."""
        span_id, upstream_span_id = self.ids.generate_span_id(), self.ids.generate_span_id()
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
                           result.decision is Decision.RECORD_AND_SAMPLE, upstream_span_id)

    def export(self, record: ObservationRecord) -> None:
        if not self.exporting:
            return
        spans = build_spans(record, upstream=self.upstream, known_models=self.known_models)
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
        """Rule 5's line and check, then the export thread (none when nothing exports)."""
        if self.where is not None:
            log.info("tracing on", **self.where)
        if self.collector is not None:
            threading.Thread(target=self.check_collector, args=(self.collector,),
                             name="nnrp-gateway-trace-check", daemon=True).start()
        if self.exporting:
            self.queue.start()

    def check_collector(self, address: tuple[str, int],
                        timeout: float = PROBE_TIMEOUT) -> bool:
        """Rule 5: one TCP connection to the collector; a warning when it cannot be made.
        A thread of its own runs it (a name to resolve may take longer than ``timeout``)."""
        try:
            socket.create_connection(address, timeout=timeout).close()
        except OSError as exc:
            log.warning("trace collector unreachable", endpoint=self.failures.endpoint,
                        reason=(str(exc) or type(exc).__name__)[:300],
                        consequence="spans are dropped (export_failed) until it answers",
                        hint=COLLECTOR_HINT)
            return False
        return True

    def close(self, timeout: float) -> None:
        self.queue.close(timeout)
        if self.queue.running:
            # The export thread outlived the timeout and its exporter may still log (the
            # OTLP exporter's "Shutdown in progress, aborting retry."): restored now, that
            # record would reach the console raw, a line that is not JSON. ``FailureLog``
            # keeps taking them; the thread is a daemon and ends with the process.
            return
        for name in EXPORTER_LOGGERS:
            logger = logging.getLogger(name)
            logger.removeHandler(self.failures)
            logger.propagate = True


@attrs.frozen
class TracingCost:
    """What tracing costs per operation in this process, on each thread's own CPU clock
    (``measure_cost``): the event loop's share and the export thread's."""

    operations: int
    #: µs of CPU per operation on the event loop: decide the span (ids, the sampler),
    #: build both spans from the record, make them ReadableSpans, queue them.
    event_loop_us: float
    #: µs of CPU per operation on the export thread: OTLP's protobuf encoding of its
    #: two spans, as the OTLP/HTTP exporter encodes a batch (sending is not counted).
    export_us: float
    spans: int
    encoded_bytes: int


class _EncodingExporter(SpanExporter):
    """Encodes each batch as the OTLP/HTTP exporter does, sends nothing, and counts the
    CPU of the thread it runs on (the export thread)."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.bytes = 0
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        start = time.thread_time()
        self.bytes += len(encode_spans(spans).SerializePartialToString())
        self.cpu_s += time.thread_time() - start
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def measure_cost(record: ObservationRecord, trace: TraceInfo | None, *, operations: int,
                 vllm_url: str) -> TracingCost:
    """``operations`` times what tracing adds to one operation like ``record`` (every one
    sampled), through the gateway's own tracer and queue: ``time.thread_time`` on this
    thread around ``decide`` and ``export`` (the record itself is the log line's and the
    metrics', made with or without tracing, so it is not counted), and on the export
    thread around the encoding."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    drops: list[int] = []
    exporter = _EncodingExporter()
    tracer = OtelTracer(exporter=exporter,
                        provider=TracerProvider(sampler=ALWAYS_ON, shutdown_on_exit=False),
                        vllm_url=vllm_url, dropped=lambda reason, n: drops.append(n),
                        exported=lambda n: None, max_queue=2 * operations, batch_size=512,
                        delay=3600.0)
    tracer.known_models = frozenset({record.model or ""})
    start = time.thread_time()
    spans = [tracer.decide(trace) for _ in range(operations)]
    deciding = time.thread_time() - start
    records = [attrs.evolve(record, span=span) for span in spans]
    start = time.thread_time()
    for each in records:
        tracer.export(each)
    exporting = time.thread_time() - start
    tracer.start()  # after the queueing: the export thread's CPU is not this thread's
    tracer.close(600.0)
    if drops or exporter.spans != 2 * operations:
        raise RuntimeError(f"measured {exporter.spans} spans of {2 * operations} "
                           f"({sum(drops)} dropped)")
    return TracingCost(operations, (deciding + exporting) / operations * 1e6,
                       exporter.cpu_s / operations * 1e6, exporter.spans, exporter.bytes)
