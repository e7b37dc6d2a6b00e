"""Differential (issue 34): one raw NNRP script, over plain TCP with the gateway's codec,
against nnrp-py's native server (tests.support.native_server: an application that only
holds sessions) and against the gateway, answers compared.

The script, on one fresh server of each kind (session ids therefore run alike):

1. Open a resumable session (profile 2, schema 0x1001 v3) and drop its connection. Once
   the server has seen it die, on a new connection resume it asking profile 0 with
   schema 0/0, then profile 2 with schema 0/0, then what it was opened with; then open a
   new session with profile 0, schema 0/0.
2. Open one resumable session on each of two connections, drop both, and once the
   server has seen both die resume both on one new connection.
3. Open a resumable session on connection A; on connection B, SESSION_MIGRATE it with
   its token (TCP to TCP: a client that reconnected); if B is answered, send a PING on
   it. Then drop both and, once that is seen, resume with the session's first token,
   and with the token the migration gave, if it gave one.

What agrees:

* A resume asking another profile, or the same profile with another schema, is refused
  with the same answer: status rejected, header session 0, ``profile_unsupported`` (the
  profile) or ``schema_unsupported`` (the schema), no token, no ``resume_enabled``, a
  diagnostic declared in ``session_extension_bytes``; and the refusal spends nothing:
  the same token then resumes the session (status resumed, its id, a new 24-byte token).
* Session ids come from one space per server, lowest free first: the sessions of two
  connections get ids apart (2 and 3, the first session holding 1 while detached), and
  both are resumed, with their own ids, on one new connection once both connections
  died.

Where they differ:

* Why the resume with another profile is refused. nnrp-py's server refuses it because it
  does not serve profile 0 or schema 0/0 at all (step 1's new session with them is
  refused the same way); given a profile it does serve, it would resume the session
  under the profile asked, and the token it used would be spent (measured against
  nnrp-py 1.0.0rc4 with a server that also serves profile 1). The gateway serves
  profile 0 with schema 0/0 (the new session opens) and refuses because the session was
  opened with another one: a session keeps its profile (preview3 section 11.2: a resume
  asks for what the session is; gateway/nnrp/_server_lifecycle.py rule 4b).
* A refusal's ACK, as in tests/interop/test_resume_differential.py: nnrp-py's fills in
  its credit, ``max_in_flight`` and window; the gateway's, granting nothing, has 0 there;
  the diagnostics' words differ. A granting ACK differs in the credit alone.
* SESSION_MIGRATE. nnrp-py's server has none: it closes B without a reply, A's session
  lives on untouched (nothing arrives on A), and the token stays what it was (the first
  token resumes the session afterwards). The gateway moves the session to B
  (SESSION_MIGRATE_ACK accepted, the next token its body), tells A (a non-fatal ERROR
  naming the session), and, once B has sent a packet after the ACK and ``confirm_grace``
  has passed (short here), the first token no longer opens the session (resume_rejected)
  while the migration's does (gateway/nnrp/_resumption.py R4, R9).
"""

from __future__ import annotations

import collections
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

pytest.importorskip("nnrp.server.native")

from gateway import nnrp
from gateway.nnrp import ResumePolicy
from tests.support.native_server import serve_referee
from tests.support.stack import start_stack
from tests.support.waits import until

pytestmark = pytest.mark.interop

#: Bounds one reply, and the wait for a server to see connections die.
REPLY_LIMIT = 5.0
SETTLE_LIMIT = 10.0
#: How long a connection must stay silent to count as told nothing (only waited out
#: where nothing comes: a packet that comes ends the wait).
QUIET = 1.0

ALLOW_RESUME = int(nnrp.SessionFlag.ALLOW_RESUME)
TCP = int(nnrp.TransportId.TCP)
#: What nnrp-py's native client sends (nnrp-wire.md, live exchange).
HELLO = nnrp.ClientHello(min_version=1, max_version=1, wire_format_bitmap=1,
                         profile_bitmap=0b11, payload_kind_bitmap=0x73, max_lane_count=1,
                         latency_budget_ms=500)
#: The SESSION_OPEN nnrp-py's native client sends (token profile), asking for resume.
OPEN = nnrp.SessionOpen(requested_session_id=0, profile_id=2, priority_class=1,
                        session_flags=ALLOW_RESUME, schema_id=0x1001, schema_version=3,
                        default_deadline_ms=500, max_in_flight=4, lease_ttl_hint_ms=30_000)
#: Profile 0 (typed) with its schema 0/0: not served by nnrp-py's server, served by ours.
TYPED = {"profile_id": 0, "schema_id": 0, "schema_version": 0}


# -- a raw NNRP client over TCP ----------------------------------------------------------


class Raw:
    """One TCP connection speaking NNRP with the gateway's codec. ``receive`` gives None
    once the server has closed the connection."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = nnrp.Decoder()
        self.pending: collections.deque[nnrp.Packet] = collections.deque()
        self.eof = False

    @classmethod
    async def connect(cls, address: str) -> Raw:
        host, _, port = address.rpartition(":")
        raw = cls(await trio.open_tcp_stream(host, int(port)))
        ack = await raw.request(HELLO)
        assert ack is not None and isinstance(ack.message, nnrp.ServerHelloAck), ack
        return raw

    async def send(self, message: Any, **fields: Any) -> None:
        await self.stream.send_all(nnrp.encode(nnrp.Packet(message, **fields)))

    async def receive(self) -> nnrp.Packet | None:
        while not self.pending:
            if self.eof:
                return None
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:  # reset by the server
                data = b""
            if not data:
                self.eof = True
            else:
                self.pending.extend(self.decoder.feed(data))
        return self.pending.popleft()

    async def request(self, message: Any, **fields: Any) -> nnrp.Packet | None:
        """Send one message; its reply (None: the server closed without one)."""
        await self.send(message, **fields)
        with trio.fail_after(REPLY_LIMIT):
            return await self.receive()

    async def told(self) -> nnrp.Packet | None:
        """The next packet if one comes within ``QUIET`` seconds (None: none came, or the
        connection closed)."""
        with trio.move_on_after(QUIET):
            return await self.receive()
        return None

    async def aclose(self) -> None:
        await self.stream.aclose()


def resume(session_id: int, token: bytes, **fields: Any) -> dict[str, Any]:
    """``request`` arguments for a resume of ``session_id`` with ``token``."""
    message = attrs.evolve(OPEN, requested_session_id=session_id,
                           resume_token_bytes=len(token), **fields)
    return {"message": message, "body": token}


# -- the script, the same for both servers -----------------------------------------------


#: The gateway's grace for a replaced token (10 s by default), short here so that the
#: first token is tried past it.
CONFIRM_GRACE = 0.2

@attrs.frozen
class Target:
    """A server, and what it says of its sessions: how many open connections hold (both
    servers), and how many wait detached for their client (the gateway's registry; None:
    nnrp-py's application has no such notion, only of the sessions it lost)."""

    address: str  # host:port of the server's TCP listener
    live: Callable[[], int]
    detached: Callable[[], int | None]
    #: How long a replaced token stays good once the new one is confirmed (the gateway's
    #: ``confirm_grace``, R4; nnrp-py's server rotates nothing here).
    spent_after: float = 0.0

    def settled(self, *, detached: int, live: int) -> bool:
        """Whether the server has seen every connection the script dropped die."""
        return self.live() == live and self.detached() in (None, detached)


@attrs.frozen
class Ack:
    """A SESSION_OPEN_ACK, with its header's session id and its body."""

    session_id: int
    message: nnrp.SessionOpenAck
    body: bytes

    @classmethod
    def of(cls, packet: nnrp.Packet | None) -> Ack:
        assert packet is not None and isinstance(packet.message, nnrp.SessionOpenAck), packet
        return cls(packet.session_id, packet.message, packet.body)


@attrs.define
class Observed:
    """What one server answered, by step (a reply, or None: the connection closed)."""

    replies: dict[str, nnrp.Packet | None] = attrs.Factory(dict)
    #: Step 3: what connection A got once the migration was answered (None: nothing).
    told_a: nnrp.Packet | None = None
    #: Step 3: sessions held by open connections once the migration was answered.
    live_after_migrate: int = -1

    def ack(self, step: str) -> Ack:
        return Ack.of(self.replies[step])


async def run_script(target: Target) -> Observed:
    seen = Observed()
    replies = seen.replies

    async def settle(detached: int, live: int) -> None:
        with trio.fail_after(SETTLE_LIMIT):
            await until(lambda: target.settled(detached=detached, live=live))

    async def connect() -> Raw:
        return await Raw.connect(target.address)

    # 1. A resume asking another profile or schema, then the session's own.
    first = await connect()
    replies["opened"] = await first.request(OPEN)
    session_id, token = seen.ack("opened").session_id, seen.ack("opened").body
    await first.aclose()
    await settle(detached=1, live=0)
    again = await connect()
    replies["other_profile"] = await again.request(**resume(session_id, token, **TYPED))
    replies["other_schema"] = await again.request(**resume(session_id, token, schema_id=0,
                                                           schema_version=0))
    replies["resumed"] = await again.request(**resume(session_id, token))
    replies["typed_session"] = await again.request(attrs.evolve(OPEN, session_flags=0,
                                                                **TYPED))
    await again.aclose()
    await settle(detached=1, live=0)

    # 2. Two connections' sessions, resumed on one.
    x, y = await connect(), await connect()
    replies["x_opened"] = await x.request(OPEN)
    replies["y_opened"] = await y.request(OPEN)
    await x.aclose()
    await y.aclose()
    await settle(detached=3, live=0)
    z = await connect()
    for name in ("x", "y"):
        ack = seen.ack(f"{name}_opened")
        replies[f"{name}_resumed"] = await z.request(**resume(ack.session_id, ack.body))
    await z.aclose()
    await settle(detached=3, live=0)

    # 3. SESSION_MIGRATE of a live session, from another connection.
    a = await connect()
    replies["a_opened"] = await a.request(OPEN)
    session_id, token = seen.ack("a_opened").session_id, seen.ack("a_opened").body
    b = await connect()
    migrate = nnrp.SessionMigrate(old_transport_id=TCP, new_transport_id=TCP,
                                  last_result_frame_id=0, client_migrate_ts_us=0)
    migrated = replies["migrated"] = await b.request(migrate, session_id=session_id,
                                                     body=token)
    if migrated is not None:
        # The first packet after the ACK: the client holds the new token (R4).
        replies["pong"] = await b.request(nnrp.Ping())
    seen.told_a = await a.told()
    seen.live_after_migrate = target.live()
    await a.aclose()
    await b.aclose()
    await settle(detached=4, live=0)
    await trio.sleep(target.spent_after)
    c = await connect()
    replies["first_token"] = await c.request(**resume(session_id, token))
    if migrated is not None and migrated.body:
        replies["migration_token"] = await c.request(**resume(session_id, migrated.body))
    await c.aclose()
    return seen


async def against_nnrp_py() -> Observed:
    async with serve_referee() as (referee, address):
        # The runtime drops a session once its connection dies, and the application's
        # next poll of it fails: then it holds only the sessions of open connections.
        seen = await run_script(Target(address, lambda: referee.live, lambda: None))
    assert referee.errors == []
    return seen


async def against_the_gateway(socket_dir: Path) -> Observed:
    async with trio.open_nursery() as nursery:
        stack = await start_stack(nursery, socket_dir,
                                  resume=ResumePolicy(confirm_grace=CONFIRM_GRACE))
        registry = stack.gateway.server.registry
        assert registry is not None
        address = stack.uri("tcp").removeprefix("tcp://")
        server = stack.gateway.server
        seen = await run_script(Target(
            address, lambda: sum(len(c.sessions) for c in server.connections),
            lambda: registry.detached, spent_after=CONFIRM_GRACE * 2))
        nursery.cancel_scope.cancel()
    return seen


@attrs.frozen
class Runs:
    reference: Observed
    ours: Observed


@pytest.fixture(scope="module")
def runs() -> Runs:
    """The script against both servers, once for this module's tests. Its own trio.run:
    pytest-trio's fixtures live for one test."""

    async def both(socket_dir: Path) -> Runs:
        return Runs(await against_nnrp_py(), await against_the_gateway(socket_dir))

    # Under /tmp: the gateway's unix socket path must be short.
    with tempfile.TemporaryDirectory(prefix="nnrp-") as path:
        return trio.run(both, Path(path))


def differing(reference: Any, ours: Any) -> dict[str, tuple[int, int]]:
    """The fields of two messages that differ: name -> (nnrp-py's, ours)."""
    theirs, mine = attrs.asdict(reference), attrs.asdict(ours)
    return {name: (value, mine[name]) for name, value in theirs.items() if mine[name] != value}


REJECTED = nnrp.SessionOpenStatus.REJECTED
RESUMED = nnrp.SessionOpenStatus.RESUMED
OPENED = nnrp.SessionOpenStatus.OPENED


def assert_refused(packet: Ack, code: nnrp.SessionError) -> None:
    ack = packet.message
    assert (packet.session_id, ack.session_id, ack.status, ack.session_error_code) == (
        0, 0, REJECTED, code)
    assert (ack.resume_token_bytes, ack.session_flags_ack) == (0, 0)
    assert ack.session_extension_bytes == len(packet.body) > 0  # the declared diagnostic


def assert_resumed(packet: Ack, session_id: int, spent: bytes) -> None:
    ack = packet.message
    assert (packet.session_id, ack.session_id, ack.status) == (session_id, session_id, RESUMED)
    assert (ack.session_flags_ack, ack.resume_window_ms, ack.resume_token_bytes,
            ack.session_error_code) == (1, 120_000, 24, 0)
    assert len(packet.body) == 24 and packet.body != spent


# -- 1. another profile or schema on resume ----------------------------------------------


def test_both_refuse_a_resume_asking_another_profile_or_schema(runs: Runs) -> None:
    for seen in (runs.reference, runs.ours):
        opened = seen.ack("opened")
        assert (opened.session_id, opened.message.status, len(opened.body)) == (1, OPENED, 24)
        assert_refused(seen.ack("other_profile"), nnrp.SessionError.PROFILE_UNSUPPORTED)
        assert_refused(seen.ack("other_schema"), nnrp.SessionError.SCHEMA_UNSUPPORTED)
        # The refusals spent nothing: the first token resumes the session.
        assert_resumed(seen.ack("resumed"), 1, opened.body)


def test_the_refusals_differ_in_what_nnrp_py_fills_in_and_in_their_words(runs: Runs) -> None:
    """As a spent token's refusal does (tests/interop/test_resume_differential.py)."""
    ours_text = b"resume rejected: the session was opened with another profile or schema"
    for step, theirs_text in (("other_profile", b"requested profile is unsupported"),
                              ("other_schema", b"requested schema is unsupported")):
        reference, ours = runs.reference.ack(step), runs.ours.ack(step)
        assert (reference.body, ours.body) == (theirs_text, ours_text)
        # The request's profile and schema echoed in both.
        assert differing(reference.message, ours.message) == {
            "granted_operation_credit": (2, 0), "max_in_flight": (4, 0),
            "resume_window_ms": (120_000, 0),
            "session_extension_bytes": (len(theirs_text), len(ours_text))}
    for step in ("opened", "resumed"):
        assert differing(runs.reference.ack(step).message, runs.ours.ack(step).message) == {
            "granted_operation_credit": (2, 4)}


def test_nnrp_py_does_not_serve_the_typed_profile_the_gateway_does(runs: Runs) -> None:
    """Why the same refusal: nnrp-py's server refuses profile 0 whatever the session;
    the gateway serves it, and refuses it only to a session opened with another."""
    assert_refused(runs.reference.ack("typed_session"), nnrp.SessionError.PROFILE_UNSUPPORTED)
    typed = runs.ours.ack("typed_session")
    assert (typed.message.status, typed.message.profile_id, typed.message.schema_id,
            typed.message.schema_version) == (OPENED, 0, 0, 0)
    assert typed.session_id == 2  # the next free id: the resumed session holds 1


# -- 2. sessions of two connections ------------------------------------------------------


def test_both_number_two_connections_sessions_apart_and_resume_both_on_one(
        runs: Runs) -> None:
    for seen in (runs.reference, runs.ours):
        x, y = seen.ack("x_opened"), seen.ack("y_opened")
        # One id space per server, lowest free first: 1 is the detached first session's.
        assert (x.session_id, y.session_id) == (2, 3)
        assert (x.message.session_id, y.message.session_id) == (2, 3)
        assert (x.message.status, y.message.status) == (OPENED, OPENED)
        assert x.body != y.body
        assert_resumed(seen.ack("x_resumed"), 2, x.body)
        assert_resumed(seen.ack("y_resumed"), 3, y.body)


# -- 3. SESSION_MIGRATE ------------------------------------------------------------------


def test_nnrp_py_closes_a_migrating_connection_without_a_reply(runs: Runs) -> None:
    seen = runs.reference
    assert seen.ack("a_opened").session_id == 4
    assert seen.replies["migrated"] is None  # closed, nothing sent
    assert "pong" not in seen.replies
    assert seen.told_a is None  # A is told nothing, and keeps its session
    assert seen.live_after_migrate == 1
    # Nothing rotated: the first token resumes the session.
    assert_resumed(seen.ack("first_token"), 4, seen.ack("a_opened").body)
    assert "migration_token" not in seen.replies


def test_the_gateway_moves_a_migrating_session_and_rotates_its_token(runs: Runs) -> None:
    seen = runs.ours
    opened = seen.ack("a_opened")
    assert opened.session_id == 4
    migrated = seen.replies["migrated"]
    assert migrated is not None and isinstance(migrated.message, nnrp.SessionMigrateAck)
    assert (migrated.session_id, migrated.message.accept_code) == (4, nnrp.MigrateAccept.ACCEPTED)
    assert len(migrated.body) == 24 and migrated.body != opened.body  # the next token
    pong = seen.replies["pong"]
    assert pong is not None and isinstance(pong.message, nnrp.Pong)
    # A is told, without losing the connection.
    told = seen.told_a
    assert told is not None and isinstance(told.message, nnrp.Error)
    assert (told.message.is_fatal, told.message.scope, told.message.related_session_id) == (
        0, nnrp.ErrorScope.SESSION, 4)
    assert told.body == b"session 4 moved to another connection (SESSION_MIGRATE)"
    assert seen.live_after_migrate == 1  # held by B alone
    # The token rotated: the first no longer opens the session, the migration's does.
    assert_refused(seen.ack("first_token"), nnrp.SessionError.RESUME_REJECTED)
    assert_resumed(seen.ack("migration_token"), 4, migrated.body)
