"""Envelope -> upstream HTTP request; NNRP trace context -> W3C ``traceparent``.

Frozen traceparent rules (docs/reference/original-plan.md, "The mapping"): an eligible context has a
non-zero trace_id and span_id; it becomes exactly one header
``00-0000000000000000{trace_id:016x}-{span_id:016x}-{flags&1:02x}`` (the 64-bit NNRP
trace id zero-extended to W3C's 128 bits, only the sampled bit kept), frozen when the
request is dispatched. It is never copied into the OpenAI body, and attribute bodies
are counted, never forwarded or logged.

With tracing on (``gateway.observe._spans`` rule 2) the rule above still
decides first and its bytes are unchanged; only an operation without an eligible client
context whose own gateway span was sampled sends the gateway's request to vLLM (the
operation span's CLIENT child, ``GatewaySpan.upstream_span_id``) as vLLM's parent, so
vLLM's spans sit under that request: ``00-{trace_id:032x}-{upstream_span_id:016x}-01``.

A priority class (the session's, or a PRIORITY_UPDATE's) becomes vLLM's ``priority``
(``vllm_priority``): lower is served earlier, and 0 is vLLM's default, which the default
class (balanced, what stock clients open) keeps, so NNRP traffic neither overtakes nor
trails other clients of the same vLLM unless it asks: interactive -10, balanced 0,
background 10; ``priority_delta`` fine-tunes.

Every request of an operation also carries its NNRP session's opaque id
(``Operation.session_uid``: random, drawn once per session, kept across resumes, unique
across gateways) as ``X-Session-ID``, what a router in front of data-parallel vLLM
engines hashes to keep one session's requests, and so their shared prefixes, on one
engine; ``PipelineLimits.session_header`` turns it off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from gateway.nnrp import PriorityClass
from gateway.profile import EndCause, ProfileError
from gateway.upstream import RequestFieldError, is_streaming, usage_requested

if TYPE_CHECKING:
    from gateway.nnrp import TraceInfo
    from gateway.observe import GatewaySpan
    from gateway.profile import Envelope


#: The session affinity header (``X-Session-ID``; httpx sends names as given).
SESSION_HEADER = "x-session-id"
#: vLLM's ``priority`` a priority class away from balanced (module docstring).
VLLM_PRIORITY_STEP = 10


def vllm_priority(priority_class: int, priority_delta: int) -> int | None:
    """vLLM's ``priority`` for an NNRP priority class and delta; None when it is vLLM's
    default (0)."""
    value = (priority_class - PriorityClass.BALANCED) * VLLM_PRIORITY_STEP + priority_delta
    return value or None


def traceparent(trace: TraceInfo | None) -> str | None:
    """The W3C traceparent for an NNRP trace context, or None when it is not eligible."""
    if trace is None or not trace.eligible:
        return None
    return f"00-{0:016x}{trace.trace_id:016x}-{trace.span_id:016x}-{trace.trace_flags & 1:02x}"


def upstream_traceparent(trace: TraceInfo | None, span: GatewaySpan | None) -> str | None:
    """The traceparent vLLM gets: the client's NNRP span as always; else the gateway's own
    request to vLLM (the CLIENT span), when it starts the trace and the sampler kept it;
    else none."""
    parent = traceparent(trace)
    if parent is not None or span is None or not span.sampled or span.parent_span_id is not None:
        return parent
    return f"00-{span.trace_id:032x}-{span.upstream_span_id:016x}-01"


def upstream_headers(request_id: str, session_uid: str | None) -> dict[str, str]:
    """The ids every upstream request of an operation carries: ``x-request-id``, and the
    session's ``X-Session-ID`` when given."""
    if session_uid is None:
        return {"x-request-id": request_id}
    return {"x-request-id": request_id, SESSION_HEADER: session_uid}


@attrs.frozen
class UpstreamRequest:
    body: dict[str, Any]
    headers: dict[str, str]
    request_id: str
    stream: bool
    usage_requested: bool


def build_request(envelope: Envelope, *, session_id: int, operation_id: int,
                  connection_id: int, trace: TraceInfo | None,
                  span: GatewaySpan | None = None,
                  session_uid: str | None = None) -> UpstreamRequest:
    """The body exactly as sent, plus ``stream_options.include_usage`` for streams (usage is
    always recorded; the usage *event* is only for clients that asked). ``stream`` and
    ``stream_options`` are read as vLLM reads them (``upstream._request_fields``); a value
    vLLM would not read is refused here, before anything is generated. ``session_uid``,
    when given, goes as ``X-Session-ID``."""
    body = dict(envelope.body)
    try:
        stream = is_streaming(body)
        usage = stream and usage_requested(body)
    except RequestFieldError as error:
        raise ProfileError(EndCause.INVALID_BODY, str(error), param=error.field) from None
    if stream:
        merged = dict(body.get("stream_options") or {})
        merged["include_usage"] = True
        body["stream_options"] = merged
    request_id = envelope.request_id or f"nnrp-{connection_id}-{session_id}-{operation_id}"
    headers = upstream_headers(request_id, session_uid)
    parent = upstream_traceparent(trace, span)
    if parent is not None:
        headers["traceparent"] = parent
    return UpstreamRequest(body, headers, request_id, stream, usage)
