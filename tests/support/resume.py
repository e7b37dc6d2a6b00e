"""Resume in the sans-IO layer, as the tests, the state machine and the fuzzer drive it:
the real ``SessionBook`` (gateway/nnrp/_resumption.py) with a clock the test moves and
tokens that are deterministic, and connections over it."""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from gateway import nnrp
from gateway.profile import EnvelopeResubmission

HELLO = nnrp.ClientHello(profile_bitmap=0b11)
RESUMABLE = nnrp.SessionOpen(profile_id=2, schema_id=0x1001, schema_version=3,
                             max_in_flight=4, session_flags=nnrp.SessionFlag.ALLOW_RESUME)


@attrs.define
class Clock:
    """Monotonic seconds the test moves by hand."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def counting_tokens() -> Any:
    """A token source: 1, 2, 3, ... as big-endian 24-byte strings (never repeats)."""
    counter = itertools.count(1)
    return lambda size: next(counter).to_bytes(size, "big")


def book(clock: Clock | None = None, **policy: Any) -> nnrp.SessionBook:
    return nnrp.SessionBook(nnrp.ResumePolicy(**policy), clock=clock or Clock(),
                            random_bytes=counting_tokens())


def connection(book: nnrp.SessionBook, *, transport: nnrp.TransportId = nnrp.TransportId.TCP,
               peer: nnrp.PeerCredentials | None = None, relayed: bool = False,
               forwarded: bool = False, **config: Any) -> nnrp.ServerConnection:
    config.setdefault("resubmission", EnvelopeResubmission())
    conn = nnrp.ServerConnection(nnrp.ServerConfig(**config), book.clock, book=book,
                                 transport_id=transport, peer=peer, relayed=relayed,
                                 forwarded=forwarded)
    conn.receive_data(nnrp.encode(nnrp.Packet(HELLO)))
    return conn


def cut(conn: nnrp.ServerConnection) -> nnrp.SessionsLost:
    """The connection ends without SESSION_CLOSE (EOF, reset): what its sessions did."""
    return conn.connection_lost()


#: Every way a session ends: its SESSION_CLOSE, its connection lost without detaching,
#: a fatal error on its connection, its resume window over while detached, the process
#: stopping (the book closed).
SESSION_ENDS = ("close", "connection_lost", "fatal_error", "expired", "drained")


def end_session(conn: nnrp.ServerConnection, sessions: nnrp.SessionBook, clock: Clock,
                end: str, *, session_id: int, pool: nnrp.ObjectBytes) -> None:
    """End session ``session_id`` of ``conn`` (resumable, opened over ``sessions``) in the
    way ``end`` (one of ``SESSION_ENDS``) names. While it waits detached for a client
    that never comes, what it holds of ``pool`` is still held."""
    if end == "close":
        conn.receive_data(nnrp.encode(nnrp.Packet(nnrp.SessionClose(), session_id=session_id)))
    elif end == "connection_lost":
        conn.connection_lost(detach=False)
    elif end == "fatal_error":
        conn.receive_data(b"\0" * 40)  # not NNRP: the connection fails
    elif end == "expired":
        held = pool.used
        conn.connection_lost()  # detached, waiting for its client ...
        assert pool.used == held
        clock.now += sessions.policy.window
        sessions.expire()  # ... which never came
    else:
        assert end == "drained", end
        conn.connection_lost()
        sessions.close()  # the process stops


def resume(token: bytes, session_id: int = 1, *, auth: bytes = b"",
           flags: int = nnrp.SessionFlag.ALLOW_RESUME, **fields: Any) -> bytes:
    request = attrs.evolve(RESUMABLE, requested_session_id=session_id, session_flags=flags,
                           resume_token_bytes=len(token), auth_bytes=len(auth), **fields)
    return nnrp.encode(nnrp.Packet(request, body=token + auth))


def migrate(token: bytes, *, old: int = nnrp.TransportId.QUIC,
            new: int = nnrp.TransportId.TCP, last: int = 0, session_id: int = 1) -> bytes:
    return nnrp.encode(nnrp.Packet(nnrp.SessionMigrate(
        old_transport_id=old, new_transport_id=new, last_result_frame_id=last),
        session_id=session_id, body=token))


def exercise(data: bytes) -> None:
    """Connections coming and going over one book, driven by ``data`` (the fuzzer's and
    the property test's input). Records, one byte of kind then its bytes:

    * 0: SESSION_OPEN asking for resume (flags, requested id from the input);
    * 1: SESSION_OPEN with a token: a live one (picked by the input), or input bytes;
    * 2: SESSION_MIGRATE naming a session, its body a live token or input bytes, with
      transport ids from the input;
    * 3: a FRAME_SUBMIT on an open session (operation and frame ids from the input);
    * 4: the connection ends (its resumable sessions detach), and a new one starts;
    * 5: time passes (windows may end).

    The contract: nothing raises; every reply decodes; a resumed ACK names the session
    the token belonged to and carries a new 24-byte token; a refusal carries session 0,
    no token and no resume flag; a session is held by at most one connection, and the
    ones a connection holds answer to their own ids."""
    clock = Clock()
    sessions = book(clock, window=30.0)
    connections = [connection(sessions)]
    tokens: list[bytes] = []
    at = 0
    while at < len(data):
        kind, arg = data[at] % 6, data[at + 1:at + 3].ljust(2, b"\0")
        at += 3
        conn = connections[-1]
        live = [t for t in tokens if _opens(sessions, t)]
        if kind == 0:
            request = nnrp.SessionOpen(requested_session_id=arg[0] % 4, profile_id=2,
                                       schema_id=0x1001, schema_version=3,
                                       session_flags=arg[1] & 0x0F)
            tokens += _check(conn, sessions, conn.receive_data(nnrp.encode(nnrp.Packet(request))))
        elif kind in (1, 2):
            token = (live[arg[0] % len(live)] if live and arg[1] & 1
                     else data[at:at + arg[0] % 32])
            at += 0 if live and arg[1] & 1 else arg[0] % 32
            record = _record_of(sessions, token)
            session_id = record.session.session_id if record is not None else arg[1] % 4
            if kind == 1:
                packet = resume(token, session_id, flags=arg[1] & 0x0F)
            else:
                packet = migrate(token, old=arg[1] % 4 + 1, new=(arg[1] >> 2) % 4 + 1,
                                 last=arg[0], session_id=session_id)
            tokens += _check(conn, sessions, conn.receive_data(packet))
        elif kind == 3:
            submit = nnrp.Packet(nnrp.FrameSubmit(operation_id=arg[0] % 5 + 1,
                                                  payload_kind_bitmap=0x10,
                                                  payload_frame_count=1),
                                 session_id=arg[1] % 4, frame_id=arg[1] % 5 + 1,
                                 body=nnrp.pack_single_frame(b"{}"))
            tokens += _check(conn, sessions, conn.receive_data(nnrp.encode(submit)))
        elif kind == 4:
            cut(conn)
            connections.append(connection(sessions))
        else:
            clock.now += arg[0]
            sessions.expire()
    held = [id(session) for conn in connections for session in conn.sessions]
    assert len(held) == len(set(held)), "a session held by two connections"
    for record in sessions.records.values():
        if record.holder is not None:
            assert record.holder.session(record.session.session_id) is record.session


def _opens(book: nnrp.SessionBook, token: bytes) -> bool:
    return _record_of(book, token) is not None


def _record_of(book: nnrp.SessionBook, token: bytes) -> nnrp.ResumeRecord | None:
    for record in book.records.values():
        if token and token in record.tokens:
            return record
    return None


def _check(conn: nnrp.ServerConnection, book: nnrp.SessionBook, events: list[object]
           ) -> list[bytes]:
    """The contract of ``exercise`` for one batch of events; the tokens they gave out."""
    decoder = nnrp.Decoder()
    packets = [p for e in events if isinstance(e, nnrp.SendBytes) for p in decoder.feed(e.data)]
    assert not decoder.buffered
    issued = []
    for packet in packets:
        message = packet.message
        if isinstance(message, nnrp.SessionOpenAck):
            if message.status == nnrp.SessionOpenStatus.RESUMED:
                assert packet.session_id == message.session_id != 0
                assert message.session_flags_ack == 1 and len(packet.body) == 24
                record = book.records[packet.session_id]
                assert record.newest == packet.body
                assert conn.session(packet.session_id) is record.session
            elif message.status != nnrp.SessionOpenStatus.OPENED:
                assert (packet.session_id, message.session_flags_ack,
                        message.resume_token_bytes) == (0, 0, 0)
            if message.resume_token_bytes:
                issued.append(bytes(packet.body[:message.resume_token_bytes]))
        if isinstance(message, nnrp.SessionMigrateAck) and message.accept_code == 0:
            session = conn.session(packet.session_id)
            assert session is not None
            assert message.resume_from_frame_id > session.max_frame_id
            if packet.body:
                issued.append(bytes(packet.body))
    for session in conn.sessions:
        assert conn.session(session.session_id) is session
    return issued
