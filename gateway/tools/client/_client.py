"""The connection of the project's NNRP client (``NnrpClient``): its reader, the
answers to session opens, resumes and migrations, and ``connect``.

Resume (docs/resume.md): ``connect(uri, resume=True)`` opens sessions
that may outlive their connection. When the connection drops, the client recovers by
itself, so ``events()`` goes on as if nothing happened: nothing is missed, nothing
arrives twice. Recovery rules:

1. It keeps trying for the sessions' resume window (or ``recovery_limit``): a refused or
   reset connection, a timeout, a connection that drops during the hello or the resume,
   a server that is full or draining: each is one failed attempt, never the end. Each
   attempt is bounded (``attempt_timeout``), so a path that swallows packets costs one
   attempt, not the window. Between attempts it backs off from 50 ms, doubling up to 2 s
   while the server cannot be reached or asks to retry later; an attempt that reached
   the server and was cut (a flapping path) is retried at once.
2. On a new connection the hello and every session's resume go in one write (one round
   trip for all of them); each operation still in flight is then resubmitted with
   ``nnrp.resume_after_sequence`` (the last result held), once its session's answer has
   come (a resubmission is the proof the new token arrived: rule 5).
3. A resume answered retry_later (the server has not seen the old connection die: a
   half-open path, a balancer still acknowledging) is followed at once by SESSION_MIGRATE
   on the same connection, which takes the session from wherever it is; the results
   held of its operations come again, and repeats are dropped by sequence.
4. Only the server's word that a session cannot be resumed (``resume_rejected``, or a
   profile or schema it does not have) ends that session: its operations fail with why.
5. A ticket is replaced only by the answer that carries the next token; a token whose
   answer was lost still opens the session (the server keeps it until the next one is
   used: gateway/nnrp/_resumption.py R4), so a lost answer costs one attempt.

``resume_session`` and ``migrate_session`` are the same steps by hand.
"""

from __future__ import annotations

import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from gateway.nnrp import (
    ClientConnection,
    ClientEvent,
    DropReceived,
    ErrorCode,
    ErrorReceived,
    HelloAcked,
    OtherReceived,
    PartialReceived,
    Pong,
    ProtocolError,
    RepeatReceived,
    ResultReceived,
    RetryAfter,
    SessionCloseAcked,
    SessionMigrateAck,
    SessionOpenAnswered,
    SessionOpenStatus,
)
from gateway.transport import (
    TRANSPORT_IDS,
    PacketTransport,
    QuicClientOptions,
    connect as connect_transport,
)

from ._session import ClientError, ClientOperation, ClientSession, ConnectionLost, ResumeTicket

#: Opens a new transport to the same endpoint (reconnecting after a drop).
Reconnect = Callable[[], Awaitable[PacketTransport]]
#: The pause after the first failed recovery attempt, doubling up to ``MAX_BACKOFF``.
MIN_BACKOFF = 0.05
MAX_BACKOFF = 2.0
#: How long a client that reconnects by itself tries to open its first session, or to
#: complete its first hello, over a path that keeps dropping it (no window applies).
DEFAULT_REOPEN = 10.0


class NnrpClient:
    def __init__(self, transport: PacketTransport, *,
                 reconnect: Reconnect | None = None,
                 recovery_limit: float | None = None,
                 attempt_timeout: float = 10.0) -> None:
        self.transport = transport
        self.sans_io = ClientConnection()
        self.sessions: dict[int, ClientSession] = {}
        self._hello = trio.Event()
        #: SESSION_OPEN_ACKs in order; None: the connection they were asked on is gone
        #: (ask again on the new one, or fail: ``failure``).
        self._session_answers = trio.open_memory_channel[SessionOpenAnswered | None](64)
        #: SESSION_OPENs sent and not answered yet.
        self._opening = 0
        self._migrate_answers = trio.open_memory_channel[tuple[SessionMigrateAck, bytes]](16)
        self._send_lock = trio.Lock()
        self.errors: list[ErrorReceived] = []
        self.failure: Exception | None = None
        self.others: list[ClientEvent] = []
        #: When set, a dropped connection is reconnected and its sessions resumed.
        self._reconnect = reconnect
        #: The longest a recovery keeps trying, when shorter than the sessions' window (a
        #: person at a terminal does not wait the server's two minutes).
        self._recovery_limit = recovery_limit
        #: The longest one recovery attempt may take (module rule 1).
        self._attempt_timeout = attempt_timeout
        #: Waiting for a PONG (``ping``), oldest first, and where each PONG came.
        self._pongs: deque[trio.Event] = deque()
        self._pong_at: dict[trio.Event, int] = {}
        #: Packets received and routed, in order (``ClientOperation.terminal_at``).
        self.received = 0
        #: Cleared while a dropped connection is being recovered: senders wait for it.
        self._connected = trio.Event()
        self._connected.set()
        #: Connections recovered after a drop, and the attempts that took (more: the
        #: server said to retry later, or an attempt failed).
        self.recoveries = 0
        self.recovery_attempts = 0
        #: Why the last recovery that failed ended (for the operations' error).
        self._recovery_ended = ""
        #: Results the server sent again that were held already (dropped here: after a
        #: resume that declared what it held, a server should send none).
        self.repeats = 0
        #: The last recovery attempt reached the server (its hello was answered).
        self._attempt_reached = False

    async def send(self, data: bytes) -> None:
        await self._connected.wait()
        if self.failure is not None:
            raise ClientError(f"connection failed: {self.failure}")
        async with self._send_lock:
            await self.transport.send([data])

    async def _submit(self, operation: ClientOperation,
                      encode: Callable[[ClientConnection], bytes]) -> None:
        """An operation's FRAME_SUBMIT, encoded for the connection as it is once the send
        lock is held. A submit racing a drop is the recovery's to finish when the session
        is resumable (the operation is in its session, so it is resubmitted): one that
        waited out the recovery is not sent again if the recovery resubmitted it, and
        one that meets the dead connection before the reader has seen it die is not an
        error to the caller (if the recovery fails, ``events()`` says so)."""
        await self._connected.wait()
        if self.failure is not None:
            raise ClientError(f"connection failed: {self.failure}")
        async with self._send_lock:
            sans_io = self.sans_io
            if operation._submitted_on is sans_io:
                return  # resubmitted on this connection by the recovery
            data = encode(sans_io)
            operation._submitted_on = sans_io
            try:
                await self.transport.send([data])
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                if self._reconnect is None or operation.session.ticket is None:
                    raise

    async def open_session(self, *, requested_session_id: int = 0, auth: bytes = b"",
                           resume: bool = False) -> ClientSession:
        """SESSION_OPEN and its answer; raises ClientError when refused. ``resume`` asks
        for a session that outlives its connection (``session.ticket`` when granted). A
        client that reconnects by itself asks again when the connection is lost before
        the answer came (a session the server opened then, unanswered, waits out its
        window there)."""
        return await self._open(lambda sans_io: sans_io.open_session(
            requested_session_id=requested_session_id, auth=auth, resume=resume), auth)

    async def resume_session(self, ticket: ResumeTicket, *, auth: bytes = b""
                             ) -> ClientSession:
        """Reopen a session of another (lost) connection here; a new session object, with
        the next ticket. Raises ClientError (``retry_later`` set when worth retrying)."""
        return await self._open(lambda sans_io: sans_io.resume_session(
            ticket.session_id, ticket.token, auth=auth), auth)

    async def _open(self, request: Callable[[ClientConnection], bytes], auth: bytes
                    ) -> ClientSession:
        while True:
            await self._connected.wait()
            if self.failure is not None:
                raise ClientError(f"connection failed: {self.failure}")
            self._opening += 1
            try:
                async with self._send_lock:
                    await self.transport.send([request(self.sans_io)])
                answer = await self._session_answers[1].receive()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                if self._reconnect is None:
                    raise
                answer = None  # the reader sees the connection die: asked again after
                await self._session_answers[1].receive()  # its None for this request
            finally:
                self._opening -= 1
            if answer is not None:
                return self._opened(answer, auth)
            if self._reconnect is None or self.failure is not None:
                raise ClientError(f"connection failed: {self.failure}")

    def _opened(self, answer: SessionOpenAnswered, auth: bytes) -> ClientSession:
        """The session ``answer`` opens (ClientError when refused)."""
        _check_opened(answer)
        session = ClientSession(self, answer.session_id, ticket=ResumeTicket.of(answer),
                                auth=auth)
        self.sessions[answer.session_id] = session
        return session

    async def ping(self) -> int | None:
        """PING, and wait for its PONG: everything sent before it has been read. Returns
        where the PONG came among what this connection received (``received``; None: the
        connection failed first): a server answers a PING in order, so what came before
        its PONG was sent before the server read what was sent before the PING."""
        pong = trio.Event()
        self._pongs.append(pong)
        await self.send(self.sans_io.ping())
        await pong.wait()
        return self._pong_at.pop(pong, None)

    async def migrate_session(self, session: ClientSession, *, old_transport_id: int,
                              new_transport_id: int, last_result_frame_id: int = 0
                              ) -> SessionMigrateAck:
        """Move ``session`` (of another connection of this client's) here with
        SESSION_MIGRATE; on acceptance its operations continue on this connection, and its
        ticket is the one the answer carries. The server sends again what it holds of
        frames after ``last_result_frame_id``: the session is taken here before asking,
        so nothing that comes with the answer, or still comes on the old connection, is
        lost (repeats are dropped)."""
        assert session.ticket is not None, "only a resumable session carries a token"
        if session.session_id in self.sessions:
            # The server refuses it too (gateway/nnrp/_server_lifecycle.py rule 4c);
            # asking would first put the moving session in place of this connection's own.
            raise ClientError(f"session {session.session_id} is already open on this "
                              "connection; a session with that id cannot migrate here")
        old = session.client
        old.sessions.pop(session.session_id, None)
        _adopt(self.sans_io, session)
        session.client = self
        self.sessions[session.session_id] = session
        await self.send(self.sans_io.migrate_session(
            session.session_id, session.ticket.token, old_transport_id=old_transport_id,
            new_transport_id=new_transport_id, last_result_frame_id=last_result_frame_id))
        ack, token = await self._migrate_answers[1].receive()
        if ack.accept_code != 0:  # it stays where it was
            self.sessions.pop(session.session_id, None)
            self.sans_io.forget_session(session.session_id)
            session.client = old
            old.sessions[session.session_id] = session
        elif token:
            session.ticket = attrs.evolve(session.ticket, token=token)
        return ack

    async def _reader(self) -> None:
        while True:
            try:
                await self._read_until_failure()
            except (ClientError, ProtocolError, trio.BrokenResourceError, OSError) as exc:
                attempts = self.recovery_attempts
                if await self._recover():
                    continue
                if self.recovery_attempts > attempts:
                    exc = ClientError(f"{exc}; the sessions were not resumed "
                                      f"({self.recovery_attempts - attempts} attempts: "
                                      f"{self._recovery_ended})")
                self._fail(exc)
                return

    async def _read_until_failure(self) -> None:
        while True:
            for event in await _receive(self.transport, self.sans_io):
                await self._route(event)

    def _fail(self, exc: Exception) -> None:
        self.failure = exc
        error = exc if isinstance(exc, ClientError) else ClientError(str(exc))
        for session in self.sessions.values():
            _end_session(session, error)
        self._hello.set()
        self._connected.set()
        self._unanswered()
        while self._pongs:
            self._pongs.popleft().set()

    def _unanswered(self) -> None:
        """The connection the pending SESSION_OPENs went on is gone: each whose answer
        has not come is told (None)."""
        answered = self._session_answers[0].statistics().current_buffer_used
        for _ in range(self._opening - answered):
            with contextlib.suppress(trio.WouldBlock):
                self._session_answers[0].send_nowait(None)

    async def _recover(self) -> bool:
        """The connection dropped: reconnect and resume every resumable session, within
        the longest resume window (module rules 1-5). False: nothing to resume, or no way
        back (every session that could not be resumed fails)."""
        resumable = [s for s in self.sessions.values() if s.ticket is not None]
        if (self._reconnect is None or not self._hello.is_set()
                or not (resumable or self._opening)):
            return False
        lost = ClientError("the connection dropped and the session was not resumable")
        for session in [s for s in self.sessions.values() if s.ticket is None]:
            self._drop_session(session, lost)
        self._connected = trio.Event()
        self._unanswered()  # asked again once connected: nothing to resume for them
        lost_kind = self.transport.kind
        window = max((s.ticket.window_ms for s in resumable if s.ticket),
                     default=int(self._recovery_limit or DEFAULT_REOPEN) * 1000) / 1000
        limited = self._recovery_limit is not None and self._recovery_limit < window
        if self._recovery_limit is not None:
            window = min(window, self._recovery_limit)
        deadline = trio.current_time() + window
        backoff = MIN_BACKOFF
        self._recovery_ended = ""
        while trio.current_time() < deadline:
            self.recovery_attempts += 1
            self._attempt_reached = False
            retry_later = False
            attempt: tuple[PacketTransport, ClientConnection, list[ClientEvent]] | None = None
            try:
                with trio.move_on_at(min(deadline, trio.current_time()
                                         + self._attempt_timeout)):
                    assert self._reconnect is not None
                    attempt = await self._resume_on(await self._reconnect(), lost_kind)
                if attempt is None:
                    self._recovery_ended = "an attempt timed out"
            except (ClientError, ProtocolError, trio.BrokenResourceError, OSError,
                    trio.TooSlowError) as error:
                self._recovery_ended = str(error)  # rule 1: one attempt failed
                retry_later = isinstance(error, ClientError) and error.retry_later and not (
                    isinstance(error, ConnectionLost))
            if attempt is not None:
                # The new connection is this client's; what came with the answers is
                # routed outside the attempt's time bound (it is not part of the attempt).
                old, (self.transport, self.sans_io, pending) = self.transport, attempt
                with trio.CancelScope(shield=True):
                    await old.aclose()
                for event in pending:
                    await self._route(event)
                self.recoveries += 1
                self._connected.set()
                return True
            if not any(s.ticket is not None for s in self.sessions.values()) and (
                    resumable):
                return False  # rule 4: the server said no to every one of them
            if self._attempt_reached and not retry_later:
                backoff = MIN_BACKOFF  # rule 1: the path works, it was cut: at once
            await trio.sleep(min(backoff, max(0.0, deadline - trio.current_time())))
            backoff = min(backoff * 2, MAX_BACKOFF)
        self._recovery_ended = (f"gave up after {window:g} s" if limited
                                else f"their window of {window:g} s passed") + (
            f" (last: {self._recovery_ended})" if self._recovery_ended else "")
        return False

    async def _resume_on(self, transport: PacketTransport, lost_kind: str
                         ) -> tuple[PacketTransport, ClientConnection, list[ClientEvent]]:
        """The exchange of one attempt on ``transport`` (closed if it fails), and what
        arrived with the answers."""
        sans_io = ClientConnection()
        pending: list[ClientEvent] = []
        try:
            sessions = [s for s in self.sessions.values() if s.ticket is not None]
            # Rule 2: the hello and every resume in one write; the answers come in order.
            await transport.send([sans_io.hello(), *(sans_io.resume_session(
                session.session_id, session.ticket.token, auth=session._auth)
                for session in sessions if session.ticket is not None)])
            await _until(transport, sans_io, pending, HelloAcked)
            self._attempt_reached = True
            sent = False
            for session in sessions:
                assert session.ticket is not None
                answer = await _until(transport, sans_io, pending, SessionOpenAnswered)
                assert isinstance(answer, SessionOpenAnswered)
                if answer.opened:
                    session.ticket = ResumeTicket.of(answer)
                    session.resumes += 1
                    packets = session.resubmissions(sans_io)
                    if packets:
                        await transport.send(packets)
                        sent = True
                elif answer.ack.status == SessionOpenStatus.RETRY_LATER:
                    # Rule 3: its old connection still looks alive to the server.
                    await self._take_over(transport, sans_io, pending, session, lost_kind)
                    sent = True
                else:  # rule 4: the server's word
                    self._drop_session(session, ClientError(
                        "the session could not be resumed: "
                        + answer.diagnostic.decode(errors="replace")))
            if not sent and any(s.ticket is not None for s in self.sessions.values()):
                # Rule 5: a packet after the answers shows the server the new tokens came.
                await transport.send([sans_io.ping()])
        except BaseException:
            with trio.CancelScope(shield=True):
                await transport.aclose()
            raise
        return transport, sans_io, pending

    async def _take_over(self, transport: PacketTransport, sans_io: ClientConnection,
                         pending: list[ClientEvent], session: ClientSession,
                         lost_kind: str) -> None:
        """Rule 3: SESSION_MIGRATE on this connection. Its operations continue here: what
        the server holds of them comes again (repeats dropped), and those that never
        produced a result are submitted again (the server may never have had them; one
        it had answers that its frame is used, and goes on)."""
        assert session.ticket is not None
        _adopt(sans_io, session)
        await transport.send([sans_io.migrate_session(
            session.session_id, session.ticket.token,
            old_transport_id=TRANSPORT_IDS[lost_kind],
            new_transport_id=TRANSPORT_IDS[transport.kind])])
        answer = await _until(transport, sans_io, pending, OtherReceived,
                              lambda event: isinstance(event, OtherReceived) and isinstance(
                                  event.packet.message, SessionMigrateAck))
        assert isinstance(answer, OtherReceived)
        ack = answer.packet.message
        assert isinstance(ack, SessionMigrateAck)
        if ack.accept_code != 0:
            sans_io.forget_session(session.session_id)
            raise ClientError(f"the session is still held elsewhere (migration refused, "
                              f"code {ack.accept_code})", retry_later=True)
        if answer.packet.body:
            session.ticket = attrs.evolve(session.ticket, token=bytes(answer.packet.body))
        session.migrations += 1
        unseen = [operation for operation in session.operations.values()
                  if operation.sequence == 0 and operation.payload is not None]
        if unseen:
            await transport.send([sans_io.submit(
                session.session_id, operation.operation_id, operation.frame_id,
                operation.payload, after_sequence=0)
                for operation in unseen if operation.payload is not None])
        for operation in unseen:
            operation._submitted_on = sans_io

    def _drop_session(self, session: ClientSession, error: ClientError) -> None:
        _end_session(session, error)
        session.operations.clear()
        session.ticket = None
        self.sessions.pop(session.session_id, None)

    async def _route(self, event: ClientEvent) -> None:
        self.received += 1
        if isinstance(event, HelloAcked):
            self._hello.set()
        elif isinstance(event, SessionOpenAnswered):
            await self._session_answers[0].send(event)
        elif isinstance(event, RepeatReceived):
            self.repeats += 1  # held already: sent again after a resume or a migration
        elif isinstance(event, PartialReceived | ResultReceived | DropReceived):
            session = self.sessions.get(event.session_id)
            if session is None:
                return  # migrated away: its results are sent again where it went
            operation = session.operations[event.frame_id]
            if isinstance(event, PartialReceived):
                operation.sequence = event.sequence
            if not isinstance(event, PartialReceived):
                operation.terminal_at = self.received
            await operation._send.send(event)
            if not isinstance(event, PartialReceived):
                del session.operations[event.frame_id]
                session.ended_frames.append(event.frame_id)
        elif isinstance(event, SessionCloseAcked):
            if event.session_id in self.sessions:
                self.sessions.pop(event.session_id).closed.set()
        elif isinstance(event, ErrorReceived):
            self.errors.append(event)
            if event.error.is_fatal:
                raise _fatal(event)
        else:
            self.others.append(event)
            packet = event.packet if isinstance(event, OtherReceived) else None
            if packet is not None and isinstance(packet.message, SessionMigrateAck):
                await self._migrate_answers[0].send((packet.message, bytes(packet.body)))
            if packet is not None and isinstance(packet.message, Pong) and self._pongs:
                pong = self._pongs.popleft()
                self._pong_at[pong] = self.received
                pong.set()
            if packet is not None and isinstance(packet.message, RetryAfter):
                owner = self.sessions.get(packet.session_id)
                waiting = owner.operations.get(packet.frame_id) if owner else None
                if waiting is not None:
                    waiting.retry_after_ms = packet.message.retry_after_ms


async def _handshake(nursery: trio.Nursery, reconnect: Reconnect, *, resume: bool,
                     recovery_limit: float | None, handshake_timeout: float) -> NnrpClient:
    """The first connection and its hello. A client that reconnects by itself tries again
    when a connection it got is lost before the hello's answer (a flapping path), for
    ``recovery_limit`` (or ``DEFAULT_REOPEN``) seconds; a connection refused at once is
    an error at once (nothing listens there), and so is an answer that is not NNRP
    (``nnrp.HttpAnswerError``: an HTTP server)."""
    deadline = trio.current_time() + (recovery_limit or DEFAULT_REOPEN)
    backoff = MIN_BACKOFF
    reached = False
    while True:
        try:
            transport = await reconnect()
        except (OSError, trio.TooSlowError):
            if not reached or trio.current_time() + backoff >= deadline:
                raise
            await trio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
            continue
        reached = True
        client = NnrpClient(transport, reconnect=reconnect if resume else None,
                            recovery_limit=recovery_limit)
        nursery.start_soon(client._reader)
        with contextlib.suppress(ClientError, trio.BrokenResourceError, OSError), \
                trio.move_on_after(handshake_timeout):
            await client.send(client.sans_io.hello())
            await client._hello.wait()
        if client._hello.is_set() and client.failure is None:
            return client
        with trio.CancelScope(shield=True):
            await transport.aclose()
        why = client.failure or "no answer in time"
        if (not resume or trio.current_time() + backoff >= deadline
                or isinstance(client.failure, ProtocolError)):
            # A server that answered, and not in NNRP (an HTTP server: vLLM's own port),
            # answers the same next time: that is no flapping path to wait out.
            raise ClientError(f"handshake failed: {why}") from client.failure
        await trio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF)


def _check_opened(answer: SessionOpenAnswered) -> None:
    if not answer.opened:
        raise ClientError(f"session refused (code {answer.ack.session_error_code:#x}): "
                          f"{answer.diagnostic.decode(errors='replace')}",
                          retry_later=answer.ack.status == SessionOpenStatus.RETRY_LATER)


async def _until(transport: PacketTransport, sans_io: ClientConnection,
                 pending: list[ClientEvent], kind: type[ClientEvent],
                 wanted: Callable[[ClientEvent], bool] | None = None) -> ClientEvent:
    """Read ``transport`` until an event of ``kind`` (that ``wanted`` takes, if given);
    what came with it waits in ``pending`` (results of resubmitted operations may share
    its read)."""
    while True:
        for index, event in enumerate(pending):
            if isinstance(event, kind) and (wanted is None or wanted(event)):
                return pending.pop(index)
        for event in pending:
            if isinstance(event, ErrorReceived) and event.error.is_fatal:
                raise _fatal(event)
        pending += await _receive(transport, sans_io)


async def _receive(transport: PacketTransport, sans_io: ClientConnection
                   ) -> list[ClientEvent]:
    """The events of the next read (ClientError when the server has closed)."""
    data = await transport.receive()
    if data is None:
        raise ConnectionLost()
    return (sans_io.receive_message(data, given_away=True) if transport.message_based
            else sans_io.receive_data(data))


def _adopt(sans_io: ClientConnection, session: ClientSession) -> None:
    """``session``'s operations in flight, and its recently ended frames, known to the
    connection ``sans_io`` speaks for (a migration: what comes again is a repeat)."""
    sans_io.adopt_session(session.session_id, {
        op.operation_id: (op.frame_id, op.sequence) for op in session.operations.values()},
        ended_frames=frozenset(session.ended_frames))


def _end_session(session: ClientSession, error: ClientError) -> None:
    """Every operation of ``session`` gets ``error``; the session is closed."""
    for operation in session.operations.values():
        with contextlib.suppress(trio.WouldBlock):
            operation._send.send_nowait(error)
    session.closed.set()


def _fatal(event: ErrorReceived) -> ClientError:
    """A fatal ERROR as the caller's error; SERVER_BUSY (a connection limit, a gateway
    shutting down) says to try again, elsewhere or later."""
    return ClientError(f"fatal ERROR {ErrorCode(event.error.code).name}: "
                       f"{event.diagnostic.decode(errors='replace')}",
                       retry_later=event.error.code == ErrorCode.SERVER_BUSY)


@asynccontextmanager
async def connect(uri: str, *, handshake_timeout: float = 10.0,
                  ssl_context: ssl.SSLContext | None = None,
                  quic: QuicClientOptions | None = None,
                  resume: bool = False,
                  recovery_limit: float | None = None) -> AsyncIterator[NnrpClient]:
    """Connect to ``tcp://``, ``unix://``, ``ws://`` (or ``tcps://``, ``wss://``,
    ``quic://``, trusting ``ssl_context``; ``quic`` for QUIC's own options) and complete
    the hello. ``resume``: when the connection drops, reconnect and resume the sessions
    opened with ``open_session(resume=True)`` (the module's docstring), trying for the
    sessions' resume window or ``recovery_limit`` seconds, whichever is shorter.

    Error handling: a refused or broken handshake raises ``ClientError``; an exception
    from the body propagates as itself (the internal nursery's group is unwrapped).
    """
    try:
        async with trio.open_nursery() as nursery:

            async def reconnect() -> PacketTransport:
                with trio.fail_after(handshake_timeout):
                    return await connect_transport(uri, nursery, ssl_context, quic=quic)

            client = await _handshake(nursery, reconnect, resume=resume,
                                      recovery_limit=recovery_limit,
                                      handshake_timeout=handshake_timeout)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await client.transport.aclose()
    except BaseExceptionGroup as group:
        # The reader never raises; a lone error here is the caller's or the handshake's.
        if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
            lone = group.exceptions[0]
            raise lone from lone.__cause__  # the why (a refused port, a certificate)
        raise
