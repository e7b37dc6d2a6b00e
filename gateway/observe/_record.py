"""The observation record: one per operation, from one builder, feeding three outputs.

    Operation + its RecordNotes ─▶ ObservationRecord ─┬─▶ response.diagnostics (NNRP)
                                                      ├─▶ canonical JSON log line
                                                      ├─▶ Prometheus metrics
                                                      └─▶ OpenTelemetry spans (_spans)

The operation gives its ids, its trace context, how it ended, its stages and token
budget; its notes (``_notes.RecordNotes``) what only observers read: the engine's
figures (arrival, events, bytes, resumes) and what the pipeline learned.

``build_record`` is the only place a record is made: once when the operation has ended
(the log line and the metrics), and, when the client asked for diagnostics, once more
just before the terminal, for the ``response.diagnostics`` event (the same builder, the
cause it is about to end with), so the three outputs cannot disagree.

Never in it: trace attribute bodies (only their byte count), API keys, message content.

Trace ids are written the OpenTelemetry way (32 and 16 lowercase hex digits), so log lines
join traces: ``trace_id`` is the NNRP trace id zero-extended (as for ``traceparent``), or
the gateway's own trace when it started one; ``span_id`` is the gateway's span when one is
exported (``parent_span_id`` then names the client's NNRP span), else the client's span.
The fields marked ``SPAN_ONLY`` feed the span alone (wall-clock start, offsets of what
becomes a span event, vLLM's response names): the log line and diagnostics stay as they
were.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from gateway.nnrp import Stage
from gateway.profile import END_TABLE, EndCause, Outcome

from ._notes import GatewaySpan, notes_of

if TYPE_CHECKING:
    from gateway.server import Operation

#: attrs metadata of a field the span reads and the log line does not.
SPAN_ONLY = {"span_only": True}


@attrs.frozen
class ObservationRecord:
    outcome: Outcome
    transport: str
    connection_id: int
    session_id: int
    operation_id: int
    frame_id: int
    model: str | None
    operation: str | None
    request_id: str | None
    stream: bool | None
    queue_delay_ms: float | None
    first_event_ms: float | None
    duration_ms: float | None
    events: int
    event_bytes: int
    inter_event_gap_ms_max: float | None
    usage: dict[str, Any] | None
    upstream_status: int | None
    upstream_ms: float | None
    upstream_aborted: bool
    upstream_abort_ms: float | None
    error_code: str | None
    cancel_source: str | None
    cancel_reason: int | None
    trace_id: str | None
    span_id: str | None
    trace_attribute_bytes: int
    parent_span_id: str | None = None
    #: Stage transitions (the PROGRESS stages), ms after the submit arrived.
    stages: dict[str, float] | None = None
    priority_updates: int | None = None
    token_budget: int | None = None
    tokens_used: int | None = None
    #: Resumes or migrations of its session while it ran, and the events replayed.
    resumed: int | None = None
    replayed_events: int | None = None
    #: vLLM's own timings for the request (its per-request ``metrics``, 0.32+ with
    #: ``--enable-per-request-metrics``), beside the gateway's: queue time in vLLM's
    #: scheduler, TTFT from scheduling, decode time, mean inter-token latency.
    backend_queue_ms: float | None = None
    backend_ttft_ms: float | None = None
    backend_generation_ms: float | None = None
    backend_mean_itl_ms: float | None = None
    backend_tokens_per_second: float | None = None
    #: An overload refusal: "vllm" (its admission control) or "gateway" (load-aware
    #: admission), and the reason.
    refusal_source: str | None = None
    refusal_reason: str | None = None
    #: Why it ended; decides the log level and the metrics (not part of the log line).
    end_cause: EndCause | None = attrs.field(default=None, repr=False)
    #: The span's alone (``SPAN_ONLY``): the submit's arrival on the wall clock, and ms
    #: after it when vLLM was called, when a cancel arrived, when its session resumed.
    received_unix_ns: int | None = attrs.field(default=None, metadata=SPAN_ONLY)
    upstream_start_ms: float | None = attrs.field(default=None, metadata=SPAN_ONLY)
    cancel_ms: float | None = attrs.field(default=None, metadata=SPAN_ONLY)
    resume_ms: tuple[float, ...] = attrs.field(default=(), metadata=SPAN_ONLY)
    response_model: str | None = attrs.field(default=None, metadata=SPAN_ONLY)
    response_id: str | None = attrs.field(default=None, metadata=SPAN_ONLY)
    finish_reasons: tuple[str, ...] | None = attrs.field(default=None, metadata=SPAN_ONLY)
    span: GatewaySpan | None = attrs.field(default=None, metadata=SPAN_ONLY)

    @property
    def log_level(self) -> str:
        return END_TABLE[self.end_cause].log_level if self.end_cause else "info"

    @property
    def upstream_error(self) -> bool:
        return self.end_cause is not None and END_TABLE[self.end_cause].upstream_error

    def as_dict(self) -> dict[str, Any]:
        """The log line's and the diagnostics event's fields: those set, in declaration
        order (read by name: ``attrs.asdict`` with a filter cost as much as building
        the record, once a request)."""
        return {name: value for name in _LOGGED if (value := getattr(self, name)) is not None}


#: The fields the log line and diagnostics carry: all but the end cause and SPAN_ONLY's.
_LOGGED = tuple(field.name for field in attrs.fields(ObservationRecord)
                if field.name != "end_cause" and not field.metadata.get("span_only"))
#: A stage's name in the record (``Enum.name`` is a descriptor call: once a stage).
_STAGE_NAMES = {stage: stage.name.lower() for stage in Stage}


def _ms(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start) * 1000, 3)


def _backend_ms(metrics: dict[str, Any] | None, field: str) -> float | None:
    """One of vLLM's per-request timings (``PerRequestMetrics``, vllm/entrypoints/
    generate/base/protocol.py); None when absent or not a number."""
    value = (metrics or {}).get(field)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return round(float(value), 3)


def build_record(op: Operation, cause: EndCause | None = None) -> ObservationRecord:
    """The record of ``op`` as it stands (``cause`` overrides its end cause: the
    diagnostics event is built just before the terminal)."""
    notes = notes_of(op)
    cause = cause or op.end_cause
    spec = END_TABLE[cause] if cause is not None else None
    received = notes.received_at
    trace = op.trace
    cancel = op.cancel_info
    span = notes.span if notes.span is not None and notes.span.sampled else None
    aborted = (spec is not None and spec.ended_from_outside
               and notes.upstream_started is not None)
    error_code = (str(cause) if spec is not None and cause is not EndCause.COMPLETED
                  and not spec.ended_from_outside else None)
    return ObservationRecord(
        outcome=spec.outcome if spec is not None else Outcome.OK,
        transport=notes.transport,
        connection_id=op.connection_id, session_id=op.session_id,
        operation_id=op.operation_id, frame_id=op.frame_id, model=notes.model,
        operation=notes.operation, request_id=notes.request_id, stream=notes.stream,
        queue_delay_ms=_ms(received, notes.started_at),
        first_event_ms=_ms(received, notes.first_event_at),
        duration_ms=_ms(received, op.terminal_at),
        events=op.events_sent, event_bytes=notes.bytes_sent,
        inter_event_gap_ms_max=round(notes.max_gap * 1000, 3) if notes.max_gap else None,
        usage=notes.usage, upstream_status=notes.upstream_status,
        upstream_ms=_ms(notes.upstream_started, notes.upstream_closed),
        upstream_aborted=aborted,
        upstream_abort_ms=_ms(cancel.at, notes.upstream_closed) if aborted and cancel else None,
        error_code=error_code,
        cancel_source=cancel.source.value if cancel else (
            str(cause) if spec is not None and spec.ended_from_outside else None),
        cancel_reason=cancel.reason if cancel else None,
        trace_id=(f"{span.trace_id:032x}" if span else
                  f"{trace.trace_id:032x}" if trace else None),
        span_id=f"{span.span_id:016x}" if span else f"{trace.span_id:016x}" if trace else None,
        parent_span_id=(f"{span.parent_span_id:016x}"
                        if span and span.parent_span_id is not None else None),
        trace_attribute_bytes=trace.attribute_bytes if trace else 0,
        stages={_STAGE_NAMES[stage]: round((at - received) * 1000, 3)
                for stage, at in op.stages} or None,
        priority_updates=notes.priority_updates or None,
        token_budget=op.token_budget,
        tokens_used=op.tokens_used if op.token_budget is not None else None,
        resumed=len(notes.reattached_at) or None,
        replayed_events=notes.replayed_events or None,
        backend_queue_ms=_backend_ms(notes.backend_metrics, "queue_time_ms"),
        backend_ttft_ms=_backend_ms(notes.backend_metrics, "time_to_first_token_ms"),
        backend_generation_ms=_backend_ms(notes.backend_metrics, "generation_time_ms"),
        backend_mean_itl_ms=_backend_ms(notes.backend_metrics, "mean_itl_ms"),
        backend_tokens_per_second=_backend_ms(notes.backend_metrics, "tokens_per_second"),
        refusal_source=notes.refusal_source, refusal_reason=notes.refusal_reason,
        end_cause=cause,
        received_unix_ns=notes.received_unix_ns,
        upstream_start_ms=_ms(received, notes.upstream_started),
        cancel_ms=_ms(received, cancel.at) if cancel else None,
        resume_ms=tuple(_ms(received, at) or 0.0 for at in notes.reattached_at),
        response_model=notes.response_model, response_id=notes.response_id,
        finish_reasons=notes.finish_reasons, span=span)
