"""The server side of an NNRP/1 connection, as a sans-IO state machine.

The I/O adapter (gateway.server) feeds bytes in and acts on the events that come out.
This module is the connection: the handshake, opening, resuming, migrating and closing
sessions, the client's flow windows, and the rule table that routes every message; a
session's own state and frames are ``_server_session``, the runtime controls
``_server_controls``.

Rules (the ``_RULES`` table at the bottom has one row per preview4 message type; each
row names its acceptance scope and its handler, and each handler cites its rule; rules
5 and 15 are ``_server_session``'s, 6 to 10, 12 to 14 and 17 ``_server_controls``' (17:
the runtime objects, whose table is ``_objects``)):

1. Connection start. ``AWAIT_HELLO`` accepts TRANSPORT_PROBE (answered with PROBE_ACK)
   and CLIENT_HELLO. Anything else before the hello (garbage, a bad magic, a
   SESSION_OPEN) closes the connection *without a reply*, as the reference server does
   (nnrp-wire.md section 5). A hello whose profile bitmap does not meet ours also closes
   it silently (section 1, step 3).
2. Only malformed or unknown input closes a connection in ``READY``: framing and header
   errors, an unknown msg_type, a second CLIENT_HELLO. Every operation still in flight,
   of every session, gets RESULT_DROP_REASON transport_closed; then a fatal ERROR with
   session_id 0 (which nnrp-py's native client ignores), then the close. Every other
   well-formed frame has a rule below, and none of them closes the connection. A
   connection that fails takes its sessions with it, resumable ones included: their
   state can no longer be trusted.
3. Refusals never break a session. A control that cannot be honoured is answered with
   ERROR_RECOVERABLE, scoped to its frame or session: nnrp-py's native client delivers
   it as an event, whereas a session-scoped ERROR (0x06) wedges that client's session
   (research: docs/runtime-controls.md). A frame naming a session that is not open is
   answered with a non-fatal ERROR carrying session_id 0 and ``related_session_id``.
4. Sessions: SESSION_OPEN gets SESSION_OPEN_ACK with the requested id when free, else
   the lowest free id from 1. Refusals (profile, schema, resume, limit, auth) are an ACK
   with status rejected, an error code and a UTF-8 diagnostic. While the server drains,
   the status is retry_later (``start_draining``).
   a. Resume granted: a SESSION_OPEN with ``allow_resume`` gets ``resume_enabled``, a
      token (the ACK's body) and the window, when the ``SessionStore`` grants them;
      otherwise the session opens without resume (session_flags_ack may only confirm or
      downgrade what was asked: preview3 section 7.1B).
   b. Resume: a SESSION_OPEN whose body starts with a token (``resume_token_bytes``)
      needs ``allow_resume`` and the session's id (session-recovery.md). The store gives
      back the detached session that token opens, and its next token (tokens rotate:
      a token is good once); the ACK says resumed. Anything wrong (unknown, expired,
      used, another identity's token, an id already open here) is rejected with
      ``resume_rejected``, the same answer whatever it was; a session still attached to
      a connection the server has not yet seen die is retry_later (only the holder of
      its current token learns that). While the server drains, retry_later.
   c. SESSION_MIGRATE for a session open on this connection is the reference runtime's
      exchange: acknowledged, nothing moves. For a session not open here it moves the
      session to this connection (preview2 section 10.4: "establish a new connection on
      the candidate path and send SESSION_MIGRATE"), taking it from the connection it
      was on, if any. Its body is the migration token, the session's current resume
      token; old and new transport must differ and the new one must be this
      connection's (nnrp-core's rule). The ACK's resume_from_frame_id is past every
      frame the session has used and not behind last_result_frame_id: the client
      resubmits nothing, and the results of frames after last_result_frame_id are
      replayed (``SessionMigrated``). A refusal is a non-zero accept_code
      (``MigrateAccept``).
   d. A token of a session another process of the gateway holds (``--workers``): if
      the resume or migration is the first session message of the connection, nothing
      is answered, the connection is ``HANDED_OFF`` (``HandedOff``) and reads nothing
      more; the I/O layer relays it whole to that process. Otherwise it is refused.
11. Flow control: BACKPRESSURE, CREDIT_UPDATE and FLOW_UPDATE change the client's windows
    over our PARTIAL_RESULTs (``_flow``); ``flow_wait`` says when the next may go. Their
    flags (or FLOW_UPDATE's scope) pick connection, session or operation; an operation
    window only for an operation in flight (else noted and ignored). Windows belong to
    the connection: a session resumed or migrated here starts with none.
13. Features this server does not have are refused in their own message's form, or
    noted and ignored (``_server_controls`` rule 13, and its ``IGNORED`` table).
16. PING is answered with PONG at once. SESSION_CLOSE moves the session to ``CLOSING``:
    no new submits; the adapter drains (or aborts) and then calls
    ``send_session_close_ack``. CLOSE and a fatal ERROR from the peer end the connection.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

import attrs

from . import _server_controls as controls
from ._codec import Decoder, Packet, decode_packet, encode
from ._constants import (
    TOKEN_SCHEMA_ID,
    TOKEN_SCHEMA_VERSION,
    CloseAckStatus,
    ErrorCode,
    ErrorScope,
    FlowScope,
    MigrateAccept,
    MsgType,
    PressureFlag,
    SessionAckFlag,
    SessionError,
    SessionFlag,
    SessionOpenStatus,
    TransportId,
)
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from ._events import (
    CancelSource,
    ConnectionFailed,
    Event,
    FlowChanged,
    FrameIgnored,
    HandedOff,
    HandshakeCompleted,
    PeerClosed,
    PeerError,
    SendBytes,
    SessionCloseRequested,
    SessionMigrated,
    SessionOpened,
    SessionOpenRefused,
    SessionResumed,
)
from ._flow import FlowControl
from ._messages import (
    Backpressure,
    ClientHello,
    CreditUpdate,
    Error,
    FlowUpdate,
    Pong,
    ServerHelloAck,
    SessionClose,
    SessionCloseAck,
    SessionMigrate,
    SessionMigrateAck,
    SessionOpen,
    SessionOpenAck,
    TransportProbe,
    TransportProbeAck,
)
from ._server_config import ServerConfig
from ._server_outputs import SessionOutputs
from ._server_recovery import ResumeGrant, ResumeRefused, SessionStore, identity_of
from ._server_session import (
    ServerSession,
    SessionState,
    diagnostic,
)


class ConnState(enum.Enum):
    AWAIT_HELLO = "await_hello"
    READY = "ready"
    CLOSED = "closed"
    HANDED_OFF = "handed_off"  # relayed to another process from now on (rule 4d)


#: SESSION_MIGRATE_ACK accept_code of a refusal without a better reason (rule 4c).
MIGRATION_REFUSED = int(MigrateAccept.REFUSED)


class ServerConnection(SessionOutputs):
    """Sans-IO server role for one transport connection (many sessions).

    ``clock`` (seconds, monotonic) times the client's retry-after windows and supersede
    holds; tests pass their own. ``store`` keeps resumable sessions between connections
    (None: resume and migrate are refused). ``transport_id`` is the carrier this
    connection arrived on (a migration must name it)."""

    def __init__(self, config: ServerConfig | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, *,
                 store: SessionStore | None = None,
                 transport_id: TransportId | None = None) -> None:
        self.config = config or ServerConfig()
        self.state = ConnState.AWAIT_HELLO
        self.draining = False
        self.flow = FlowControl(clock)
        self.store = store
        self.transport_id = transport_id
        self._clock = clock
        self._wall_clock = wall_clock  # DEADLINE / EXPIRE_AT are Unix times
        self._decoder = Decoder(self.config.max_packet)
        self._sessions: dict[int, ServerSession] = {}
        #: The credentials sessions were opened or resumed with here (with session auth
        #: on): what a SESSION_MIGRATE, which carries none, is checked against (rule 4c).
        self._identities: set[bytes] = set()
        self.hello: ClientHello | None = None

    @property
    def is_closed(self) -> bool:
        return self.state is ConnState.CLOSED

    def session(self, session_id: int) -> ServerSession | None:
        return self._sessions.get(session_id)

    def start_draining(self) -> None:
        """Refuse new sessions (retry_later) and new submits (recoverable, with a retry
        time): the gateway is shutting down and clients should go elsewhere (rule 4, 5)."""
        self.draining = True
        for session in self._sessions.values():
            session.draining = True

    def detach(self, session_id: int) -> ServerSession | None:
        """Let a session go (its connection ended without SESSION_CLOSE, or a migration
        takes it elsewhere): its operations stay as they are, its flow windows go."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self.flow.forget_session(session_id)
        return session

    def _attach(self, session: ServerSession) -> None:
        session.draining = self.draining
        self._sessions[session.session_id] = session

    # ------------------------------------------------------------------ inputs

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Bytes from a stream transport (TCP, unix socket, a QUIC stream)."""
        if self.state in (ConnState.CLOSED, ConnState.HANDED_OFF):
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
        if self.state in (ConnState.CLOSED, ConnState.HANDED_OFF):
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
            if self.state in (ConnState.CLOSED, ConnState.HANDED_OFF):
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
        if isinstance(rule, ConnectionRule):
            rule.handler(self, packet, events)
            return
        session = self._session_of(packet, rule.scope)
        if session is None:
            events.append(self._nonfatal_error(
                ErrorCode.INVALID_STATE, packet.session_id,
                f"{msg_type.name} names session {packet.session_id}, which is not open"))
            return
        if session.session_id != packet.session_id:
            packet = packet._replace(session_id=session.session_id)
        rule.handler(session, packet, events)

    def _session_of(self, packet: Packet, scope: Scope) -> ServerSession | None:
        session = self._sessions.get(packet.session_id)
        if session is not None:
            return session
        if packet.session_id == 0 and scope is Scope.SESSION_OR_ONLY_ONE and len(
                self._sessions) == 1:
            return next(iter(self._sessions.values()))  # session-optional controls (rule 12)
        return None

    def _fail(self, error: ProtocolError) -> ConnectionFailed:
        """Rules 1 and 2: silent before the handshake; after it, every operation still in
        flight (of every session) ends with RESULT_DROP_REASON transport_closed, then the
        fatal ERROR, then the close."""
        replies: list[bytes] = []
        if self.state is ConnState.READY:
            for session in self._sessions.values():
                replies.extend(session.drops_on_failure())
            replies.append(self._error_packet(error.code, str(error), fatal=True))
        self.state = ConnState.CLOSED
        self._sessions.clear()
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
        token = packet.body[:request.resume_token_bytes]
        auth = packet.body[request.resume_token_bytes:
                           request.resume_token_bytes + request.auth_bytes]
        refusal = self._session_refusal(request, auth, resuming=bool(token))
        if refusal is None and token:
            self._resume(request, token, auth, events)
            return
        session_id = self._pick_session_id(request.requested_session_id)
        if refusal is None and session_id is None:
            refusal = (SessionError.LIMIT_REACHED, "no free session id")
        busy = None
        if refusal is None and self.config.admit_session is not None:
            busy = self.config.admit_session()  # the gateway's load-aware admission
            if busy is not None:
                refusal = (SessionError.LIMIT_REACHED, busy)
        if refusal is not None:
            code, text = refusal
            retry = (self.draining or busy is not None) and code is SessionError.LIMIT_REACHED
            self._refuse_open(request, code, text, events, retry_later=retry)
            return
        assert session_id is not None
        max_in_flight = min(request.max_in_flight or self.config.max_in_flight,
                            self.config.max_in_flight)
        session = ServerSession(session_id, self.config, max_in_flight=max_in_flight,
                                priority_class=request.priority_class,
                                profile=_profile_of(request), clock=self._clock,
                                wall_clock=self._wall_clock)
        self._authenticated(auth)
        grant = None
        if request.session_flags & SessionFlag.ALLOW_RESUME and self.store is not None:
            grant = self.store.grant(session, identity_of(auth))  # rule 4a
        session.resumable = grant is not None
        self._attach(session)
        events.append(SendBytes(self._open_ack(session, request, SessionOpenStatus.OPENED,
                                               grant)))
        events.append(SessionOpened(session_id, request, max_in_flight,
                                    resumable=grant is not None))

    def _resume(self, request: SessionOpen, token: bytes, auth: bytes,
                events: list[Event]) -> None:
        """Rule 4b."""
        session_id = request.requested_session_id
        rejected = (SessionError.RESUME_REJECTED,
                    "resume rejected: no session can be resumed with this token")
        gone = (SessionError.RESUME_REJECTED,
                "resume rejected: the gateway process that held the session is gone")
        if not request.session_flags & SessionFlag.ALLOW_RESUME or not session_id:
            self._refuse_open(request, *rejected, events)
            return
        if self.draining:
            self._refuse_open(request, SessionError.RESUME_REJECTED,
                              "the server is draining; open a session elsewhere", events,
                              retry_later=True)
            return
        if self.store is None or session_id in self._sessions:
            self._refuse_open(request, *rejected, events)
            return
        claimed = self.store.resume(session_id, token, identity_of(auth))
        if not isinstance(claimed, ResumeRefused) and claimed[0].profile != _profile_of(
                request):
            # Incompatible with the profile or schema it was opened with: rejected alike
            # (preview3 section 11.2). Its token was spent: it stays detached until its
            # window passes, as after any refusal a client cannot take back.
            claimed = ResumeRefused.REJECTED
        if claimed is ResumeRefused.ELSEWHERE and not self._sessions:
            self._hand_off(session_id, self._open_refusal(request, *gone), events)  # rule 4d
            return
        if isinstance(claimed, ResumeRefused):
            if claimed is ResumeRefused.RETRY_LATER:
                self._refuse_open(request, SessionError.RESUME_REJECTED,
                                  "the session is still attached to its previous "
                                  "connection; retry shortly", events, retry_later=True)
            else:
                self._refuse_open(request, *rejected, events)
            return
        session, grant = claimed
        session.resumed()
        self._authenticated(auth)
        self._attach(session)
        events.append(SendBytes(self._open_ack(session, request, SessionOpenStatus.RESUMED,
                                               grant)))
        events.append(SessionResumed(session_id, request))

    def _open_ack(self, session: ServerSession, request: SessionOpen,
                  status: SessionOpenStatus, grant: ResumeGrant | None) -> bytes:
        """What the session is (a resumed one: as it was opened), and the credit left
        (a resumed one may have operations in flight)."""
        max_in_flight = min(session.max_in_flight, 0xFFFF)
        profile_id, schema_id, schema_version = session.profile
        ack = SessionOpenAck(
            session_id=session.session_id, profile_id=profile_id,
            priority_class=session.priority_class, status=status,
            schema_id=schema_id, schema_version=schema_version,
            granted_operation_credit=max(0, max_in_flight - len(session.operations)),
            max_in_flight=max_in_flight,
            lease_ttl_ms=self.config.lease_ttl_ms,
            resume_window_ms=grant.window_ms if grant else 0,
            resume_token_bytes=len(grant.token) if grant else 0,
            server_session_tag=session.session_id,
            session_flags_ack=int(SessionAckFlag.RESUME_ENABLED) if grant else 0)
        return encode(Packet(ack, session_id=session.session_id,
                             body=grant.token if grant else b""))

    def _authenticated(self, auth: bytes) -> None:
        if self.config.authenticate is not None:
            self._identities.add(identity_of(auth))

    def _refuse_open(self, request: SessionOpen, code: SessionError, text: str,
                     events: list[Event], *, retry_later: bool = False) -> None:
        events.append(SendBytes(self._open_refusal(request, code, text,
                                                   retry_later=retry_later)))
        events.append(SessionOpenRefused(request.requested_session_id, int(code), text))

    def _open_refusal(self, request: SessionOpen, code: SessionError, text: str, *,
                      retry_later: bool = False) -> bytes:
        status = SessionOpenStatus.RETRY_LATER if retry_later else SessionOpenStatus.REJECTED
        body = diagnostic(text)
        # The diagnostic is declared in session_extension_bytes, as the reference server
        # declares its own: nnrp-py's client refuses a body it was not told of (and then
        # reports a local fault instead of the refusal).
        ack = SessionOpenAck(
            session_id=0, profile_id=request.profile_id,
            priority_class=request.priority_class, status=status,
            schema_id=request.schema_id, schema_version=request.schema_version,
            lease_ttl_ms=self.config.lease_ttl_ms, session_extension_bytes=len(body),
            session_error_code=code)
        return encode(Packet(ack, body=body))

    def _session_refusal(self, request: SessionOpen, auth: bytes, *, resuming: bool
                         ) -> tuple[SessionError, str] | None:
        config = self.config
        if config.authenticate is not None and not config.authenticate(auth):
            return SessionError.AUTH_FAILED, "authentication failed"
        if self.draining and not resuming:  # a resume says it itself (rule 4b)
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
        session = self._sessions.get(packet.session_id)
        if session is None:
            events.append(self._nonfatal_error(
                ErrorCode.INVALID_STATE, packet.session_id,
                f"SESSION_CLOSE names session {packet.session_id}, which is not open"))
            return
        if session.state is SessionState.CLOSING:
            events.append(FrameIgnored(session.session_id, int(MsgType.SESSION_CLOSE),
                                       "the session is already closing"))
            return
        session.state = SessionState.CLOSING
        for replacement in list(session.pending_supersedes):
            session.release_held(replacement, events)  # no replacement can come now
        session.pending_deadlines.clear()
        session.awaiting.clear()  # nothing is resubmitted into a closing session
        session.objects.clear()  # nothing can reference them any more (rule 17, O8)
        abort = request.in_flight_policy == 1
        if abort:
            for operation in list(session.operations.values()):
                session.cancel(operation, CancelSource.SESSION_CLOSE, request.reason, b"",
                               events)
        events.append(SessionCloseRequested(session.session_id, abort, request.drain_timeout_ms))

    def _on_session_migrate(self, packet: Packet, events: list[Event]) -> None:
        """Rule 4c."""
        request = packet.message
        assert isinstance(request, SessionMigrate)
        session_id = packet.session_id
        session = self._sessions.get(session_id)
        moves = session is None
        refusal = self._migrate_refusal(request, packet, moves)
        if refusal is None and moves:
            assert self.store is not None
            taken = self.store.migrate(
                session_id, bytes(packet.body),
                self._identities if self.config.authenticate is not None else None)
            if taken is ResumeRefused.ELSEWHERE and not self._sessions:
                refused = SessionMigrateAck(
                    accept_code=int(MigrateAccept.REFUSED),
                    resume_from_frame_id=request.last_result_frame_id,
                    server_migrate_ts_us=int(self._wall_clock() * 1e6))
                self._hand_off(session_id, encode(Packet(refused, session_id=session_id)),
                               events)  # rule 4d
                return
            session = taken if isinstance(taken, ServerSession) else None
            if session is None:
                refusal = MigrateAccept.REFUSED
        now_us = int(self._wall_clock() * 1e6)
        if refusal is not None or session is None:
            ack = SessionMigrateAck(accept_code=int(refusal or MigrateAccept.REFUSED),
                                    resume_from_frame_id=request.last_result_frame_id,
                                    server_migrate_ts_us=now_us)
            events.append(SendBytes(encode(Packet(ack, session_id=session_id))))
            return
        if moves:
            self._attach(session)
        cursor = max(request.last_result_frame_id, session.max_frame_id + 1)
        ack = SessionMigrateAck(accept_code=int(MigrateAccept.ACCEPTED),
                                resume_from_frame_id=cursor, server_migrate_ts_us=now_us)
        events.append(SendBytes(encode(Packet(ack, session_id=session_id))))
        if moves:
            events.append(SessionMigrated(session_id, request.last_result_frame_id, cursor))

    def _hand_off(self, session_id: int, refusal: bytes, events: list[Event]) -> None:
        self.state = ConnState.HANDED_OFF
        events.append(HandedOff(session_id, refusal))

    def _migrate_refusal(self, request: SessionMigrate, packet: Packet, moves: bool
                         ) -> MigrateAccept | None:
        if request.old_transport_id == request.new_transport_id:
            return MigrateAccept.SAME_TRANSPORT
        if not moves:
            # The session's own connection: the reference runtime's exchange, no token,
            # nothing moves. A token here names a session of another connection whose id
            # this one uses too: it cannot come (an id already open here, as for a resume).
            return MigrateAccept.REFUSED if packet.body else None
        if self.draining:
            return MigrateAccept.DRAINING
        if self.transport_id is not None and request.new_transport_id != self.transport_id:
            return MigrateAccept.TRANSPORT_MISMATCH
        if (self.store is None or not packet.body or not packet.session_id
                or len(self._sessions) >= self.config.max_sessions):
            return MigrateAccept.REFUSED
        return None

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
            session_id = resolved.session_id
            if request.flags & PressureFlag.OPERATION and not self._in_flight(
                    resolved, request.scope_id, packet.msg_type, events):
                return
        self.flow.on_pressure(request, session_id)
        events.append(FlowChanged())

    def _in_flight(self, session: ServerSession, operation_id: int, msg_type: MsgType,
                   events: list[Event]) -> bool:
        """An operation-scoped window needs an operation in flight (``_flow`` rule 6)."""
        if operation_id in session.operations:
            return True
        events.append(FrameIgnored(session.session_id, int(msg_type),
                                   f"operation {operation_id} is not in flight"))
        return False

    def _on_flow_update(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, FlowUpdate)
        session_id = packet.session_id
        session = self._sessions.get(session_id)
        if request.scope != FlowScope.CONNECTION and session is None:
            events.append(self._nonfatal_error(
                ErrorCode.INVALID_STATE, session_id,
                f"FLOW_UPDATE names session {session_id}, which is not open"))
            return
        if request.scope == FlowScope.OPERATION and session is not None and not self._in_flight(
                session, request.operation_id, MsgType.FLOW_UPDATE, events):
            return
        if self.flow.on_flow_update(request, session_id):
            events.append(FlowChanged())
        else:
            events.append(FrameIgnored(session_id, int(MsgType.FLOW_UPDATE),
                                       f"stale credit_epoch {request.credit_epoch}"))

    # ------------------------------------------------------------------ connection (rules 13, 16)

    def _on_ignored(self, packet: Packet, events: list[Event]) -> None:
        events.append(FrameIgnored(packet.session_id, int(packet.msg_type),
                                   controls.IGNORED[packet.msg_type]))

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

    def _nonfatal_error(self, code: ErrorCode, related_session_id: int, text: str) -> SendBytes:
        """A non-fatal ERROR about a session that is not open: header session_id 0, so no
        client mistakes it for a frame of one of its sessions (rule 3)."""
        return SendBytes(self._error_packet(code, text, fatal=False, scope=ErrorScope.SESSION,
                                            related_session_id=related_session_id))

    @staticmethod
    def _error_packet(code: ErrorCode, message: str, *, fatal: bool,
                      scope: ErrorScope = ErrorScope.CONNECTION, related_session_id: int = 0,
                      related_frame_id: int = 0) -> bytes:
        body = diagnostic(message)
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
ConnectionHandler = Callable[[ServerConnection, Packet, list[Event]], None]
#: What one client message does to the session it names: (session, packet, events out).
SessionHandler = Callable[[ServerSession, Packet, list[Event]], None]


@attrs.frozen
class ConnectionRule:
    scope: Scope
    handler: ConnectionHandler


@attrs.frozen
class SessionRule:
    scope: Scope  # SESSION or SESSION_OR_ONLY_ONE
    handler: SessionHandler


S = ServerConnection
C = controls
#: One row per preview4 message type (tests/nnrp checks the table covers MsgType).
_RULES: dict[MsgType, ConnectionRule | SessionRule] = {
    MsgType.CLIENT_HELLO: ConnectionRule(Scope.BEFORE_HELLO, S._on_hello),
    MsgType.TRANSPORT_PROBE: ConnectionRule(Scope.ANY_TIME, S._on_probe),
    MsgType.SESSION_OPEN: ConnectionRule(Scope.CONNECTION, S._on_session_open),
    MsgType.SESSION_CLOSE: ConnectionRule(Scope.CONNECTION, S._on_session_close),
    MsgType.SESSION_MIGRATE: ConnectionRule(Scope.CONNECTION, S._on_session_migrate),
    MsgType.CLOSE: ConnectionRule(Scope.CONNECTION, S._on_close),
    MsgType.ERROR: ConnectionRule(Scope.CONNECTION, S._on_peer_error),
    MsgType.PING: ConnectionRule(Scope.CONNECTION, S._on_ping),
    MsgType.BACKPRESSURE: ConnectionRule(Scope.CONNECTION, S._on_pressure),  # by its flags
    MsgType.CREDIT_UPDATE: ConnectionRule(Scope.CONNECTION, S._on_pressure),
    MsgType.FLOW_UPDATE: ConnectionRule(Scope.CONNECTION, S._on_flow_update),
    MsgType.FRAME_SUBMIT: SessionRule(Scope.SESSION, ServerSession.on_submit),
    MsgType.FRAME_CANCEL: SessionRule(Scope.SESSION, C.on_frame_cancel),
    MsgType.CANCEL: SessionRule(Scope.SESSION, C.on_cancel),
    MsgType.ABORT: SessionRule(Scope.SESSION, C.on_cancel),
    MsgType.DEADLINE: SessionRule(Scope.SESSION, C.on_deadline),
    MsgType.EXPIRE_AT: SessionRule(Scope.SESSION, C.on_deadline),
    MsgType.PRIORITY_UPDATE: SessionRule(Scope.SESSION, C.on_priority),
    MsgType.SUPERSEDE: SessionRule(Scope.SESSION, C.on_supersede),
    MsgType.BUDGET_UPDATE: SessionRule(Scope.SESSION, C.on_budget),
    MsgType.ROUTE_HINT: SessionRule(Scope.SESSION_OR_ONLY_ONE, C.on_hint),
    MsgType.EXECUTION_HINT: SessionRule(Scope.SESSION_OR_ONLY_ONE, C.on_hint),
    MsgType.TRACE_CONTEXT: SessionRule(Scope.SESSION_OR_ONLY_ONE, C.on_trace_context),
    MsgType.CAPABILITY_NEGOTIATION: SessionRule(Scope.SESSION_OR_ONLY_ONE, C.on_capabilities),
    MsgType.DEGRADE_PROFILE: SessionRule(Scope.SESSION_OR_ONLY_ONE, C.on_degrade),
    MsgType.SESSION_PATCH: SessionRule(Scope.SESSION, C.on_session_patch),
    MsgType.CACHE_PUT: SessionRule(Scope.SESSION, C.on_cache_put),
    MsgType.CACHE_REFERENCE: SessionRule(Scope.SESSION_OR_ONLY_ONE, C.on_cache_reference),
    MsgType.OBJECT_DECLARE: SessionRule(Scope.SESSION, C.on_object_declare),
    MsgType.OBJECT_REF: SessionRule(Scope.SESSION, C.on_object_ref),
    MsgType.OBJECT_RELEASE: SessionRule(Scope.SESSION, C.on_object_release),
    MsgType.OBJECT_PATCH: SessionRule(Scope.SESSION, C.on_object_delta),
    MsgType.OBJECT_DELTA: SessionRule(Scope.SESSION, C.on_object_delta),
    **{msg_type: ConnectionRule(Scope.CONNECTION, S._on_ignored) for msg_type in controls.IGNORED},
}
del S, C
assert set(_RULES) == set(MsgType), "every preview4 message type needs a rule"


def _profile_of(request: SessionOpen) -> tuple[int, int, int]:
    return request.profile_id, request.schema_id, request.schema_version
