"""The server side of an NNRP/1 connection, as a sans-IO state machine.

Rules (everything that changes connection, session or operation state lives here):

1. Connection: ``AWAIT_HELLO`` accepts TRANSPORT_PROBE (answered with PROBE_ACK) and
   CLIENT_HELLO. Anything else before the hello — garbage, a bad magic, a
   SESSION_OPEN — closes the connection *without a reply*, as the reference server
   does (nnrp-wire.md section 5, "Malformed input"). A hello whose profile bitmap
   does not intersect ours also closes it silently (section 1, step 3).
2. ``READY``: framing or header errors send ERROR (is_fatal=1, MALFORMED_HEADER /
   MALFORMED_BODY / LIMIT_EXCEEDED / UNSUPPORTED_VERSION) and close the connection.
   So does a message only a server may send, or one naming a session that is not open.
3. Sessions: SESSION_OPEN gets SESSION_OPEN_ACK with the requested id when free,
   else the lowest free id from 1. Refusals (profile, schema, resume, limit, auth)
   are an ACK with status rejected, an error code and a UTF-8 diagnostic body.
4. Operations: FRAME_SUBMIT needs a non-zero frame_id unused in the session and an
   operation_id unused in the session. A duplicate operation id, the in-flight limit
   or a closing session *refuse the submit* (the adapter answers on that frame);
   a repeated frame_id cannot be answered unambiguously and gets a non-fatal ERROR.
   A typed body that does not parse still becomes an operation: the profile layer
   answers it with ``invalid_submit_body``.
5. Cancellation: FRAME_CANCEL names the operation by header.frame_id; CANCEL and
   ABORT by operation_id, 0 meaning every operation of the session. A non-zero
   header.frame_id on CANCEL/ABORT must be the operation's own frame (section 3,
   "Keep the (operation_id, frame_id) pair"). A cancel of an operation that already
   ended is a normal race and is ignored; one for an operation never seen, or with
   a mismatched frame, gets a non-fatal ERROR and changes nothing.
6. DEADLINE / EXPIRE_AT for an active operation update its deadline; for an unknown
   one they are held (bounded) and applied when its submit arrives (the wire case
   deadline-before-submit). DEADLINE drops with deadline_expired, EXPIRE_AT with
   superseded (section 7).
7. TRACE_CONTEXT with header.frame_id 0 sets the session default; a non-zero
   frame_id must name an active operation's frame; a non-zero header.trace_id must
   equal the metadata trace_id. Violations are non-fatal ERRORs.
8. Exactly one terminal per operation, nothing after it. After a cancel only
   RESULT_DROP_REASON may end the operation. A send that breaks this raises
   ``LocalProtocolError`` and writes nothing (see ``_OPERATION_TABLE``).
9. PING is answered with PONG at once. SESSION_CLOSE moves the session to
   ``CLOSING``: no new submits; the adapter drains (or aborts) and then calls
   ``send_session_close_ack``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs

from ._body import pack_single_frame, parse_typed_body
from ._codec import Decoder, Packet, decode_packet, encode, encode_partial_result
from ._constants import (
    DEFAULT_MAX_PACKET,
    TOKEN_SCHEMA_ID,
    TOKEN_SCHEMA_VERSION,
    CloseAckStatus,
    DropReason,
    ErrorCode,
    ErrorScope,
    MsgType,
    PayloadKind,
    Role,
    SessionError,
    SessionOpenStatus,
    StandardProfile,
)
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError, TypedBodyError
from ._events import (
    CancelSource,
    ConnectionFailed,
    DeadlineUpdated,
    Event,
    HandshakeCompleted,
    OperationCancelled,
    OperationSubmitted,
    PeerClosed,
    PeerError,
    RefusalReason,
    SendBytes,
    SessionCloseRequested,
    SessionOpened,
    SessionOpenRefused,
    SubmitRefused,
    TraceContextUpdated,
    TraceInfo,
)
from ._idruns import IdRuns
from ._messages import (
    Abort,
    Cancel,
    ClientHello,
    Deadline,
    Error,
    ExpireAt,
    FrameSubmit,
    Pong,
    ResultDropReason,
    ResultPush,
    ServerHelloAck,
    SessionClose,
    SessionCloseAck,
    SessionOpen,
    SessionOpenAck,
    TraceContext,
    TransportProbe,
    TransportProbeAck,
)


class ConnState(enum.Enum):
    AWAIT_HELLO = "await_hello"
    READY = "ready"
    CLOSED = "closed"


class SessionState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"


class OpState(enum.Enum):
    ACTIVE = "active"
    CANCELLING = "cancelling"  # a cancel arrived: only RESULT_DROP_REASON may follow
    DONE = "done"


class OpAction(enum.Enum):
    PARTIAL = "partial"
    RESULT = "result"
    DROP = "drop"
    CANCEL = "cancel"


#: Operation transitions; a missing entry is a LocalProtocolError (rule 8).
_OPERATION_TABLE: dict[tuple[OpState, OpAction], OpState] = {
    (OpState.ACTIVE, OpAction.PARTIAL): OpState.ACTIVE,
    (OpState.ACTIVE, OpAction.RESULT): OpState.DONE,
    (OpState.ACTIVE, OpAction.DROP): OpState.DONE,
    (OpState.ACTIVE, OpAction.CANCEL): OpState.CANCELLING,
    (OpState.CANCELLING, OpAction.DROP): OpState.DONE,
    (OpState.CANCELLING, OpAction.CANCEL): OpState.CANCELLING,
}

#: Session-scoped messages must name an open session (header.session_id).
_SESSION_SCOPED = frozenset({
    MsgType.SESSION_CLOSE, MsgType.FRAME_SUBMIT, MsgType.FRAME_CANCEL, MsgType.CANCEL,
    MsgType.ABORT, MsgType.DEADLINE, MsgType.EXPIRE_AT, MsgType.TRACE_CONTEXT,
    MsgType.PRIORITY_UPDATE, MsgType.SUPERSEDE, MsgType.BUDGET_UPDATE,
    MsgType.CAPABILITY_NEGOTIATION, MsgType.ROUTE_HINT, MsgType.EXECUTION_HINT,
})


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
    lease_ttl_ms: int = 30_000
    token_ttl_ms: int = 120_000
    #: Checks SESSION_OPEN auth bytes; None accepts any (auth is then the transport's job).
    authenticate: Callable[[bytes], bool] | None = None


@attrs.define
class _Operation:
    operation_id: int
    frame_id: int
    state: OpState = OpState.ACTIVE
    sequence: int = 0


@attrs.define
class _Session:
    session_id: int
    max_in_flight: int
    state: SessionState = SessionState.OPEN
    operations: dict[int, _Operation] = attrs.field(factory=dict)
    by_frame: dict[int, int] = attrs.field(factory=dict)
    seen_operations: IdRuns = attrs.field(factory=IdRuns)
    seen_frames: IdRuns = attrs.field(factory=IdRuns)
    pending_deadlines: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    trace: TraceInfo | None = None
    last_operation_id: int = 0


def _diag(text: str) -> bytes:
    return text.encode("utf-8", "replace")[:1024]


class ServerConnection:
    """Sans-IO server role for one transport connection (many sessions)."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.state = ConnState.AWAIT_HELLO
        self._decoder = Decoder(self.config.max_packet)
        self._sessions: dict[int, _Session] = {}
        self.hello: ClientHello | None = None

    @property
    def is_closed(self) -> bool:
        return self.state is ConnState.CLOSED

    # ------------------------------------------------------------------ inputs

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Bytes from a stream transport (TCP, unix socket)."""
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
        handler = _CONNECTION_TABLE[self.state].get(msg_type)
        if handler is None:
            if self.state is ConnState.AWAIT_HELLO:
                raise RemoteProtocolError(f"{msg_type.name} before CLIENT_HELLO",
                                          code=ErrorCode.INVALID_STATE)
            raise RemoteProtocolError(f"{msg_type.name} is not valid from a client",
                                      code=ErrorCode.INVALID_STATE)
        if msg_type in _SESSION_SCOPED and packet.session_id not in self._sessions:
            raise RemoteProtocolError(
                f"{msg_type.name} names session {packet.session_id}, which is not open",
                code=ErrorCode.INVALID_STATE)
        handler(self, packet, events)

    def _fail(self, error: ProtocolError) -> ConnectionFailed:
        """Rules 1 and 2: silent before the handshake, ERROR + close after it."""
        reply = None
        if self.state is ConnState.READY:
            reply = self._error_packet(error.code, str(error), fatal=True)
        self.state = ConnState.CLOSED
        self._sessions.clear()
        return ConnectionFailed(error, reply)

    # ------------------------------------------------------------------ handshake

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

    # ------------------------------------------------------------------ sessions

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
            body = _diag(text)
            ack = SessionOpenAck(
                session_id=0, profile_id=request.profile_id,
                priority_class=request.priority_class, status=SessionOpenStatus.REJECTED,
                schema_id=request.schema_id, schema_version=request.schema_version,
                lease_ttl_ms=self.config.lease_ttl_ms, session_error_code=code)
            events.append(SendBytes(encode(Packet(ack, body=body))))
            events.append(SessionOpenRefused(request.requested_session_id, int(code), text))
            return
        assert session_id is not None
        max_in_flight = min(request.max_in_flight or self.config.max_in_flight,
                            self.config.max_in_flight)
        self._sessions[session_id] = _Session(session_id, max_in_flight)
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
        session.state = SessionState.CLOSING
        abort = request.in_flight_policy == 1
        if abort:
            for operation in list(session.operations.values()):
                self._cancel(session, operation, CancelSource.SESSION_CLOSE, request.reason,
                             b"", events)
        events.append(SessionCloseRequested(session.session_id, abort, request.drain_timeout_ms))

    # ------------------------------------------------------------------ operations

    def _on_submit(self, packet: Packet, events: list[Event]) -> None:
        submit = packet.message
        assert isinstance(submit, FrameSubmit)
        session = self._sessions[packet.session_id]
        frame_id, operation_id = packet.frame_id, submit.operation_id
        if frame_id == 0 or frame_id in session.seen_frames:
            events.append(self._nonfatal(
                ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id, frame_id,
                f"FRAME_SUBMIT frame_id {frame_id} is zero or already used in this session"))
            return
        session.seen_frames.add(frame_id)
        refusal: tuple[RefusalReason, str] | None = None
        if operation_id in session.seen_operations:
            refusal = (RefusalReason.DUPLICATE_OPERATION_ID,
                       f"operation_id {operation_id} is already used in this session")
        elif session.state is SessionState.CLOSING:
            refusal = (RefusalReason.SESSION_CLOSING, "the session is closing")
        elif len(session.operations) >= session.max_in_flight:
            refusal = (RefusalReason.OPERATION_LIMIT,
                       f"session has {session.max_in_flight} operations in flight (the limit)")
        if refusal is not None:
            events.append(SubmitRefused(session.session_id, operation_id, frame_id, *refusal))
            return
        session.seen_operations.add(operation_id)
        session.last_operation_id = operation_id
        session.operations[operation_id] = _Operation(operation_id, frame_id)
        session.by_frame[frame_id] = operation_id
        typed_body = None
        body_error = None
        try:
            typed_body = parse_typed_body(packet.body,
                                          payload_kind_bitmap=submit.payload_kind_bitmap,
                                          payload_frame_count=submit.payload_frame_count)
        except TypedBodyError as exc:
            body_error = str(exc)
        deadline, drop_reason = session.pending_deadlines.pop(operation_id, (None, 0))
        events.append(OperationSubmitted(
            session.session_id, operation_id, frame_id, submit, typed_body, body_error,
            packet.trace_id, session.trace, deadline, drop_reason))

    def _on_frame_cancel(self, packet: Packet, events: list[Event]) -> None:
        session = self._sessions[packet.session_id]
        operation_id = session.by_frame.get(packet.frame_id)
        if operation_id is None:
            if packet.frame_id not in session.seen_frames:
                events.append(self._nonfatal(
                    ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id,
                    packet.frame_id, f"FRAME_CANCEL for unknown frame {packet.frame_id}"))
            return  # already ended: a normal race (rule 5)
        operation = session.operations[operation_id]
        self._cancel(session, operation, CancelSource.FRAME_CANCEL, 1, b"", events)

    def _on_cancel(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, Cancel | Abort)
        session = self._sessions[packet.session_id]
        is_abort = isinstance(request, Abort)
        operation_id, reason = request.operation_id, request.reason
        if operation_id == 0:
            for each in list(session.operations.values()):
                self._cancel(session, each, CancelSource.SESSION_CANCEL, reason, packet.body,
                             events)
            return
        operation = session.operations.get(operation_id)
        if operation is None:
            if operation_id not in session.seen_operations:
                events.append(self._nonfatal(
                    ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id,
                    packet.frame_id,
                    f"{packet.msg_type.name} for unknown operation {operation_id}"))
            return
        if packet.frame_id and packet.frame_id != operation.frame_id:
            events.append(self._nonfatal(
                ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id, packet.frame_id,
                f"{packet.msg_type.name}: operation {operation_id} is bound to frame "
                f"{operation.frame_id}, not {packet.frame_id}"))
            return
        source = CancelSource.ABORT if is_abort else CancelSource.CANCEL
        self._cancel(session, operation, source, reason, packet.body, events)

    def _cancel(self, session: _Session, operation: _Operation, source: CancelSource,
                reason: int, diagnostic: bytes, events: list[Event]) -> None:
        if operation.state is not OpState.ACTIVE:
            return
        operation.state = _OPERATION_TABLE[(operation.state, OpAction.CANCEL)]
        events.append(OperationCancelled(session.session_id, operation.operation_id,
                                         operation.frame_id, source, reason, diagnostic))

    def _on_deadline(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, Deadline | ExpireAt)
        session = self._sessions[packet.session_id]
        drop = (DropReason.DEADLINE_EXPIRED if isinstance(request, Deadline)
                else DropReason.SUPERSEDED)
        operation = session.operations.get(request.operation_id)
        if operation is not None:
            if packet.frame_id and packet.frame_id != operation.frame_id:
                events.append(self._nonfatal(
                    ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id,
                    packet.frame_id, f"{packet.msg_type.name}: operation {operation.operation_id} "
                    f"is bound to frame {operation.frame_id}"))
                return
            if operation.state is OpState.ACTIVE:
                events.append(DeadlineUpdated(session.session_id, operation.operation_id,
                                              request.deadline_unix_ms, int(drop)))
            return
        if request.operation_id in session.seen_operations:
            return  # ended already
        if (request.operation_id not in session.pending_deadlines
                and len(session.pending_deadlines) >= self.config.max_pending_deadlines):
            events.append(self._nonfatal(
                ErrorCode.LIMIT_EXCEEDED, ErrorScope.SESSION, session.session_id,
                packet.frame_id, "too many deadlines held for operations not yet submitted"))
            return
        session.pending_deadlines[request.operation_id] = (request.deadline_unix_ms, int(drop))

    def _on_trace_context(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, TraceContext)
        session = self._sessions[packet.session_id]
        if packet.trace_id and packet.trace_id != request.trace_id:
            events.append(self._nonfatal(
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
        if operation_id is None or session.operations[operation_id].state is not OpState.ACTIVE:
            events.append(self._nonfatal(
                ErrorCode.INVALID_STATE, ErrorScope.FRAME, session.session_id, packet.frame_id,
                f"TRACE_CONTEXT frame {packet.frame_id} names no active operation"))
            return
        events.append(TraceContextUpdated(session.session_id, operation_id, trace))

    # ------------------------------------------------------------------ connection events

    def _on_ping(self, packet: Packet, events: list[Event]) -> None:
        events.append(SendBytes(encode(Packet(Pong(), session_id=packet.session_id,
                                              trace_id=packet.trace_id))))

    def _on_ignorable(self, packet: Packet, events: list[Event]) -> None:
        """PONG and peer flow hints: valid, and nothing to do for a Level 1 server."""

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

    def _on_unsupported(self, packet: Packet, events: list[Event]) -> None:
        events.append(self._nonfatal(
            ErrorCode.UNSUPPORTED_CAPABILITY, ErrorScope.SESSION, packet.session_id,
            packet.frame_id, f"{packet.msg_type.name} is not supported by this server"))

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
        operation.state = next_state
        if next_state is OpState.DONE:
            assert session is not None
            del session.operations[operation_id]
            del session.by_frame[operation.frame_id]
        return operation

    def operation_state(self, session_id: int, operation_id: int) -> OpState:
        """The state of an operation; DONE once it has left the registry."""
        session = self._sessions.get(session_id)
        operation = session.operations.get(operation_id) if session else None
        return operation.state if operation else OpState.DONE

    def send_partial(self, session_id: int, operation_id: int, body: bytes) -> bytes:
        """One PARTIAL_RESULT with the next result_sequence (1, 2, 3, ...)."""
        operation = self._operation(session_id, operation_id, OpAction.PARTIAL)
        operation.sequence += 1
        return encode_partial_result(session_id, operation.frame_id, operation_id,
                                     operation.sequence, body)

    def send_result(self, session_id: int, operation_id: int, status: int, payload: bytes
                    ) -> bytes:
        """The terminal RESULT_PUSH: a typed body with one STRUCTURED_EVENT frame."""
        operation = self._operation(session_id, operation_id, OpAction.RESULT)
        return self._result_packet(session_id, operation.frame_id, status, payload)

    def send_refusal(self, session_id: int, frame_id: int, status: int, payload: bytes) -> bytes:
        """Answer a refused submit (``SubmitRefused``) on its frame; no operation exists."""
        return self._result_packet(session_id, frame_id, status, payload)

    def _result_packet(self, session_id: int, frame_id: int, status: int, payload: bytes
                       ) -> bytes:
        meta = ResultPush(status_code=status,
                          payload_kind_bitmap=int(PayloadKind.STRUCTURED_EVENT),
                          payload_frame_count=1)
        return encode(Packet(meta, session_id=session_id, frame_id=frame_id,
                             body=pack_single_frame(payload)))

    def send_drop(self, session_id: int, operation_id: int, drop_reason: DropReason,
                  diagnostic: bytes) -> bytes:
        """The terminal RESULT_DROP_REASON (after a cancel, a deadline, or a shutdown)."""
        operation = self._operation(session_id, operation_id, OpAction.DROP)
        meta = ResultDropReason(operation_id=operation_id,
                                result_sequence=operation.sequence + 1,
                                drop_reason=int(drop_reason), source_role=int(Role.SERVER),
                                flags=0x01, diagnostic_bytes=len(diagnostic))
        return encode(Packet(meta, session_id=session_id, frame_id=operation.frame_id,
                             body=diagnostic))

    def send_session_close_ack(self, session_id: int) -> bytes:
        """Acknowledge SESSION_CLOSE once the session's operations have ended."""
        session = self._sessions.get(session_id)
        if session is None or session.state is not SessionState.CLOSING:
            raise LocalProtocolError(f"session {session_id} has not asked to close")
        if session.operations:
            raise LocalProtocolError(
                f"session {session_id} still has {len(session.operations)} operations in flight")
        del self._sessions[session_id]
        ack = SessionCloseAck(status=CloseAckStatus.CLOSED,
                              last_operation_id=session.last_operation_id)
        return encode(Packet(ack, session_id=session_id))

    def send_error(self, code: ErrorCode, message: str, *, fatal: bool,
                   scope: ErrorScope = ErrorScope.CONNECTION, session_id: int = 0,
                   frame_id: int = 0) -> bytes:
        """An ERROR frame; a fatal one closes the connection state."""
        data = self._error_packet(code, message, fatal=fatal, scope=scope,
                                  session_id=session_id, frame_id=frame_id)
        if fatal:
            self.state = ConnState.CLOSED
        return data

    def _nonfatal(self, code: ErrorCode, scope: ErrorScope, session_id: int, frame_id: int,
                  message: str) -> SendBytes:
        return SendBytes(self._error_packet(code, message, fatal=False, scope=scope,
                                            session_id=session_id, frame_id=frame_id))

    @staticmethod
    def _error_packet(code: ErrorCode, message: str, *, fatal: bool,
                      scope: ErrorScope = ErrorScope.CONNECTION, session_id: int = 0,
                      frame_id: int = 0) -> bytes:
        body = _diag(message)
        meta = Error(code=int(code), scope=int(scope), is_fatal=int(fatal),
                     related_session_id=session_id, related_frame_id=frame_id,
                     diagnostic_bytes=len(body))
        return encode(Packet(meta, session_id=session_id, body=body))


#: What one client message does to the connection: (connection, packet, events out).
Handler = Callable[[ServerConnection, Packet, list[Event]], None]

#: Which client messages each connection state accepts, and the handler for each.
#: AWAIT_HELLO misses are silent closes (rule 1); READY misses are fatal ERRORs (rule 2).
_CONNECTION_TABLE: dict[ConnState, dict[MsgType, Handler]] = {
    ConnState.AWAIT_HELLO: {
        MsgType.TRANSPORT_PROBE: ServerConnection._on_probe,
        MsgType.CLIENT_HELLO: ServerConnection._on_hello,
    },
    ConnState.READY: {
        MsgType.TRANSPORT_PROBE: ServerConnection._on_probe,
        MsgType.SESSION_OPEN: ServerConnection._on_session_open,
        MsgType.SESSION_CLOSE: ServerConnection._on_session_close,
        MsgType.FRAME_SUBMIT: ServerConnection._on_submit,
        MsgType.FRAME_CANCEL: ServerConnection._on_frame_cancel,
        MsgType.CANCEL: ServerConnection._on_cancel,
        MsgType.ABORT: ServerConnection._on_cancel,
        MsgType.DEADLINE: ServerConnection._on_deadline,
        MsgType.EXPIRE_AT: ServerConnection._on_deadline,
        MsgType.TRACE_CONTEXT: ServerConnection._on_trace_context,
        MsgType.PING: ServerConnection._on_ping,
        MsgType.PONG: ServerConnection._on_ignorable,
        MsgType.FLOW_UPDATE: ServerConnection._on_ignorable,
        MsgType.CREDIT_UPDATE: ServerConnection._on_ignorable,
        MsgType.BACKPRESSURE: ServerConnection._on_ignorable,
        MsgType.CLOSE: ServerConnection._on_close,
        MsgType.ERROR: ServerConnection._on_peer_error,
        # Valid preview4 controls this server does not implement: a typed, non-fatal
        # refusal instead of silence (the reference adapter does the same).
        MsgType.PRIORITY_UPDATE: ServerConnection._on_unsupported,
        MsgType.SUPERSEDE: ServerConnection._on_unsupported,
        MsgType.BUDGET_UPDATE: ServerConnection._on_unsupported,
        MsgType.CAPABILITY_NEGOTIATION: ServerConnection._on_unsupported,
        MsgType.ROUTE_HINT: ServerConnection._on_unsupported,
        MsgType.EXECUTION_HINT: ServerConnection._on_unsupported,
    },
    ConnState.CLOSED: {},
}
