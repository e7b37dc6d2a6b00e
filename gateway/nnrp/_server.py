"""The server side of an NNRP/1 connection, as a sans-IO state machine.

Everything that changes connection, session or operation state lives here; the I/O
adapter (gateway.server) feeds bytes in and acts on the events that come out.

Rules (the ``_RULES`` table at the bottom has one row per preview4 message type; each
row names its acceptance scope and its handler, and each handler cites its rule):

1. Connection start. ``AWAIT_HELLO`` accepts TRANSPORT_PROBE (answered with PROBE_ACK)
   and CLIENT_HELLO. Anything else before the hello (garbage, a bad magic, a
   SESSION_OPEN) closes the connection *without a reply*, as the reference server does
   (nnrp-wire.md section 5). A hello whose profile bitmap does not meet ours also closes
   it silently (section 1, step 3).
2. Only malformed or unknown input closes a connection in ``READY``: framing and header
   errors, an unknown msg_type, a second CLIENT_HELLO. Every operation still in flight,
   of every session, gets RESULT_DROP_REASON transport_closed; then a fatal ERROR with
   session_id 0 (which nnrp-py's native client ignores), then the close. Every other
   well-formed frame has a rule below, and none of them closes the connection.
3. Refusals never break a session. A control that cannot be honoured is answered with
   ERROR_RECOVERABLE, scoped to its frame or session: nnrp-py's native client delivers
   it as an event, whereas a session-scoped ERROR (0x06) wedges that client's session
   (research: docs/runtime-controls.md). A frame naming a session that is not open is
   answered with a non-fatal ERROR carrying session_id 0 and ``related_session_id``.
4. Sessions: SESSION_OPEN gets SESSION_OPEN_ACK with the requested id when free, else
   the lowest free id from 1. Refusals (profile, schema, resume, limit, auth) are an ACK
   with status rejected, an error code and a UTF-8 diagnostic. While the server drains,
   the status is retry_later (``start_draining``).
5. Operations: FRAME_SUBMIT needs a non-zero frame_id and operation_id unused in the
   session. A duplicate operation id, the in-flight limit, a closing session or a
   draining server *refuse the submit* on its frame (the adapter answers it); a reused
   frame_id cannot be answered on its frame and gets ERROR_RECOVERABLE. A typed body
   that does not parse still becomes an operation (the profile answers
   ``invalid_submit_body``).
6. Operation-scoped controls (CANCEL, ABORT, PRIORITY_UPDATE, DEADLINE, EXPIRE_AT,
   SUPERSEDE, BUDGET_UPDATE, the hints) name their operation by operation_id; a non-zero
   header.frame_id must be that operation's frame ("keep the (operation_id, frame_id)
   pair", section 3), and 0 is accepted (the Rust runner's client sends 0). An operation
   never seen, or a mismatched frame, gets ERROR_RECOVERABLE INVALID_STATE and changes
   nothing; one that already ended is a normal race and is ignored; an exact repeat
   (same type, operation and control_sequence) is ignored.
7. Cancellation: FRAME_CANCEL names its operation by header.frame_id; CANCEL and ABORT by
   operation_id, 0 meaning every operation of the session. After a cancel only
   RESULT_DROP_REASON may end the operation.
8. Deadlines: DEADLINE / EXPIRE_AT for an active operation tighten its deadline; for one
   not yet submitted they are held (bounded; a later one replaces it; dropped when its
   time passes, when its submit is refused, or at SESSION_CLOSE) and applied when its
   submit arrives, if the submit's frame is the one the deadline named (wire case
   deadline-before-submit). DEADLINE drops with deadline_expired, EXPIRE_AT with
   superseded (section 7).
9. SUPERSEDE: the replacement is admitted before the old operation is dropped. If the
   new operation is already in flight (or flags bit0, "abort old now"), the old one is
   cancelled at once; otherwise the old one is SUPERSEDING (the client counts it ended:
   only its drop may follow, ``_OPERATION_TABLE``) until the replacement arrives (it is
   admitted even at the in-flight limit: the old one makes room), is refused, the
   session closes, or ``supersede_hold_ms`` passes (``supersede_hold_left``); then it is
   cancelled. One replacement per supersede: a second naming the same replacement, or
   a SUPERSEDE of an operation already waiting, is refused. The old operation ends with
   drop reason superseded.
10. PRIORITY_UPDATE and BUDGET_UPDATE are handed to the adapter, which knows whether the
    operation was dispatched (``PriorityRequested``, ``BudgetRequested``); a refusal is
    ``refuse_control``. A budget with no token budget is refused here (only tokens
    apply to a language model). ROUTE_HINT / EXECUTION_HINT with must-honor set are
    refused; best-effort hints are noted and ignored.
11. Flow control: BACKPRESSURE, CREDIT_UPDATE and FLOW_UPDATE change the client's windows
    over our PARTIAL_RESULTs (``_flow``); ``flow_wait`` says when the next may go. Their
    flags (or FLOW_UPDATE's scope) pick connection, session or operation; an operation
    window only for an operation in flight (else noted and ignored).
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
    SESSION_PATCH gets SESSION_PATCH_ACK rejected, SESSION_MIGRATE gets
    SESSION_MIGRATE_ACK not accepted, CACHE_PUT gets CACHE_ACK rejected, CACHE_REFERENCE
    gets CACHE_MISS not_found. CACHE_INVALIDATE, OBJECT_*, the client's PROGRESS,
    PARTIAL_RESULT, RESULT_DROP_REASON, ERROR_RECOVERABLE, RETRY_AFTER, CACHE_MISS,
    CACHE_ACK, PONG, and messages only a server sends are noted and ignored
    (``FrameIgnored``).
14. TRACE_CONTEXT with header.frame_id 0 sets the session default; a non-zero frame_id
    must name an active operation's frame; a non-zero header.trace_id must equal the
    metadata trace_id.
15. Exactly one terminal per operation, nothing after it. A drop is preceded by
    TRACE_CONTEXT with header.frame_id 0 (wire case cancel-abort). A send that breaks
    this raises ``LocalProtocolError`` and writes nothing (``_OPERATION_TABLE``).
16. PING is answered with PONG at once. SESSION_CLOSE moves the session to ``CLOSING``:
    no new submits; the adapter drains (or aborts) and then calls
    ``send_session_close_ack``. CLOSE and a fatal ERROR from the peer end the connection.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

import attrs

from ._body import OPENAI_EVENT_FRAME, FrameShape, pack_single_frame, parse_typed_body
from ._codec import Decoder, Packet, decode_packet, encode, encode_partial_result
from ._constants import (
    DEFAULT_MAX_PACKET,
    TOKEN_SCHEMA_ID,
    TOKEN_SCHEMA_VERSION,
    BudgetFlag,
    CacheAckStatus,
    CacheMissReason,
    CapabilityFlag,
    CloseAckStatus,
    ControlReason,
    DropFlag,
    DropReason,
    ErrorCode,
    ErrorScope,
    FlowScope,
    HintFlag,
    MsgType,
    PatchAckStatus,
    PatchRejectReason,
    PressureFlag,
    PressureLevel,
    PressureReason,
    RecoverableFlag,
    RetryScopeFlag,
    Role,
    SessionError,
    SessionOpenStatus,
    Stage,
    StandardProfile,
    SupersedeFlag,
    TraceFlag,
)
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError, TypedBodyError
from ._events import (
    BudgetRequested,
    CancelSource,
    CapabilitiesNegotiated,
    ConnectionFailed,
    DeadlineUpdated,
    Event,
    FlowChanged,
    FrameIgnored,
    HandshakeCompleted,
    OperationCancelled,
    OperationSubmitted,
    PeerClosed,
    PeerError,
    PriorityRequested,
    RefusalReason,
    SendBytes,
    SessionCloseRequested,
    SessionOpened,
    SessionOpenRefused,
    SubmitRefused,
    TraceContextUpdated,
    TraceInfo,
)
from ._flow import FlowControl
from ._idruns import IdRuns
from ._messages import (
    Abort,
    Backpressure,
    BudgetUpdate,
    CacheAck,
    CacheMiss,
    CachePut,
    CacheReference,
    Cancel,
    CapabilityNegotiation,
    ClientHello,
    CreditUpdate,
    Deadline,
    DegradeProfile,
    Error,
    ErrorRecoverable,
    ExecutionHint,
    ExpireAt,
    FlowUpdate,
    FrameSubmit,
    Pong,
    PriorityUpdate,
    Progress,
    ResultDropReason,
    ResultPush,
    RetryAfter,
    RouteHint,
    ServerHelloAck,
    SessionClose,
    SessionCloseAck,
    SessionMigrate,
    SessionMigrateAck,
    SessionOpen,
    SessionOpenAck,
    SessionPatch,
    SessionPatchAck,
    Supersede,
    TraceContext,
    TransportProbe,
    TransportProbeAck,
)
from ._tokens import pack_tokens, parse_tokens


class ConnState(enum.Enum):
    AWAIT_HELLO = "await_hello"
    READY = "ready"
    CLOSED = "closed"


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

#: SESSION_MIGRATE_ACK accept_code: 0 is "accepted" to nnrp-py's client; the spec has no
#: registry, so any other value refuses (rule 13).
MIGRATION_REFUSED = 1
#: Longest diagnostic we write (ASCII/UTF-8 text for a human).
MAX_DIAGNOSTIC = 1024


@attrs.frozen
class ServerConfig:
    """Limits and advertised values of one server connection."""

    max_packet: int = DEFAULT_MAX_PACKET
    max_sessions: int = 64
    max_in_flight: int = 64
    #: Profiles a session may open: the stock clients' token profile (the openai
    #: profile is chosen per frame) plus the typed profile 0 itself.
    session_profiles: frozenset[int] = frozenset({int(StandardProfile.TOKEN),
                                                  int(StandardProfile.OPENAI_TYPED)})
    #: Hello profile bitmap, bit (profile_id - 1): the token profile.
    hello_profile_bitmap: int = 1 << (int(StandardProfile.TOKEN) - 1)
    max_pending_deadlines: int = 64
    max_pending_supersedes: int = 64
    #: How long a superseded operation waits for its replacement before it is dropped
    #: anyway (rule 9): a client that never submits one must not hold vLLM's work.
    supersede_hold_ms: int = 5_000
    lease_ttl_ms: int = 30_000
    token_ttl_ms: int = 120_000
    #: The runtime tokens capability negotiation may grant (what the adapter implements).
    runtime_tokens: frozenset[str] = frozenset()
    #: The retry time sent with a busy refusal (in-flight limit, draining).
    busy_retry_after_ms: int = 1000
    #: Checks SESSION_OPEN auth bytes; None accepts any (auth is then the transport's job).
    authenticate: Callable[[bytes], bool] | None = None


@attrs.define
class _Operation:
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
class _PendingDeadline:
    frame_id: int
    deadline_unix_ms: int
    drop_reason: int


@attrs.frozen
class _PendingSupersede:
    old_operation_id: int
    diagnostic: bytes


@attrs.define
class _Session:
    session_id: int
    max_in_flight: int
    priority_class: int = 0
    state: SessionState = SessionState.OPEN
    operations: dict[int, _Operation] = attrs.field(factory=dict)
    by_frame: dict[int, int] = attrs.field(factory=dict)
    seen_operations: IdRuns = attrs.field(factory=IdRuns)
    seen_frames: IdRuns = attrs.field(factory=IdRuns)
    pending_deadlines: dict[int, _PendingDeadline] = attrs.field(factory=dict)
    #: new operation_id -> the supersede waiting for it (rule 9)
    pending_supersedes: dict[int, _PendingSupersede] = attrs.field(factory=dict)
    trace: TraceInfo | None = None
    last_operation_id: int = 0
    tokens: frozenset[str] = frozenset()
    token_budget: int | None = None
    retry_sequence: int = 0

    @property
    def advertises_credit(self) -> bool:
        return "control.credit_backpressure" in self.tokens


def _diag(text: str) -> bytes:
    return text.encode("utf-8", "replace")[:MAX_DIAGNOSTIC]


class ServerConnection:
    """Sans-IO server role for one transport connection (many sessions).

    ``clock`` (seconds, monotonic) times the client's retry-after windows; tests pass
    their own.
    """

    def __init__(self, config: ServerConfig | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.config = config or ServerConfig()
        self.state = ConnState.AWAIT_HELLO
        self.draining = False
        self.flow = FlowControl(clock)
        self._clock = clock
        self._wall_clock = wall_clock  # DEADLINE / EXPIRE_AT are Unix times
        #: Operations SUPERSEDING on this connection (the I/O layer's fast path).
        self.holding = 0
        self._decoder = Decoder(self.config.max_packet)
        self._sessions: dict[int, _Session] = {}
        self.hello: ClientHello | None = None

    @property
    def is_closed(self) -> bool:
        return self.state is ConnState.CLOSED

    def start_draining(self) -> None:
        """Refuse new sessions (retry_later) and new submits (recoverable, with a retry
        time): the gateway is shutting down and clients should go elsewhere (rule 4, 5)."""
        self.draining = True

    # ------------------------------------------------------------------ inputs

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Bytes from a stream transport (TCP, unix socket, a QUIC stream)."""
        if self.state is ConnState.CLOSED:
            return []
        try:
            packets = self._decoder.feed(data)
        except RemoteProtocolError as exc:
            return [self._fail(exc)]
        events = self._handle_all(packets)
        error = self._decoder.error
        if error is not None and not self.is_closed:
            # Valid packets came before the bad one in this read: they were handled
            # above (nothing is lost), and the bad one still ends the connection.
            events.append(self._fail(error))
        return events

    def receive_message(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """One WebSocket binary message: exactly one packet."""
        if self.state is ConnState.CLOSED:
            return []
        try:
            packet = decode_packet(data, self.config.max_packet)
        except RemoteProtocolError as exc:
            return [self._fail(exc)]
        return self._handle_all([packet])

    def protocol_failure(self, error: ProtocolError) -> ConnectionFailed:
        """A transport-level violation (a WebSocket text message, say)."""
        return self._fail(error)

    def _handle_all(self, packets: list[Packet]) -> list[Event]:
        events: list[Event] = []
        for packet in packets:
            try:
                self._dispatch(packet, events)
            except RemoteProtocolError as exc:
                events.append(self._fail(exc))
            if self.state is ConnState.CLOSED:
                break
        return events

    def _dispatch(self, packet: Packet, events: list[Event]) -> None:
        msg_type = packet.msg_type
        rule = _RULES[msg_type]
        if self.state is ConnState.AWAIT_HELLO:
            if rule.scope not in (Scope.BEFORE_HELLO, Scope.ANY_TIME):
                raise RemoteProtocolError(f"{msg_type.name} before CLIENT_HELLO",
                                          code=ErrorCode.INVALID_STATE)
        elif rule.scope is Scope.BEFORE_HELLO:
            raise RemoteProtocolError(f"{msg_type.name} after the handshake",
                                      code=ErrorCode.INVALID_STATE)
        if rule.scope in (Scope.SESSION, Scope.SESSION_OR_ONLY_ONE):
            session_id = self._session_of(packet, rule.scope)
            if session_id is None:
                events.append(self._nonfatal_error(
                    ErrorCode.INVALID_STATE, packet.session_id,
                    f"{msg_type.name} names session {packet.session_id}, which is not open"))
                return
            if session_id != packet.session_id:
                packet = packet._replace(session_id=session_id)
        rule.handler(self, packet, events)

    def _session_of(self, packet: Packet, scope: Scope) -> int | None:
        if packet.session_id in self._sessions:
            return packet.session_id
        if packet.session_id == 0 and scope is Scope.SESSION_OR_ONLY_ONE and len(
                self._sessions) == 1:
            return next(iter(self._sessions))  # session-optional controls (rule 12)
        return None

    def _fail(self, error: ProtocolError) -> ConnectionFailed:
        """Rules 1 and 2: silent before the handshake; after it, every operation still in
        flight (of every session) ends with RESULT_DROP_REASON transport_closed, then the
        fatal ERROR, then the close."""
        replies: list[bytes] = []
        if self.state is ConnState.READY:
            for session in self._sessions.values():
                for operation in session.operations.values():
                    drop = ResultDropReason(
                        operation_id=operation.operation_id,
                        result_sequence=operation.sequence + 1,
                        drop_reason=int(DropReason.TRANSPORT_CLOSED),
                        source_role=int(Role.SERVER), flags=int(DropFlag.FINAL))
                    replies.append(encode(Packet(drop, session_id=session.session_id,
                                                 frame_id=operation.frame_id)))
            replies.append(self._error_packet(error.code, str(error), fatal=True))
        self.state = ConnState.CLOSED
        self._sessions.clear()
        self.holding = 0
        return ConnectionFailed(error, tuple(replies))

    # ------------------------------------------------------------------ handshake (rule 1)

    def _on_probe(self, packet: Packet, events: list[Event]) -> None:
        probe = packet.message
        assert isinstance(probe, TransportProbe)
        ack = TransportProbeAck(probe_id=probe.probe_id, payload_bytes=0,
                                timestamp_us=probe.timestamp_us)
        events.append(SendBytes(encode(Packet(ack))))

    def _on_hello(self, packet: Packet, events: list[Event]) -> None:
        hello = packet.message
        assert isinstance(hello, ClientHello)
        if packet.body:
            # The reference server rejects hello extensions (section 1); so do we.
            raise RemoteProtocolError("CLIENT_HELLO with a body (extensions) is not supported",
                                      code=ErrorCode.UNSUPPORTED_CAPABILITY)
        if not (hello.min_version <= 1 <= hello.max_version and hello.wire_format_bitmap & 1):
            raise RemoteProtocolError("no common version or wire format",
                                      code=ErrorCode.UNSUPPORTED_VERSION)
        accepted = hello.profile_bitmap & self.config.hello_profile_bitmap
        if not accepted:
            raise RemoteProtocolError("no common profile", code=ErrorCode.UNSUPPORTED_CAPABILITY)
        ack = ServerHelloAck(
            accepted_profile_bitmap=accepted,
            accepted_payload_kind_bitmap=hello.payload_kind_bitmap,
            accepted_codec_bitmap=hello.codec_bitmap,
            accepted_compression_bitmap=hello.compression_bitmap,
            accepted_dtype_bitmap=hello.dtype_bitmap,
            accepted_layout_bitmap=hello.layout_bitmap,
            max_lane_count=1,
            max_concurrent_frames=min(self.config.max_in_flight, 0xFFFF),
            latency_budget_ms=hello.latency_budget_ms,
            max_body_bytes=self.config.max_packet,
            token_ttl_ms=self.config.token_ttl_ms,
        )
        self.hello = hello
        self.state = ConnState.READY
        events.append(SendBytes(encode(Packet(ack))))
        events.append(HandshakeCompleted(hello, accepted))

    # ------------------------------------------------------------------ sessions (rules 4, 16)

    def _on_session_open(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, SessionOpen)
        auth = packet.body[request.resume_token_bytes:
                           request.resume_token_bytes + request.auth_bytes]
        session_id = self._pick_session_id(request.requested_session_id)
        refusal = self._session_refusal(request, auth)
        if refusal is None and session_id is None:
            refusal = (SessionError.LIMIT_REACHED, "no free session id")
        if refusal is not None:
            code, text = refusal
            status = (SessionOpenStatus.RETRY_LATER if self.draining
                      and code is SessionError.LIMIT_REACHED else SessionOpenStatus.REJECTED)
            ack = SessionOpenAck(
                session_id=0, profile_id=request.profile_id,
                priority_class=request.priority_class, status=status,
                schema_id=request.schema_id, schema_version=request.schema_version,
                lease_ttl_ms=self.config.lease_ttl_ms, session_error_code=code)
            events.append(SendBytes(encode(Packet(ack, body=_diag(text)))))
            events.append(SessionOpenRefused(request.requested_session_id, int(code), text))
            return
        assert session_id is not None
        max_in_flight = min(request.max_in_flight or self.config.max_in_flight,
                            self.config.max_in_flight)
        self._sessions[session_id] = _Session(session_id, max_in_flight, request.priority_class)
        ack = SessionOpenAck(
            session_id=session_id, profile_id=request.profile_id,
            priority_class=request.priority_class, status=SessionOpenStatus.OPENED,
            schema_id=request.schema_id, schema_version=request.schema_version,
            granted_operation_credit=min(max_in_flight, 0xFFFF),
            max_in_flight=min(max_in_flight, 0xFFFF), lease_ttl_ms=self.config.lease_ttl_ms,
            resume_window_ms=0, server_session_tag=session_id)
        events.append(SendBytes(encode(Packet(ack, session_id=session_id))))
        events.append(SessionOpened(session_id, request, max_in_flight))

    def _session_refusal(self, request: SessionOpen, auth: bytes
                         ) -> tuple[SessionError, str] | None:
        config = self.config
        if config.authenticate is not None and not config.authenticate(auth):
            return SessionError.AUTH_FAILED, "authentication failed"
        if self.draining:
            return SessionError.LIMIT_REACHED, "the server is draining; open the session elsewhere"
        if len(self._sessions) >= config.max_sessions:
            return SessionError.LIMIT_REACHED, (
                f"connection already has {config.max_sessions} sessions (the limit)")
        if request.profile_id not in config.session_profiles:
            return SessionError.PROFILE_UNSUPPORTED, f"profile {request.profile_id} is not served"
        if (request.schema_id, request.schema_version) not in (
                (TOKEN_SCHEMA_ID, TOKEN_SCHEMA_VERSION), (0, 0)):
            return SessionError.SCHEMA_UNSUPPORTED, (
                f"schema {request.schema_id:#x} v{request.schema_version} is not served")
        if request.resume_token_bytes:
            return SessionError.RESUME_REJECTED, "session resume is not supported"
        return None

    def _pick_session_id(self, requested: int) -> int | None:
        if requested and requested not in self._sessions:
            return requested
        candidate = 1
        while candidate in self._sessions:
            candidate += 1
        return candidate if candidate <= 0xFFFFFFFF else None

    def _on_session_close(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, SessionClose)
        session = self._sessions[packet.session_id]
        if session.state is SessionState.CLOSING:
            events.append(FrameIgnored(session.session_id, int(MsgType.SESSION_CLOSE),
                                       "the session is already closing"))
            return
        session.state = SessionState.CLOSING
        for replacement in list(session.pending_supersedes):
            self._release_held(session, replacement, events)  # no replacement can come now
        session.pending_deadlines.clear()
        abort = request.in_flight_policy == 1
        if abort:
            for operation in list(session.operations.values()):
                self._cancel(session, operation, CancelSource.SESSION_CLOSE, request.reason,
                             b"", events)
        events.append(SessionCloseRequested(session.session_id, abort, request.drain_timeout_ms))

    # ------------------------------------------------------------------ operations (rule 5)

    def _on_submit(self, packet: Packet, events: list[Event]) -> None:
        submit = packet.message
        assert isinstance(submit, FrameSubmit)
        session = self._sessions[packet.session_id]
        frame_id, operation_id = packet.frame_id, submit.operation_id
        if frame_id == 0 or frame_id in session.seen_frames:
            # Not answerable on its frame: a refusal to the session (rule 3).
            events.append(self._refuse(
                ErrorCode.INVALID_STATE, ErrorScope.SESSION, session.session_id, 0,
                f"FRAME_SUBMIT frame_id {frame_id} is zero or already used in this session"))
            self._release_held(session, operation_id, events)
            return
        session.seen_frames.add(frame_id)
        superseding = session.pending_supersedes.get(operation_id)
        replaces_live = (superseding is not None
                         and superseding.old_operation_id in session.operations)
        refusal: tuple[RefusalReason, str] | None = None
        if operation_id in session.seen_operations:
            refusal = (RefusalReason.DUPLICATE_OPERATION_ID,
                       f"operation_id {operation_id} is already used in this session")
        elif session.state is SessionState.CLOSING:
            refusal = (RefusalReason.SESSION_CLOSING, "the session is closing")
        elif self.draining:
            refusal = (RefusalReason.DRAINING,
                       "the server is draining; submit on another connection")
        elif len(session.operations) >= session.max_in_flight and not replaces_live:
            refusal = (RefusalReason.OPERATION_LIMIT,
                       f"session has {session.max_in_flight} operations in flight (the limit)")
        if refusal is not None:
            events.append(SubmitRefused(session.session_id, operation_id, frame_id, *refusal))
            if operation_id not in session.seen_operations:
                self._release_held(session, operation_id, events)
            return
        session.seen_operations.add(operation_id)
        session.last_operation_id = operation_id
        trace = session.trace
        operation = _Operation(operation_id, frame_id,
                               trace_id=packet.trace_id or (trace.trace_id if trace else 0),
                               trace_flags=trace.trace_flags if trace else 0)
        session.operations[operation_id] = operation
        session.by_frame[frame_id] = operation_id
        typed_body = None
        body_error = None
        try:
            typed_body = parse_typed_body(packet.body,
                                          payload_kind_bitmap=submit.payload_kind_bitmap,
                                          payload_frame_count=submit.payload_frame_count)
        except TypedBodyError as exc:
            body_error = str(exc)
        deadline: int | None = None
        drop_reason = 0
        pending = session.pending_deadlines.pop(operation_id, None)
        if pending is not None:
            if pending.frame_id and pending.frame_id != frame_id:
                events.append(self._refuse(
                    ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id, frame_id,
                    f"the deadline held for operation {operation_id} named frame "
                    f"{pending.frame_id}, but it was submitted on frame {frame_id}: "
                    "the deadline is not applied"))
            else:
                deadline, drop_reason = pending.deadline_unix_ms, pending.drop_reason
        events.append(OperationSubmitted(
            session.session_id, operation_id, frame_id, submit, typed_body, body_error,
            packet.trace_id, session.trace, deadline, drop_reason,
            priority_class=session.priority_class, token_budget=session.token_budget))
        if superseding is not None:
            del session.pending_supersedes[operation_id]
            old = session.operations.get(superseding.old_operation_id)
            if old is not None:
                self._cancel(session, old, CancelSource.SUPERSEDE, ControlReason.SUPERSEDED,
                             superseding.diagnostic, events)
        self._advertise_credit(session, events)

    def _release_held(self, session: _Session, operation_id: int, events: list[Event]) -> None:
        """A submit that will not run: what was held for it goes (rules 8, 9). Its held
        deadline is forgotten, and an operation it was to replace is dropped superseded
        now (the client asked for it to be replaced; no replacement is coming)."""
        session.pending_deadlines.pop(operation_id, None)
        superseding = session.pending_supersedes.pop(operation_id, None)
        if superseding is not None:
            old = session.operations.get(superseding.old_operation_id)
            if old is not None:
                self._cancel(session, old, CancelSource.SUPERSEDE, ControlReason.SUPERSEDED,
                             superseding.diagnostic, events)

    def _set_state(self, session: _Session, operation: _Operation, state: OpState) -> None:
        """Every transition goes here, so leaving SUPERSEDING releases its hold."""
        if operation.state is OpState.SUPERSEDING and state is not OpState.SUPERSEDING:
            self.holding -= 1
            for new_id, pending in list(session.pending_supersedes.items()):
                if pending.old_operation_id == operation.operation_id:
                    del session.pending_supersedes[new_id]
        elif state is OpState.SUPERSEDING:
            self.holding += 1
        operation.state = state

    def _control_target(self, packet: Packet, operation_id: int, events: list[Event],
                        control_sequence: int | None = None) -> _Operation | None:
        """The active operation an operation-scoped control names, or None (rule 6)."""
        session = self._sessions[packet.session_id]
        name = packet.msg_type.name
        operation = session.operations.get(operation_id)
        if operation is None:
            if operation_id not in session.seen_operations:
                events.append(self._refuse(
                    ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id,
                    packet.frame_id, f"{name} names operation {operation_id}, which this "
                    "session never submitted"))
            return None  # already ended: a normal race
        if packet.frame_id and packet.frame_id != operation.frame_id:
            events.append(self._refuse(
                ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id, packet.frame_id,
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

    def _on_frame_cancel(self, packet: Packet, events: list[Event]) -> None:
        session = self._sessions[packet.session_id]
        operation_id = session.by_frame.get(packet.frame_id)
        if operation_id is None:
            if packet.frame_id not in session.seen_frames:
                events.append(self._refuse(
                    ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id,
                    packet.frame_id, f"FRAME_CANCEL for unknown frame {packet.frame_id}"))
            return  # already ended: a normal race (rule 7)
        operation = session.operations[operation_id]
        self._cancel(session, operation, CancelSource.FRAME_CANCEL,
                     ControlReason.USER_CANCELLED, b"", events)

    def _on_cancel(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, Cancel | Abort)
        session = self._sessions[packet.session_id]
        if request.operation_id == 0:
            for each in list(session.operations.values()):
                self._cancel(session, each, CancelSource.SESSION_CANCEL, request.reason,
                             packet.body, events)
            return
        operation = self._control_target(packet, request.operation_id, events,
                                         request.control_sequence)
        if operation is None:
            return
        source = CancelSource.ABORT if isinstance(request, Abort) else CancelSource.CANCEL
        self._cancel(session, operation, source, request.reason, packet.body, events)

    def _cancel(self, session: _Session, operation: _Operation, source: CancelSource,
                reason: int, diagnostic: bytes, events: list[Event]) -> None:
        if operation.state not in (OpState.ACTIVE, OpState.SUPERSEDING):
            return
        self._set_state(session, operation, _OPERATION_TABLE[(operation.state,
                                                               OpAction.CANCEL)])
        events.append(OperationCancelled(session.session_id, operation.operation_id,
                                         operation.frame_id, source, reason, diagnostic))

    def _on_deadline(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, Deadline | ExpireAt)
        session = self._sessions[packet.session_id]
        drop = (DropReason.DEADLINE_EXPIRED if isinstance(request, Deadline)
                else DropReason.SUPERSEDED)
        if request.operation_id in session.operations:
            operation = self._control_target(packet, request.operation_id, events,
                                             request.control_sequence)
            if operation is not None:
                events.append(DeadlineUpdated(session.session_id, operation.operation_id,
                                              request.deadline_unix_ms, int(drop)))
            return
        if request.operation_id in session.seen_operations:
            return  # ended already
        # Rule 8: held for a submit to come, on the frame it names.
        if packet.frame_id and packet.frame_id in session.seen_frames:
            events.append(self._refuse(
                ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id, packet.frame_id,
                f"{packet.msg_type.name} for a future submit names frame {packet.frame_id}, "
                "which is already used"))
            return
        now_ms = int(self._wall_clock() * 1000)
        for operation_id, held in list(session.pending_deadlines.items()):
            if held.deadline_unix_ms <= now_ms:
                del session.pending_deadlines[operation_id]  # its submit never came in time
        if (request.operation_id not in session.pending_deadlines
                and len(session.pending_deadlines) >= self.config.max_pending_deadlines):
            events.append(self._refuse(
                ErrorCode.LIMIT_EXCEEDED, ErrorScope.SESSION, session.session_id,
                packet.frame_id, "too many deadlines held for operations not yet submitted"))
            return
        # For an operation not yet submitted the latest word counts ("only tighten" is
        # for a running one): a retry after a refused submit brings its own deadline.
        session.pending_deadlines[request.operation_id] = _PendingDeadline(
            packet.frame_id, request.deadline_unix_ms, int(drop))

    def _on_priority(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, PriorityUpdate)
        operation = self._control_target(packet, request.operation_id, events,
                                         request.control_sequence)
        if operation is not None:
            events.append(PriorityRequested(packet.session_id, operation.operation_id,
                                            operation.frame_id, request.priority_class,
                                            request.priority_delta))

    def _on_supersede(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, Supersede)
        session = self._sessions[packet.session_id]
        old = self._control_target(packet, request.old_operation_id, events,
                                   request.control_sequence)
        if old is None:
            return
        new_id = request.new_operation_id
        if old.state is not OpState.ACTIVE:
            if old.state is OpState.SUPERSEDING:
                events.append(self._refuse(
                    ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id,
                    old.frame_id, f"operation {old.operation_id} already waits for its "
                    "replacement"))
            return  # being cancelled already
        abort_now = bool(request.flags & SupersedeFlag.ABORT_OLD_IMMEDIATELY)
        if abort_now or new_id in session.seen_operations or new_id == 0:
            # The replacement was admitted already (or none is coming, or the client says
            # not to wait): the old operation goes now (rule 9).
            self._cancel(session, old, CancelSource.SUPERSEDE, ControlReason.SUPERSEDED,
                         packet.body, events)
            return
        waiting = session.pending_supersedes.get(new_id)
        if waiting is not None:
            events.append(self._refuse(
                ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id, old.frame_id,
                f"operation {new_id} is already the replacement of operation "
                f"{waiting.old_operation_id}"))
            return
        if len(session.pending_supersedes) >= self.config.max_pending_supersedes:
            events.append(self._refuse(
                ErrorCode.LIMIT_EXCEEDED, ErrorScope.FRAME, session.session_id, old.frame_id,
                "too many supersedes waiting for their replacement"))
            return
        # The client counts the old operation superseded already: nothing more of it may
        # reach the client but its drop (rule 15). It waits for its replacement, at most
        # supersede_hold_ms (``supersede_hold_left``).
        session.pending_supersedes[new_id] = _PendingSupersede(old.operation_id, packet.body)
        self._set_state(session, old, _OPERATION_TABLE[(old.state, OpAction.HOLD)])
        old.held_until = self._clock() + self.config.supersede_hold_ms / 1000

    def _on_budget(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, BudgetUpdate)
        session = self._sessions[packet.session_id]
        if not request.token_budget:
            # Compute, memory and bandwidth budgets have no meaning for a language model
            # behind HTTP; only tokens can be counted and capped (rule 10).
            if request.compute_units or request.memory_bytes or request.bandwidth_bytes:
                events.append(self._refuse(
                    ErrorCode.UNSUPPORTED_CAPABILITY, ErrorScope.FRAME, session.session_id,
                    packet.frame_id, "only token budgets are supported"))
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
        operation = self._control_target(packet, request.operation_id, events)
        if operation is not None:
            events.append(BudgetRequested(session.session_id, operation.operation_id,
                                          operation.frame_id, request.token_budget, increment))

    def _on_hint(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, RouteHint | ExecutionHint)
        if request.operation_id:
            operation = self._control_target(packet, request.operation_id, events)
            if operation is None:
                return
        name = packet.msg_type.name
        if request.flags & HintFlag.MUST_HONOR:
            events.append(self._refuse(
                ErrorCode.UNSUPPORTED_CAPABILITY, ErrorScope.FRAME, packet.session_id,
                packet.frame_id, f"{name.lower()} cannot be honoured: one vLLM serves this "
                "gateway"))
            return
        events.append(FrameIgnored(packet.session_id, int(packet.msg_type),
                                   "best-effort hint: one vLLM serves this gateway"))

    # ------------------------------------------------------------------ flow (rule 11)

    def _on_pressure(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, Backpressure | CreditUpdate)
        session_id = packet.session_id
        if not request.flags & PressureFlag.CONNECTION:
            # Session or operation scope: a session must be named, or be the only one.
            resolved = self._session_of(packet, Scope.SESSION_OR_ONLY_ONE)
            if resolved is None:
                events.append(self._nonfatal_error(
                    ErrorCode.INVALID_STATE, session_id,
                    f"{packet.msg_type.name} names session {session_id}, which is not open"))
                return
            session_id = resolved
            if request.flags & PressureFlag.OPERATION and not self._in_flight(
                    session_id, request.scope_id, packet.msg_type, events):
                return
        self.flow.on_pressure(request, session_id)
        events.append(FlowChanged())

    def _in_flight(self, session_id: int, operation_id: int, msg_type: MsgType,
                   events: list[Event]) -> bool:
        """An operation-scoped window needs an operation in flight (``_flow`` rule 6)."""
        if operation_id in self._sessions[session_id].operations:
            return True
        events.append(FrameIgnored(session_id, int(msg_type),
                                   f"operation {operation_id} is not in flight"))
        return False

    def _on_flow_update(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, FlowUpdate)
        session_id = packet.session_id
        if request.scope != FlowScope.CONNECTION and session_id not in self._sessions:
            events.append(self._nonfatal_error(
                ErrorCode.INVALID_STATE, session_id,
                f"FLOW_UPDATE names session {session_id}, which is not open"))
            return
        if request.scope == FlowScope.OPERATION and not self._in_flight(
                session_id, request.operation_id, MsgType.FLOW_UPDATE, events):
            return
        if self.flow.on_flow_update(request, session_id):
            events.append(FlowChanged())
        else:
            events.append(FrameIgnored(session_id, int(MsgType.FLOW_UPDATE),
                                       f"stale credit_epoch {request.credit_epoch}"))

    # ------------------------------------------------------------------ negotiation (rule 12)

    def _on_capabilities(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, CapabilityNegotiation)
        session = self._sessions[packet.session_id]
        offered = parse_tokens(packet.body, request.capability_count)
        if offered is None:
            events.append(FrameIgnored(session.session_id, int(MsgType.CAPABILITY_NEGOTIATION),
                                       "the offer is not a canonical token list"))
            return
        accepted = frozenset(offered) & self.config.runtime_tokens
        if request.profile_id not in self.config.session_profiles:
            accepted = frozenset()
        dropped = len(accepted) < len(offered)
        reply_class: type[CapabilityNegotiation | DegradeProfile] = (
            DegradeProfile if dropped and accepted
            and request.flags & CapabilityFlag.DOWNGRADE_ALLOWED else CapabilityNegotiation)
        body = pack_tokens(accepted)
        reply = reply_class(profile_id=request.profile_id, capability_count=len(accepted),
                            body_bytes=len(body), flags=request.flags)
        events.append(SendBytes(encode(Packet(reply, session_id=session.session_id,
                                              body=body))))
        if not accepted and request.flags & CapabilityFlag.HARD_REQUIREMENT:
            events.append(self._refuse(
                ErrorCode.UNSUPPORTED_CAPABILITY, ErrorScope.SESSION, session.session_id, 0,
                "capability_mismatch: none of the required runtime capabilities is served"))
        advertised_before = session.advertises_credit
        session.tokens = accepted
        events.append(CapabilitiesNegotiated(session.session_id, accepted))
        if session.advertises_credit and not advertised_before:
            self._advertise_credit(session, events)

    def _on_degrade(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, DegradeProfile)
        session = self._sessions[packet.session_id]
        kept = parse_tokens(packet.body, request.capability_count)
        if kept is None:
            events.append(FrameIgnored(session.session_id, int(MsgType.DEGRADE_PROFILE),
                                       "the degrade is not a canonical token list"))
            return
        session.tokens = session.tokens & frozenset(kept)
        events.append(CapabilitiesNegotiated(session.session_id, session.tokens))

    def _advertise_credit(self, session: _Session, events: list[Event]) -> None:
        events.extend(SendBytes(data) for data in self._credit_packets(session))

    def _credit_packets(self, session: _Session) -> list[bytes]:
        """The session's free operation slots (rule 12), once credit was negotiated."""
        if not session.advertises_credit or session.state is not SessionState.OPEN:
            return []
        free = max(0, session.max_in_flight - len(session.operations))
        if free:
            message: CreditUpdate | Backpressure = CreditUpdate(
                scope_id=session.session_id, credit_window=free, level=int(PressureLevel.NONE))
        else:
            message = Backpressure(
                scope_id=session.session_id, credit_window=0, level=int(PressureLevel.HARD),
                reason=int(PressureReason.RECEIVER_QUEUE_FULL),
                retry_after_ms=self.config.busy_retry_after_ms)
        return [encode(Packet(message, session_id=session.session_id))]

    # ------------------------------------------------------------------ trace (rule 14)

    def _on_trace_context(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, TraceContext)
        session = self._sessions[packet.session_id]
        if packet.trace_id and packet.trace_id != request.trace_id:
            events.append(self._refuse(
                ErrorCode.INVALID_STATE, ErrorScope.SESSION, session.session_id, packet.frame_id,
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
            events.append(self._refuse(
                ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id, packet.frame_id,
                f"TRACE_CONTEXT frame {packet.frame_id} names no active operation"))
            return
        if trace.eligible:
            operation.trace_id, operation.trace_flags = trace.trace_id, trace.trace_flags
        events.append(TraceContextUpdated(session.session_id, operation.operation_id, trace))

    # ------------------------------------------------------------------ not served (rule 13)

    def _on_session_patch(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, SessionPatch)
        ack = SessionPatchAck(ack_status=int(PatchAckStatus.REJECTED),
                              reject_reason=int(PatchRejectReason.UNSUPPORTED_FIELD),
                              rejected_patch_mask=request.patch_mask,
                              effective_profile_id=request.profile_id)
        events.append(SendBytes(encode(Packet(ack, session_id=packet.session_id))))

    def _on_session_migrate(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, SessionMigrate)
        ack = SessionMigrateAck(accept_code=MIGRATION_REFUSED,
                                resume_from_frame_id=request.last_result_frame_id)
        events.append(SendBytes(encode(Packet(ack, session_id=packet.session_id))))

    def _on_cache_put(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, CachePut)
        ack = CacheAck(cache_namespace=request.cache_namespace,
                       status=int(CacheAckStatus.REJECTED), cache_key_hi=request.cache_key_hi,
                       cache_key_lo=request.cache_key_lo,
                       detail_code=int(ErrorCode.UNSUPPORTED_CAPABILITY))
        events.append(SendBytes(encode(Packet(ack, session_id=packet.session_id))))

    def _on_cache_reference(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, CacheReference)
        miss = CacheMiss(cache_namespace=request.cache_namespace,
                         profile_id=request.profile_id,
                         miss_reason=int(CacheMissReason.NOT_FOUND),
                         cache_key_hi=request.cache_key_hi, cache_key_lo=request.cache_key_lo)
        events.append(SendBytes(encode(Packet(miss, session_id=packet.session_id))))

    def _on_ignored(self, packet: Packet, events: list[Event]) -> None:
        events.append(FrameIgnored(packet.session_id, int(packet.msg_type),
                                   _IGNORED[packet.msg_type]))

    # ------------------------------------------------------------------ connection (rule 16)

    def _on_ping(self, packet: Packet, events: list[Event]) -> None:
        events.append(SendBytes(encode(Packet(Pong(), session_id=packet.session_id,
                                              trace_id=packet.trace_id))))

    def _on_close(self, packet: Packet, events: list[Event]) -> None:
        self.state = ConnState.CLOSED
        events.append(PeerClosed())

    def _on_peer_error(self, packet: Packet, events: list[Event]) -> None:
        error = packet.message
        assert isinstance(error, Error)
        fatal = bool(error.is_fatal)
        if fatal:
            self.state = ConnState.CLOSED
        events.append(PeerError(error, packet.body, fatal))

    # ------------------------------------------------------------------ outputs

    def _operation(self, session_id: int, operation_id: int, action: OpAction) -> _Operation:
        session = self._sessions.get(session_id)
        operation = session.operations.get(operation_id) if session else None
        if operation is None:
            raise LocalProtocolError(
                f"{action.value} for operation {operation_id} of session {session_id}, "
                "which is not in flight")
        next_state = _OPERATION_TABLE.get((operation.state, action))
        if next_state is None:
            raise LocalProtocolError(
                f"{action.value} not allowed for operation {operation_id} in state "
                f"{operation.state.value}")
        assert session is not None
        self._set_state(session, operation, next_state)
        if next_state is OpState.DONE:
            del session.operations[operation_id]
            del session.by_frame[operation.frame_id]
            self.flow.forget_operation(session_id, operation_id)
        return operation

    def session_tokens(self, session_id: int) -> frozenset[str]:
        """The runtime capability tokens a session negotiated (rule 12)."""
        session = self._sessions.get(session_id)
        return session.tokens if session is not None else frozenset()

    def superseding(self, session_id: int, operation_id: int) -> bool:
        """Whether a SUPERSEDE of this operation waits for its replacement (rule 9): its
        output is held, and it may end only with the superseded drop."""
        return self.operation_state(session_id, operation_id) is OpState.SUPERSEDING

    def supersede_hold_left(self, session_id: int, operation_id: int) -> float | None:
        """Seconds the superseded operation still waits for its replacement (0 or less:
        the wait is over, drop it superseded); None when it is not held."""
        session = self._sessions.get(session_id)
        operation = session.operations.get(operation_id) if session else None
        if operation is None or operation.state is not OpState.SUPERSEDING:
            return None
        return operation.held_until - self._clock()

    def operation_state(self, session_id: int, operation_id: int) -> OpState:
        """The state of an operation; DONE once it has left the registry."""
        session = self._sessions.get(session_id)
        operation = session.operations.get(operation_id) if session else None
        return operation.state if operation else OpState.DONE

    def flow_wait(self, session_id: int, operation_id: int) -> float | None:
        """When the operation's next PARTIAL_RESULT may go (rule 11): 0 now, else seconds
        to wait, or None until the client changes a window (``FlowChanged``)."""
        return self.flow.wait(session_id, operation_id)

    def send_partial(self, session_id: int, operation_id: int, body: bytes) -> bytes:
        """One PARTIAL_RESULT with the next result_sequence (1, 2, 3, ...)."""
        operation = self._operation(session_id, operation_id, OpAction.PARTIAL)
        operation.sequence += 1
        if self.flow.active:
            self.flow.spend(session_id, operation_id)
        return encode_partial_result(session_id, operation.frame_id, operation_id,
                                     operation.sequence, body)

    def send_progress(self, session_id: int, operation_id: int, stage: Stage) -> bytes:
        """PROGRESS for an operation still running (never after a cancel: rule 15)."""
        operation = self._operation(session_id, operation_id, OpAction.PROGRESS)
        operation.progress_sequence += 1
        message = Progress(operation_id=operation_id,
                           progress_sequence=operation.progress_sequence, stage=int(stage))
        return encode(Packet(message, session_id=session_id, frame_id=operation.frame_id))

    def send_result(self, session_id: int, operation_id: int, status: int, payload: bytes, *,
                    retry_after_ms: int | None = None,
                    frame: FrameShape = OPENAI_EVENT_FRAME) -> list[bytes]:
        """The terminal RESULT_PUSH: a typed body with one frame of ``payload`` (by default
        the openai-compatible JSON event). With
        ``retry_after_ms`` (a recoverable failure) ERROR_RECOVERABLE and RETRY_AFTER go
        first, saying when to try again. Packets in order (one WebSocket message each)."""
        operation = self._operation(session_id, operation_id, OpAction.RESULT)
        advice = [] if retry_after_ms is None else self._busy(
            session_id, operation.frame_id, operation_id, retry_after_ms, payload_status=status)
        return [*advice, self._result_packet(session_id, operation.frame_id, status, payload,
                                             frame),
                *self._credit_packets(self._sessions[session_id])]

    def send_refusal(self, session_id: int, frame_id: int, operation_id: int, status: int,
                     payload: bytes, *, retry_after_ms: int | None = None) -> list[bytes]:
        """Answer a refused submit (``SubmitRefused``) on its frame; no operation exists."""
        advice = [] if retry_after_ms is None else self._busy(
            session_id, frame_id, operation_id, retry_after_ms, payload_status=status)
        return [*advice, self._result_packet(session_id, frame_id, status, payload,
                                             OPENAI_EVENT_FRAME)]

    def _busy(self, session_id: int, frame_id: int, operation_id: int, retry_after_ms: int, *,
              payload_status: int) -> list[bytes]:
        """ERROR_RECOVERABLE (SERVER_BUSY, frame scope) + RETRY_AFTER (the operation), the
        reference adapter's pair before a recoverable terminal."""
        session = self._sessions.get(session_id)
        sequence = 0
        if session is not None:
            session.retry_sequence += 1
            sequence = session.retry_sequence
        text = _diag(f"recoverable: retry after {retry_after_ms} ms (status {payload_status})")
        error = ErrorRecoverable(
            error_code=int(ErrorCode.SERVER_BUSY), scope=int(ErrorScope.FRAME),
            role=int(Role.SERVER), flags=int(RecoverableFlag.RETRY_AFTER_REQUIRED),
            retry_after_ms=retry_after_ms, related_session_id=session_id,
            related_frame_id=frame_id, diagnostic_bytes=len(text))
        retry = RetryAfter(scope_id=operation_id, control_sequence=sequence,
                           retry_after_ms=retry_after_ms, role=int(Role.SERVER),
                           flags=int(RetryScopeFlag.OPERATION), diagnostic_bytes=len(text))
        return [encode(Packet(error, session_id=session_id, frame_id=frame_id, body=text)),
                encode(Packet(retry, session_id=session_id, frame_id=frame_id, body=text))]

    def _result_packet(self, session_id: int, frame_id: int, status: int, payload: bytes,
                       frame: FrameShape) -> bytes:
        meta = ResultPush(status_code=status, payload_kind_bitmap=frame.kind,
                          payload_frame_count=1)
        return encode(Packet(meta, session_id=session_id, frame_id=frame_id,
                             body=pack_single_frame(payload, **frame._asdict())))

    def send_drop(self, session_id: int, operation_id: int, drop_reason: DropReason,
                  diagnostic: bytes, *, traced: bool = True) -> list[bytes]:
        """The terminal RESULT_DROP_REASON (after a cancel, a deadline, a supersede, a
        budget or a shutdown); ``traced``: preceded by TRACE_CONTEXT with header.frame_id 0
        naming the operation's trace (rule 15; the reference adapter's terminal trace)."""
        operation = self._operation(session_id, operation_id, OpAction.DROP)
        trace_id = operation.trace_id or operation_id
        trace = TraceContext(trace_id=trace_id, span_id=operation.frame_id,
                             stage=int(Stage.DROPPED),
                             trace_flags=operation.trace_flags & int(TraceFlag.SAMPLED))
        meta = ResultDropReason(operation_id=operation_id,
                                result_sequence=operation.sequence + 1,
                                drop_reason=int(drop_reason), source_role=int(Role.SERVER),
                                flags=int(DropFlag.FINAL), diagnostic_bytes=len(diagnostic))
        session = self._sessions.get(session_id)
        packets = ([encode(Packet(trace, session_id=session_id, trace_id=trace_id))]
                   if traced else [])
        packets.append(encode(Packet(meta, session_id=session_id, frame_id=operation.frame_id,
                                     body=diagnostic)))
        return packets + (self._credit_packets(session) if session is not None else [])

    def refuse_control(self, session_id: int, frame_id: int, code: ErrorCode, text: str
                       ) -> bytes:
        """ERROR_RECOVERABLE for a control the adapter could not honour (rules 3, 10)."""
        return self._refuse(code, ErrorScope.FRAME, session_id, frame_id, text).data

    def send_session_close_ack(self, session_id: int) -> bytes:
        """Acknowledge SESSION_CLOSE once the session's operations have ended."""
        session = self._sessions.get(session_id)
        if session is None or session.state is not SessionState.CLOSING:
            raise LocalProtocolError(f"session {session_id} has not asked to close")
        if session.operations:
            raise LocalProtocolError(
                f"session {session_id} still has {len(session.operations)} operations in flight")
        del self._sessions[session_id]
        self.flow.forget_session(session_id)
        ack = SessionCloseAck(status=CloseAckStatus.CLOSED,
                              last_operation_id=session.last_operation_id)
        return encode(Packet(ack, session_id=session_id))

    def send_error(self, code: ErrorCode, message: str, *, fatal: bool,
                   scope: ErrorScope = ErrorScope.CONNECTION, session_id: int = 0,
                   frame_id: int = 0) -> bytes:
        """An ERROR frame (connection scope: header session_id 0); a fatal one closes the
        connection state."""
        data = self._error_packet(code, message, fatal=fatal, scope=scope,
                                  related_session_id=session_id, related_frame_id=frame_id)
        if fatal:
            self.state = ConnState.CLOSED
        return data

    def _refuse(self, code: ErrorCode, scope: ErrorScope, session_id: int, frame_id: int,
                text: str) -> SendBytes:
        """ERROR_RECOVERABLE: a refusal the client's session survives (rule 3)."""
        body = _diag(text)
        meta = ErrorRecoverable(error_code=int(code), scope=int(scope), role=int(Role.SERVER),
                                related_session_id=session_id, related_frame_id=frame_id,
                                diagnostic_bytes=len(body))
        return SendBytes(encode(Packet(meta, session_id=session_id, frame_id=frame_id,
                                       body=body)))

    def _nonfatal_error(self, code: ErrorCode, related_session_id: int, text: str) -> SendBytes:
        """A non-fatal ERROR about a session that is not open: header session_id 0, so no
        client mistakes it for a frame of one of its sessions (rule 3)."""
        return SendBytes(self._error_packet(code, text, fatal=False, scope=ErrorScope.SESSION,
                                            related_session_id=related_session_id))

    @staticmethod
    def _error_packet(code: ErrorCode, message: str, *, fatal: bool,
                      scope: ErrorScope = ErrorScope.CONNECTION, related_session_id: int = 0,
                      related_frame_id: int = 0) -> bytes:
        body = _diag(message)
        meta = Error(code=int(code), scope=int(scope), is_fatal=int(fatal),
                     related_session_id=related_session_id, related_frame_id=related_frame_id,
                     diagnostic_bytes=len(body))
        return encode(Packet(meta, body=body))


class Scope(enum.Enum):
    """Where a message may arrive (rules 1, 2, 3, 12)."""

    BEFORE_HELLO = "before_hello"  # only as the first message
    ANY_TIME = "any_time"  # before or after the hello
    CONNECTION = "connection"  # after the hello; header.session_id is not looked at
    SESSION = "session"  # must name an open session
    SESSION_OR_ONLY_ONE = "session_or_only_one"  # session 0 means the only open session


#: What one client message does to the connection: (connection, packet, events out).
Handler = Callable[[ServerConnection, Packet, list[Event]], None]


@attrs.frozen
class Rule:
    scope: Scope
    handler: Handler


#: Why a frame is noted and ignored (rule 13): the FrameIgnored reason.
_IGNORED: dict[MsgType, str] = {
    MsgType.PONG: "a PONG answers nothing we sent",
    MsgType.CACHE_INVALIDATE: "this server keeps no cache",
    MsgType.CACHE_ACK: "this server sends no CACHE_PUT",
    MsgType.CACHE_MISS: "this server sends no CACHE_REFERENCE",
    MsgType.OBJECT_DECLARE: "runtime objects are not served",
    MsgType.OBJECT_REF: "runtime objects are not served",
    MsgType.OBJECT_RELEASE: "runtime objects are not served",
    MsgType.OBJECT_PATCH: "runtime objects are not served",
    MsgType.OBJECT_DELTA: "runtime objects are not served",
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

S = ServerConnection
#: One row per preview4 message type (tests/nnrp checks the table covers MsgType).
_RULES: dict[MsgType, Rule] = {
    MsgType.CLIENT_HELLO: Rule(Scope.BEFORE_HELLO, S._on_hello),
    MsgType.TRANSPORT_PROBE: Rule(Scope.ANY_TIME, S._on_probe),
    MsgType.SESSION_OPEN: Rule(Scope.CONNECTION, S._on_session_open),
    MsgType.SESSION_CLOSE: Rule(Scope.SESSION, S._on_session_close),
    MsgType.CLOSE: Rule(Scope.CONNECTION, S._on_close),
    MsgType.ERROR: Rule(Scope.CONNECTION, S._on_peer_error),
    MsgType.PING: Rule(Scope.CONNECTION, S._on_ping),
    MsgType.FRAME_SUBMIT: Rule(Scope.SESSION, S._on_submit),
    MsgType.FRAME_CANCEL: Rule(Scope.SESSION, S._on_frame_cancel),
    MsgType.CANCEL: Rule(Scope.SESSION, S._on_cancel),
    MsgType.ABORT: Rule(Scope.SESSION, S._on_cancel),
    MsgType.DEADLINE: Rule(Scope.SESSION, S._on_deadline),
    MsgType.EXPIRE_AT: Rule(Scope.SESSION, S._on_deadline),
    MsgType.PRIORITY_UPDATE: Rule(Scope.SESSION, S._on_priority),
    MsgType.SUPERSEDE: Rule(Scope.SESSION, S._on_supersede),
    MsgType.BUDGET_UPDATE: Rule(Scope.SESSION, S._on_budget),
    MsgType.ROUTE_HINT: Rule(Scope.SESSION_OR_ONLY_ONE, S._on_hint),
    MsgType.EXECUTION_HINT: Rule(Scope.SESSION_OR_ONLY_ONE, S._on_hint),
    MsgType.TRACE_CONTEXT: Rule(Scope.SESSION_OR_ONLY_ONE, S._on_trace_context),
    MsgType.BACKPRESSURE: Rule(Scope.CONNECTION, S._on_pressure),  # scope by its flags
    MsgType.CREDIT_UPDATE: Rule(Scope.CONNECTION, S._on_pressure),
    MsgType.FLOW_UPDATE: Rule(Scope.CONNECTION, S._on_flow_update),
    MsgType.CAPABILITY_NEGOTIATION: Rule(Scope.SESSION_OR_ONLY_ONE, S._on_capabilities),
    MsgType.DEGRADE_PROFILE: Rule(Scope.SESSION_OR_ONLY_ONE, S._on_degrade),
    MsgType.SESSION_PATCH: Rule(Scope.SESSION, S._on_session_patch),
    MsgType.SESSION_MIGRATE: Rule(Scope.SESSION, S._on_session_migrate),
    MsgType.CACHE_PUT: Rule(Scope.SESSION, S._on_cache_put),
    MsgType.CACHE_REFERENCE: Rule(Scope.SESSION_OR_ONLY_ONE, S._on_cache_reference),
    **{msg_type: Rule(Scope.CONNECTION, S._on_ignored) for msg_type in _IGNORED},
}
del S
assert set(_RULES) == set(MsgType), "every preview4 message type needs a rule"
