"""OpenTelemetry spans from the observation record: sans-IO (no opentelemetry import).

The rules (issue 24; the design's "one record, no split-brain"):

1. **One record.** A span is built from the ``ObservationRecord`` that also makes the log
   line, the metrics and ``response.diagnostics`` (``build_spans``): nothing is timed or
   counted twice. Two spans per operation: the operation (kind SERVER, submit received
   to terminal) and, when vLLM was called, its child for the upstream request (kind
   CLIENT, request sent to response closed).
2. **Parentage** follows the frozen trace rule (``gateway.pipeline._request``). With an
   eligible client TRACE_CONTEXT the gateway's span is a child of the NNRP span: the same
   trace (the 64-bit NNRP id zero-extended to 128 bits), parent = the NNRP span id
   (``span_parent``), and the client's sampled bit is the parent's. The ``traceparent``
   sent to vLLM is unchanged: it still names the NNRP span. Without one, the gateway
   starts a trace of its own (a root span), and vLLM's ``traceparent`` names the
   gateway's operation span (``GatewaySpan``), only when it is sampled.
3. **Sampling** is the configured sampler's (``OTEL_TRACES_SAMPLER``; the default,
   parentbased_always_on, follows the client's sampled bit), asked once per operation
   when the upstream request is built, or when the record is made for an operation that
   never got that far. An unsampled span is never built.
4. **Attributes** are ``ATTRIBUTES``'s, each a record field or a value derived from one:
   the OpenTelemetry GenAI semantic conventions where they name the thing, ``nnrp.*`` for
   the protocol's own. Never prompt or completion text, API keys, resume tokens or trace
   attribute bodies: none of them is in the record to begin with (only the attribute
   bodies' byte count is), and tests/security scans every exported span for them.
5. **Events** are ``EVENT_RULES``'s: first token, cancel, deadline, supersede, resume, at
   the record's offsets from the submit's arrival.
6. **Status** is ``ERROR_OUTCOMES``'s: failures of the gateway or vLLM (and a refusal for
   load) are errors, the description the profile's error code; a client's own mistake, a
   cancel, a drain or a lost peer are not (the OpenTelemetry rule for server spans: the
   caller's 4xx is not the server's error).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import attrs

from gateway.profile import CHAT_COMPLETIONS, TOKEN_COMPLETION, EndCause, Outcome

if TYPE_CHECKING:
    from gateway.nnrp import TraceInfo

    from ._record import ObservationRecord

AttributeValue = str | int | float | bool | tuple[str, ...]

#: The instrumentation scope's name (the gateway's spans, whatever the service is called).
SCOPE = "nnrp-vllm-gateway"
#: GenAI's ``gen_ai.operation.name`` per NNRP operation; others keep their NNRP name.
GENAI_OPERATIONS = {CHAT_COMPLETIONS: "chat", TOKEN_COMPLETION: "text_completion"}
#: Outcomes that make the span's status ERROR (rule 6).
ERROR_OUTCOMES = frozenset({Outcome.UPSTREAM_ERROR, Outcome.INTERNAL_ERROR, Outcome.DEADLINE,
                            Outcome.SHED})
#: End causes told as a span event of their own (rule 5), at the terminal.
END_EVENTS = {EndCause.DEADLINE_EXPIRED: "nnrp.deadline", EndCause.EXPIRED_AT: "nnrp.deadline",
              EndCause.SUPERSEDED: "nnrp.supersede", EndCause.REQUEST_TIMEOUT: "nnrp.deadline"}


def _usage(key: str) -> Callable[[ObservationRecord], AttributeValue | None]:
    def read(record: ObservationRecord) -> AttributeValue | None:
        value = (record.usage or {}).get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return read


def _field(name: str) -> Callable[[ObservationRecord], AttributeValue | None]:
    def read(record: ObservationRecord) -> AttributeValue | None:
        value: AttributeValue | None = getattr(record, name)
        return value
    return read


#: The operation span's attributes (rule 4): name -> how the record gives it (None: left
#: out). Strings for enums: OTLP carries str, int, float, bool and their arrays only.
ATTRIBUTES: dict[str, Callable[[ObservationRecord], AttributeValue | None]] = {
    "gen_ai.operation.name": lambda r: GENAI_OPERATIONS.get(r.operation or "", r.operation),
    "gen_ai.provider.name": lambda r: "vllm" if r.upstream_start_ms is not None else None,
    "gen_ai.request.model": _field("model"),
    "gen_ai.response.model": _field("response_model"),
    "gen_ai.response.id": _field("response_id"),
    "gen_ai.response.finish_reasons": _field("finish_reasons"),
    "gen_ai.usage.input_tokens": _usage("prompt_tokens"),
    "gen_ai.usage.output_tokens": _usage("completion_tokens"),
    "nnrp.transport": _field("transport"),
    "nnrp.connection.id": _field("connection_id"),
    "nnrp.session.id": _field("session_id"),
    "nnrp.operation.id": _field("operation_id"),
    "nnrp.operation.name": _field("operation"),
    "nnrp.request_id": _field("request_id"),
    "nnrp.stream": _field("stream"),
    "nnrp.outcome": lambda r: str(r.outcome),
    "nnrp.end_cause": lambda r: str(r.end_cause) if r.end_cause is not None else None,
    "nnrp.events": _field("events"),
    "nnrp.event_bytes": _field("event_bytes"),
    "nnrp.cancel.source": _field("cancel_source"),
    "nnrp.cancel.reason": _field("cancel_reason"),
    "nnrp.upstream.aborted": lambda r: r.upstream_aborted or None,
    "nnrp.resumed": _field("resumed"),
    "nnrp.trace.attribute_bytes": lambda r: r.trace_attribute_bytes or None,
    "nnrp.refusal.source": _field("refusal_source"),
    "nnrp.refusal.reason": _field("refusal_reason"),
    "error.type": _field("error_code"),
}


@attrs.frozen
class SpanEvent:
    name: str
    at_ns: int
    attributes: Mapping[str, AttributeValue] = attrs.field(factory=dict)


@attrs.frozen
class SpanData:
    """One span as OTLP will carry it (``_otel`` turns it into the SDK's ReadableSpan)."""

    name: str
    kind: str  # "server" or "client"
    trace_id: int
    span_id: int
    parent_span_id: int | None
    #: The parent lives in another process (the client's NNRP span).
    remote_parent: bool
    start_ns: int
    end_ns: int
    attributes: Mapping[str, AttributeValue]
    events: tuple[SpanEvent, ...] = ()
    #: The status description when the span is an error (rule 6); None: unset.
    error: str | None = None


def span_parent(trace: TraceInfo | None) -> tuple[int, int, bool] | None:
    """The client's NNRP span as the gateway span's parent (rule 2): its trace id (the
    64-bit id zero-extended), span id and sampled bit; None when it is not eligible (the
    same test as ``traceparent``'s)."""
    if trace is None or not trace.eligible:
        return None
    return trace.trace_id, trace.span_id, bool(trace.trace_flags & 1)


def _at(start_ns: int, offset_ms: float | None) -> int:
    """The wall-clock time of a record's offset (ms after the submit arrived)."""
    return start_ns + round((offset_ms or 0.0) * 1_000_000)


def _events(record: ObservationRecord, start_ns: int, end_ns: int) -> tuple[SpanEvent, ...]:
    """Rule 5, in time order."""
    events: list[SpanEvent] = []
    if record.events and record.first_event_ms is not None:
        events.append(SpanEvent("nnrp.first_token", _at(start_ns, record.first_event_ms)))
    for offset in record.resume_ms:
        events.append(SpanEvent("nnrp.resume", _at(start_ns, offset)))
    if record.cancel_ms is not None:
        attributes: dict[str, AttributeValue] = {}
        if record.cancel_source is not None:
            attributes["nnrp.cancel.source"] = record.cancel_source
        if record.cancel_reason is not None:
            attributes["nnrp.cancel.reason"] = record.cancel_reason
        events.append(SpanEvent("nnrp.cancel", _at(start_ns, record.cancel_ms),
                                attributes))
    ended = END_EVENTS.get(record.end_cause) if record.end_cause is not None else None
    if ended is not None:
        events.append(SpanEvent(ended, end_ns, {"nnrp.end_cause": str(record.end_cause)}))
    return tuple(sorted(events, key=lambda event: event.at_ns))


def build_spans(record: ObservationRecord, *, upstream_span_id: int,
                server_address: str, server_port: int) -> tuple[SpanData, ...]:
    """The operation's span and its upstream child, from the record alone (rule 1); none
    when the record has no sampled gateway span (rule 3). ``upstream_span_id`` is the
    child's id (nobody names it before it exists)."""
    span = record.span
    if span is None or not span.sampled or record.received_unix_ns is None:
        return ()
    start_ns = record.received_unix_ns
    end_ns = max(start_ns, _at(start_ns, record.duration_ms))
    attributes = {name: value for name, read in ATTRIBUTES.items()
                  if (value := read(record)) is not None}
    if record.upstream_start_ms is not None:
        attributes["server.address"], attributes["server.port"] = server_address, server_port
    operation = attributes.get("gen_ai.operation.name") or "nnrp.operation"
    name = f"{operation} {record.model}" if record.model else str(operation)
    error = None
    if record.outcome in ERROR_OUTCOMES:
        error = record.error_code or str(record.outcome)
    spans = [SpanData(name, "server", span.trace_id, span.span_id, span.parent_span_id,
                      span.parent_span_id is not None, start_ns, end_ns, attributes,
                      _events(record, start_ns, end_ns), error)]
    if record.upstream_start_ms is not None:
        upstream_start = _at(start_ns, record.upstream_start_ms)
        upstream_end = max(upstream_start, upstream_start + round(
            (record.upstream_ms or 0.0) * 1_000_000))
        upstream: dict[str, AttributeValue] = {
            "http.request.method": "POST", "server.address": server_address,
            "server.port": server_port}
        if record.upstream_status is not None:
            upstream["http.response.status_code"] = record.upstream_status
        if record.upstream_aborted:
            upstream["nnrp.upstream.aborted"] = True
        failed = record.upstream_error or (record.upstream_status or 0) >= 400
        spans.append(SpanData("POST", "client", span.trace_id, upstream_span_id, span.span_id,
                              False, upstream_start, upstream_end, upstream,
                              error=(record.error_code or "upstream_error") if failed else None))
    return tuple(spans)
