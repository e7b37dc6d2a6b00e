"""The sessions of a connection: opening, resuming, migrating and closing them, as
``_server``'s ``ServerConnection`` does (a mixin of it: the connection holds the state
declared below and routes SESSION_OPEN, SESSION_MIGRATE and SESSION_CLOSE here through
its rule table), and the ERROR frames both send.

Rules (numbered as in ``_server``; SESSION_CLOSE is its rule 16's):

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
      request does not confirm another's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ._codec import Packet, encode
from ._constants import (
    TOKEN_SCHEMA_ID,
    TOKEN_SCHEMA_VERSION,
    ErrorCode,
    ErrorScope,
    MigrateAccept,
    MsgType,
    SessionAckFlag,
    SessionError,
    SessionFlag,
    SessionOpenStatus,
    TransportId,
)
from ._events import (
    AbandonCause,
    CancelSource,
    Event,
    FrameIgnored,
    HolderProbed,
    OperationAbandoned,
    SendBytes,
    SessionCloseRequested,
    SessionMigrated,
    SessionOpened,
    SessionOpenRefused,
    SessionResumed,
    SessionTaken,
)
from ._fleet import Elsewhere
from ._messages import (
    Error,
    SessionClose,
    SessionMigrate,
    SessionMigrateAck,
    SessionOpen,
    SessionOpenAck,
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
from ._server_session import ServerSession, SessionState, diagnostic

if TYPE_CHECKING:
    from ._flow import FlowControl
    from ._server_config import ServerConfig
    from ._session_ids import SessionIds

#: Rule 4d: the most a connection may have sent when it is handed off, all of which the
#: I/O layer keeps until then: a hello and a first session message (16 KiB is ample),
#: with the rest of the read that carried them (a carrier reads up to 64 KiB at once).
#: More, kept for every connection an unauthenticated client opens, would cost this
#: much times --max-connections.
MAX_HAND_OFF_BYTES = (16 << 10) + (64 << 10)


class SessionLifecycle:
    """Rule 4's half of ``ServerConnection``: what its sessions are (attached here,
    detached, ended) and every answer to a session message."""

    config: ServerConfig
    book: SessionBook | None
    ids: SessionIds
    peer: PeerCredentials
    transport_id: TransportId | None
    relayed: bool
    forwarded: bool
    draining: bool
    flow: FlowControl
    _sessions: dict[int, ServerSession]
    _clock: Callable[[], float]
    _wall_clock: Callable[[], float]
    #: The credentials sessions were opened or resumed with here (with session auth
    #: on): what a SESSION_MIGRATE, which carries none, is checked against (rule 4c).
    _identities: set[bytes]
    #: A session message (open, resume, migrate) was handled: no hand-off now (4d).
    _session_messages: int
    #: Bytes received before the first session message (4d).
    _received_before_session: int
    #: Resumed or migrated here, their new token not yet shown to have arrived (4f).
    _unconfirmed: list[ResumeRecord]
    #: Rule 4e: refusals this connection may still collect now, and when last counted.
    _refusal_allowance: float
    _refusal_checked: float

    if TYPE_CHECKING:  # the connection's own (``_server``)
        def start_probe(self) -> bytes | None: ...

        def _hand_off(self, session_id: int, destination: Elsewhere, refusal: bytes,
                      busy: bytes, events: list[Event]) -> None: ...

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
        session.objects.clear()  # its kept bytes go back to the process (_objects O9)
        session.connection = None

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

    def _on_session_open(self, packet: Packet, events: list[Event]) -> None:
        request = packet.message
        assert isinstance(request, SessionOpen)
        opening = bytes(packet.body)
        token = opening[:request.resume_token_bytes]
        auth = opening[request.resume_token_bytes:
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
            events.append(session_not_open(
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
            notice = error_packet(
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


def session_not_open(code: ErrorCode, related_session_id: int, text: str) -> SendBytes:
    """A non-fatal ERROR about a session that is not open: header session_id 0, so no
    client mistakes it for a frame of one of its sessions (``_server`` rule 3)."""
    return SendBytes(error_packet(code, text, fatal=False, scope=ErrorScope.SESSION,
                                  related_session_id=related_session_id))


def error_packet(code: ErrorCode, message: str, *, fatal: bool,
                 scope: ErrorScope = ErrorScope.CONNECTION, related_session_id: int = 0,
                 related_frame_id: int = 0) -> bytes:
    """An ERROR frame (header session_id 0)."""
    body = diagnostic(message)
    meta = Error(code=int(code), scope=int(scope), is_fatal=int(fatal),
                 related_session_id=related_session_id, related_frame_id=related_frame_id,
                 diagnostic_bytes=len(body))
    return encode(Packet(meta, body=body))


def _profile_of(request: SessionOpen) -> tuple[int, int, int]:
    return request.profile_id, request.schema_id, request.schema_version
