"""The QUIC listener (``quic://host:port``): one UDP socket driven by trio.

``QuicListener`` owns the socket and one task per QUIC connection (its aioquic timer, its
keepalive and its NNRP ``Connection``); ``QuicTransport`` is that connection's NNRP
stream as a ``PacketTransport``. Everything about datagrams, admission, routing and
aioquic itself is the sans-IO ``_quic_endpoint`` (its docstring has the bad-input
table); this module only moves datagrams between it and the socket and wakes the tasks
waiting on a connection.
"""

from __future__ import annotations

import contextlib
import errno
import math
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import structlog
import trio
from aioquic.quic.packet import (
    QuicErrorCode,
)

from gateway.nnrp import PeerCredentials

from ._carriers import peer_address
from ._listeners import ACCEPT_FAILURES, UDP_RECEIVE_BUFFER
from ._quic_endpoint import (
    QuicEndpoint,
    QuicPeer,
    QuicStats,
    check_aioquic,
    server_configuration,
)
from ._quic_settings import MAX_DATAGRAM, NNRP_STREAM_ID

if TYPE_CHECKING:
    from aioquic.quic.connection import NetworkAddress

    from ._quic_settings import QuicSettings

log = structlog.get_logger("gateway.transport")

#: Datagrams read per wake-up of the listener's task before the connections they touched
#: are serviced (``QuicListener._drain``): a batch's worth of a big submit costs one pass
#: through each connection's events and transmissions. Bounded in datagrams and in time,
#: so that the task yields to the rest of the process between batches: a datagram of a
#: stream costs about 0.1 ms, a client's Initial (the TLS handshake's first flight) about
#: 1 ms, so a flood of Initials ends its batch after a few, not after 64.
RECEIVE_BATCH = 64
RECEIVE_BATCH_SECONDS = 0.005

#: recvfrom() failures that are about one datagram, not the socket: an ICMP error the
#: kernel reports for an earlier send, and the passing shortages of ``ACCEPT_FAILURES``.
#: Any other failure (EBADF, ENOTSOCK: the socket is gone) is terminal: ``run`` raises it
#: and the server closes its whole listener set (gateway.server, "The listener set").
PASSING_RECEIVE_FAILURES = frozenset({
    errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH,
    errno.EHOSTDOWN, errno.ENETDOWN, errno.EMSGSIZE, *ACCEPT_FAILURES})


class _Session:
    """The trio side of one QUIC connection: who to wake when something happened."""

    def __init__(self, peer: QuicPeer) -> None:
        self.peer = peer
        self._changed = trio.Event()

    def notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    @property
    def changed(self) -> trio.Event:
        return self._changed


class QuicTransport:
    """The NNRP stream of one QUIC connection, as a ``PacketTransport``."""

    kind = "quic"
    message_based = False
    #: Every write goes through the QUIC connection's state: no direct writes.
    send_now: Callable[[bytes], int] | None = None

    def __init__(self, listener: QuicListener, session: _Session) -> None:
        self._listener = listener
        self._session = session
        self.peer = session.peer.address

    @property
    def alpn(self) -> str | None:
        return self._session.peer.alpn

    def credentials(self) -> PeerCredentials:
        """Encrypted always; QUIC takes no client certificate here (no mutual TLS)."""
        return PeerCredentials(peer_address(self.peer), secure=True)

    async def receive(self, awaited: int = 0) -> bytes | None:
        session, peer = self._session, self._session.peer
        while not peer.inbound:
            if peer.receive_ended:
                return None
            await session.wait_changed()
        data = peer.take_inbound()
        self._listener.service(session)  # grants the freed credit
        return data

    async def send(self, packets: list[bytes]) -> None:
        """Hand packets to aioquic once the unacknowledged backlog has room.

        aioquic buffers whatever it is given and transmits as flow control and the
        congestion window allow; waiting here while more than ``send_buffer`` bytes are
        unacknowledged keeps that buffer bounded. A client that stops reading stalls this
        send (and so its Connection's operations, up to the write timeout), nothing else.
        """
        data = packets[0] if len(packets) == 1 else b"".join(packets)
        session, peer = self._session, self._session.peer
        limit = self._listener.settings.send_buffer
        while True:
            if peer.send_ended or not peer.quic.has_stream(NNRP_STREAM_ID):
                raise trio.BrokenResourceError("QUIC stream closed")
            backlog = peer.quic.unacked_bytes(NNRP_STREAM_ID)
            if backlog == 0 or backlog + len(data) <= limit:
                break
            await session.wait_changed()
        peer.quic.send_stream_data(NNRP_STREAM_ID, data)
        self._listener.service(session)

    async def aclose(self) -> None:
        """FIN the stream, give the peer ``close_linger`` to acknowledge what was sent
        (an ERROR reply must arrive before the close), then close the QUIC connection."""
        session, peer = self._session, self._session.peer
        if peer.terminated:
            return
        with trio.move_on_after(self._listener.settings.close_linger):
            if not peer.send_ended and peer.quic.has_stream(NNRP_STREAM_ID):
                peer.send_ended = True
                peer.quic.send_stream_data(NNRP_STREAM_ID, b"", end_stream=True)
                self._listener.service(session)
            while peer.quic.unacked_bytes(NNRP_STREAM_ID) and not peer.terminated:
                await session.wait_changed()
        self._listener.close(session)


ConnectionHandler = Callable[[QuicTransport], Awaitable[None]]


class QuicListener:
    """One UDP socket serving QUIC connections, each handed to ``handler`` as a transport.

    ``run`` serves until cancelled, or until ``stop_accepting`` was called and the last
    connection has ended: draining a server leaves established QUIC connections their
    socket, as it leaves TCP connections theirs.
    """

    def __init__(self, settings: QuicSettings, sock: socket.socket) -> None:
        self.settings = settings
        self.endpoint = QuicEndpoint(settings, server_configuration(settings))
        self._sock = sock
        self._trio_sock = trio.socket.from_stdlib_socket(sock)
        self._sessions: dict[QuicPeer, _Session] = {}
        self._recv_scope = trio.CancelScope()
        name = sock.getsockname()
        self.host: str = name[0]
        self.port: int = name[1]

    @property
    def stats(self) -> QuicStats:
        return self.endpoint.stats

    @property
    def connections_open(self) -> int:
        """QUIC connections this listener routes to (handshaking or established)."""
        return len(self.endpoint.routes)

    @property
    def handshakes_in_progress(self) -> int:
        return self.endpoint.handshakes_in_progress

    @classmethod
    async def bind(cls, settings: QuicSettings, host: str, port: int) -> QuicListener:
        check_aioquic()
        infos = await trio.socket.getaddrinfo(host or None, port, type=socket.SOCK_DGRAM,
                                              flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            with contextlib.suppress(OSError):  # room for bursts; the kernel may cap it
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_RECEIVE_BUFFER)
            sock.bind(address)
            return cls(settings, sock)
        except BaseException:
            sock.close()
            raise

    def reload_tls(self) -> None:
        """Re-read the certificate files: new handshakes use them, established
        connections keep theirs. Raises (and keeps the old files) on a bad file."""
        self.endpoint.configuration = server_configuration(self.settings)

    def stop_accepting(self) -> None:
        self.endpoint.accepting = False
        if not self._sessions:
            self._recv_scope.cancel()

    async def run(self, handler: ConnectionHandler) -> None:
        try:
            async with trio.open_nursery() as nursery:
                with self._recv_scope:
                    if not self.endpoint.accepting and not self._sessions:
                        return
                    while True:
                        await trio.lowlevel.wait_readable(self._sock)
                        touched: dict[QuicPeer, _Session] = {}
                        self._drain(nursery, handler, touched)
                        for session in touched.values():
                            self.service(session)
        finally:
            self._trio_sock.close()

    def _drain(self, nursery: trio.Nursery, handler: ConnectionHandler,
               touched: dict[QuicPeer, _Session]) -> None:
        """The datagrams waiting, up to ``RECEIVE_BATCH`` (or as many as
        ``RECEIVE_BATCH_SECONDS`` takes), read without waiting: each connection they
        touched is then serviced once (its events, its ACKs and whatever else it sends,
        its waiters woken), not once per datagram. A big submit arrives as thousands of
        datagrams; servicing each alone was most of its cost."""
        until = time.perf_counter() + RECEIVE_BATCH_SECONDS
        for _ in range(RECEIVE_BATCH):
            if time.perf_counter() > until:
                return
            try:
                data, addr = self._receive()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno not in PASSING_RECEIVE_FAILURES:
                    raise  # the socket failed for good
                continue
            self._datagram(data, addr, nursery, handler, touched)

    def _receive(self) -> tuple[bytes, NetworkAddress]:
        """One datagram waiting on the socket (BlockingIOError: none)."""
        return self._sock.recvfrom(MAX_DATAGRAM)

    def _datagram(self, data: bytes, addr: NetworkAddress, nursery: trio.Nursery,
                  handler: ConnectionHandler, touched: dict[QuicPeer, _Session]) -> None:
        received = self.endpoint.receive_datagram(data, addr, trio.current_time())
        for reply in received.replies:
            self._sendto(reply, addr)
        peer = received.peer
        if peer is None:
            return
        session = self._sessions.get(peer)
        if session is None:
            session = self._sessions[peer] = _Session(peer)
            nursery.start_soon(self._run_session, session, handler)
        touched[peer] = session

    def service(self, session: _Session) -> None:
        """After anything changed a connection: apply its events, transmit, wake waiters."""
        self.endpoint.process(session.peer)
        for data, addr in self.endpoint.datagrams_to_send(session.peer, trio.current_time()):
            self._sendto(data, addr)
        session.notify()

    def close(self, session: _Session, error_code: int = QuicErrorCode.NO_ERROR,
              reason: str = "") -> None:
        session.peer.send_ended = True
        session.peer.quic.close(error_code=error_code, reason_phrase=reason)
        self.service(session)

    def _sendto(self, data: bytes, addr: NetworkAddress) -> None:
        # Synchronous and non-blocking: a full socket buffer drops the datagram, which QUIC
        # loss recovery resends; no task ever waits on the socket to send.
        try:
            self._sock.sendto(data, addr)
        except OSError:
            self.endpoint.stats.send_errors += 1

    async def _run_session(self, session: _Session, handler: ConnectionHandler) -> None:
        peer = session.peer
        settings = self.settings
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._timer, session)
                with trio.move_on_after(settings.handshake_timeout):
                    while not peer.handshake_complete and not peer.terminated:
                        await session.wait_changed()
                if not peer.handshake_complete:
                    if not peer.terminated:  # no closing period for a half-open one
                        self.endpoint.stats.handshake_timeouts += 1
                        self.close(session, QuicErrorCode.CONNECTION_REFUSED,
                                   "handshake timeout")
                        self.endpoint.forget(peer)
                        session.notify()
                elif not peer.terminated:
                    keepalive = trio.CancelScope()
                    nursery.start_soon(self._keepalive, session, keepalive)
                    try:
                        await handler(QuicTransport(self, session))
                    except Exception:
                        log.exception("QUIC connection handler failed", peer=peer.address)
                    keepalive.cancel()
                    self.close(session)
                # The timer task ends once aioquic's closing period is over (3 PTO).
        finally:
            if not peer.terminated:  # cancelled: tell the peer, best effort, no waiting
                peer.quic.close(error_code=QuicErrorCode.NO_ERROR, reason_phrase="shutdown")
                for data, addr in self.endpoint.datagrams_to_send(peer, trio.current_time()):
                    self._sendto(data, addr)
                self.endpoint.forget(peer)
            del self._sessions[peer]
            if not self.endpoint.accepting and not self._sessions:
                self._recv_scope.cancel()

    async def _timer(self, session: _Session) -> None:
        """aioquic's one timer per connection (loss detection, ACK delay, pacing, idle,
        closing period): sleep until it is due or something changed, then recompute."""
        peer = session.peer
        while not peer.terminated:
            at = peer.quic.get_timer()
            changed = session.changed
            with trio.move_on_at(math.inf if at is None else at):
                await changed.wait()
                continue
            assert at is not None
            peer.quic.handle_timer(max(at, trio.current_time()))
            self.service(session)

    async def _keepalive(self, session: _Session, scope: trio.CancelScope) -> None:
        """PING every third of the idle timeout while the NNRP connection is open: a live
        client keeps answering (a quiet operation waiting on vLLM never looks idle), a
        vanished one does not, and aioquic ends the connection after idle_timeout."""
        interval = self.settings.idle_timeout / 3
        uid = 0
        with scope:
            while not session.peer.terminated:
                await trio.sleep(interval)
                uid += 1
                session.peer.quic.send_ping(uid)
                self.service(session)
