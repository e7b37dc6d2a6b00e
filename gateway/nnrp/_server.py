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
4. Sessions: SESSION_OPEN gets SESSION_OPEN_ACK with the requested id when no session of
   the process holds it, else the next free one (``SessionIds``: ids are unique per
   process, so the sessions of several lost connections can be resumed on one).
   Refusals (profile, schema, resume, limit, auth) are an ACK with status rejected, an
   error code and a UTF-8 diagnostic. While the server drains, a new session is
   retry_later (``start_draining``). Resumable sessions are the ``SessionBook``'s
   (``_resumption``, rules R1-R12); this connection asks it and moves nothing itself.
   a. Resume granted: a SESSION_OPEN with ``allow_resume`` gets ``resume_enabled``, a
      token (the ACK's body) and the window when the book grants them (R1); otherwise
      the session opens without resume (session_flags_ack may only confirm or
      downgrade what was asked: preview3 section 7.1B).
   b. Resume: a SESSION_OPEN whose body starts with a token (``resume_token_bytes``),
      checked in this order; a refusal spends nothing (R5), and every "rejected" answer
      to a token is the same, so nothing says whether a session exists:

      | the resume                                    | answer                           |
      |-----------------------------------------------|----------------------------------|
      | without ``allow_resume``, or for session 0    | rejected, resume_rejected        |
      | on a connection past its refusals' rate (4e)  | retry_later                      |
      | with resume off, or for an id open here       | rejected, resume_rejected        |
      | with a token of another worker (R11)          | handed off (4d), or retry_later  |
      | no session for this id, token, binding (R3)   | rejected, resume_rejected        |
      | another profile or schema than the session's  | rejected, profile_unsupported or |
      |   (nnrp-py's server's answer)                 |   schema_unsupported             |
      | the session is attached to a connection       | retry_later; that one is probed  |
      |                                               |   (R8, rule 18)                  |
      | this connection holds ``max_sessions``        | rejected, limit_reached          |
      | otherwise                                     | resumed, the next token (R4, R7) |

   c. SESSION_MIGRATE (preview2 section 10.4: "establish a new connection on the
      candidate path and send SESSION_MIGRATE"; its body is the session's current token):

      | the migration                                     | accept_code                 |
      |---------------------------------------------------|-----------------------------|
      | of a session open here, with no token             | accepted, nothing moves (the|
      |                                                   |   reference runtime's way)  |
      | of a session open here, with a token              | refused (an id open here)   |
      | on a connection past its refusals' rate (4e)      | refused                     |
      | old and new transport the same, nothing to move   | same_transport (nnrp-core)  |
      | naming another transport than this connection's   | transport_mismatch          |
      | resume off, no token, session 0, connection full  | refused                     |
      | with a token of another worker (R11)              | handed off (4d), or refused |
      | no session for this id, token and binding (R3);   | refused                     |
      |   with session auth on, the session's identity is |                             |
      |   not one this connection authenticated with      |                             |
      | otherwise                                         | accepted: the session moves |
      |                                                   |   here from wherever (R9)   |

      Accepted, the ACK's resume_from_frame_id is past every frame the session has used
      and not behind last_result_frame_id: the client resubmits nothing, and the
      results of frames after last_result_frame_id are sent again (``SessionMigrated``).
      A moved session's ACK carries its next token as its body (R4, R9), and the
      connection it left is told (``SessionTaken``: a non-fatal ERROR naming it). Two
      connections of the same carrier kind may move a session between them (a client
      that reconnected over the same transport): only a migration of nothing is the
      same transport.
   d. A token another process of the gateway issued (another worker, ``--workers``, or
      another pod of the fleet, ``--fleet-advertise``; R11): when the resume or
      migration is the first session message of a connection that was not itself
      relayed by a worker and sent at most ``MAX_HAND_OFF_BYTES`` so far
      (``may_hand_off``: the I/O layer keeps that much to relay, and no more), nothing
      is answered, the connection is ``HANDED_OFF`` (``HandedOff``) and reads nothing
      more; the I/O layer relays it whole to that process. A connection another pod
      forwarded here may still go to a worker of this pod, never to a pod again: a
      resume naming a third pod there opens nothing (``_fleet`` F5). Otherwise a resume
      is answered retry_later (the session may live there: the client resumes it first
      thing on another connection) and a migration is refused. So a connection is
      handed over at most once per hop (pod, then worker), and sessions of two
      processes resume on two connections. Where the holder cannot be reached, the
      client gets ``HandedOff.refusal``: rejected for a worker that is gone, retry_later
      for a pod out of reach; where it was reached but did not answer (busy, stopping),
      ``HandedOff.busy``: retry_later.
   e. Refusals a guesser would collect are rate-limited per connection: a session open
      or resume with credentials that fail, and a resume or migration whose token
      opens nothing. A token bucket of ``refusal_burst``, refilled at
      ``refusals_per_second`` (``ServerConfig``); past it every session open or resume
      is answered retry_later (a migration: refused) without looking at credentials
      or tokens (``SessionOpenRefused.rate_limited``). Refusals of a token that does
      open a session (another profile, a live holder, a full connection) spend nothing.
   f. A resumed or migrated session's new token is confirmed by the first packet the
      client sends on this connection after the ACK that names the session (a
      resubmission, any control), or by a PING: until then, and for ``confirm_grace``
      after (a client may have sent it before the ACK reached it), the token it used
      still opens the session (R4). A client may pipeline several resumes: one's
      request does not confirm another's.
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
    AbandonCause,
    CancelSource,
    ConnectionFailed,
    Event,
    FlowChanged,
    FrameIgnored,
    HandedOff,
    HandshakeCompleted,
    HolderProbed,
    OperationAbandoned,
    PeerClosed,
    PeerError,
    SendBytes,
    SessionCloseRequested,
    SessionMigrated,
    SessionOpened,
    SessionOpenRefused,
    SessionResumed,
    SessionTaken,
)
from ._fleet import Elsewhere
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
    SessionClose,
    SessionCloseAck,
    SessionMigrate,
    SessionMigrateAck,
    SessionOpen,
    SessionOpenAck,
    TransportProbe,
    TransportProbeAck,
)
from ._resumption import (
    Binding,
    Lookup,
    NotGranted,
    PeerCredentials,
    ResumeGrant,
    ResumeRecord,
    SessionBook,
)
from ._server_config import ServerConfig
from ._server_outputs import SessionOutputs
from ._server_session import (
    ServerSession,
    SessionState,
    diagnostic,
)
from ._session_ids import SessionIds


class ConnState(enum.Enum):
    AWAIT_HELLO = "await_hello"
    READY = "ready"
    CLOSED = "closed"
    HANDED_OFF = "handed_off"  # relayed to another process from now on (rule 4d)


#: SESSION_MIGRATE_ACK accept_code of a refusal without a better reason (rule 4c).
MIGRATION_REFUSED = int(MigrateAccept.REFUSED)
#: Rule 4d: the most a connection may have sent when it is handed off, all of which the
#: I/O layer keeps until then: a hello and a first session message (16 KiB is ample),
#: with the rest of the read that carried them (a carrier reads up to 64 KiB at once).
#: More, kept for every connection an unauthenticated client opens, would cost this
#: much times --max-connections.
MAX_HAND_OFF_BYTES = (16 << 10) + (64 << 10)


@attrs.frozen
class SessionsLost:
    """What a connection's end did to its sessions (``connection_lost``): the resumable
    ones that now wait for their client, and the ones that ended with it."""

    detached: tuple[int, ...]
    ended: tuple[int, ...]


class ServerConnection(SessionOutputs):
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
        self._decoder = Decoder(self.config.max_packet)
        self._sessions: dict[int, ServerSession] = {}
        #: The credentials sessions were opened or resumed with here (with session auth
        #: on): what a SESSION_MIGRATE, which carries none, is checked against (rule 4c).
        self._identities: set[bytes] = set()
        self.hello: ClientHello | None = None
        #: A session message (open, resume, migrate) was handled: no hand-off now (4d).
        self._session_messages = 0
        #: Bytes received before the first session message (4d).
        self._received_before_session = 0
        #: Resumed or migrated here, their new token not yet shown to have arrived (4f).
        self._unconfirmed: list[ResumeRecord] = []
        #: Rule 4e: refusals this connection may still collect now.
        self._refusal_allowance = float(self.config.refusal_burst)
        self._refusal_checked = clock()
        #: Rule 18: when something last arrived, and when the probe went (None: none).
        self.last_received = clock()
        self.probe_sent_at: float | None = None

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

    def detach(self, session_id: int) -> ServerSession | None:
        """Let a session go (a migration takes it elsewhere, or its connection ended):
        its operations stay as they are, its flow windows go."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self.flow.forget_session(session_id)
            session.connection = None
            self._unconfirmed = [r for r in self._unconfirmed if r.session is not session]
        return session

    def _attach(self, session: ServerSession) -> None:
        session.draining = self.draining
        session.connection = self
        self._sessions[session.session_id] = session

    def _end_session(self, session: ServerSession) -> None:
        """The session is over (closed, or lost with a connection that failed): its id,
        and its record if it was resumable, go."""
        record = self.book.record_of(session.session_id) if self.book is not None else None
        if record is not None and record.session is session:
            assert self.book is not None
            self.book.end(record)
        else:
            self.ids.release(session.session_id)
        session.connection = None

    def connection_lost(self, *, detach: bool = True) -> SessionsLost:
        """The carrier ended without a fatal error (EOF, reset, idle cut, a probe that
        went unanswered): each resumable session that is open detaches and waits for
        its client (``_resumption`` R6); every other session ends. ``detach`` False: the
        gateway closed it itself, its sessions drained and delivered (a drain's end):
        every session ends."""
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

    def receive_message(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """One WebSocket binary message: exactly one packet."""
        if self.state in (ConnState.CLOSED, ConnState.HANDED_OFF):
            return []
        self._received(len(data))
        try:
            packet = decode_packet(data, self.config.max_packet)
        except RemoteProtocolError as exc:
            return [self._fail(exc)]
        return self._handle_all([packet])

    def _received(self, size: int) -> None:
        self.last_received = self._clock()  # rule 18
        if self._session_messages == 0:
            self._received_before_session += size  # rule 4d

    @property
    def may_hand_off(self) -> bool:
        """Rule 4d: whether this connection may still be handed to another worker or
        pod, so that the I/O layer must keep what it received (it lets go once this is
        False)."""
        return (not self.relayed and self._session_messages == 0
                and self._received_before_session <= MAX_HAND_OFF_BYTES)

    def _may_hand_to(self, destination: Elsewhere, may_hand_off: bool) -> bool:
        """Rule 4d: a connection another pod forwarded here goes to a worker of this pod
        at most, never to a pod again (``_fleet`` F5)."""
        return may_hand_off and (destination.pod is None or not self.forwarded)

    def protocol_failure(self, error: ProtocolError) -> ConnectionFailed:
        """A transport-level violation (a WebSocket text message, say)."""
        return self._fail(error)

    def _handle_all(self, packets: list[Packet]) -> list[Event]:
        events: list[Event] = []
        for packet in packets:
            if self._unconfirmed:
                self._confirm(packet)  # rule 4f: a packet after the ACK
            try:
                self._dispatch(packet, events)
            except RemoteProtocolError as exc:
                events.append(self._fail(exc))
            if self.state in (ConnState.CLOSED, ConnState.HANDED_OFF):
                break
        return events

    def _confirm(self, packet: Packet) -> None:
        """Rule 4f."""
        assert self.book is not None
        pinged = packet.msg_type is MsgType.PING
        waiting = []
        for record in self._unconfirmed:
            if record.confirm_on is not self:
                continue
            if pinged or packet.session_id == record.session.session_id:
                self.book.confirm(record)
            else:
                waiting.append(record)
        self._unconfirmed = waiting

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
        fatal ERROR, then the close. The sessions end with the connection."""
        replies: list[bytes] = []
        if self.state is ConnState.READY:
            for session in self._sessions.values():
                replies.extend(session.drops_on_failure())
            replies.append(self._error_packet(error.code, str(error), fatal=True))
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

    # ------------------------------------------------------------------ sessions (rules 4, 16)

    def _on_session_open(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, SessionOpen)
        token = packet.body[:request.resume_token_bytes]
        auth = packet.body[request.resume_token_bytes:
                           request.resume_token_bytes + request.auth_bytes]
        may_hand_off = self.may_hand_off
        self._session_messages += 1
        if not self._refusals_left():  # rule 4e: nothing is looked at
            self._refuse_open(request, SessionError.LIMIT_REACHED,
                              "too many refused session opens on this connection; "
                              "retry shortly", events, retry_later=True,
                              resume=bool(token), rate_limited=True)
            return
        refusal = self._session_refusal(request, auth, resuming=bool(token))
        if refusal is not None and refusal[0] is SessionError.AUTH_FAILED:
            self._spend_refusal()
        if refusal is None and token:
            self._resume(request, bytes(token), bytes(auth), may_hand_off, events)
            return
        busy = None
        if refusal is None and self.config.admit_session is not None:
            busy = self.config.admit_session()  # the gateway's load-aware admission
            if busy is not None:
                refusal = (SessionError.LIMIT_REACHED, busy)
        session_id = self.ids.take(request.requested_session_id) if refusal is None else None
        if refusal is None and session_id is None:
            refusal = (SessionError.LIMIT_REACHED, "no free session id")
        if refusal is not None:
            code, text = refusal
            retry = (self.draining or busy is not None) and code is SessionError.LIMIT_REACHED
            self._refuse_open(request, code, text, events, retry_later=retry,
                              resume=bool(token))
            return
        assert session_id is not None
        max_in_flight = min(request.max_in_flight or self.config.max_in_flight,
                            self.config.max_in_flight)
        session = ServerSession(session_id, self.config, max_in_flight=max_in_flight,
                                priority_class=request.priority_class,
                                profile=_profile_of(request), clock=self._clock,
                                wall_clock=self._wall_clock)
        self._authenticated(auth)
        grant: ResumeGrant | NotGranted | None = None
        if request.session_flags & SessionFlag.ALLOW_RESUME and self.book is not None:
            binding = Binding.of(bytes(auth), self.peer)
            grant = self.book.grant(session, binding, self._client_of(binding), self)  # 4a
        granted = grant if isinstance(grant, ResumeGrant) else None
        self._attach(session)
        events.append(SendBytes(self._open_ack(session, request, SessionOpenStatus.OPENED,
                                               granted)))
        events.append(SessionOpened(session_id, request, max_in_flight,
                                    resumable=granted is not None,
                                    not_granted=grant.value if isinstance(
                                        grant, NotGranted) else None))

    def _client_of(self, binding: Binding) -> bytes:
        """Who a session belongs to, for the per-client caps (``_resumption`` R2)."""
        if self.config.authenticate is not None:
            return b"auth:" + binding.auth
        if binding.certificate:
            return b"certificate:" + binding.certificate
        return b"address:" + self.peer.address.encode("utf-8", "replace")

    def _resume(self, request: SessionOpen, token: bytes, auth: bytes, may_hand_off: bool,
                events: list[Event]) -> None:
        """Rule 4b, in its table's order; a refusal spends nothing (``_resumption`` R5)."""
        session_id = request.requested_session_id
        rejected = (SessionError.RESUME_REJECTED,
                    "resume rejected: no session can be resumed with this token")
        if not request.session_flags & SessionFlag.ALLOW_RESUME or not session_id:
            self._refuse_resume(request, *rejected, events)
            return
        book = self.book
        if book is None or session_id in self._sessions:
            self._refuse_resume(request, *rejected, events)
            return
        binding = Binding.of(auth, self.peer)
        found = book.find(session_id, token, binding)
        if isinstance(found, Elsewhere):
            destination = found
            if self._may_hand_to(destination, may_hand_off):
                busy = self._open_refusal(
                    request, SessionError.RESUME_REJECTED, "the gateway process that holds "
                    "this session is busy or stopping; retry shortly", retry_later=True)
                self._hand_off(session_id, destination,
                               self._hand_off_refusal(request, destination), busy,
                               events)  # 4d
            elif destination.pod is not None and self.forwarded:
                # F5: forwarded once already; a token naming a third pod opens nothing.
                self._refuse_resume(request, *rejected, events)
            else:
                # It may live there: not "gone" (a client would give it up), but not here.
                self._spend_refusal()
                self._refuse_open(request, SessionError.RESUME_REJECTED,
                                  "another process of the gateway holds this session: resume "
                                  "it first thing on a connection of its own", events,
                                  retry_later=True, resume=True)
            return
        if isinstance(found, Lookup):
            self._refuse_resume(request, *rejected, events)
            return
        record = found
        profile = _profile_of(request)
        if record.session.profile != profile:
            # Preview3 section 11.2: a resume asks for what the session is. Refused as a
            # profile the session does not have, as nnrp-py's server does; the token
            # stays good for a resume that asks the session's own.
            code = (SessionError.PROFILE_UNSUPPORTED
                    if record.session.profile[0] != profile[0]
                    else SessionError.SCHEMA_UNSUPPORTED)
            self._refuse_open(request, code, "resume rejected: the session was opened with "
                              "another profile or schema", events, resume=True)
            return
        if record.holder is not None:
            # R8: its connection may be dead without our knowing; it must show otherwise.
            holder = record.holder
            ping = holder.start_probe() if holder is not self else None
            if ping is not None:
                book.stats.probes_total += 1
                events.append(HolderProbed(session_id, holder, ping,
                                           book.policy.probe_timeout))
            self._refuse_open(request, SessionError.RESUME_REJECTED,
                              "the session is still attached to its previous connection, "
                              "which is being checked; retry shortly", events,
                              retry_later=True, resume=True)
            return
        if len(self._sessions) >= self.config.max_sessions:
            self._refuse_open(request, SessionError.LIMIT_REACHED,
                              f"connection already has {self.config.max_sessions} sessions "
                              "(the limit)", events, resume=True)
            return
        grant = book.resume(record, token, self, binding)
        session = record.session
        self._authenticated(auth)
        self._attach(session)
        self._unconfirmed.append(record)
        events.append(SendBytes(self._open_ack(session, request, SessionOpenStatus.RESUMED,
                                               grant)))
        events.append(SessionResumed(session_id, request))

    def _refuse_resume(self, request: SessionOpen, code: SessionError, text: str,
                       events: list[Event]) -> None:
        """A token that opens nothing here: counted against this connection (4e)."""
        self._spend_refusal()
        self._refuse_open(request, code, text, events, resume=True)

    def _refusals_left(self) -> bool:
        """Rule 4e: a token bucket over the refusals this connection collects."""
        config = self.config
        now = self._clock()
        self._refusal_allowance = min(
            float(config.refusal_burst),
            self._refusal_allowance + (now - self._refusal_checked) * config.refusals_per_second)
        self._refusal_checked = now
        return self._refusal_allowance >= 1

    def _spend_refusal(self) -> None:
        self._refusal_allowance = max(0.0, self._refusal_allowance - 1)

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
            self._identities.add(bytes(auth))

    def _refuse_open(self, request: SessionOpen, code: SessionError, text: str,
                     events: list[Event], *, retry_later: bool = False,
                     resume: bool = False, rate_limited: bool = False) -> None:
        events.append(SendBytes(self._open_refusal(request, code, text,
                                                   retry_later=retry_later)))
        events.append(SessionOpenRefused(request.requested_session_id, int(code), text,
                                         resume=resume, rate_limited=rate_limited))

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
        if self.draining and not resuming:  # a resume is still answered (R12)
            return SessionError.LIMIT_REACHED, "the server is draining; open the session elsewhere"
        if len(self._sessions) >= config.max_sessions and not resuming:
            return SessionError.LIMIT_REACHED, (
                f"connection already has {config.max_sessions} sessions (the limit)")
        if request.profile_id not in config.session_profiles:
            return SessionError.PROFILE_UNSUPPORTED, f"profile {request.profile_id} is not served"
        if (request.schema_id, request.schema_version) not in (
                (TOKEN_SCHEMA_ID, TOKEN_SCHEMA_VERSION), (0, 0)):
            return SessionError.SCHEMA_UNSUPPORTED, (
                f"schema {request.schema_id:#x} v{request.schema_version} is not served")
        return None

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
        # Nothing is resubmitted into a closing session: what still waits for its
        # resubmission ends unseen (its frames must not reach a client that holds no
        # such operation).
        for operation_id in session.abandon_awaiting():
            events.append(OperationAbandoned(session.session_id, operation_id,
                                             AbandonCause.SESSION_CLOSED))
        session.objects.clear()  # nothing can reference them any more (rule 17, O8)
        abort = request.in_flight_policy == 1
        if abort:
            for operation in list(session.operations.values()):
                session.cancel(operation, CancelSource.SESSION_CLOSE, request.reason, b"",
                               events)
        events.append(SessionCloseRequested(session.session_id, abort, request.drain_timeout_ms))

    def _on_session_migrate(self, packet: Packet, events: list[Event]) -> None:
        """Rule 4c, in its table's order."""
        request = packet.message
        assert isinstance(request, SessionMigrate)
        may_hand_off = self.may_hand_off
        self._session_messages += 1
        session_id = packet.session_id
        token = bytes(packet.body)
        here = session_id in self._sessions
        refusal = self._migrate_refusal(request, packet, here)
        if refusal is None and here:
            session = self._sessions[session_id]
            cursor = max(request.last_result_frame_id, session.max_frame_id + 1)
            self._migrate_ack(session_id, MigrateAccept.ACCEPTED, cursor, events)
            return
        book = self.book
        if refusal is None:
            assert book is not None
            found: ResumeRecord | Lookup | Elsewhere = book.find(session_id, token, None)
            binding = (book.admitted(found, self._bindings())
                       if isinstance(found, ResumeRecord) else None)
            if binding is None and isinstance(found, ResumeRecord):
                found = Lookup.REJECTED
            if isinstance(found, Elsewhere) and self._may_hand_to(found, may_hand_off):
                refused = SessionMigrateAck(
                    accept_code=int(MigrateAccept.REFUSED),
                    resume_from_frame_id=request.last_result_frame_id,
                    server_migrate_ts_us=int(self._wall_clock() * 1e6))
                migration_refused = encode(Packet(refused, session_id=session_id))
                self._hand_off(session_id, found, migration_refused, migration_refused,
                               events)  # 4d
                return
            if isinstance(found, Lookup | Elsewhere):
                self._spend_refusal()
                refusal = MigrateAccept.REFUSED
            elif found.session.state is not SessionState.OPEN:
                refusal = MigrateAccept.REFUSED
            else:
                assert binding is not None
                self._migrate_here(found, token, binding, request, events)
                return
        self._migrate_ack(session_id, refusal or MigrateAccept.REFUSED,
                          request.last_result_frame_id, events)

    def _bindings(self) -> list[Binding]:
        """What a migration may present (it carries no credentials): with session auth
        on, every identity this connection authenticated with that still authenticates
        (a token revoked since, by SIGHUP, moves nothing), on its carrier (rule 4c);
        otherwise the carrier alone."""
        authenticate = self.config.authenticate
        if authenticate is None:
            return [Binding.of(b"", self.peer)]
        return [Binding.of(identity, self.peer) for identity in self._identities
                if authenticate(identity)]

    def _migrate_here(self, record: ResumeRecord, token: bytes, binding: Binding,
                      request: SessionMigrate, events: list[Event]) -> None:
        """R9: the session moves here, the connection it leaves is told, the token
        rotates (the ACK's body), and what it holds of frames after the client's last is
        sent again (``SessionMigrated``)."""
        assert self.book is not None
        session = record.session
        session_id = session.session_id
        session.stop_awaiting()  # a migration resubmits nothing: everything goes on live
        grant, previous = self.book.migrate(record, token, self, binding)
        self._attach(session)
        self._unconfirmed.append(record)
        cursor = max(request.last_result_frame_id, session.max_frame_id + 1)
        self._migrate_ack(session_id, MigrateAccept.ACCEPTED, cursor, events,
                          token=grant.token)
        if previous is not None and previous is not self:
            notice = self._error_packet(
                ErrorCode.INVALID_STATE,
                f"session {session_id} moved to another connection (SESSION_MIGRATE)",
                fatal=False, scope=ErrorScope.SESSION, related_session_id=session_id)
            events.append(SessionTaken(session_id, previous, notice))
        replay = session.replay_after_frame(request.last_result_frame_id)
        events.append(SessionMigrated(session_id, request.last_result_frame_id, cursor,
                                      replay.packets, replay.partials))

    def _migrate_ack(self, session_id: int, accept: MigrateAccept, cursor: int,
                     events: list[Event], *, token: bytes = b"") -> None:
        ack = SessionMigrateAck(accept_code=int(accept), resume_from_frame_id=cursor,
                                server_migrate_ts_us=int(self._wall_clock() * 1e6))
        events.append(SendBytes(encode(Packet(ack, session_id=session_id, body=token))))

    def _hand_off(self, session_id: int, destination: Elsewhere, refusal: bytes,
                  busy: bytes, events: list[Event]) -> None:
        self.state = ConnState.HANDED_OFF
        events.append(HandedOff(session_id, destination, refusal, busy))

    def _hand_off_refusal(self, request: SessionOpen, destination: Elsewhere) -> bytes:
        """What a handed-off resume is answered when its destination cannot be reached
        (``HandedOff.refusal``): a worker of this pod that is gone took its sessions with
        it; a pod out of reach may be back in a moment (retry later)."""
        if destination.pod is None:
            return self._open_refusal(
                request, SessionError.RESUME_REJECTED,
                "resume rejected: the gateway process that held the session is gone")
        return self._open_refusal(
            request, SessionError.RESUME_REJECTED,
            "the gateway pod that holds this session cannot be reached; retry shortly",
            retry_later=True)

    def _migrate_refusal(self, request: SessionMigrate, packet: Packet, here: bool
                         ) -> MigrateAccept | None:
        if not here and not self._refusals_left():
            return MigrateAccept.REFUSED
        if request.old_transport_id == request.new_transport_id and (here or not packet.body):
            return MigrateAccept.SAME_TRANSPORT
        if here:
            # The session's own connection: the reference runtime's exchange, no token,
            # nothing moves. With a token it would move a session onto the connection that
            # holds it: nothing to move, refused as a resume of an id open here is.
            return MigrateAccept.REFUSED if packet.body else None
        if self.transport_id is not None and request.new_transport_id != self.transport_id:
            return MigrateAccept.TRANSPORT_MISMATCH
        if (self.book is None or not packet.body or not packet.session_id
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
        self._end_session(session)
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
