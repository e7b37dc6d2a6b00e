"""The observation record: one per operation, built once, feeding three outputs.

    OperationContext + pipeline notes ─▶ ObservationRecord ─┬─▶ response.diagnostics (NNRP)
                                                            ├─▶ canonical JSON log line
                                                            └─▶ Prometheus metrics

Never in it: trace attribute bodies (only their byte count), API keys, message content.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from gateway.server import OperationContext


@attrs.frozen
class ObservationRecord:
    outcome: str
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

    def as_dict(self) -> dict[str, Any]:
        return {key: value for key, value in attrs.asdict(self).items() if value is not None}


def _ms(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start) * 1000, 3)


def build_record(op: OperationContext) -> ObservationRecord:
    notes = op.notes

    def get(name: str) -> Any:
        return getattr(notes, name, None)

    trace = op.trace
    cancel = op.cancel_info
    upstream_started = get("upstream_started")
    upstream_closed = get("upstream_closed")
    aborted = (op.outcome in ("cancelled", "deadline", "shutdown", "disconnected")
               and upstream_started is not None)
    return ObservationRecord(
        outcome=op.outcome or "unknown", transport=op.transport,
        connection_id=op.connection_id, session_id=op.session_id,
        operation_id=op.operation_id, frame_id=op.frame_id, model=get("model"),
        operation=get("operation"), request_id=get("request_id"), stream=get("stream"),
        queue_delay_ms=_ms(op.received_at, op.started_at),
        first_event_ms=_ms(op.received_at, op.first_event_at),
        duration_ms=_ms(op.received_at, op.terminal_at),
        events=op.events_sent, event_bytes=op.bytes_sent,
        inter_event_gap_ms_max=round(op.max_gap * 1000, 3) if op.max_gap else None,
        usage=get("usage"), upstream_status=get("upstream_status"),
        upstream_ms=_ms(upstream_started, upstream_closed),
        upstream_aborted=aborted,
        upstream_abort_ms=_ms(cancel.at, upstream_closed) if aborted and cancel else None,
        error_code=get("error_code"),
        cancel_source=cancel.source.value if cancel else (
            op.end_reason.value if op.end_reason else None),
        cancel_reason=cancel.reason if cancel else None,
        trace_id=f"{trace.trace_id:016x}" if trace else None,
        span_id=f"{trace.span_id:016x}" if trace else None,
        trace_attribute_bytes=trace.attribute_bytes if trace else 0)
