"""The server side of an NNRP/1 connection, as a sans-IO state machine.

The I/O adapter (gateway.server) feeds bytes in and acts on the events that come out.
This module is the connection: the handshake, its failure, the client's flow windows,
liveness, and the rule table that routes every message. Opening, resuming, migrating
and closing its sessions are ``_server_lifecycle`` (a mixin of the connection); a
session's own state and frames are ``_server_session``, the runtime controls
``_server_controls``.

Rules (the ``_RULES`` table at the bottom has one row per preview4 message type; each
row names its acceptance scope and its handler, and each handler cites its rule; rule 4
and 16's SESSION_CLOSE are ``_server_lifecycle``'s, 5 and 15 ``_server_session``'s, 6
to 10, 12 to 14, 17 and 19 ``_server_controls``' (17: the runtime objects, whose table
is ``_objects``; 19: the session's cache, ``_cache``)):

1. Connection start. ``AWAIT_HELLO`` accepts TRANSPORT_PROBE (answered with PROBE_ACK)
   and CLIENT_HELLO. Anything else before the hello (garbage, a bad magic, a
   SESSION_OPEN) closes the connection *without a reply*, as the reference server does
   (docs/reference/nnrp-wire.md section 5). A hello whose profile bitmap does not meet ours also
   closes
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
4. Sessions: opening, resuming (4a, 4b), migrating (4c), handing a connection to the
   process that holds its session (4d), the refusals' rate (4e) and the confirmation
   of a new token (4f) are ``_server_lifecycle``'s, with their tables.

11. Flow control: BACKPRESSURE, CREDIT_UPDATE and FLOW_UPDATE change the client's windows
    over our PARTIAL_RESULTs (``_flow``); ``flow_wait`` says when the next may go. Their
    flags (or FLOW_UPDATE's scope) pick connection, session or operation; an operation
    window only for an operation in flight (else noted and ignored). Windows belong to
    the connection: a session resumed or migrated here starts with none.
13. Features this server does not have are refused in their own message's form, or
    noted and ignored (``_server_controls`` rule 13, and its ``IGNORED`` table).
16. PING is answered with PONG at once. SESSION_CLOSE moves the session to ``CLOSING``:
    no new submits; what still awaits its resubmission ends unseen; the adapter drains
    (or aborts) and then calls ``send_session_close_ack``. CLOSE and a fatal ERROR from
    the peer end the connection.
18. Liveness: a connection is alive while bytes arrive on it. ``start_probe`` sends a
    PING (when a resume names a session attached here: R8); if nothing at all has
    arrived by the time the I/O layer asks ``probe_failed`` (``probe_timeout`` later),
    the connection is dead: the I/O layer closes it, and ``connection_lost`` detaches its
    resumable sessions. Any bytes answer it, a PONG or not (nnrp-py's native client may
    not answer PING: its silence costs it only when someone holding its session's token
    asks for the session).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from . import _server_controls as controls
from ._codec import Decoder, Packet, decode_packet, encode
from ._constants import (
    CloseAckStatus,
    ErrorCode,
    ErrorScope,
    FlowScope,
    MigrateAccept,
    MsgType,
    PressureFlag,
    TransportId,
)
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from ._events import (
    ConnectionFailed,
    Event,
    FlowChanged,
    FrameIgnored,
    HandedOff,
    HandshakeCompleted,
    PeerClosed,
    PeerError,
    RequestKeyWanted,
    SendBytes,
)
from ._flow import FlowControl
from ._messages import (
    Backpressure,
    ClientHello,
    CreditUpdate,
    Error,
    FlowUpdate,
    Ping,
    Pong,
    ServerHelloAck,
    SessionCloseAck,
    TransportProbe,
    TransportProbeAck,
)
from ._resumption import PeerCredentials, ResumeRecord, SessionBook
from ._server_config import ResubmissionRead, ServerConfig
from ._server_lifecycle import SessionLifecycle, error_packet, session_not_open
from ._server_outputs import SessionOutputs
from ._server_session import KeyWanted, ServerSession, SessionState
from ._session_ids import SessionIds

if TYPE_CHECKING:
    from ._fleet import Elsewhere


class ConnState(enum.Enum):
    AWAIT_HELLO = "await_hello"
    READY = "ready"
    CLOSED = "closed"
    HANDED_OFF = "handed_off"  # relayed to another process from now on (rule 4d)


#: SESSION_MIGRATE_ACK accept_code of a refusal without a better reason (rule 4c).
MIGRATION_REFUSED = int(MigrateAccept.REFUSED)


@attrs.frozen
class SessionsLost:
    """What a connection's end did to its sessions (``connection_lost``): the resumable
    ones that now wait for their client, and the ones that ended with it."""

    detached: tuple[int, ...]
    ended: tuple[int, ...]


class ServerConnection(SessionOutputs, SessionLifecycle):
    """Sans-IO server role for one transport connection (many sessions).

    ``clock`` (seconds, monotonic) times the client's retry-after windows, supersede
    holds, the liveness probe and the resume refusals' rate; tests pass their own.
    ``book`` keeps the process's resumable sessions (None: resume and migrate are
    refused); ``ids`` the process's session ids (the book's, when there is one; None:
    this connection's own). ``peer``: what the carrier says about the client (rule 4b's
    binding). ``transport_id``: the carrier this connection arrived on (a migration must
    name it). ``relayed``: another worker handed this connection over; ``forwarded``:
    another pod of the fleet did (rule 4d)."""

    def __init__(self, config: ServerConfig | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, *,
                 book: SessionBook | None = None,
                 ids: SessionIds | None = None,
                 peer: PeerCredentials | None = None,
                 transport_id: TransportId | None = None,
                 relayed: bool = False, forwarded: bool = False) -> None:
        self.config = config or ServerConfig()
        self.state = ConnState.AWAIT_HELLO
        self.draining = False
        self.flow = FlowControl(clock)
        self.book = book
        self.ids = book.ids if book is not None else ids if ids is not None else SessionIds()
        self.peer = peer or PeerCredentials()
        self.transport_id = transport_id
        self.relayed = relayed
        self.forwarded = forwarded
        self._clock = clock
        self._wall_clock = wall_clock  # DEADLINE / EXPIRE_AT are Unix times
        self._decoder = Decoder(self.config.max_packet, spill=self.config.spill)
        self._sessions: dict[int, ServerSession] = {}
        self.hello: ClientHello | None = None
        # Rule 4's own state (``SessionLifecycle`` says what each is).
        self._identities: set[bytes] = set()
        self._session_messages = 0
        self._received_before_session = 0
        self._unconfirmed: list[ResumeRecord] = []
        self._refusal_allowance = float(self.config.refusal_burst)
        self._refusal_checked = clock()
        #: Rule 18: when something last arrived, and when the probe went (None: none).
        self.last_received = clock()
        self.probe_sent_at: float | None = None
        #: ``_server_session`` rule 5c: the submit whose key is awaited, with the packets
        #: that came after it (handled once ``request_keyed`` brings the key).
        self._wanted: KeyWanted | None = None
        self._held: list[Packet] = []

    @property
    def is_closed(self) -> bool:
        return self.state is ConnState.CLOSED

    def session(self, session_id: int) -> ServerSession | None:
        return self._sessions.get(session_id)

    @property
    def sessions(self) -> tuple[ServerSession, ...]:
        return tuple(self._sessions.values())

    def start_draining(self) -> None:
        """Refuse new sessions (retry_later) and new submits (recoverable, with a retry
        time): the gateway is shutting down and clients should go elsewhere (rule 4, 5).
        Resumes of the process's sessions are still answered (``_resumption`` R12)."""
        self.draining = True
        for session in self._sessions.values():
            session.draining = True

    def connection_lost(self, *, detach: bool = True) -> SessionsLost:
        """The carrier ended without a fatal error (EOF, reset, idle cut, a probe that
        went unanswered): each resumable session that is open detaches and waits for
        its client (``_resumption`` R6); every other session ends. ``detach`` False: the
        gateway closed it itself, its sessions drained and delivered (a drain's end):
        every session ends."""
        # What was held for packets not yet handled goes now: a connection may wait in
        # a reference cycle for the collector, and a big submit's memory (or its spill's
        # file, counted against the media directory's bound) with it.
        self._decoder.close()
        self._held = []  # (a key being computed comes back to nothing: request_keyed)
        detached: list[int] = []
        ended: list[int] = []
        for session_id in list(self._sessions):
            session = self._sessions[session_id]
            record = self.book.record_of(session_id) if self.book is not None else None
            self.detach(session_id)
            if (detach and record is not None and self.book is not None
                    and record.session is session and session.state is SessionState.OPEN
                    and self.book.detach(record)):
                detached.append(session_id)
            else:
                self._end_session(session)
                ended.append(session_id)
        if self.state is ConnState.READY:
            self.state = ConnState.CLOSED
        return SessionsLost(tuple(detached), tuple(ended))

    # ------------------------------------------------------------------ liveness (rule 18)

    def start_probe(self) -> bytes | None:
        """A PING to prove this connection alive (``_resumption`` R8); None when one is
        out already."""
        if self.probe_sent_at is not None or self.state is not ConnState.READY:
            return None
        self.probe_sent_at = self._clock()
        return encode(Packet(Ping()))

    def probe_failed(self) -> bool:
        """Whether the probe went unanswered: nothing at all arrived since it was sent.
        Asked when its time is up; a probe that was answered is over."""
        sent = self.probe_sent_at
        if sent is None:
            return False
        self.probe_sent_at = None
        return self.last_received <= sent

    # ------------------------------------------------------------------ inputs

    @property
    def awaited(self) -> int:
        """Bytes a big packet being read still needs (``Decoder.awaited``)."""
        return self._decoder.awaited

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Bytes from a stream transport (TCP, unix socket, a QUIC stream)."""
        if self.state in (ConnState.CLOSED, ConnState.HANDED_OFF):
            return []
        self._received(len(data))
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

    def receive_message(self, data: bytes | bytearray | memoryview, *,
                        given_away: bool = False) -> list[Event]:
        """One WebSocket binary message: exactly one packet. ``given_away``: the caller
        never changes a bytearray ``data`` again (``decode_packet``)."""
        if self.state in (ConnState.CLOSED, ConnState.HANDED_OFF):
            return []
        self._received(len(data))
        try:
            packet = decode_packet(data, self.config.max_packet, given_away=given_away)
        except RemoteProtocolError as exc:
            return [self._fail(exc)]
        return self._handle_all([packet])

    def _received(self, size: int) -> None:
        self.last_received = self._clock()  # rule 18
        if self._session_messages == 0:
            self._received_before_session += size  # rule 4d

    def protocol_failure(self, error: ProtocolError) -> ConnectionFailed:
        """A transport-level violation (a WebSocket text message, say)."""
        return self._fail(error)

    def request_keyed(self, read: ResubmissionRead) -> list[Event]:
        """The key ``RequestKeyWanted`` asked for (``_server_session`` rule 5c): its submit
        is handled now, then what came after it, in order."""
        wanted, held = self._wanted, self._held
        if wanted is None:
            raise LocalProtocolError("no request key is awaited")
        self._wanted, self._held = None, []
        if self.state in (ConnState.CLOSED, ConnState.HANDED_OFF):
            return []
        # The key is the awaited submit's alone: set for it, cleared before what follows
        # (a submit refused before its key is read, a drain begun meanwhile say, must not
        # leave it to the next submit held behind it).
        wanted.session.supplied_read = read
        try:
            events = self._handle_all(held[:1])
        finally:
            wanted.session.supplied_read = None
        return events + self._handle_all(held[1:])

    def _handle_all(self, packets: list[Packet]) -> list[Event]:
        events: list[Event] = []
        if self._wanted is not None:  # behind a submit whose key is awaited (rule 5c)
            self._held += packets
            return events
        for index, packet in enumerate(packets):
            if self._unconfirmed:
                self._confirm(packet)  # rule 4f: a packet after the ACK
            try:
                self._dispatch(packet, events)
            except KeyWanted as wanted:
                self._wanted, self._held = wanted, packets[index:]
                events.append(RequestKeyWanted(wanted.session.session_id, wanted.body))
                break
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
            events.append(session_not_open(
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
        fatal ERROR, then the close. The sessions end with the connection."""
        replies: list[bytes] = []
        if self.state is ConnState.READY:
            for session in self._sessions.values():
                replies.extend(session.drops_on_failure())
            replies.append(error_packet(error.code, str(error), fatal=True))
        self.state = ConnState.CLOSED
        for session in self._sessions.values():
            self.flow.forget_session(session.session_id)
            self._end_session(session)
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

    # ------------------------------------------------------------------ sessions (rule 4d)

    def _hand_off(self, session_id: int, destination: Elsewhere, refusal: bytes,
                  busy: bytes, events: list[Event]) -> None:
        self.state = ConnState.HANDED_OFF
        events.append(HandedOff(session_id, destination, refusal, busy))

    # ------------------------------------------------------------------ flow (rule 11)

    def _on_pressure(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, Backpressure | CreditUpdate)
        session_id = packet.session_id
        if not request.flags & PressureFlag.CONNECTION:
            # Session or operation scope: a session must be named, or be the only one.
            resolved = self._session_of(packet, Scope.SESSION_OR_ONLY_ONE)
            if resolved is None:
                events.append(session_not_open(
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
            events.append(session_not_open(
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
        events.append(PeerError(error, bytes(packet.body), fatal))

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
        self._end_session(session)
        ack = SessionCloseAck(status=CloseAckStatus.CLOSED,
                              last_operation_id=session.last_operation_id)
        return encode(Packet(ack, session_id=session_id))

    def send_error(self, code: ErrorCode, message: str, *, fatal: bool,
                   scope: ErrorScope = ErrorScope.CONNECTION, session_id: int = 0,
                   frame_id: int = 0) -> bytes:
        """An ERROR frame (connection scope: header session_id 0); a fatal one closes the
        connection state."""
        data = error_packet(code, message, fatal=fatal, scope=scope,
                            related_session_id=session_id, related_frame_id=frame_id)
        if fatal:
            self.state = ConnState.CLOSED
        return data

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
    MsgType.CACHE_INVALIDATE: SessionRule(Scope.SESSION_OR_ONLY_ONE, C.on_cache_invalidate),
    MsgType.OBJECT_DECLARE: SessionRule(Scope.SESSION, C.on_object_declare),
    MsgType.OBJECT_REF: SessionRule(Scope.SESSION, C.on_object_ref),
    MsgType.OBJECT_RELEASE: SessionRule(Scope.SESSION, C.on_object_release),
    MsgType.OBJECT_PATCH: SessionRule(Scope.SESSION, C.on_object_delta),
    MsgType.OBJECT_DELTA: SessionRule(Scope.SESSION, C.on_object_delta),
    **{msg_type: ConnectionRule(Scope.CONNECTION, S._on_ignored) for msg_type in controls.IGNORED},
}
del S, C
assert set(_RULES) == set(MsgType), "every preview4 message type needs a rule"
