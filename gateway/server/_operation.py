"""The operation context: what a handler (the vLLM pipeline) sees of one NNRP operation."""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio

from gateway.nnrp import CancelSource, DropReason, OpState, TraceInfo, TypedBody

if TYPE_CHECKING:
    from ._connection import Connection


class EndReason(enum.Enum):
    """Why an operation's scope was cancelled from outside the handler."""

    PEER_CANCEL = "peer_cancel"
    DEADLINE = "deadline"
    SHUTDOWN = "shutdown"
    DISCONNECT = "disconnect"


@attrs.frozen
class CancelInfo:
    source: CancelSource
    reason: int
    diagnostic: bytes
    at: float  # trio.current_time() when the cancel arrived


class OperationContext:
    """One operation, from its FRAME_SUBMIT to its single terminal.

    Attributes a handler reads: the ids, ``transport``, ``typed_body`` (or
    ``body_error``), ``trace`` (the best trace context so far), ``deadline_unix_ms``,
    ``cancel_scope`` (the handler runs inside it).

    Methods a handler calls: ``emit`` for each non-terminal event (PARTIAL_RESULT) and
    exactly one of ``finish`` (RESULT_PUSH). If the handler returns without a terminal,
    or is cancelled, the connection sends the right RESULT_DROP_REASON itself.

    Error handling: after the terminal, or once a cancel has arrived, ``emit`` and
    ``finish`` raise ``trio.Cancelled`` through the cancelled scope (a cancelled
    operation sends nothing more); calling them with no cancel and after a terminal
    raises ``LocalProtocolError``.
    """

    def __init__(self, connection: Connection, session_id: int, operation_id: int,
                 frame_id: int, typed_body: TypedBody | None, body_error: str | None,
                 header_trace_id: int, trace: TraceInfo | None,
                 deadline_unix_ms: int | None, deadline_drop_reason: int) -> None:
        self._connection = connection
        self.connection_id = connection.connection_id
        self.transport = connection.transport.kind
        self.session_id = session_id
        self.operation_id = operation_id
        self.frame_id = frame_id
        self.typed_body = typed_body
        self.body_error = body_error
        self.header_trace_id = header_trace_id
        self.trace = trace
        self.operation_trace: TraceInfo | None = None
        self.deadline_unix_ms: int | None = None
        self.deadline_drop_reason = DropReason(deadline_drop_reason or DropReason.DEADLINE_EXPIRED)
        self.cancel_scope = trio.CancelScope()
        self.end_reason: EndReason | None = None
        self.cancel_info: CancelInfo | None = None
        self.received_at = trio.current_time()
        self.started_at: float | None = None
        self.first_event_at: float | None = None
        self.last_event_at: float | None = None
        self.max_gap = 0.0
        self.terminal_at: float | None = None
        self.events_sent = 0
        self.bytes_sent = 0
        self.outcome: str | None = None
        #: What the handler learned (the pipeline's OperationNotes), for observation.
        self.notes: object | None = None
        self.finished = trio.Event()
        if deadline_unix_ms:
            self.set_deadline(deadline_unix_ms, self.deadline_drop_reason)

    # ------------------------------------------------------------------ inputs

    def set_deadline(self, deadline_unix_ms: int, drop_reason: DropReason) -> None:
        """Apply an absolute deadline (DEADLINE / EXPIRE_AT) to the operation's scope."""
        if self.deadline_unix_ms is not None and deadline_unix_ms >= self.deadline_unix_ms:
            return  # only ever tighten
        self.deadline_unix_ms = deadline_unix_ms
        self.deadline_drop_reason = drop_reason
        remaining = deadline_unix_ms / 1000 - time.time()
        self.cancel_scope.deadline = min(self.cancel_scope.deadline,
                                         trio.current_time() + max(remaining, 0.0))

    def update_trace(self, trace: TraceInfo, *, operation_scoped: bool) -> None:
        """A TRACE_CONTEXT arrived; operation scope beats the session default."""
        if operation_scoped:
            self.operation_trace = trace
            self.trace = trace
        elif self.operation_trace is None:
            self.trace = trace

    def cancel(self, reason: EndReason, info: CancelInfo | None = None) -> None:
        if self.end_reason is None:
            self.end_reason = reason
            self.cancel_info = info
        self.cancel_scope.cancel()

    # ------------------------------------------------------------------ outputs

    @property
    def is_terminal(self) -> bool:
        return self.terminal_at is not None

    def _check_sendable(self) -> bool:
        state = self._connection.sans_io.operation_state(self.session_id, self.operation_id)
        return state is OpState.ACTIVE and self.end_reason is None

    async def emit(self, body: bytes) -> None:
        """Send one non-terminal event (a PARTIAL_RESULT), waiting out backpressure."""
        await self._connection.outbox.wait_for_room()
        if not self._check_sendable():
            await trio.lowlevel.checkpoint()  # raises Cancelled when the cancel is ours
        data = self._connection.sans_io.send_partial(self.session_id, self.operation_id, body)
        self._connection.write(data)
        now = trio.current_time()
        if self.first_event_at is None:
            self.first_event_at = now
        elif self.last_event_at is not None:
            self.max_gap = max(self.max_gap, now - self.last_event_at)
        self.last_event_at = now
        self.events_sent += 1
        self.bytes_sent += len(body)

    async def finish(self, status: int, payload: bytes, *, outcome: str = "ok") -> None:
        """Send the terminal RESULT_PUSH (typed body with ``payload``)."""
        await self._connection.outbox.wait_for_room()
        if not self._check_sendable():
            await trio.lowlevel.checkpoint()
        data = self._connection.sans_io.send_result(self.session_id, self.operation_id, status,
                                                    payload)
        self._connection.write(data)
        self._mark_terminal(outcome)
        self.bytes_sent += len(payload)

    def _mark_terminal(self, outcome: str) -> None:
        self.terminal_at = trio.current_time()
        if self.first_event_at is None:
            self.first_event_at = self.terminal_at
        self.outcome = outcome


#: The interface the vLLM pipeline implements: run one operation to its terminal.
OperationHandler = Callable[[OperationContext], Awaitable[None]]
