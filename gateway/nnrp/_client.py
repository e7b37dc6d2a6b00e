"""The client side of an NNRP/1 connection, as a sans-IO state machine.

Rules:

1. ``hello()`` first; nothing else is sent before SERVER_HELLO_ACK arrives, but SESSION_OPEN
   (a client resuming on a new connection sends the hello and its resumes in one write:
   the server answers them in order).
2. ``open_session()`` may be called many times; each SESSION_OPEN is answered in order
   (the server assigns the id, so acks are matched to requests first-in first-out).
3. ``submit()`` registers (operation_id, frame_id); both must be fresh in the session.
4. Results for an operation arrive as PARTIAL_RESULTs with result_sequence 1, 2, 3...
   then exactly one terminal: RESULT_PUSH or RESULT_DROP_REASON (or RESULT_DROP).
   A gap in the sequence, a frame for an unknown operation, or anything after the
   terminal is a ``RemoteProtocolError``: the server broke the ordering guarantee.
5. ``close_session()`` sends SESSION_CLOSE; SESSION_CLOSE_ACK ends the session.
6. Resume (gateway/nnrp/_server_lifecycle.py rule 4): ``open_session(resume=True)`` asks for it;
   ``resume_session(session_id, token)`` reopens a session on a new connection;
   ``submit(..., after_sequence=n)`` resubmits an operation whose results up to ``n``
   the client holds, and ``migrate_session`` moves a session here. After a resume or a
   migration a server may send again results the client holds (the same bytes under the
   same sequence): up to what it held, those are ``RepeatReceived``, not a gap.
7. An answer to the hello that starts ``HTTP/`` is an HTTP server's (vLLM's own port: a
   uvicorn answers the hello's bytes with 400 at once): ``HttpAnswerError``, as soon as
   those five bytes are in, rather than a bad magic or a wait for a packet that never
   comes.
"""

from __future__ import annotations

import enum

import attrs

from ._body import TypedBody, parse_typed_body
from ._codec import Decoder, Packet, decode_packet, encode, encode_openai_submit
from ._constants import (
    DEFAULT_MAX_PACKET,
    TOKEN_SCHEMA_ID,
    TOKEN_SCHEMA_VERSION,
    ErrorCode,
    FlowReason,
    FlowScope,
    InFlightPolicy,
    PressureFlag,
    PressureLevel,
    Role,
    SessionFlag,
    SessionOpenStatus,
    StandardProfile,
)
from ._errors import HttpAnswerError, LocalProtocolError, RemoteProtocolError, TypedBodyError
from ._messages import (
    Abort,
    Backpressure,
    Cancel,
    ClientHello,
    CreditUpdate,
    Deadline,
    Error,
    FlowUpdate,
    FrameCancel,
    FrameSubmit,
    Message,
    PartialResult,
    Ping,
    ResultDropReason,
    ResultPush,
    ServerHelloAck,
    SessionClose,
    SessionCloseAck,
    SessionMigrate,
    SessionOpen,
    SessionOpenAck,
    TraceContext,
)

#: How an HTTP server's answer starts (rule 7), and the most of its status line quoted.
_HTTP_ANSWER = b"HTTP/"
_STATUS_LINE_MAX = 80


class ClientState(enum.Enum):
    IDLE = "idle"
    AWAIT_HELLO_ACK = "await_hello_ack"
    READY = "ready"
    CLOSED = "closed"


# --------------------------------------------------------------------------- events


@attrs.frozen
class HelloAcked:
    ack: ServerHelloAck


@attrs.frozen
class SessionOpenAnswered:
    session_id: int
    ack: SessionOpenAck
    diagnostic: bytes

    @property
    def opened(self) -> bool:
        return self.ack.status in (SessionOpenStatus.OPENED, SessionOpenStatus.RESUMED)


@attrs.frozen
class PartialReceived:
    session_id: int
    operation_id: int
    frame_id: int
    sequence: int
    body: bytes


@attrs.frozen
class ResultReceived:
    """Terminal RESULT_PUSH. ``typed_body`` is None for a body-less success."""

    session_id: int
    operation_id: int
    frame_id: int
    meta: ResultPush
    typed_body: TypedBody | None


@attrs.frozen
class DropReceived:
    """Terminal RESULT_DROP_REASON (or header-only RESULT_DROP, with reason 0)."""

    session_id: int
    operation_id: int
    frame_id: int
    drop_reason: int
    diagnostic: bytes


@attrs.frozen
class SessionCloseAcked:
    session_id: int
    ack: SessionCloseAck


@attrs.frozen
class ErrorReceived:
    session_id: int
    error: Error
    diagnostic: bytes


@attrs.frozen
class OtherReceived:
    """Any other valid server message (PONG, PROGRESS, TRACE_CONTEXT, flow hints...)."""

    packet: Packet


@attrs.frozen
class RepeatReceived:
    """A PARTIAL_RESULT the client holds already, sent again after a resume or a migration
    (rule 6): dropped."""

    session_id: int
    operation_id: int
    frame_id: int
    sequence: int


ClientEvent = (HelloAcked | SessionOpenAnswered | PartialReceived | RepeatReceived
               | ResultReceived | DropReceived | SessionCloseAcked | ErrorReceived
               | OtherReceived)


@attrs.define
class _ClientOp:
    operation_id: int
    frame_id: int
    sequence: int = 0
    #: Results up to ``sequence`` may come again (a resumed or migrated session).
    repeats: bool = False


@attrs.define
class _ClientSession:
    session_id: int
    by_frame: dict[int, _ClientOp] = attrs.field(factory=dict)
    by_operation: dict[int, _ClientOp] = attrs.field(factory=dict)
    closing: bool = False
    #: The highest operation id submitted: SESSION_CLOSE's last_operation_id.
    last_operation_id: int = 0
    #: Frames whose terminal the client holds already (a migrated session: what the
    #: server sends again of them is a repeat).
    ended_frames: frozenset[int] = frozenset()


class ClientConnection:
    """Sans-IO client role for one transport connection."""

    def __init__(self, max_packet: int = DEFAULT_MAX_PACKET) -> None:
        self.state = ClientState.IDLE
        self.max_packet = max_packet
        self._decoder = Decoder(max_packet)
        self._sessions: dict[int, _ClientSession] = {}
        self._opening = 0
        self.server_hello: ServerHelloAck | None = None
        #: The first bytes the server sent, until they show whether it speaks HTTP (rule
        #: 7); None once they have.
        self._first_bytes: bytes | None = b""

    # ------------------------------------------------------------------ sends

    def hello(self, *, profile_bitmap: int = 0b11,
              payload_kind_bitmap: int = 0x73, latency_budget_ms: int = 500) -> bytes:
        if self.state is not ClientState.IDLE:
            raise LocalProtocolError("hello() may only be sent once, first")
        self.state = ClientState.AWAIT_HELLO_ACK
        return encode(Packet(ClientHello(profile_bitmap=profile_bitmap,
                                         payload_kind_bitmap=payload_kind_bitmap,
                                         latency_budget_ms=latency_budget_ms)))

    def open_session(self, *, requested_session_id: int = 0,
                     profile_id: int = int(StandardProfile.TOKEN),
                     schema_id: int = TOKEN_SCHEMA_ID,
                     schema_version: int = TOKEN_SCHEMA_VERSION, max_in_flight: int = 0,
                     auth: bytes = b"", resume: bool = False) -> bytes:
        """SESSION_OPEN; ``resume`` asks for a resume token (rule 6)."""
        return self._open(requested_session_id, b"", auth, profile_id, schema_id,
                          schema_version, max_in_flight, resume=resume)

    def resume_session(self, session_id: int, token: bytes, *, auth: bytes = b"",
                       profile_id: int = int(StandardProfile.TOKEN),
                       schema_id: int = TOKEN_SCHEMA_ID,
                       schema_version: int = TOKEN_SCHEMA_VERSION,
                       max_in_flight: int = 0) -> bytes:
        """SESSION_OPEN with the session's resume token (rule 6)."""
        return self._open(session_id, token, auth, profile_id, schema_id, schema_version,
                          max_in_flight, resume=True)

    def _open(self, requested_session_id: int, token: bytes, auth: bytes, profile_id: int,
              schema_id: int, schema_version: int, max_in_flight: int, *, resume: bool
              ) -> bytes:
        if self.state is not ClientState.AWAIT_HELLO_ACK:  # rule 1: pipelined after it
            self._require_ready()
        self._opening += 1
        meta = SessionOpen(requested_session_id=requested_session_id, profile_id=profile_id,
                           priority_class=1, schema_id=schema_id, schema_version=schema_version,
                           max_in_flight=max_in_flight, lease_ttl_hint_ms=30_000,
                           session_flags=int(SessionFlag.ALLOW_RESUME) if resume else 0,
                           resume_token_bytes=len(token), auth_bytes=len(auth))
        return encode(Packet(meta, body=token + auth))

    def migrate_session(self, session_id: int, token: bytes, *, old_transport_id: int,
                        new_transport_id: int, last_result_frame_id: int = 0) -> bytes:
        """SESSION_MIGRATE for a session open on another connection (rule 6): its answer
        is an ``OtherReceived`` SESSION_MIGRATE_ACK; ``adopt_session`` once accepted."""
        self._require_ready()
        meta = SessionMigrate(old_transport_id=old_transport_id,
                              new_transport_id=new_transport_id,
                              last_result_frame_id=last_result_frame_id)
        return encode(Packet(meta, session_id=session_id, body=token))

    def adopt_session(self, session_id: int,
                      operations: dict[int, tuple[int, int]], *,
                      ended_frames: frozenset[int] = frozenset()) -> None:
        """A session migrated here, with its operations in flight (operation id ->
        (frame id, sequence held)): their results continue, repeats allowed; what comes
        again for ``ended_frames`` (their terminal is held) is a repeat too."""
        session = self._sessions.setdefault(session_id, _ClientSession(session_id))
        session.ended_frames = ended_frames
        for operation_id, (frame_id, sequence) in operations.items():
            operation = _ClientOp(operation_id, frame_id, sequence, repeats=True)
            session.by_frame[frame_id] = operation
            session.by_operation[operation_id] = operation

    def forget_session(self, session_id: int) -> None:
        """A session adopted here that stays elsewhere after all (a refused migration)."""
        self._sessions.pop(session_id, None)

    def submit(self, session_id: int, operation_id: int, frame_id: int, payload: bytes, *,
               trace_id: int = 0, after_sequence: int | None = None) -> bytes:
        """FRAME_SUBMIT with one STRUCTURED_EVENT typed frame (the openai mapping);
        ``after_sequence``: a resubmission after a resume, of an operation whose results
        up to that sequence the client holds (the payload must then say so: rule 6)."""
        self._register(session_id, operation_id, frame_id)
        if after_sequence is not None:
            operation = self._sessions[session_id].by_operation[operation_id]
            operation.sequence, operation.repeats = after_sequence, True
        return encode_openai_submit(session_id, frame_id, operation_id, payload,
                                    trace_id=trace_id)

    def submit_frame(self, session_id: int, frame_id: int, meta: FrameSubmit,
                     body: bytes) -> bytes:
        """FRAME_SUBMIT with metadata and typed body as given (other profiles' requests,
        such as the wire runner's token chunk)."""
        self._register(session_id, meta.operation_id, frame_id)
        return encode(Packet(meta, session_id=session_id, frame_id=frame_id, body=body))

    def _register(self, session_id: int, operation_id: int, frame_id: int) -> None:
        session = self._session(session_id)
        if (operation_id == 0 or frame_id == 0 or operation_id in session.by_operation
                or frame_id in session.by_frame):
            raise LocalProtocolError(
                f"operation {operation_id} / frame {frame_id} is zero or already in flight")
        operation = _ClientOp(operation_id, frame_id)
        session.by_frame[frame_id] = operation
        session.by_operation[operation_id] = operation
        session.last_operation_id = max(session.last_operation_id, operation_id)

    def cancel(self, session_id: int, operation_id: int, *, frame_id: int = 0,
               control_sequence: int = 1, reason: int = 1, abort: bool = False,
               diagnostic: bytes = b"") -> bytes:
        """CANCEL (or ABORT); ``operation_id`` 0 cancels the whole session."""
        self._session(session_id)
        cls = Abort if abort else Cancel
        meta = cls(operation_id=operation_id, control_sequence=control_sequence, reason=reason,
                   source_role=int(Role.CLIENT), flags=0x01 if not abort else 0x02,
                   diagnostic_bytes=len(diagnostic))
        return encode(Packet(meta, session_id=session_id, frame_id=frame_id, body=diagnostic))

    def frame_cancel(self, session_id: int, frame_id: int) -> bytes:
        self._session(session_id)
        return encode(Packet(FrameCancel(), session_id=session_id, frame_id=frame_id))

    def deadline(self, session_id: int, operation_id: int, deadline_unix_ms: int, *,
                 frame_id: int = 0, control_sequence: int = 1) -> bytes:
        self._session(session_id)
        meta = Deadline(operation_id=operation_id, control_sequence=control_sequence,
                        deadline_unix_ms=deadline_unix_ms)
        return encode(Packet(meta, session_id=session_id, frame_id=frame_id))

    def trace_context(self, session_id: int, *, trace_id: int, span_id: int,
                      parent_span_id: int = 0, trace_flags: int = 1, frame_id: int = 0,
                      attributes: bytes = b"") -> bytes:
        """TRACE_CONTEXT: ``frame_id`` 0 = session default, else that operation's frame."""
        self._session(session_id)
        meta = TraceContext(trace_id=trace_id, span_id=span_id, parent_span_id=parent_span_id,
                            trace_flags=trace_flags, body_bytes=len(attributes))
        return encode(Packet(meta, session_id=session_id, frame_id=frame_id, trace_id=trace_id,
                             body=attributes))

    def backpressure(self, session_id: int, level: PressureLevel, *,
                     operation_id: int = 0) -> bytes:
        """BACKPRESSURE (soft, hard or paused) over the session's output, or one
        operation's when ``operation_id`` is given."""
        if level is PressureLevel.NONE:
            raise LocalProtocolError("BACKPRESSURE needs a level: lift one with "
                                     "credit_update or flow_resume")
        return self._pressure(Backpressure, session_id, level, 0, operation_id)

    def credit_update(self, session_id: int, window: int, *, operation_id: int = 0) -> bytes:
        """CREDIT_UPDATE: ``window`` more PARTIAL_RESULTs may come (absolute, not added)."""
        return self._pressure(CreditUpdate, session_id, PressureLevel.NONE, window,
                              operation_id)

    def flow_resume(self, session_id: int) -> bytes:
        """FLOW_UPDATE resume: the session's output flows again, with no window."""
        self._session(session_id)
        meta = FlowUpdate(scope=int(FlowScope.SESSION), reason=int(FlowReason.RESUME))
        return encode(Packet(meta, session_id=session_id))

    def _pressure(self, cls: type[Backpressure | CreditUpdate], session_id: int,
                  level: PressureLevel, window: int, operation_id: int) -> bytes:
        self._session(session_id)
        flags = PressureFlag.OPERATION if operation_id else PressureFlag.NONE
        meta = cls(scope_id=operation_id or session_id, credit_window=window,
                   level=int(level), flags=int(flags))
        return encode(Packet(meta, session_id=session_id))

    def ping(self) -> bytes:
        self._require_ready()
        return encode(Packet(Ping()))

    def close_session(self, session_id: int, *, abort: bool = False,
                      drain_timeout_ms: int = 5_000, close_tag: int = 0) -> bytes:
        session = self._session(session_id)
        session.closing = True
        meta = SessionClose(reason=1, in_flight_policy=int(InFlightPolicy.ABORT if abort
                                                           else InFlightPolicy.DRAIN),
                            drain_timeout_ms=drain_timeout_ms,
                            last_operation_id=session.last_operation_id, close_tag=close_tag)
        return encode(Packet(meta, session_id=session_id))

    def _require_ready(self) -> None:
        if self.state is not ClientState.READY:
            raise LocalProtocolError(f"connection is {self.state.value}, not ready")

    def _session(self, session_id: int) -> _ClientSession:
        self._require_ready()
        session = self._sessions.get(session_id)
        if session is None:
            raise LocalProtocolError(f"session {session_id} is not open")
        return session

    # ------------------------------------------------------------------ receives

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[ClientEvent]:
        """Bytes from a stream transport. Raises RemoteProtocolError on a server violation."""
        if self._first_bytes is not None:
            self._check_not_http(data)
        events = [self._handle(packet) for packet in self._decoder.feed(data)]
        if self._decoder.error is not None:
            self.state = ClientState.CLOSED
            if not events:
                raise self._decoder.error
        return events

    def _check_not_http(self, data: bytes | bytearray | memoryview) -> None:
        """Rule 7, on the first bytes of the stream (those of a few reads at most)."""
        assert self._first_bytes is not None
        first = self._first_bytes + bytes(data[:_STATUS_LINE_MAX])
        if len(first) < len(_HTTP_ANSWER) and _HTTP_ANSWER.startswith(first):
            self._first_bytes = first  # "HTT": wait for the next read to say
            return
        self._first_bytes = None
        if first.startswith(_HTTP_ANSWER):
            self.state = ClientState.CLOSED
            line = first[:_STATUS_LINE_MAX].split(b"\r\n", 1)[0].split(b"\n", 1)[0]
            raise HttpAnswerError(line.decode("latin-1"))

    def receive_message(self, data: bytes | bytearray | memoryview, *,
                        given_away: bool = False) -> list[ClientEvent]:
        """One WebSocket binary message (exactly one packet). ``given_away``: the caller
        never changes a bytearray ``data`` again (``decode_packet``)."""
        return [self._handle(decode_packet(data, self.max_packet, given_away=given_away))]

    def _handle(self, packet: Packet) -> ClientEvent:
        message: Message = packet.message
        #: The client owns what it hands its caller: a view of a big body becomes bytes.
        body = bytes(packet.body)
        if self.state is ClientState.AWAIT_HELLO_ACK and not isinstance(message, Error):
            if not isinstance(message, ServerHelloAck):
                raise RemoteProtocolError(f"expected SERVER_HELLO_ACK, got {packet.msg_type.name}",
                                          code=ErrorCode.INVALID_STATE)
            self.server_hello = message
            self.state = ClientState.READY
            return HelloAcked(message)
        if isinstance(message, SessionOpenAck):
            if self._opening <= 0:
                raise RemoteProtocolError("unsolicited SESSION_OPEN_ACK",
                                          code=ErrorCode.INVALID_STATE)
            self._opening -= 1
            event = SessionOpenAnswered(packet.session_id, message, body)
            if event.opened:
                self._sessions[packet.session_id] = _ClientSession(packet.session_id)
            return event
        if isinstance(message, Error):
            if message.is_fatal:
                self.state = ClientState.CLOSED
            return ErrorReceived(packet.session_id, message, body)
        if isinstance(message, SessionCloseAck):
            self._sessions.pop(packet.session_id, None)
            return SessionCloseAcked(packet.session_id, message)
        if isinstance(message, PartialResult | ResultPush | ResultDropReason):
            session = self._sessions.get(packet.session_id)
            if (session is not None and packet.frame_id in session.ended_frames
                    and packet.frame_id not in session.by_frame):
                sequence = (message.result_sequence
                            if isinstance(message, PartialResult | ResultDropReason) else 0)
                operation_id = (message.operation_id
                                if isinstance(message, PartialResult | ResultDropReason)
                                else 0)
                return RepeatReceived(packet.session_id, operation_id, packet.frame_id,
                                      sequence)
        if isinstance(message, PartialResult):
            operation = self._operation_for(packet, message.operation_id)
            if operation.repeats and message.result_sequence <= operation.sequence:
                return RepeatReceived(packet.session_id, operation.operation_id,
                                      packet.frame_id, message.result_sequence)
            expected = operation.sequence + 1
            if message.result_sequence != expected:
                raise RemoteProtocolError(
                    f"PARTIAL_RESULT sequence {message.result_sequence}, expected {expected}",
                    code=ErrorCode.INVALID_STATE)
            operation.sequence = expected
            return PartialReceived(packet.session_id, operation.operation_id, packet.frame_id,
                                   expected, body)
        if isinstance(message, ResultPush):
            operation = self._terminal(packet, None)
            typed = None
            if message.payload_frame_count or body:
                try:
                    typed = parse_typed_body(body,
                                             payload_kind_bitmap=message.payload_kind_bitmap,
                                             payload_frame_count=message.payload_frame_count)
                except TypedBodyError as exc:
                    raise RemoteProtocolError(f"RESULT_PUSH body: {exc}",
                                              code=ErrorCode.MALFORMED_BODY) from exc
            return ResultReceived(packet.session_id, operation.operation_id, packet.frame_id,
                                  message, typed)
        if isinstance(message, ResultDropReason):
            operation = self._terminal(packet, message.operation_id)
            return DropReceived(packet.session_id, operation.operation_id, packet.frame_id,
                                message.drop_reason, body)
        if packet.msg_type.name == "RESULT_DROP":
            operation = self._terminal(packet, None)
            return DropReceived(packet.session_id, operation.operation_id, packet.frame_id, 0,
                                b"")
        return OtherReceived(packet)

    def _operation_for(self, packet: Packet, operation_id: int | None) -> _ClientOp:
        session = self._sessions.get(packet.session_id)
        operation = session.by_frame.get(packet.frame_id) if session else None
        if operation is None or (operation_id is not None
                                 and operation.operation_id != operation_id):
            raise RemoteProtocolError(
                f"{packet.msg_type.name} for session {packet.session_id} frame "
                f"{packet.frame_id}, which has no operation in flight",
                code=ErrorCode.INVALID_STATE)
        return operation

    def _terminal(self, packet: Packet, operation_id: int | None) -> _ClientOp:
        operation = self._operation_for(packet, operation_id)
        session = self._sessions[packet.session_id]
        del session.by_frame[operation.frame_id]
        del session.by_operation[operation.operation_id]
        return operation

    def in_flight(self, session_id: int) -> int:
        session = self._sessions.get(session_id)
        return len(session.by_operation) if session else 0
