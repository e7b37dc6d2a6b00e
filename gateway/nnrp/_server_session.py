"""One server session as NNRP sees it, apart from any connection: its operations, and
every frame the server sends for them.

A ``ServerSession`` is the unit that can outlive its connection (resume, migrate): it
holds everything about the session and nothing about the carrier. The connection that
holds it (``_server.ServerConnection``) dispatches the session's messages to it (the
runtime controls, rules 6 to 14, are ``_server_controls``), keeps the client's flow
windows, and wraps the outputs below; a detached session goes on producing frames for
the record the I/O layer keeps of it.

Rules (numbered as in ``_server``, whose table routes every message):

5. Operations: FRAME_SUBMIT needs a non-zero frame_id and an operation_id unused in the
   session. A duplicate operation id, the in-flight limit, a closing session or a
   draining server *refuse the submit* on its frame (the adapter answers it); a reused
   frame_id cannot be answered on its frame and gets ERROR_RECOVERABLE. A typed body
   that does not parse still becomes an operation (the profile answers
   ``invalid_submit_body``). After a resume, the operations whose results the server
   still holds wait for the client to resubmit them (``awaiting``; session-recovery.md:
   nnrp-py's client takes results for an operation of a resumed session only once it
   has resubmitted it). A FRAME_SUBMIT naming such an operation *and its original frame*
   is that resubmission (``OperationResubmitted``), not a duplicate; on another frame it
   is refused as a duplicate. The resubmission of an operation whose results the server
   no longer holds (``released``: the most recent ``MAX_RELEASED``) is answered on its
   frame: results_unavailable. A submit whose body references cached objects (its
   object_reference region) depends on what this server does not hold (it keeps no
   cache): each reference is answered CACHE_MISS not_found, then the submit is refused
   ``object_reference_unresolved`` before it becomes an operation. An operation's runtime
   object references (OBJECT_REF, ``_objects`` rule O5) end when it ends.
15. Exactly one terminal per operation, nothing after it. A drop is preceded by
    TRACE_CONTEXT with header.frame_id 0 (wire case cancel-abort). A send that breaks
    this raises ``LocalProtocolError`` and writes nothing (``_OPERATION_TABLE``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from ._body import (
    OPENAI_EVENT_FRAME,
    FrameShape,
    TypedBody,
    check_object_references,
    pack_single_frame,
    parse_typed_body,
)
from ._codec import Packet, encode, encode_partial_result
from ._constants import (
    CacheMissReason,
    ControlReason,
    DropFlag,
    DropReason,
    ErrorCode,
    ErrorScope,
    PressureLevel,
    PressureReason,
    RecoverableFlag,
    RetryScopeFlag,
    Role,
    Stage,
    TraceFlag,
)
from ._errors import LocalProtocolError, TypedBodyError
from ._events import (
    CancelSource,
    Event,
    OperationCancelled,
    OperationResubmitted,
    OperationSubmitted,
    OperationSuperseding,
    RefusalReason,
    SendBytes,
    SubmitRefused,
    TraceInfo,
)
from ._idruns import IdRuns
from ._messages import (
    Backpressure,
    CacheMiss,
    CreditUpdate,
    ErrorRecoverable,
    FrameSubmit,
    Progress,
    ResultDropReason,
    ResultPush,
    RetryAfter,
    TraceContext,
)
from ._objects import ObjectTable

if TYPE_CHECKING:
    from ._server_config import ServerConfig

#: Longest diagnostic we write (ASCII/UTF-8 text for a human).
MAX_DIAGNOSTIC = 1024
#: Operations whose results were let go that a resubmission is still answered for.
MAX_RELEASED = 1024


class SessionState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"


class OpState(enum.Enum):
    ACTIVE = "active"
    #: A SUPERSEDE waits for its replacement: the client counts the operation ended, so
    #: only its drop (or a cancel) may follow (rules 9, 15).
    SUPERSEDING = "superseding"
    CANCELLING = "cancelling"  # a cancel arrived: only RESULT_DROP_REASON may follow
    DONE = "done"


class OpAction(enum.Enum):
    PARTIAL = "partial"
    PROGRESS = "progress"
    RESULT = "result"
    DROP = "drop"
    CANCEL = "cancel"
    HOLD = "hold"  # a SUPERSEDE whose replacement has not arrived


#: Operation transitions; a missing entry is a LocalProtocolError (rule 15).
_OPERATION_TABLE: dict[tuple[OpState, OpAction], OpState] = {
    (OpState.ACTIVE, OpAction.PARTIAL): OpState.ACTIVE,
    (OpState.ACTIVE, OpAction.PROGRESS): OpState.ACTIVE,
    (OpState.ACTIVE, OpAction.RESULT): OpState.DONE,
    (OpState.ACTIVE, OpAction.DROP): OpState.DONE,
    (OpState.ACTIVE, OpAction.CANCEL): OpState.CANCELLING,
    (OpState.ACTIVE, OpAction.HOLD): OpState.SUPERSEDING,
    (OpState.SUPERSEDING, OpAction.DROP): OpState.DONE,
    (OpState.SUPERSEDING, OpAction.CANCEL): OpState.CANCELLING,
    (OpState.CANCELLING, OpAction.DROP): OpState.DONE,
    (OpState.CANCELLING, OpAction.CANCEL): OpState.CANCELLING,
}


@attrs.define
class ServerOperation:
    operation_id: int
    frame_id: int
    state: OpState = OpState.ACTIVE
    sequence: int = 0
    progress_sequence: int = 0
    #: The trace the TRACE_CONTEXT before a drop names (the submit's, or a later one).
    trace_id: int = 0
    trace_flags: int = 0
    #: (msg_type, control_sequence) already seen: exact repeats are ignored (rule 6).
    controls: set[tuple[int, int]] = attrs.field(factory=set)
    #: While SUPERSEDING: until when (``clock``) it waits for its replacement.
    held_until: float = 0.0


@attrs.frozen
class PendingDeadline:
    frame_id: int
    deadline_unix_ms: int
    drop_reason: int


@attrs.frozen
class PendingSupersede:
    old_operation_id: int
    diagnostic: bytes


def diagnostic(text: str) -> bytes:
    return text.encode("utf-8", "replace")[:MAX_DIAGNOSTIC]


def recoverable_error(code: ErrorCode, scope: ErrorScope, session_id: int, frame_id: int,
                      text: str) -> SendBytes:
    """ERROR_RECOVERABLE: a refusal the client's session survives (rule 3)."""
    body = diagnostic(text)
    meta = ErrorRecoverable(error_code=int(code), scope=int(scope), role=int(Role.SERVER),
                            related_session_id=session_id, related_frame_id=frame_id,
                            diagnostic_bytes=len(body))
    return SendBytes(encode(Packet(meta, session_id=session_id, frame_id=frame_id,
                                   body=body)))


class ServerSession:
    """One session's protocol state. The connection that holds it sets ``draining``; the
    I/O layer that keeps its results tells it which operations it can still replay
    (``release_results``).

    ``clock`` (seconds, monotonic) times supersede holds; ``wall_clock`` is Unix time,
    for DEADLINE / EXPIRE_AT."""

    def __init__(self, session_id: int, config: ServerConfig, *, max_in_flight: int,
                 priority_class: int = 0, resumable: bool = False,
                 profile: tuple[int, int, int] = (0, 0, 0),
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.session_id = session_id
        #: (profile_id, schema_id, schema_version) it was opened with: a resume asks the
        #: same, or is refused (preview3 section 11.2, rule 4).
        self.profile = profile
        self.config = config
        self.max_in_flight = max_in_flight
        self.priority_class = priority_class
        self.clock = clock
        self.wall_clock = wall_clock
        self.state = SessionState.OPEN
        self.operations: dict[int, ServerOperation] = {}
        self.by_frame: dict[int, int] = {}
        self.seen_operations = IdRuns()
        self.seen_frames = IdRuns()
        self.max_frame_id = 0
        self.pending_deadlines: dict[int, PendingDeadline] = {}
        #: new operation_id -> the supersede waiting for it (rule 9)
        self.pending_supersedes: dict[int, PendingSupersede] = {}
        self.trace: TraceInfo | None = None
        self.last_operation_id = 0
        self.tokens: frozenset[str] = frozenset()
        self.token_budget: int | None = None
        self.retry_sequence = 0
        #: The server drains: submits are refused recoverably (rule 5).
        self.draining = False
        #: Resume was granted: the I/O layer keeps its results for a replay.
        self.resumable = resumable
        #: operation id -> frame id, for every operation whose results may still be
        #: replayed (a superset: the I/O layer releases what it no longer holds).
        self.replayable: dict[int, int] = {}
        #: After a resume: the replayable operations the client has not resubmitted yet.
        self.awaiting: dict[int, int] = {}
        #: Operations no longer replayable, oldest first (bounded: ``MAX_RELEASED``).
        self.released: dict[int, int] = {}
        #: The session's runtime objects (``_objects``; served once negotiated).
        self.objects = ObjectTable(session_id, config.objects)

    @property
    def advertises_credit(self) -> bool:
        return "control.credit_backpressure" in self.tokens

    # ------------------------------------------------------------------ resume (rule 5)

    def resumed(self) -> None:
        """The session is back on a connection after a resume: every operation whose
        results are held waits for its resubmission."""
        self.awaiting = dict(self.replayable)

    def release_results(self, operation_id: int) -> None:
        """The I/O layer holds no more results of this operation: it cannot be replayed,
        and a resubmission of it is a duplicate again."""
        frame_id = self.replayable.pop(operation_id, None)
        self.awaiting.pop(operation_id, None)
        if frame_id is not None:
            self.released[operation_id] = frame_id
            if len(self.released) > MAX_RELEASED:
                del self.released[next(iter(self.released))]

    # ------------------------------------------------------------------ submit (rule 5)

    def on_submit(self, packet: Packet, events: list[Event]) -> None:
        submit = packet.message
        assert isinstance(submit, FrameSubmit)
        frame_id, operation_id = packet.frame_id, submit.operation_id
        awaited = self.awaiting.get(operation_id)
        if awaited is not None and awaited == frame_id:
            del self.awaiting[operation_id]
            typed_body, body_error = _parse_body(packet, submit)
            events.append(OperationResubmitted(self.session_id, operation_id, frame_id,
                                               typed_body, body_error))
            return
        if self.released.get(operation_id) == frame_id:
            del self.released[operation_id]
            events.append(SubmitRefused(
                self.session_id, operation_id, frame_id, RefusalReason.RESULTS_UNAVAILABLE,
                f"the results of operation {operation_id} are no longer held"))
            return
        if frame_id == 0 or frame_id in self.seen_frames:
            # Not answerable on its frame: a refusal to the session (rule 3).
            events.append(recoverable_error(
                ErrorCode.INVALID_STATE, ErrorScope.SESSION, self.session_id, 0,
                f"FRAME_SUBMIT frame_id {frame_id} is zero or already used in this session"))
            self.release_held(operation_id, events)
            return
        self.seen_frames.add(frame_id)
        self.max_frame_id = max(self.max_frame_id, frame_id)
        superseding = self.pending_supersedes.get(operation_id)
        replaces_live = (superseding is not None
                         and superseding.old_operation_id in self.operations)
        refusal: tuple[RefusalReason, str] | None = None
        if operation_id in self.seen_operations:
            refusal = (RefusalReason.DUPLICATE_OPERATION_ID,
                       f"operation_id {operation_id} is already used in this session" + (
                           f" (resubmit it on its frame {awaited})" if awaited else ""))
        elif self.state is SessionState.CLOSING:
            refusal = (RefusalReason.SESSION_CLOSING, "the session is closing")
        elif self.draining:
            refusal = (RefusalReason.DRAINING,
                       "the server is draining; submit on another connection")
        elif len(self.operations) >= self.max_in_flight and not replaces_live:
            refusal = (RefusalReason.OPERATION_LIMIT,
                       f"session has {self.max_in_flight} operations in flight (the limit)")
        typed_body, body_error = (None, None) if refusal else _parse_body(packet, submit)
        if refusal is None:
            refusal = self._object_refusal(operation_id, typed_body, events)
        if refusal is not None:
            events.append(SubmitRefused(self.session_id, operation_id, frame_id, *refusal))
            if operation_id not in self.seen_operations:
                self.release_held(operation_id, events)
            return
        self.seen_operations.add(operation_id)
        self.last_operation_id = operation_id
        trace = self.trace
        operation = ServerOperation(operation_id, frame_id,
                                    trace_id=packet.trace_id or (trace.trace_id if trace else 0),
                                    trace_flags=trace.trace_flags if trace else 0)
        self.operations[operation_id] = operation
        self.by_frame[frame_id] = operation_id
        if self.resumable:
            self.replayable[operation_id] = frame_id
        deadline: int | None = None
        drop_reason = 0
        pending = self.pending_deadlines.pop(operation_id, None)
        if pending is not None:
            if pending.frame_id and pending.frame_id != frame_id:
                events.append(recoverable_error(
                    ErrorCode.INVALID_STATE, ErrorScope.FRAME, self.session_id, frame_id,
                    f"the deadline held for operation {operation_id} named frame "
                    f"{pending.frame_id}, but it was submitted on frame {frame_id}: "
                    "the deadline is not applied"))
            else:
                deadline, drop_reason = pending.deadline_unix_ms, pending.drop_reason
        events.append(OperationSubmitted(
            self.session_id, operation_id, frame_id, submit, typed_body, body_error,
            packet.trace_id, self.trace, deadline, drop_reason,
            priority_class=self.priority_class, token_budget=self.token_budget))
        if superseding is not None:
            del self.pending_supersedes[operation_id]
            old = self.operations.get(superseding.old_operation_id)
            if old is not None:
                self.cancel(old, CancelSource.SUPERSEDE, ControlReason.SUPERSEDED,
                            superseding.diagnostic, events)
        self.advertise_credit(events)

    def _object_refusal(self, operation_id: int, typed_body: TypedBody | None,
                        events: list[Event]) -> tuple[RefusalReason, str] | None:
        """Rule 5: a submit whose body references cached objects."""
        references = typed_body.object_references if typed_body is not None else ()
        if not references:
            return None
        for reference in references:
            miss = CacheMiss(cache_namespace=reference.cache_namespace,
                             miss_reason=int(CacheMissReason.NOT_FOUND),
                             cache_key_hi=reference.cache_key_hi,
                             cache_key_lo=reference.cache_key_lo)
            events.append(SendBytes(encode(Packet(miss, session_id=self.session_id))))
        return (RefusalReason.OBJECT_REFERENCE_UNRESOLVED,
                f"operation {operation_id} references {len(references)} cached object(s) "
                "in its object_reference region; this server holds no cache (each was "
                "answered CACHE_MISS not_found): send the request inline")

    def release_held(self, operation_id: int, events: list[Event]) -> None:
        """A submit that will not run: what was held for it goes (rules 8, 9). Its held
        deadline is forgotten, and an operation it was to replace is dropped superseded
        now (the client asked for it to be replaced; no replacement is coming)."""
        self.pending_deadlines.pop(operation_id, None)
        superseding = self.pending_supersedes.pop(operation_id, None)
        if superseding is not None:
            old = self.operations.get(superseding.old_operation_id)
            if old is not None:
                self.cancel(old, CancelSource.SUPERSEDE, ControlReason.SUPERSEDED,
                            superseding.diagnostic, events)

    # ------------------------------------------------------------------ state (rule 15)

    def set_state(self, operation: ServerOperation, state: OpState) -> None:
        """Every transition goes here, so leaving SUPERSEDING releases its hold."""
        if operation.state is OpState.SUPERSEDING and state is not OpState.SUPERSEDING:
            for new_id, pending in list(self.pending_supersedes.items()):
                if pending.old_operation_id == operation.operation_id:
                    del self.pending_supersedes[new_id]
        operation.state = state

    def cancel(self, operation: ServerOperation, source: CancelSource, reason: int,
               diagnostic: bytes, events: list[Event]) -> None:
        """Rule 7: after a cancel only RESULT_DROP_REASON may end the operation."""
        if operation.state not in (OpState.ACTIVE, OpState.SUPERSEDING):
            return
        self.set_state(operation, _OPERATION_TABLE[(operation.state, OpAction.CANCEL)])
        events.append(OperationCancelled(self.session_id, operation.operation_id,
                                         operation.frame_id, source, reason, diagnostic))

    def hold(self, operation: ServerOperation, new_operation_id: int,
             diagnostic: bytes, events: list[Event]) -> None:
        """A SUPERSEDE whose replacement has not come: the operation waits for it, at
        most ``supersede_hold_ms`` (rule 9). Only its drop can still reach the client,
        so the adapter is told to stop its work now (``OperationSuperseding``)."""
        self.pending_supersedes[new_operation_id] = PendingSupersede(
            operation.operation_id, diagnostic)
        self.set_state(operation, _OPERATION_TABLE[(operation.state, OpAction.HOLD)])
        operation.held_until = self.clock() + self.config.supersede_hold_ms / 1000
        events.append(OperationSuperseding(self.session_id, operation.operation_id,
                                           operation.frame_id))

    def _transition(self, operation_id: int, action: OpAction) -> ServerOperation:
        operation = self.operations.get(operation_id)
        if operation is None:
            raise LocalProtocolError(
                f"{action.value} for operation {operation_id} of session {self.session_id}, "
                "which is not in flight")
        next_state = _OPERATION_TABLE.get((operation.state, action))
        if next_state is None:
            raise LocalProtocolError(
                f"{action.value} not allowed for operation {operation_id} in state "
                f"{operation.state.value}")
        self.set_state(operation, next_state)
        if next_state is OpState.DONE:
            del self.operations[operation_id]
            del self.by_frame[operation.frame_id]
            self.objects.retire(operation_id)
        return operation

    def operation_state(self, operation_id: int) -> OpState:
        """The state of an operation; DONE once it has left the registry."""
        operation = self.operations.get(operation_id)
        return operation.state if operation else OpState.DONE

    def supersede_hold_left(self, operation_id: int) -> float | None:
        """Seconds the superseded operation still waits for its replacement (0 or less:
        the wait is over, drop it superseded); None when it is not held."""
        operation = self.operations.get(operation_id)
        if operation is None or operation.state is not OpState.SUPERSEDING:
            return None
        return operation.held_until - self.clock()

    # ------------------------------------------------------------------ outputs (rule 15)

    def send_partial(self, operation_id: int, body: bytes) -> bytes:
        """One PARTIAL_RESULT with the next result_sequence (1, 2, 3, ...)."""
        operation = self._transition(operation_id, OpAction.PARTIAL)
        operation.sequence += 1
        return encode_partial_result(self.session_id, operation.frame_id, operation_id,
                                     operation.sequence, body)

    def send_progress(self, operation_id: int, stage: Stage) -> bytes:
        """PROGRESS for an operation still running (never after a cancel: rule 15)."""
        operation = self._transition(operation_id, OpAction.PROGRESS)
        operation.progress_sequence += 1
        message = Progress(operation_id=operation_id,
                           progress_sequence=operation.progress_sequence, stage=int(stage))
        return encode(Packet(message, session_id=self.session_id, frame_id=operation.frame_id))

    def send_result(self, operation_id: int, status: int, payload: bytes, *,
                    retry_after_ms: int | None = None,
                    frame: FrameShape = OPENAI_EVENT_FRAME) -> list[bytes]:
        """The terminal RESULT_PUSH: a typed body with one frame of ``payload`` (by default
        the openai-compatible JSON event). With ``retry_after_ms`` (a recoverable
        failure) ERROR_RECOVERABLE and RETRY_AFTER go first, saying when to try again.
        Packets in order (one WebSocket message each); the session's credit, which
        changes as the operation ends, is the caller's to add (``credit_packets``)."""
        operation = self._transition(operation_id, OpAction.RESULT)
        advice = [] if retry_after_ms is None else self._busy(
            operation.frame_id, operation_id, retry_after_ms, payload_status=status)
        return [*advice, self._result_packet(operation.frame_id, status, payload, frame)]

    def send_refusal(self, frame_id: int, operation_id: int, status: int, payload: bytes, *,
                     retry_after_ms: int | None = None) -> list[bytes]:
        """Answer a refused submit (``SubmitRefused``) on its frame; no operation exists."""
        advice = [] if retry_after_ms is None else self._busy(
            frame_id, operation_id, retry_after_ms, payload_status=status)
        return [*advice, self._result_packet(frame_id, status, payload, OPENAI_EVENT_FRAME)]

    def send_drop(self, operation_id: int, drop_reason: DropReason, diagnostic: bytes, *,
                  traced: bool = True) -> list[bytes]:
        """The terminal RESULT_DROP_REASON (after a cancel, a deadline, a supersede, a
        budget or a shutdown); ``traced``: preceded by TRACE_CONTEXT with header.frame_id 0
        naming the operation's trace (rule 15; the reference adapter's terminal trace)."""
        operation = self._transition(operation_id, OpAction.DROP)
        trace_id = operation.trace_id or operation_id
        trace = TraceContext(trace_id=trace_id, span_id=operation.frame_id,
                             stage=int(Stage.DROPPED),
                             trace_flags=operation.trace_flags & int(TraceFlag.SAMPLED))
        meta = ResultDropReason(operation_id=operation_id,
                                result_sequence=operation.sequence + 1,
                                drop_reason=int(drop_reason), source_role=int(Role.SERVER),
                                flags=int(DropFlag.FINAL), diagnostic_bytes=len(diagnostic))
        packets = ([encode(Packet(trace, session_id=self.session_id, trace_id=trace_id))]
                   if traced else [])
        packets.append(encode(Packet(meta, session_id=self.session_id,
                                     frame_id=operation.frame_id, body=diagnostic)))
        return packets

    def drops_on_failure(self) -> list[bytes]:
        """RESULT_DROP_REASON transport_closed for every operation in flight, untraced:
        the connection fails (rule 2) and the session with it. They are the operations'
        terminals: any later send for them raises (rule 15)."""
        drops = [encode(Packet(ResultDropReason(
            operation_id=operation.operation_id, result_sequence=operation.sequence + 1,
            drop_reason=int(DropReason.TRANSPORT_CLOSED), source_role=int(Role.SERVER),
            flags=int(DropFlag.FINAL)), session_id=self.session_id,
            frame_id=operation.frame_id)) for operation in self.operations.values()]
        for operation in list(self.operations.values()):
            self.set_state(operation, OpState.DONE)
        self.operations.clear()
        self.by_frame.clear()
        self.objects.clear()
        return drops

    def _busy(self, frame_id: int, operation_id: int, retry_after_ms: int, *,
              payload_status: int) -> list[bytes]:
        """ERROR_RECOVERABLE (SERVER_BUSY, frame scope) + RETRY_AFTER (the operation), the
        reference adapter's pair before a recoverable terminal."""
        self.retry_sequence += 1
        text = diagnostic(f"recoverable: retry after {retry_after_ms} ms "
                          f"(status {payload_status})")
        error = ErrorRecoverable(
            error_code=int(ErrorCode.SERVER_BUSY), scope=int(ErrorScope.FRAME),
            role=int(Role.SERVER), flags=int(RecoverableFlag.RETRY_AFTER_REQUIRED),
            retry_after_ms=retry_after_ms, related_session_id=self.session_id,
            related_frame_id=frame_id, diagnostic_bytes=len(text))
        retry = RetryAfter(scope_id=operation_id, control_sequence=self.retry_sequence,
                           retry_after_ms=retry_after_ms, role=int(Role.SERVER),
                           flags=int(RetryScopeFlag.OPERATION), diagnostic_bytes=len(text))
        return [encode(Packet(error, session_id=self.session_id, frame_id=frame_id, body=text)),
                encode(Packet(retry, session_id=self.session_id, frame_id=frame_id, body=text))]

    def _result_packet(self, frame_id: int, status: int, payload: bytes,
                       frame: FrameShape) -> bytes:
        meta = ResultPush(status_code=status, payload_kind_bitmap=frame.kind,
                          payload_frame_count=1)
        return encode(Packet(meta, session_id=self.session_id, frame_id=frame_id,
                             body=pack_single_frame(payload, **frame._asdict())))

    def advertise_credit(self, events: list[Event]) -> None:
        events.extend(SendBytes(data) for data in self.credit_packets())

    def credit_packets(self) -> list[bytes]:
        """The session's free operation slots (rule 12), once credit was negotiated."""
        if not self.advertises_credit or self.state is not SessionState.OPEN:
            return []
        free = max(0, self.max_in_flight - len(self.operations))
        if free:
            message: CreditUpdate | Backpressure = CreditUpdate(
                scope_id=self.session_id, credit_window=free, level=int(PressureLevel.NONE))
        else:
            message = Backpressure(
                scope_id=self.session_id, credit_window=0, level=int(PressureLevel.HARD),
                reason=int(PressureReason.RECEIVER_QUEUE_FULL),
                retry_after_ms=self.config.busy_retry_after_ms)
        return [encode(Packet(message, session_id=self.session_id))]

    def refuse(self, code: ErrorCode, scope: ErrorScope, frame_id: int, text: str
               ) -> SendBytes:
        """ERROR_RECOVERABLE about this session (rule 3)."""
        return recoverable_error(code, scope, self.session_id, frame_id, text)


def _parse_body(packet: Packet, submit: FrameSubmit) -> tuple[TypedBody | None, str | None]:
    try:
        body = parse_typed_body(packet.body, payload_kind_bitmap=submit.payload_kind_bitmap,
                                payload_frame_count=submit.payload_frame_count)
        check_object_references(body.object_references, submit_mode=submit.submit_mode,
                                object_ref_mask=submit.object_ref_mask)
    except TypedBodyError as exc:
        return None, str(exc)
    return body, None
