"""OpenTelemetry spans from the observation record: sans-IO (no opentelemetry import).

The rules (the design's "one record, no split-brain"):

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
   gateway's CLIENT span (``GatewaySpan.upstream_span_id``, decided with the operation
   span), only when it is sampled, so vLLM's spans sit under the request that made them.
3. **Sampling** is the configured sampler's (``OTEL_TRACES_SAMPLER``; the default,
   parentbased_always_on, follows the client's sampled bit), asked once per operation
   when the upstream request is built, or when the record is made for an operation that
   never got that far. An unsampled span is never built.
4. **Attributes.** The GenAI semantic conventions describe the *client's* inference span
   (kind CLIENT; "Semantic conventions for generative client AI spans"), and
   ``server.address``/``server.port`` on a SERVER span name the gateway itself. So the
   ``gen_ai.*`` attributes, ``server.*`` and ``url.full`` (vLLM's URL, without userinfo,
   query or fragment) are the CLIENT span's (``CLIENT_ATTRIBUTES``), which is named as
   GenAI names it (``{gen_ai.operation.name} {model}``) and exists only for an inference
   operation that reached vLLM; the SERVER span carries the protocol's ``nnrp.*``
   (``SERVER_ATTRIBUTES``) and is named ``{NNRP operation} {model}``. Never prompt or
   completion text, API keys, resume tokens or trace attribute bodies: none of them is
   in the record to begin with (only the attribute bodies' byte count is), and
   tests/security scans every exported span for them.
5. **Bounded.** The model in a span name is one vLLM serves, else ``other`` (as the
   metrics' ``model`` label: a client's string must not make span names without end),
   and the operation one the gateway knows, else ``nnrp.operation``;
   every string attribute is cut at ``MAX_ATTRIBUTE_CHARS``: ``_otel`` builds the SDK's
   ReadableSpan directly, past the SDK's own attribute limits.
6. **Events** are ``_events``'s (``END_EVENTS`` for the end causes): first token,
   cancel, deadline, supersede, resume, at the record's offsets from the submit's
   arrival.
7. **Status** is ``ERROR_CAUSES``'s, by end cause (not outcome: the outcome ``shed``
   mixes a drain with a load refusal): a failure of vLLM or of the gateway (vLLM's 5xx,
   unreachable, its auth refusing the gateway's key, the gateway's upstream timeout, the
   gateway's own bug) and a refusal for load are errors, the description and
   ``error.type`` the profile's error code (``error.type`` is set only then). The caller's
   own mistakes are not: an invalid request, a model vLLM does not serve or a body vLLM
   refused (its 4xx), a cancel, a drain, a lost peer (the OpenTelemetry rule for SERVER
   spans: the caller's 4xx is not the server's error). A deadline or EXPIRE_AT the client
   set is not either: the client chose how long to wait and the gateway honoured it (as
   a client's cancel); it shows as the ``nnrp.deadline`` event and the span's duration,
   and the gateway's own time limit on vLLM (``request_timeout``) is an error. The
   CLIENT span follows the HTTP client rule instead: any failed exchange, vLLM's 4xx
   included, is ERROR there, ``error.type`` the profile's code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import attrs

from gateway.profile import (
    CAPABILITIES_OPERATION,
    CHAT_COMPLETIONS,
    KNOWN_OPERATIONS,
    TOKEN_COMPLETION,
    EndCause,
)
from gateway.upstream import CHAT_PATH, TEXT_COMPLETION_PATH

if TYPE_CHECKING:
    from gateway.nnrp import TraceInfo

    from ._record import ObservationRecord

AttributeValue = str | int | float | bool | tuple[str, ...]

#: The instrumentation scope's name (the gateway's spans, whatever the service is called).
SCOPE = "nnrp-vllm-gateway"
#: GenAI's ``gen_ai.operation.name`` per NNRP inference operation, and the path vLLM
#: serves it on. Any other operation (``gateway.capabilities``) is not an inference: no
#: ``gen_ai.*`` attribute and no CLIENT span.
GENAI_OPERATIONS = {CHAT_COMPLETIONS: "chat", TOKEN_COMPLETION: "text_completion"}
UPSTREAM_PATHS = {CHAT_COMPLETIONS: CHAT_PATH, TOKEN_COMPLETION: TEXT_COMPLETION_PATH}
#: Rule 5: a string attribute's length at most (characters).
MAX_ATTRIBUTE_CHARS = 256
#: Rule 5: the model in a span name when vLLM does not list it.
OTHER_MODEL = "other"
#: Rule 5: the operations a span name may carry (any other: ``UNNAMED_OPERATION``).
NAMED_OPERATIONS = KNOWN_OPERATIONS | {CAPABILITIES_OPERATION, TOKEN_COMPLETION}
UNNAMED_OPERATION = "nnrp.operation"
#: End causes that make the operation span's status ERROR (rule 7).
ERROR_CAUSES = frozenset({
    # vLLM's fault: a 5xx, no answer, a broken stream.
    EndCause.BACKEND_UNAVAILABLE, EndCause.BACKEND_ERROR,
    # The gateway's: its key refused by vLLM, its own time limit on vLLM, its bugs.
    EndCause.BACKEND_AUTH_FAILED, EndCause.REQUEST_TIMEOUT, EndCause.ADAPTER_RUNTIME_ERROR,
    EndCause.NO_TERMINAL,
    # Refusals for load: vLLM's admission, the gateway's load-aware admission and its
    # operation limit.
    EndCause.BACKEND_OVERLOAD, EndCause.SCHEDULER_REJECTED, EndCause.ADAPTER_OPERATION_LIMIT,
})
#: End causes told as a span event of their own (rule 6), at the terminal.
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


#: The SERVER span's attributes (rule 4): name -> how the record gives it (None: left
#: out). Strings for enums: OTLP carries str, int, float, bool and their arrays only.
SERVER_ATTRIBUTES: dict[str, Callable[[ObservationRecord], AttributeValue | None]] = {
    "nnrp.transport": _field("transport"),
    "nnrp.connection.id": _field("connection_id"),
    "nnrp.session.id": _field("session_id"),
    "nnrp.operation.id": _field("operation_id"),
    "nnrp.operation.name": _field("operation"),
    "nnrp.request.model": _field("model"),
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
}
#: The CLIENT span's GenAI attributes (rule 4), beside its HTTP ones (``_client_span``).
CLIENT_ATTRIBUTES: dict[str, Callable[[ObservationRecord], AttributeValue | None]] = {
    "gen_ai.operation.name": lambda r: GENAI_OPERATIONS.get(r.operation or ""),
    "gen_ai.provider.name": lambda r: "vllm",
    "gen_ai.request.model": _field("model"),
    "gen_ai.response.model": _field("response_model"),
    "gen_ai.response.id": _field("response_id"),
    "gen_ai.response.finish_reasons": _field("finish_reasons"),
    "gen_ai.usage.input_tokens": _usage("prompt_tokens"),
    "gen_ai.usage.output_tokens": _usage("completion_tokens"),
}


def _bounded(value: AttributeValue) -> AttributeValue:
    """Rule 5: strings (alone or in an array) cut at ``MAX_ATTRIBUTE_CHARS``."""
    if isinstance(value, str):
        return value[:MAX_ATTRIBUTE_CHARS]
    if isinstance(value, tuple):
        return tuple(item[:MAX_ATTRIBUTE_CHARS] for item in value)
    return value


def _attributes(rules: Mapping[str, Callable[[ObservationRecord], AttributeValue | None]],
                record: ObservationRecord) -> dict[str, AttributeValue]:
    return {name: _bounded(value) for name, read in rules.items()
            if (value := read(record)) is not None}


def span_model(model: str | None, known_models: frozenset[str]) -> str | None:
    """Rule 5: the model as a span name may carry it."""
    if not model:
        return None
    return model if model in known_models else OTHER_MODEL


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
    #: The status description when the span is an error (rule 7); None: unset.
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
    """Rule 6, in time order."""
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


@attrs.frozen
class Upstream:
    """Where vLLM is, as the CLIENT span tells it (rule 4)."""

    address: str
    port: int
    #: vLLM's base URL without userinfo, query or fragment (``url.full`` adds the path).
    base_url: str


def build_spans(record: ObservationRecord, *, upstream: Upstream,
                known_models: frozenset[str] = frozenset()) -> tuple[SpanData, ...]:
    """The operation's span and its upstream child, from the record alone (rule 1); none
    when the record has no sampled gateway span (rule 3). ``known_models``: the models
    vLLM serves (rule 5)."""
    span = record.span
    if span is None or not span.sampled or record.received_unix_ns is None:
        return ()
    start_ns = record.received_unix_ns
    end_ns = max(start_ns, _at(start_ns, record.duration_ms))
    attributes = _attributes(SERVER_ATTRIBUTES, record)
    error = None
    if record.end_cause in ERROR_CAUSES:
        error = record.error_code or str(record.end_cause)
        attributes["error.type"] = _bounded(error)
    model = span_model(record.model, known_models)
    operation = (record.operation if record.operation in NAMED_OPERATIONS
                 else UNNAMED_OPERATION)
    spans = [SpanData(f"{operation} {model}" if model else operation, "server",
                      span.trace_id, span.span_id, span.parent_span_id,
                      span.parent_span_id is not None, start_ns, end_ns, attributes,
                      _events(record, start_ns, end_ns), error)]
    genai = GENAI_OPERATIONS.get(record.operation or "")
    if record.upstream_start_ms is not None and genai is not None:
        spans.append(_client_span(record, span.trace_id, span.upstream_span_id, span.span_id,
                                  start_ns, upstream, f"{genai} {model}" if model else genai))
    return tuple(spans)


def _client_span(record: ObservationRecord, trace_id: int, span_id: int, parent_id: int,
                 start_ns: int, upstream: Upstream, name: str) -> SpanData:
    """The request to vLLM: GenAI's inference span, over an HTTP client span (rule 4)."""
    upstream_start = _at(start_ns, record.upstream_start_ms)
    upstream_end = max(upstream_start, upstream_start + round(
        (record.upstream_ms or 0.0) * 1_000_000))
    attributes = _attributes(CLIENT_ATTRIBUTES, record)
    attributes.update({
        "http.request.method": "POST", "server.address": _bounded(upstream.address),
        "server.port": upstream.port,
        "url.full": _bounded(upstream.base_url + UPSTREAM_PATHS[record.operation or ""])})
    if record.upstream_status is not None:
        attributes["http.response.status_code"] = record.upstream_status
    if record.upstream_aborted:
        attributes["nnrp.upstream.aborted"] = True
    error = None
    if record.upstream_error or (record.upstream_status or 0) >= 400:
        error = record.error_code or "upstream_error"
        attributes["error.type"] = _bounded(error)
    return SpanData(name, "client", trace_id, span_id, parent_id, False, upstream_start,
                    upstream_end, attributes, error=error)
