"""A session store the sans-IO tests and the fuzzer hold (gateway.nnrp.SessionStore):
it keeps sessions as the registry does, without trio, and records what it handed out so
an oracle can check that only the right token ever opened a session."""

from __future__ import annotations

from collections.abc import Collection

import attrs

from gateway import nnrp


@attrs.define
class Store:
    """Keeps sessions as a registry would. ``granting``: False refuses resume to new
    sessions (the cap). ``attached``: the sessions some connection holds (ids of the
    objects); ``detach`` is a connection's end."""

    window_ms: int = 120_000
    granting: bool = True
    sessions: dict[bytes, nnrp.ServerSession] = attrs.field(factory=dict)
    identities: dict[bytes, bytes] = attrs.field(factory=dict)
    attached: set[int] = attrs.field(factory=set)
    issued: int = 0

    def _token(self) -> bytes:
        self.issued += 1
        return bytes([self.issued]) * 24

    def grant(self, session: nnrp.ServerSession, identity: bytes) -> nnrp.ResumeGrant | None:
        if not self.granting:
            return None
        token = self._token()
        self.sessions[token] = session
        self.identities[token] = identity
        self.attached.add(id(session))
        return nnrp.ResumeGrant(token, self.window_ms)

    def resume(self, session_id: int, token: bytes, identity: bytes
               ) -> tuple[nnrp.ServerSession, nnrp.ResumeGrant] | nnrp.ResumeRefused:
        session = self.sessions.get(token)
        if (session is None or session.session_id != session_id
                or self.identities[token] != identity):
            return nnrp.ResumeRefused.REJECTED
        if id(session) in self.attached:
            return nnrp.ResumeRefused.RETRY_LATER
        del self.sessions[token]
        fresh = self._token()
        self.sessions[fresh] = session
        self.identities[fresh] = identity
        self.attached.add(id(session))
        return session, nnrp.ResumeGrant(fresh, self.window_ms)

    def migrate(self, session_id: int, token: bytes, identities: Collection[bytes] | None
                ) -> nnrp.ServerSession | nnrp.ResumeRefused:
        session = self.sessions.get(token)
        if (session is None or session.session_id != session_id
                or (identities is not None and self.identities[token] not in identities)):
            return nnrp.ResumeRefused.REJECTED
        self.attached.add(id(session))
        return session

    def detach(self, session: nnrp.ServerSession) -> None:
        self.attached.discard(id(session))

    def token_of(self, session: nnrp.ServerSession) -> bytes | None:
        """The session's live token (what a resume or migration of it must present)."""
        return next((token for token, held in self.sessions.items() if held is session), None)


def exercise(data: bytes) -> None:
    """Connections coming and going over one store, driven by ``data`` (the fuzzer's and
    the property test's input). Records, one byte of kind then its bytes:

    * 0: SESSION_OPEN asking for resume (flags, requested id from the input);
    * 1: SESSION_OPEN with a token: a live one (picked by the input), or input bytes;
    * 2: SESSION_MIGRATE naming a session, its body a live token or input bytes, with
      transport ids from the input;
    * 3: a FRAME_SUBMIT on an open session (operation and frame ids from the input);
    * 4: the connection ends (its resumable sessions detach), and a new one starts.

    The contract: nothing raises; every reply decodes; a resumed ACK names the session
    the token belonged to and carries a new 24-byte token; a refusal carries session 0,
    no token and no resume flag; a session is held by at most one connection, and the
    ones a connection holds answer to their own ids."""
    store = Store()
    connections = [_connection(store)]
    at = 0
    while at < len(data):
        kind, arg = data[at] % 5, data[at + 1:at + 3].ljust(2, b"\0")
        at += 3
        conn = connections[-1]
        live = list(store.sessions)
        if kind == 0:
            request = nnrp.SessionOpen(requested_session_id=arg[0] % 4, profile_id=2,
                                       schema_id=0x1001, schema_version=3,
                                       session_flags=arg[1] & 0x0F)
            _check(conn, store, conn.receive_data(nnrp.encode(nnrp.Packet(request))))
        elif kind in (1, 2):
            token = (live[arg[0] % len(live)] if live and arg[1] & 1
                     else data[at:at + arg[0] % 32])
            at += 0 if live and arg[1] & 1 else arg[0] % 32
            session_id = (store.sessions[token].session_id if token in store.sessions
                          else arg[1] % 4)
            if kind == 1:
                packet = nnrp.Packet(nnrp.SessionOpen(
                    requested_session_id=session_id, profile_id=2, schema_id=0x1001,
                    schema_version=3, session_flags=arg[1] & 0x0F,
                    resume_token_bytes=len(token)), body=token)
            else:
                packet = nnrp.Packet(nnrp.SessionMigrate(
                    old_transport_id=arg[1] % 4 + 1, new_transport_id=(arg[1] >> 2) % 4 + 1,
                    last_result_frame_id=arg[0]), session_id=session_id, body=token)
            _check(conn, store, conn.receive_data(nnrp.encode(packet)))
        elif kind == 3:
            submit = nnrp.Packet(nnrp.FrameSubmit(operation_id=arg[0] % 5 + 1,
                                                  payload_kind_bitmap=0x10,
                                                  payload_frame_count=1),
                                 session_id=arg[1] % 4, frame_id=arg[1] % 5 + 1,
                                 body=nnrp.pack_single_frame(b"{}"))
            _check(conn, store, conn.receive_data(nnrp.encode(submit)))
        else:
            for session_id in list(range(1, 8)):
                session = conn.detach(session_id)
                if session is not None:
                    store.detach(session)
            connections.append(_connection(store))
    held = [id(session) for conn in connections for session_id in range(1, 8)
            if (session := conn.session(session_id)) is not None]
    assert len(held) == len(set(held)), "a session held by two connections"


def _connection(store: Store) -> nnrp.ServerConnection:
    conn = nnrp.ServerConnection(store=store, transport_id=nnrp.TransportId.TCP)
    conn.receive_data(nnrp.encode(nnrp.Packet(nnrp.ClientHello(profile_bitmap=0b11))))
    return conn


def _check(conn: nnrp.ServerConnection, store: Store, events: list[object]) -> None:
    decoder = nnrp.Decoder()
    packets = [p for e in events if isinstance(e, nnrp.SendBytes) for p in decoder.feed(e.data)]
    assert not decoder.buffered
    for packet in packets:
        message = packet.message
        if isinstance(message, nnrp.SessionOpenAck):
            if message.status == nnrp.SessionOpenStatus.RESUMED:
                assert packet.session_id == message.session_id != 0
                assert message.session_flags_ack == 1 and len(packet.body) == 24
                assert store.sessions.get(packet.body) is conn.session(packet.session_id)
            elif message.status != nnrp.SessionOpenStatus.OPENED:
                assert (packet.session_id, message.session_flags_ack,
                        message.resume_token_bytes) == (0, 0, 0)
        if isinstance(message, nnrp.SessionMigrateAck) and message.accept_code == 0:
            session = conn.session(packet.session_id)
            assert session is not None
            assert message.resume_from_frame_id > session.max_frame_id
    for session_id in range(1, 8):
        session = conn.session(session_id)
        assert session is None or session.session_id == session_id
