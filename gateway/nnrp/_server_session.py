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
   ``invalid_submit_body``). A submit whose body references cached objects (its
   object_reference region) runs when the session's cache (``_cache`` C6) holds each
   one, of its kind, and depends on them from then on (invalidated, it is dropped
   ``object_invalidated``). Each block that does not resolve is answered CACHE_MISS
   (not_found, expired, schema_mismatch) on the submit's frame, then the submit is
   refused ``object_reference_unresolved`` before it becomes an operation. An
   operation's runtime object references (OBJECT_REF, ``_objects`` rule O5) and cache
   dependencies end when it ends.

   a. Delivery. A session is attached to one connection or none (``connection``). An
      operation's frames go to the client only while the session is attached and the
      operation is not ``quiet``: awaiting its resubmission after a resume, or muted
      (its frame had its terminal another way, or it was abandoned). Every frame of a
      resumable session's operations goes to its journal (``_journal``) either way;
      the outputs below return what goes on the wire now, and nothing when nothing does.
   b. After a resume (``resumed``), every operation the journal holds waits for the
      client to resubmit it (``awaiting``; docs/reference/session-recovery.md: nnrp-py's client
      takes
      results for an operation of a resumed session only once it has resubmitted it). A
      FRAME_SUBMIT naming such an operation *and its original frame* is its
      resubmission, checked in this order (``_on_resubmission``):

      | the resubmission                               | answer                | then         |
      |------------------------------------------------|-----------------------|--------------|
      | a position that is no integer >= 0             | 400 invalid_nnrp_policy | still awaits |
      | another request (its key differs: J3)          | 409 resubmission_differs | abandoned |
      | a position past the last result produced       | 400 invalid_nnrp_policy | still awaits |
      | a position before the earliest result held     | 410 results_unavailable | abandoned  |
      | otherwise                                      | the replay (J2), then live |          |

      On another frame it is refused as a duplicate. An operation abandoned ends unseen
      (``OperationAbandoned``: its upstream is aborted). The resubmission of an operation
      whose results are no longer held (``released``: the most recent ``MAX_RELEASED``)
      is answered results_unavailable. A CANCEL of an operation still awaiting its
      resubmission ends its wait: a running one is cancelled and its drop goes out; an
      ended one gets its held terminal again. Either way its terminal is then the
      client's, and a resubmission of it reuses an ended frame (ERROR_RECOVERABLE).
      A migration resubmits nothing: what awaited goes on live (``stop_awaiting``).
   c. Keys. A resumable session's submit, and every resubmission, has its request
      keyed when it is read (``ServerConfig.resubmission``; ``_journal`` J3): here for a
      small one; one whose frames hold ``key_off_loop_bytes`` or more raises
      ``KeyWanted`` before anything of it is done, and the connection holds it, and all
      that came after it, until the I/O layer has computed the key off the event loop
      and handed it back (``supplied_read``); then it is handled as if it had just
      arrived, and the rest in order. A session that is not resumable keys nothing.
15. Exactly one terminal per operation, nothing after it. A drop is preceded by
    TRACE_CONTEXT with header.frame_id 0 (wire case cancel-abort). A send that breaks
    this raises ``LocalProtocolError`` and writes nothing (the transitions are
    ``_server_operation``'s ``OPERATION_TABLE``).
"""

from __future__ import annotations

import enum
import hmac
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

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
    HEADER_LEN,
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
    AbandonCause,
    CancelSource,
    Event,
    OperationAbandoned,
    OperationCancelled,
    OperationResumed,
    OperationSubmitted,
    OperationSuperseding,
    RefusalReason,
    SendBytes,
    SubmitRefused,
    TraceInfo,
)
from ._idruns import IdRuns
from ._journal import Journal, Replay, ReplayGap
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
from ._server_operation import (
    OPERATION_TABLE,
    OpAction,
    OpState,
    PendingDeadline,
    PendingSupersede,
    ServerOperation,
)

if TYPE_CHECKING:
    from ._flow import FlowControl
    from ._server_config import ResubmissionRead, ServerConfig


class Carrier(Protocol):
    """The connection a session is attached to, as the session sees it (``_server``'s
    ``ServerConnection``): the client's flow windows, which its outputs spend."""

    flow: FlowControl

#: Longest diagnostic we write (ASCII/UTF-8 text for a human).
MAX_DIAGNOSTIC = 1024
#: Operations whose results were let go that a resubmission is still answered for.
MAX_RELEASED = 1024


class KeyWanted(Exception):
    """Rule 5c: this submit's key must be computed off the event loop first."""

    def __init__(self, session: ServerSession, body: TypedBody) -> None:
        super().__init__(f"session {session.session_id}: a request key is wanted")
        self.session = session
        self.body = body


class SessionState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"


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
    """One session's protocol state. The connection that holds it attaches it
    (``connection``) and sets ``draining``; a resumable one (``journal``) is granted by
    the ``SessionBook`` and keeps its results (rule 5a).

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
        #: Resume was granted: its journal keeps its results for a replay (rule 5a).
        self.resumable = resumable
        self.journal: Journal | None = None
        #: The connection it is attached to (rule 5a); None while detached.
        self.connection: Carrier | None = None
        #: After a resume: the operations held that the client has not resubmitted yet
        #: (operation id -> frame id; rule 5b).
        self.awaiting: dict[int, int] = {}
        #: Running operations whose frames never reach the client again (rule 5a).
        self.muted: set[int] = set()
        #: Operations no longer replayable, oldest first (bounded: ``MAX_RELEASED``).
        self.released: dict[int, int] = {}
        #: Rule 5c: the key of the submit handled next, computed off the event loop.
        self.supplied_read: ResubmissionRead | None = None
        #: The session's runtime objects (``_objects``; served once negotiated).
        self.objects = ObjectTable(session_id, config.objects, config.object_bytes,
                                   cache=config.cache, clock=clock)

    @property
    def advertises_credit(self) -> bool:
        return "control.credit_backpressure" in self.tokens

    # ------------------------------------------------------------------ delivery (rule 5a, 5b)

    def delivers(self, operation_id: int) -> bool:
        """Whether the operation's frames go to the client now (rule 5a)."""
        operation = self.operations.get(operation_id)
        return (self.connection is not None and operation is not None
                and not operation.quiet)

    def resumed(self) -> bool:
        """Attached again after a resume (rule 5b): every operation the journal holds
        waits for its resubmission. Whether any does."""
        journal = self.journal
        if journal is None:
            return False
        self.awaiting = {operation_id: record.frame_id
                         for operation_id, record in journal.records.items()
                         if operation_id not in self.muted}
        for operation_id in self.awaiting:
            journal.records[operation_id].pinned = True
            operation = self.operations.get(operation_id)
            if operation is not None:
                operation.quiet = True
        return bool(self.awaiting)

    def stop_awaiting(self) -> None:
        """A migration (``_server_lifecycle`` rule 4c): the client resubmits nothing, so what
        awaited its resubmission goes on live (its held results are sent again)."""
        journal = self.journal
        for operation_id in list(self.awaiting):
            del self.awaiting[operation_id]
            if journal is not None:
                journal.pin(operation_id, operation_id in self.muted)
            operation = self.operations.get(operation_id)
            if operation is not None and operation_id not in self.muted:
                operation.quiet = False

    def abandon(self, operation_id: int) -> bool:
        """Nothing more of the operation reaches the client, and nothing of it is held;
        whether it still runs (then the I/O layer ends it)."""
        self.awaiting.pop(operation_id, None)
        self.mute(operation_id)
        if self.journal is not None:
            self.journal.forget(operation_id)
            self._collect_released()
        return operation_id in self.operations

    def abandon_awaiting(self) -> tuple[int, ...]:
        """Every operation still awaiting its resubmission ends unseen (its window
        passed, or the session closes); the running ones, for the I/O layer to end."""
        return tuple(operation_id for operation_id in list(self.awaiting)
                     if self.abandon(operation_id))

    def mute(self, operation_id: int) -> None:
        """Its frame had its terminal another way (a refused resubmission, a failed
        connection's drop): nothing more of it goes out."""
        operation = self.operations.get(operation_id)
        if operation is not None:
            operation.quiet = True
            self.muted.add(operation_id)
            if self.journal is not None:
                self.journal.pin(operation_id, True)

    def _collect_released(self) -> None:
        """The journal let these go: a resubmission of one is results_unavailable."""
        journal = self.journal
        if journal is None or not journal.released:
            return
        for operation_id in journal.released:
            frame_id = self.awaiting.pop(operation_id, None)
            if frame_id is None:
                operation = self.operations.get(operation_id)
                frame_id = operation.frame_id if operation is not None else 0
            self.released[operation_id] = frame_id
            if len(self.released) > MAX_RELEASED:
                del self.released[next(iter(self.released))]
        journal.released.clear()

    def _on_resubmission(self, packet: Packet, submit: FrameSubmit,
                         events: list[Event]) -> None:
        """Rule 5b, in its table's order."""
        operation_id, frame_id = submit.operation_id, packet.frame_id
        journal = self.journal
        record = journal.records.get(operation_id) if journal is not None else None
        if journal is None or record is None:
            self.awaiting.pop(operation_id, None)
            self._refuse_resubmission(operation_id, frame_id, RefusalReason.RESULTS_UNAVAILABLE,
                                      "the results of this operation are no longer held",
                                      events)
            return
        typed_body, body_error = _parse_body(packet, submit)
        read = self._request_read(typed_body)
        if read.problem is not None:
            self._refuse_resubmission(operation_id, frame_id,
                                      RefusalReason.INVALID_NNRP_POLICY, read.problem, events)
            return
        if body_error is not None or not hmac.compare_digest(read.key, record.key):
            self._refuse_resubmission(operation_id, frame_id,
                                      RefusalReason.RESUBMISSION_DIFFERS,
                                      "the resubmission is not the request it resubmits",
                                      events, abandon=True)
            return
        if read.position is not None:
            problem = journal.position_problem(operation_id, read.position)
            if problem is not None:
                self._refuse_resubmission(operation_id, frame_id,
                                          RefusalReason.INVALID_NNRP_POLICY, problem, events)
                return
        try:
            replay = journal.replay(operation_id, read.position)
        except ReplayGap as gap:
            self._refuse_resubmission(operation_id, frame_id,
                                      RefusalReason.RESULTS_UNAVAILABLE,
                                      f"{gap}; submit it anew", events, abandon=True)
            return
        del self.awaiting[operation_id]
        record.pinned = False
        operation = self.operations.get(operation_id)
        if operation is not None:
            operation.quiet = False
        events.append(OperationResumed(self.session_id, operation_id, replay.packets,
                                       replay.partials, read.position, operation is not None))

    def _refuse_resubmission(self, operation_id: int, frame_id: int, reason: RefusalReason,
                             message: str, events: list[Event], *, abandon: bool = False
                             ) -> None:
        events.append(SubmitRefused(self.session_id, operation_id, frame_id, reason, message))
        if abandon and self.abandon(operation_id):
            events.append(OperationAbandoned(self.session_id, operation_id,
                                             AbandonCause.RESUBMISSION_REFUSED))

    def replay_after_frame(self, last_result_frame_id: int) -> Replay:
        """A migration (``_server_lifecycle`` rule 4c): what the journal holds of the operations on
        frames after the client's last, in frame order, of those that reach the client
        now (not awaiting, not muted). The client gave no position and drops repeats by
        sequence; what was trimmed while attached went out long before."""
        journal = self.journal
        if journal is None:
            return Replay((), 0)
        packets: list[bytes] = []
        partials = 0
        for record in sorted(journal.records.values(), key=lambda r: r.frame_id):
            if (record.frame_id <= last_result_frame_id or record.operation_id in self.awaiting
                    or record.operation_id in self.muted):
                continue
            replay = journal.replay(record.operation_id)
            packets += replay.packets
            partials += replay.partials
        return Replay(tuple(packets), partials)

    def end_awaiting(self, operation_id: int, events: list[Event]) -> bool:
        """A CANCEL of an operation awaiting its resubmission (rule 5b): its wait ends. A
        running one goes on live (its drop is on its way: the caller cancels it); an
        ended one's held terminal goes out again. False: it awaits nothing."""
        if operation_id not in self.awaiting:
            return False
        del self.awaiting[operation_id]
        journal = self.journal
        operation = self.operations.get(operation_id)
        if operation is not None:
            operation.quiet = False
            if journal is not None:
                journal.pin(operation_id, False)
            return True
        if journal is not None and operation_id in journal.records:
            for data in journal.terminal(operation_id).packets:
                events.append(SendBytes(data))
            journal.forget(operation_id)
            self._collect_released()
            self.released.pop(operation_id, None)  # its terminal is delivered: nothing more
        return True

    # ------------------------------------------------------------------ submit (rule 5)

    def on_submit(self, packet: Packet, events: list[Event]) -> None:
        submit = packet.message
        assert isinstance(submit, FrameSubmit)
        frame_id, operation_id = packet.frame_id, submit.operation_id
        awaited = self.awaiting.get(operation_id)
        if awaited is not None and awaited == frame_id:
            self._on_resubmission(packet, submit, events)
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
        read = None
        if refusal is None and self.journal is not None:
            read = self._request_read(typed_body)  # rule 5c: before anything is done
        self.seen_frames.add(frame_id)
        self.max_frame_id = max(self.max_frame_id, frame_id)
        if refusal is None:
            refusal = self._object_refusal(operation_id, frame_id, typed_body, events)
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
        if self.journal is not None and read is not None:
            self.journal.start(operation_id, frame_id, read.key)
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

    def _request_read(self, body: TypedBody | None) -> ResubmissionRead:
        """Rule 5c: the request's key (and the position it declares)."""
        read, self.supplied_read = self.supplied_read, None
        if read is not None:
            return read
        if body is not None and sum(
                len(frame.payload) for frame in body.frames) >= self.config.key_off_loop_bytes:
            raise KeyWanted(self, body)
        return self.config.resubmission.read(body)

    def _object_refusal(self, operation_id: int, frame_id: int, typed_body: TypedBody | None,
                        events: list[Event]) -> tuple[RefusalReason, str] | None:
        """Rule 5: a submit whose body references cached objects. Each CACHE_MISS goes on
        the submit's frame with the session's profile (CACHE_MISS carries no operation
        id: the frame is how the client matches it to its submit, as the profile is for
        a CACHE_REFERENCE's miss)."""
        references = typed_body.object_references if typed_body is not None else ()
        if not references:
            return None
        missed = self.objects.cache.resolve(
            (((reference.cache_namespace, reference.cache_key_hi, reference.cache_key_lo),
              reference.object_kind) for reference in references), operation_id)
        if not missed:
            return None  # it runs, depending on each entry (_cache C6)
        for miss in missed:
            namespace, key_hi, key_lo = miss.key
            message = CacheMiss(cache_namespace=namespace, profile_id=self.profile[0],
                                miss_reason=int(miss.reason), cache_key_hi=key_hi,
                                cache_key_lo=key_lo)
            events.append(SendBytes(encode(Packet(message, session_id=self.session_id,
                                                  frame_id=frame_id))))
        reasons = ", ".join(sorted({miss.reason.name.lower() for miss in missed}))
        return (RefusalReason.OBJECT_REFERENCE_UNRESOLVED,
                f"operation {operation_id} references {len(missed)} cached object(s) in "
                f"its object_reference region that this session does not hold ({reasons}; "
                "each was answered CACHE_MISS): CACHE_PUT them first, or send the request "
                "inline")

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
        self.set_state(operation, OPERATION_TABLE[(operation.state, OpAction.CANCEL)])
        events.append(OperationCancelled(self.session_id, operation.operation_id,
                                         operation.frame_id, source, reason, diagnostic))

    def hold(self, operation: ServerOperation, new_operation_id: int,
             diagnostic: bytes, events: list[Event]) -> None:
        """A SUPERSEDE whose replacement has not come: the operation waits for it, at
        most ``supersede_hold_ms`` (rule 9). Only its drop can still reach the client,
        so the adapter is told to stop its work now (``OperationSuperseding``)."""
        self.pending_supersedes[new_operation_id] = PendingSupersede(
            operation.operation_id, diagnostic)
        self.set_state(operation, OPERATION_TABLE[(operation.state, OpAction.HOLD)])
        operation.held_until = self.clock() + self.config.supersede_hold_ms / 1000
        events.append(OperationSuperseding(self.session_id, operation.operation_id,
                                           operation.frame_id))

    def _transition(self, operation_id: int, action: OpAction) -> ServerOperation:
        operation = self.operations.get(operation_id)
        if operation is None:
            raise LocalProtocolError(
                f"{action.value} for operation {operation_id} of session {self.session_id}, "
                "which is not in flight")
        next_state = OPERATION_TABLE.get((operation.state, action))
        if next_state is None:
            raise LocalProtocolError(
                f"{action.value} not allowed for operation {operation_id} in state "
                f"{operation.state.value}")
        self.set_state(operation, next_state)
        if next_state is OpState.DONE:
            del self.operations[operation_id]
            del self.by_frame[operation.frame_id]
            self.objects.retire(operation_id)
            self.muted.discard(operation_id)
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

    def send_partial(self, operation_id: int, body: bytes) -> bytes | None:
        """One PARTIAL_RESULT with the next result_sequence (1, 2, 3, ...), kept in the
        journal and counted against the client's windows; the packet to write now, or
        None when it reaches no client now (rule 5a). Once per event: kept lean."""
        operation = self._transition(operation_id, OpAction.PARTIAL)
        sequence = operation.sequence = operation.sequence + 1
        packet = encode_partial_result(self.session_id, operation.frame_id, operation_id,
                                       sequence, body)
        journal = self.journal
        connection = self.connection
        if journal is not None:
            journal.add(operation_id, packet, sequence)
            if connection is not None and journal.over_budget():
                journal.trim()
                self._collect_released()
        if connection is None or operation.quiet:
            return None
        flow = connection.flow
        if flow.active:
            flow.spend(self.session_id, operation_id)
        return packet

    def send_progress(self, operation_id: int, stage: Stage) -> bytes | None:
        """PROGRESS for an operation still running (never after a cancel: rule 15); the
        packet to write now, or None (rule 5a)."""
        operation = self._transition(operation_id, OpAction.PROGRESS)
        operation.progress_sequence += 1
        message = Progress(operation_id=operation_id,
                           progress_sequence=operation.progress_sequence, stage=int(stage))
        packet = encode(Packet(message, session_id=self.session_id, frame_id=operation.frame_id))
        if self.journal is not None:
            self.journal.add(operation_id, packet)
        return packet if self.connection is not None and not operation.quiet else None

    def send_result(self, operation_id: int, status: int, payload: bytes, *,
                    retry_after_ms: int | None = None,
                    frame: FrameShape = OPENAI_EVENT_FRAME) -> list[bytes]:
        """The terminal RESULT_PUSH: a typed body with one frame of ``payload`` (by default
        the openai-compatible JSON event). With ``retry_after_ms`` (a recoverable
        failure) ERROR_RECOVERABLE and RETRY_AFTER go first, saying when to try again.
        The packets to write now, in order (one WebSocket message each), with the
        session's credit, which changes as the operation ends; none when the operation
        reaches no client now (rule 5a). The journal keeps the terminal either way."""
        operation = self._transition(operation_id, OpAction.RESULT)
        advice = [] if retry_after_ms is None else self._busy(
            operation.frame_id, operation_id, retry_after_ms, payload_status=status)
        return self._terminal(operation, [
            *advice, self._result_packet(operation.frame_id, status, payload, frame)])

    def _terminal(self, operation: ServerOperation, packets: list[bytes]) -> list[bytes]:
        """Rule 15's terminal, kept (rule 5a), and what goes out now."""
        if self.journal is not None:
            self.journal.end(operation.operation_id, packets)
        connection = self.connection
        if connection is None:
            return []
        connection.flow.forget_operation(self.session_id, operation.operation_id)
        if operation.quiet:
            return []
        return packets + self.credit_packets()

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
        naming the operation's trace (rule 15; the reference adapter's terminal trace).
        What goes out now, as ``send_result``."""
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
        return self._terminal(operation, packets)

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
    if packet.discarded:  # over the decoder's cap: read and dropped (``_codec``)
        size = HEADER_LEN + FrameSubmit.LAYOUT.size + packet.discarded
        return None, (f"the submit of {size} bytes exceeds this server's packet limit; "
                      "its body was read and discarded")
    try:
        body = parse_typed_body(packet.body, payload_kind_bitmap=submit.payload_kind_bitmap,
                                payload_frame_count=submit.payload_frame_count)
        check_object_references(body.object_references, submit_mode=submit.submit_mode,
                                object_ref_mask=submit.object_ref_mask)
    except TypedBodyError as exc:
        return None, str(exc)
    return body, None
