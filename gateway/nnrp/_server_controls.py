"""What each session-scoped client message does to its session: the runtime controls
(preview4 0x30-0x49 and FRAME_CANCEL), trace context, capability negotiation, and the
session features this server refuses. One function per message kind, each taking the
session it names (the connection's rule table, ``_server._RULES``, routes to them).

Rules (numbered as in ``_server``):

6. Operation-scoped controls (CANCEL, ABORT, PRIORITY_UPDATE, DEADLINE, EXPIRE_AT,
   SUPERSEDE, BUDGET_UPDATE, the hints) name their operation by operation_id; a non-zero
   header.frame_id must be that operation's frame ("keep the (operation_id, frame_id)
   pair", section 3), and 0 is accepted (the Rust runner's client sends 0). An operation
   never seen, or a mismatched frame, gets ERROR_RECOVERABLE INVALID_STATE and changes
   nothing; one that already ended is a normal race and is ignored; an exact repeat
   (same type, operation and control_sequence) is ignored.
7. Cancellation: FRAME_CANCEL names its operation by header.frame_id; CANCEL and ABORT by
   operation_id, 0 meaning every operation of the session. After a cancel only
   RESULT_DROP_REASON may end the operation. One that awaits its resubmission after a
   resume stops waiting (``_server_session`` rule 5b): the client gets its terminal.
8. Deadlines: DEADLINE / EXPIRE_AT for an active operation tighten its deadline; for one
   not yet submitted they are held (bounded; a later one replaces it; dropped when its
   time passes, when its submit is refused, or at SESSION_CLOSE) and applied when its
   submit arrives, if the submit's frame is the one the deadline named (wire case
   deadline-before-submit). DEADLINE drops with deadline_expired, EXPIRE_AT with
   superseded (section 7).
9. SUPERSEDE: the replacement is admitted before the old operation is dropped. If the
   new operation is already in flight (or flags bit0, "abort old now"), the old one is
   cancelled at once; otherwise the old one is SUPERSEDING (the client counts it ended:
   only its drop may follow) until the replacement arrives (it is admitted even at the
   in-flight limit: the old one makes room), is refused, the session closes, or
   ``supersede_hold_ms`` passes (``ServerSession.supersede_hold_left``); then it is
   cancelled. Nothing of a SUPERSEDING operation can be delivered, so the hold begins
   with ``OperationSuperseding``: the adapter stops its work (and its upstream) at once
   and keeps only the operation's place until its drop. One replacement per supersede:
   a second naming the same replacement, or a SUPERSEDE of an operation already
   waiting, is refused. The old operation ends with drop reason superseded.
10. PRIORITY_UPDATE and BUDGET_UPDATE are handed to the adapter, which knows whether the
    operation was dispatched (``PriorityRequested``, ``BudgetRequested``); a refusal is
    ``ServerConnection.refuse_control``. A budget with no token budget is refused here
    (only tokens apply to a language model). ROUTE_HINT / EXECUTION_HINT with must-honor
    set are refused; best-effort hints are noted and ignored.
12. CAPABILITY_NEGOTIATION with a canonical token list is answered with the tokens we
    implement (``ServerConfig.runtime_tokens``): CAPABILITY_NEGOTIATION, or
    DEGRADE_PROFILE when some were dropped and the offer allows downgrade, plus
    ERROR_RECOVERABLE when nothing was accepted and the offer was a hard requirement. An
    opaque body gets no reply (the capability-route-cache wire case wants CACHE_MISS
    next). DEGRADE_PROFILE from a client narrows the session's tokens. With
    ``control.credit_backpressure`` negotiated, the session's free operation slots are
    advertised (CREDIT_UPDATE, or BACKPRESSURE hard when none are left) at once and on
    every change.
13. Features this server does not have are refused in their own message's form:
    SESSION_PATCH gets SESSION_PATCH_ACK rejected. The client's PROGRESS,
    PARTIAL_RESULT, RESULT_DROP_REASON, ERROR_RECOVERABLE, RETRY_AFTER,
    CACHE_MISS, CACHE_ACK, PONG, and messages only a server sends are noted and ignored
    (``FrameIgnored``, with the reason ``IGNORED`` gives; the connection routes them).
14. TRACE_CONTEXT with header.frame_id 0 sets the session default; a non-zero frame_id
    must name an active operation's frame; a non-zero header.trace_id must equal the
    metadata trace_id.
17. Runtime objects (OBJECT_DECLARE, OBJECT_REF, OBJECT_RELEASE, OBJECT_PATCH,
    OBJECT_DELTA) change the session's object table as ``_objects`` rules O1 to O8 say:
    silently when applied; a refusal is ERROR_RECOVERABLE, session scope, with the code
    ``_objects.FAULTS`` gives, and changes nothing. A release that invalidates
    dependents cancels each operation in flight that referenced the object: it ends
    with RESULT_DROP_REASON object_invalidated (rule 7's path, ``CancelSource``
    OBJECT_INVALIDATED).
19. The session's cache (CACHE_PUT, CACHE_REFERENCE, CACHE_INVALIDATE) is ``_cache``'s
    table, rules C1 to C8: CACHE_PUT is answered CACHE_ACK (accepted, replaced or
    rejected with its detail code), a CACHE_REFERENCE to a held entry with nothing and
    to any other with CACHE_MISS, a CACHE_INVALIDATE with nothing. An entry replaced or
    invalidated drops the operations that depended on it as rule 17's release does.
    None needs negotiation (nnrp-py's server takes them so; ``cache.reference`` is
    granted to a client that asks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._codec import Packet, encode
from ._constants import (
    BudgetFlag,
    CacheInvalidateScope,
    CacheMissReason,
    CapabilityFlag,
    ControlReason,
    DropReason,
    ErrorCode,
    ErrorScope,
    HintFlag,
    MsgType,
    PatchAckStatus,
    PatchRejectReason,
    SupersedeFlag,
)
from ._events import (
    BudgetRequested,
    CancelSource,
    CapabilitiesNegotiated,
    DeadlineUpdated,
    Event,
    FrameIgnored,
    PriorityRequested,
    SendBytes,
    TraceContextUpdated,
    TraceInfo,
)
from ._messages import (
    Abort,
    BudgetUpdate,
    CacheAck,
    CacheInvalidate,
    CacheMiss,
    CachePut,
    CacheReference,
    Cancel,
    CapabilityNegotiation,
    Deadline,
    DegradeProfile,
    ExecutionHint,
    ExpireAt,
    ObjectDeclare,
    ObjectDelta,
    ObjectPatch,
    ObjectRef,
    ObjectRelease,
    PriorityUpdate,
    RouteHint,
    SessionPatch,
    SessionPatchAck,
    Supersede,
    TraceContext,
)
from ._objects import DELTA_TOKEN, LIFECYCLE_TOKEN, ObjectFault, ObjectRefusal, Released
from ._server_operation import OpState, PendingDeadline, ServerOperation
from ._server_session import ServerSession, diagnostic
from ._tokens import pack_tokens, parse_tokens

if TYPE_CHECKING:
    from ._cache import CacheKey

#: Why a frame is noted and ignored (rule 13): the FrameIgnored reason.
IGNORED: dict[MsgType, str] = {
    MsgType.PONG: "a PONG answers nothing we sent",
    MsgType.CACHE_ACK: "this server sends no CACHE_PUT",
    MsgType.CACHE_MISS: "this server sends no CACHE_REFERENCE",
    MsgType.PROGRESS: "the openai-compatible profile has no client-side progress",
    MsgType.PARTIAL_RESULT: "the openai-compatible profile has no client-side results",
    MsgType.RESULT_DROP_REASON: "the openai-compatible profile has no client-side results",
    MsgType.ERROR_RECOVERABLE: "noted: a client's recoverable error needs no answer",
    MsgType.RETRY_AFTER: "noted: this server sends nothing a client could ask to retry",
    MsgType.SERVER_HELLO_ACK: "only a server sends it",
    MsgType.SESSION_OPEN_ACK: "only a server sends it",
    MsgType.SESSION_CLOSE_ACK: "only a server sends it",
    MsgType.SESSION_PATCH_ACK: "only a server sends it",
    MsgType.RESULT_PUSH: "only a server sends it",
    MsgType.RESULT_DROP: "only a server sends it",
    MsgType.RESULT_HINT: "only a server sends it",
    MsgType.TRANSPORT_PROBE_ACK: "only a server sends it",
    MsgType.SESSION_MIGRATE_ACK: "only a server sends it",
}

def control_target(session: ServerSession, packet: Packet, operation_id: int,
                   events: list[Event], control_sequence: int | None = None
                   ) -> ServerOperation | None:
    """The active operation an operation-scoped control names, or None (rule 6)."""
    name = packet.msg_type.name
    operation = session.operations.get(operation_id)
    if operation is None:
        if operation_id not in session.seen_operations:
            events.append(session.refuse(
                ErrorCode.INVALID_STATE, ErrorScope.FRAME, packet.frame_id,
                f"{name} names operation {operation_id}, which this session never "
                "submitted"))
        return None  # already ended: a normal race
    if packet.frame_id and packet.frame_id != operation.frame_id:
        events.append(session.refuse(
            ErrorCode.INVALID_STATE, ErrorScope.FRAME, packet.frame_id,
            f"{name}: operation {operation_id} is bound to frame {operation.frame_id}, "
            f"not {packet.frame_id}"))
        return None
    if control_sequence is not None:
        key = (int(packet.msg_type), control_sequence)
        if key in operation.controls:
            events.append(FrameIgnored(session.session_id, int(packet.msg_type),
                                       f"repeats control_sequence {control_sequence}"))
            return None
        if len(operation.controls) < 64:  # bounded: a repeat past this is re-applied
            operation.controls.add(key)
    if operation.state not in (OpState.ACTIVE, OpState.SUPERSEDING):
        return None  # being cancelled: nothing more to apply
    return operation


# --------------------------------------------------------------------------- cancel (rule 7)


def on_frame_cancel(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    awaited = next((operation_id for operation_id, frame_id in session.awaiting.items()
                    if frame_id == packet.frame_id), None)
    if awaited is not None and session.end_awaiting(awaited, events) and (
            awaited not in session.operations):
        return  # it had ended: its held terminal went out again (_server_session rule 5b)
    operation_id = session.by_frame.get(packet.frame_id)
    if operation_id is None:
        if packet.frame_id not in session.seen_frames:
            events.append(session.refuse(
                ErrorCode.INVALID_STATE, ErrorScope.FRAME, packet.frame_id,
                f"FRAME_CANCEL for unknown frame {packet.frame_id}"))
        return  # already ended: a normal race (rule 7)
    session.cancel(session.operations[operation_id], CancelSource.FRAME_CANCEL,
                   ControlReason.USER_CANCELLED, b"", events)


def on_cancel(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, Cancel | Abort)
    if request.operation_id == 0:
        for awaited in list(session.awaiting):
            session.end_awaiting(awaited, events)
        for each in list(session.operations.values()):
            session.cancel(each, CancelSource.SESSION_CANCEL, request.reason, bytes(packet.body),
                           events)
        return
    if session.end_awaiting(request.operation_id, events) and (
            request.operation_id not in session.operations):
        return  # it had ended: its held terminal went out again (_server_session rule 5b)
    operation = control_target(session, packet, request.operation_id, events,
                               request.control_sequence)
    if operation is None:
        return
    source = CancelSource.ABORT if isinstance(request, Abort) else CancelSource.CANCEL
    session.cancel(operation, source, request.reason, bytes(packet.body), events)


# --------------------------------------------------------------------------- deadlines (rule 8)


def on_deadline(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, Deadline | ExpireAt)
    drop = (DropReason.DEADLINE_EXPIRED if isinstance(request, Deadline)
            else DropReason.SUPERSEDED)
    if request.operation_id in session.operations:
        operation = control_target(session, packet, request.operation_id, events,
                                   request.control_sequence)
        if operation is not None:
            events.append(DeadlineUpdated(session.session_id, operation.operation_id,
                                          request.deadline_unix_ms, int(drop)))
        return
    if request.operation_id in session.seen_operations:
        return  # ended already
    # Rule 8: held for a submit to come, on the frame it names.
    if packet.frame_id and packet.frame_id in session.seen_frames:
        events.append(session.refuse(
            ErrorCode.INVALID_STATE, ErrorScope.FRAME, packet.frame_id,
            f"{packet.msg_type.name} for a future submit names frame {packet.frame_id}, "
            "which is already used"))
        return
    now_ms = int(session.wall_clock() * 1000)
    for operation_id, held in list(session.pending_deadlines.items()):
        if held.deadline_unix_ms <= now_ms:
            del session.pending_deadlines[operation_id]  # its submit never came in time
    if (request.operation_id not in session.pending_deadlines
            and len(session.pending_deadlines) >= session.config.max_pending_deadlines):
        events.append(session.refuse(
            ErrorCode.LIMIT_EXCEEDED, ErrorScope.SESSION, packet.frame_id,
            "too many deadlines held for operations not yet submitted"))
        return
    # For an operation not yet submitted the latest word counts ("only tighten" is for a
    # running one): a retry after a refused submit brings its own deadline.
    session.pending_deadlines[request.operation_id] = PendingDeadline(
        packet.frame_id, request.deadline_unix_ms, int(drop))


# --------------------------------------------------------------------------- supersede (rule 9)


def on_supersede(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, Supersede)
    old = control_target(session, packet, request.old_operation_id, events,
                         request.control_sequence)
    if old is None:
        return
    new_id = request.new_operation_id
    if old.state is not OpState.ACTIVE:
        if old.state is OpState.SUPERSEDING:
            events.append(session.refuse(
                ErrorCode.INVALID_STATE, ErrorScope.FRAME, old.frame_id,
                f"operation {old.operation_id} already waits for its replacement"))
        return  # being cancelled already
    abort_now = bool(request.flags & SupersedeFlag.ABORT_OLD_IMMEDIATELY)
    if abort_now or new_id in session.seen_operations or new_id == 0:
        # The replacement was admitted already (or none is coming, or the client says not
        # to wait): the old operation goes now (rule 9).
        session.cancel(old, CancelSource.SUPERSEDE, ControlReason.SUPERSEDED, bytes(packet.body),
                       events)
        return
    waiting = session.pending_supersedes.get(new_id)
    if waiting is not None:
        events.append(session.refuse(
            ErrorCode.INVALID_STATE, ErrorScope.FRAME, old.frame_id,
            f"operation {new_id} is already the replacement of operation "
            f"{waiting.old_operation_id}"))
        return
    if len(session.pending_supersedes) >= session.config.max_pending_supersedes:
        events.append(session.refuse(
            ErrorCode.LIMIT_EXCEEDED, ErrorScope.FRAME, old.frame_id,
            "too many supersedes waiting for their replacement"))
        return
    # The client counts the old operation superseded already: nothing more of it may
    # reach the client but its drop (rule 15). It waits for its replacement, at most
    # supersede_hold_ms.
    session.hold(old, new_id, bytes(packet.body), events)


# --------------------------------------------------------------------------- adapter's (rule 10)


def on_priority(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, PriorityUpdate)
    operation = control_target(session, packet, request.operation_id, events,
                               request.control_sequence)
    if operation is not None:
        events.append(PriorityRequested(session.session_id, operation.operation_id,
                                        operation.frame_id, request.priority_class,
                                        request.priority_delta))


def on_budget(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, BudgetUpdate)
    if not request.token_budget:
        # Compute, memory and bandwidth budgets have no meaning for a language model
        # behind HTTP; only tokens can be counted and capped (rule 10).
        if request.compute_units or request.memory_bytes or request.bandwidth_bytes:
            events.append(session.refuse(
                ErrorCode.UNSUPPORTED_CAPABILITY, ErrorScope.FRAME, packet.frame_id,
                "only token budgets are supported"))
        return
    increment = bool(request.flags & BudgetFlag.INCREMENT)
    if request.operation_id == 0:
        if not increment:
            session.token_budget = request.token_budget
        elif session.token_budget is not None:  # more on top of no limit: no limit
            session.token_budget += request.token_budget
        events.append(BudgetRequested(session.session_id, None, 0, request.token_budget,
                                      increment))
        return
    operation = control_target(session, packet, request.operation_id, events)
    if operation is not None:
        events.append(BudgetRequested(session.session_id, operation.operation_id,
                                      operation.frame_id, request.token_budget, increment))


def on_hint(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, RouteHint | ExecutionHint)
    if request.operation_id and control_target(session, packet, request.operation_id,
                                               events) is None:
        return
    name = packet.msg_type.name
    if request.flags & HintFlag.MUST_HONOR:
        events.append(session.refuse(
            ErrorCode.UNSUPPORTED_CAPABILITY, ErrorScope.FRAME, packet.frame_id,
            f"{name.lower()} cannot be honoured: one vLLM serves this gateway"))
        return
    events.append(FrameIgnored(session.session_id, int(packet.msg_type),
                               "best-effort hint: one vLLM serves this gateway"))


# --------------------------------------------------------------------------- negotiation (rule 12)


def on_capabilities(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, CapabilityNegotiation)
    offered = parse_tokens(bytes(packet.body), request.capability_count)
    if offered is None:
        events.append(FrameIgnored(session.session_id, int(MsgType.CAPABILITY_NEGOTIATION),
                                   "the offer is not a canonical token list"))
        return
    config = session.config
    accepted = frozenset(offered) & config.runtime_tokens
    if request.profile_id not in config.session_profiles:
        accepted = frozenset()
    dropped = len(accepted) < len(offered)
    reply_class: type[CapabilityNegotiation | DegradeProfile] = (
        DegradeProfile if dropped and accepted
        and request.flags & CapabilityFlag.DOWNGRADE_ALLOWED else CapabilityNegotiation)
    body = pack_tokens(accepted)
    reply = reply_class(profile_id=request.profile_id, capability_count=len(accepted),
                        body_bytes=len(body), flags=request.flags)
    events.append(SendBytes(encode(Packet(reply, session_id=session.session_id, body=body))))
    if not accepted and request.flags & CapabilityFlag.HARD_REQUIREMENT:
        events.append(session.refuse(
            ErrorCode.UNSUPPORTED_CAPABILITY, ErrorScope.SESSION, 0,
            "capability_mismatch: none of the required runtime capabilities is served"))
    advertised_before = session.advertises_credit
    session.tokens = accepted
    events.append(CapabilitiesNegotiated(session.session_id, accepted))
    if session.advertises_credit and not advertised_before:
        session.advertise_credit(events)


def on_degrade(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, DegradeProfile)
    kept = parse_tokens(bytes(packet.body), request.capability_count)
    if kept is None:
        events.append(FrameIgnored(session.session_id, int(MsgType.DEGRADE_PROFILE),
                                   "the degrade is not a canonical token list"))
        return
    session.tokens = session.tokens & frozenset(kept)
    events.append(CapabilitiesNegotiated(session.session_id, session.tokens))


# --------------------------------------------------------------------------- trace (rule 14)


def on_trace_context(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, TraceContext)
    if packet.trace_id and packet.trace_id != request.trace_id:
        events.append(session.refuse(
            ErrorCode.INVALID_STATE, ErrorScope.SESSION, packet.frame_id,
            "TRACE_CONTEXT header trace_id differs from its metadata trace_id"))
        return
    trace = TraceInfo(request.trace_id, request.span_id, request.parent_span_id,
                      request.trace_flags, request.body_bytes)
    if packet.frame_id == 0:
        session.trace = trace
        events.append(TraceContextUpdated(session.session_id, None, trace))
        return
    operation_id = session.by_frame.get(packet.frame_id)
    operation = session.operations.get(operation_id) if operation_id else None
    if operation is None or operation.state is not OpState.ACTIVE:
        events.append(session.refuse(
            ErrorCode.INVALID_STATE, ErrorScope.FRAME, packet.frame_id,
            f"TRACE_CONTEXT frame {packet.frame_id} names no active operation"))
        return
    if trace.eligible:
        operation.trace_id, operation.trace_flags = trace.trace_id, trace.trace_flags
    events.append(TraceContextUpdated(session.session_id, operation.operation_id, trace))


# --------------------------------------------------------------------------- not served (rule 13)


def on_session_patch(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, SessionPatch)
    ack = SessionPatchAck(ack_status=int(PatchAckStatus.REJECTED),
                          reject_reason=int(PatchRejectReason.UNSUPPORTED_FIELD),
                          rejected_patch_mask=request.patch_mask,
                          effective_profile_id=request.profile_id)
    events.append(SendBytes(encode(Packet(ack, session_id=session.session_id))))


# --------------------------------------------------------------------------- cache (rule 19)


def _drop_dependents(session: ServerSession, operation_ids: tuple[int, ...], what: str,
                     events: list[Event]) -> None:
    """C5 (and O6): what the operations depended on is gone, and so is their result."""
    for operation_id in operation_ids:
        operation = session.operations.get(operation_id)
        if operation is not None:
            session.cancel(operation, CancelSource.OBJECT_INVALIDATED,
                           ControlReason.DEPENDENCY_FAILED, diagnostic(what), events)


def _key_text(key: CacheKey) -> str:
    namespace, key_hi, key_lo = key
    return f"cache entry {namespace}/{key_hi:016x}{key_lo:016x}"


def on_cache_put(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, CachePut)
    cache = session.objects.cache
    outcome = cache.put(request, packet.body)
    ack = CacheAck(cache_namespace=request.cache_namespace, status=int(outcome.status),
                   cache_key_hi=request.cache_key_hi, cache_key_lo=request.cache_key_lo,
                   accepted_ttl_ms=outcome.ttl_ms, max_object_bytes=cache.max_object_bytes,
                   detail_code=outcome.detail_code)
    events.append(SendBytes(encode(Packet(ack, session_id=session.session_id))))
    key = (request.cache_namespace, request.cache_key_hi, request.cache_key_lo)
    _drop_dependents(session, outcome.invalidated, f"{_key_text(key)} was replaced", events)


def on_cache_reference(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, CacheReference)
    found = session.objects.cache.lookup(
        (request.cache_namespace, request.cache_key_hi, request.cache_key_lo))
    if not isinstance(found, CacheMissReason):
        return  # held: the protocol has no hit message (C4)
    miss = CacheMiss(cache_namespace=request.cache_namespace,
                     profile_id=request.profile_id, miss_reason=int(found),
                     cache_key_hi=request.cache_key_hi, cache_key_lo=request.cache_key_lo)
    events.append(SendBytes(encode(Packet(miss, session_id=session.session_id))))


def on_cache_invalidate(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, CacheInvalidate)
    invalidated = session.objects.cache.invalidate(request)
    scope = CacheInvalidateScope(request.scope).name.lower()
    _drop_dependents(session, invalidated, f"the cache was invalidated ({scope} scope)",
                     events)


# --------------------------------------------------------------------------- objects (rule 17)


def _objects_refused(session: ServerSession, packet: Packet, refusal: ObjectRefusal | None,
                     events: list[Event]) -> None:
    if refusal is not None:
        events.append(session.refuse(
            refusal.code, ErrorScope.SESSION, packet.frame_id,
            f"{packet.msg_type.name}: {refusal.fault.value}: {refusal.text}"))


def _not_negotiated(session: ServerSession, packet: Packet, events: list[Event]) -> bool:
    """O1: object frames need ``object.lifecycle``, deltas ``object.delta`` too."""
    needed = [LIFECYCLE_TOKEN]
    if packet.msg_type in (MsgType.OBJECT_PATCH, MsgType.OBJECT_DELTA):
        needed.append(DELTA_TOKEN)
    missing = [token for token in needed if token not in session.tokens]
    if not missing:
        return False
    _objects_refused(session, packet, ObjectRefusal(
        ObjectFault.NOT_NEGOTIATED,
        f"negotiate {', '.join(missing)} first (CAPABILITY_NEGOTIATION)"), events)
    return True


def on_object_declare(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, ObjectDeclare)
    if not _not_negotiated(session, packet, events):
        _objects_refused(session, packet, session.objects.declare(request), events)


def on_object_ref(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, ObjectRef)
    if _not_negotiated(session, packet, events):
        return
    operation_id = request.operation_id
    _objects_refused(session, packet, session.objects.reference(
        request, operation_in_flight=operation_id in session.operations,
        operation_seen=operation_id in session.seen_operations), events)


def on_object_release(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, ObjectRelease)
    if _not_negotiated(session, packet, events):
        return
    outcome = session.objects.release(request)
    if not isinstance(outcome, Released):
        _objects_refused(session, packet, outcome, events)
        return
    for operation_id in outcome.invalidated:  # O6: its object is gone, so is its result
        operation = session.operations.get(operation_id)
        if operation is not None:
            session.cancel(operation, CancelSource.OBJECT_INVALIDATED,
                           ControlReason.DEPENDENCY_FAILED,
                           diagnostic(f"object {request.object_id} was invalidated"), events)


def on_object_delta(session: ServerSession, packet: Packet, events: list[Event]) -> None:
    request = packet.message
    assert isinstance(request, ObjectPatch | ObjectDelta)
    if not _not_negotiated(session, packet, events):
        _objects_refused(session, packet, session.objects.apply_delta(request, packet.body),
                         events)
