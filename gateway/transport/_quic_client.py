"""The client side of ``quic://`` for the project's own tools: aioquic's sans-IO
``QuicConnection`` on one connected trio UDP socket, as a ``PacketTransport``.

NNRP over QUIC as nnrp-py's native client speaks it, and as the gateway's listener
(``_quic_endpoint.py``, ``_quic_listener.py``) serves it: TLS 1.3, the client opens the
first bidirectional stream (id 0) and writes packets back to back on it; no
unidirectional streams, no DATAGRAM frames. ALPN: none by default (the listener's
default policy, and the native client's behaviour); ``("nnrp/1",)`` for a listener that
requires it.

``gateway.transport.connect`` imports this module for quic:// URIs only, so the other
transports (and the server) never load aioquic for a client.

Shape: one task (``_drive``, in the caller's nursery) owns the socket's receive side and
aioquic's one timer; ``receive``, ``send`` and ``aclose`` run in the caller's tasks.
Whatever changes the connection ends in ``_transmit``: apply aioquic's events, send its
datagrams (non-blocking; a full socket buffer is loss that QUIC recovers), re-arm the
driver's timer, wake the waiters.

Trust (aioquic verifies with its own store, not through ``ssl``): ``QuicClientOptions.
ca_file`` if given; else the ``ssl.SSLContext`` given to ``connect`` (as for tcps:// and
wss://), read for its CA certificates (``get_ca_certs``, which lists CA certificates only)
and its verify mode; a context that lists none (the system store, loaded lazily from a
directory) means the system's default verify paths.
The server name checked is ``QuicClientOptions.server_name`` or the URI's host (an IP
address is checked against the certificate's IP entries). A client certificate in the
context is not used: the gateway's quic:// listener does no mutual TLS.

Resource handling: ``aclose`` is abrupt, as TCP's ``aclose_forcefully``: it sends
CONNECTION_CLOSE at once and closes the socket. Close the NNRP session first
(SESSION_CLOSE_ACK proves the peer has read everything before it).

Error handling: a handshake that does not complete (nothing listening, a certificate or
ALPN the server refuses) raises ``QuicConnectError``, an ``OSError`` as a refused TCP
connect is. A connection lost later makes ``receive()`` return None and ``send()`` raise
``trio.BrokenResourceError``.
"""

from __future__ import annotations

import contextlib
import math
import socket
import ssl
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import NetworkAddress, QuicConnection
from aioquic.quic.events import (
    ConnectionTerminated,
    HandshakeCompleted,
    StopSendingReceived,
    StreamDataReceived,
    StreamReset,
)
from aioquic.quic.packet import QuicErrorCode
from aioquic.tls import AlertDescription

from gateway.nnrp import PeerCredentials

from ._carriers import peer_address
from ._quic_settings import MAX_DATAGRAM, NNRP_STREAM_ID

if TYPE_CHECKING:
    from ._endpoints import QuicClientOptions


class QuicConnectError(OSError):
    """The QUIC handshake did not complete; the message says what the server or the
    network answered. ``untrusted``: the server's certificate was refused here (not
    signed by what the client trusts, or not for the name dialled), as
    ``ssl.SSLCertVerificationError`` says on tcps and wss; ``reason``: what the check
    said (``self-signed certificate``)."""

    def __init__(self, message: str, *, untrusted: bool = False, reason: str = "") -> None:
        super().__init__(message)
        self.untrusted = untrusted
        self.reason = reason


#: The connection error aioquic closes with when the certificate check fails: TLS's
#: bad_certificate alert as a QUIC CRYPTO_ERROR (RFC 9001 section 4.8). The gateway's
#: QUIC listener asks for no client certificate, so on this client it is the server's.
CERTIFICATE_REFUSED = QuicErrorCode.CRYPTO_ERROR + AlertDescription.bad_certificate


def client_configuration(options: QuicClientOptions, server_name: str,
                         ssl_context: ssl.SSLContext | None) -> QuicConfiguration:
    """aioquic's client configuration: ALPN, idle timeout, and the trust of
    ``ssl_context`` (see the module docstring)."""
    configuration = QuicConfiguration(
        is_client=True, alpn_protocols=list(options.alpn) or None, server_name=server_name,
        idle_timeout=options.idle_timeout, max_datagram_frame_size=None)
    if ssl_context is None:
        # The system's store, by its paths: building a default context here only to read
        # it back would load the whole store on every connect (~50 ms of CPU each).
        configuration.verify_mode = ssl.CERT_REQUIRED
        anchors: list[bytes] = []
    else:
        configuration.verify_mode = ssl_context.verify_mode
        anchors = ssl_context.get_ca_certs(binary_form=True)
    if options.ca_file is not None:
        configuration.load_verify_locations(cafile=str(options.ca_file))
    elif anchors:
        configuration.cadata = "".join(ssl.DER_cert_to_PEM_cert(der)
                                       for der in anchors).encode()
    else:
        paths = ssl.get_default_verify_paths()
        configuration.cafile, configuration.capath = paths.cafile, paths.capath
    return configuration


def _unacked_bytes(quic: QuicConnection, stream_id: int) -> int:
    """Bytes written to ``stream_id`` and not yet acknowledged (aioquic 1.7.2 internals,
    the same ones the listener reads in ``NnrpQuicConnection.unacked_bytes``)."""
    stream = quic._streams.get(stream_id)
    if stream is None:
        return 0
    return stream.sender._buffer_stop - stream.sender._buffer_start


class QuicClientTransport:
    """The NNRP stream of one client QUIC connection, as a ``PacketTransport``.

    ``send`` waits while more than ``send_buffer`` bytes are unacknowledged (aioquic
    would buffer without bound), as a TCP send waits on a full socket buffer.
    """

    kind = "quic"
    message_based = False
    #: Every write goes through the QUIC connection's state: no direct writes.
    send_now: Callable[[bytes], int] | None = None

    def __init__(self, quic: QuicConnection, sock: socket.socket, address: NetworkAddress,
                 *, peer: str, send_buffer: int) -> None:
        self.quic = quic
        self.peer = peer
        self.address = address
        self.handshake: HandshakeCompleted | None = None
        #: Why the connection ended (aioquic's reason, or the socket's error); None: open.
        self.ended: str | None = None
        #: The QUIC error code it ended with, when aioquic gave one.
        self.ended_code: int | None = None
        self._sock = sock
        self._trio_sock = trio.socket.from_stdlib_socket(sock)
        self._send_buffer = send_buffer
        self._inbound: deque[bytes] = deque()
        self._receive_ended = False
        self._send_ended = False
        self._changed = trio.Event()
        self._driver = trio.CancelScope()
        self._wait = trio.CancelScope()  # the driver's current wait (its deadline: the timer)

    def credentials(self) -> PeerCredentials:
        """The server, as this client's carrier knows it: encrypted."""
        return PeerCredentials(peer_address(self.peer), secure=True)

    @property
    def alpn(self) -> str | None:
        """The ALPN the server selected (None: none offered or none selected)."""
        return self.handshake.alpn_protocol if self.handshake is not None else None

    async def receive(self, awaited: int = 0) -> bytes | None:
        while not self._inbound:
            if self._receive_ended or self.ended is not None:
                return None
            await self._changed.wait()
        data = self._inbound[0] if len(self._inbound) == 1 else b"".join(self._inbound)
        self._inbound.clear()
        return data

    async def send(self, packets: list[bytes]) -> None:
        data = packets[0] if len(packets) == 1 else b"".join(packets)
        while True:
            if self._send_ended or self.ended is not None:
                raise trio.BrokenResourceError(f"QUIC connection closed: {self.ended}")
            backlog = _unacked_bytes(self.quic, NNRP_STREAM_ID)
            if backlog == 0 or backlog + len(data) <= self._send_buffer:
                break
            await self._changed.wait()
        self.quic.send_stream_data(NNRP_STREAM_ID, data)
        self._transmit()
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        if self.ended is None:
            self.quic.close()
            self._transmit()  # CONNECTION_CLOSE leaves now
            self._end("closed by this client")
        self._driver.cancel()
        self._trio_sock.close()
        await trio.lowlevel.checkpoint()

    # ------------------------------------------------------------------ the driver

    async def wait_for_handshake(self) -> None:
        """Until the TLS handshake completed; raises ``QuicConnectError`` if the
        connection ended first (bound it with a cancel scope)."""
        while self.handshake is None:
            if self.ended is not None:
                raise QuicConnectError(f"QUIC handshake with {self.peer} failed: "
                                       f"{self.ended}",
                                       untrusted=self.ended_code == CERTIFICATE_REFUSED,
                                       reason=self.ended)
            await self._changed.wait()

    async def drive(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Receive datagrams and run aioquic's timer until the connection ends."""
        with self._driver:
            self.quic.connect(self.address, now=trio.current_time())
            self._transmit()
            task_status.started()
            while self.ended is None:
                timer = self.quic.get_timer()
                self._wait = trio.CancelScope(deadline=math.inf if timer is None else timer)
                with self._wait:
                    try:
                        data, address = await self._trio_sock.recvfrom(MAX_DATAGRAM)
                    except ConnectionRefusedError:  # ICMP port unreachable (socket connected)
                        self._end(f"nothing listens on UDP {self.peer}")
                        return
                    except (OSError, trio.ClosedResourceError) as exc:
                        self._end(f"socket error: {exc}")
                        return
                    self.quic.receive_datagram(data, address, now=trio.current_time())
                    self._transmit()
                    continue
                if self._wait.cancelled_caught:  # the timer is due
                    self.quic.handle_timer(now=max(self._wait.deadline, trio.current_time()))
                    self._transmit()

    def _transmit(self) -> None:
        """After anything changed the connection: events, datagrams, timer, waiters."""
        while (event := self.quic.next_event()) is not None:
            if isinstance(event, StreamDataReceived) and event.stream_id == NNRP_STREAM_ID:
                if event.data:
                    self._inbound.append(event.data)
                self._receive_ended = self._receive_ended or event.end_stream
            elif isinstance(event, StreamReset | StopSendingReceived) and \
                    event.stream_id == NNRP_STREAM_ID:
                self._receive_ended = self._send_ended = True
            elif isinstance(event, HandshakeCompleted):
                self.handshake = event
            elif isinstance(event, ConnectionTerminated):
                if self.ended is None:
                    self.ended_code = event.error_code
                self._end(event.reason_phrase or f"QUIC error {event.error_code:#x}")
        for data, _ in self.quic.datagrams_to_send(now=trio.current_time()):
            # A full buffer or an ICMP error: loss, which QUIC recovers.
            with contextlib.suppress(OSError):
                self._sock.send(data)
        timer = self.quic.get_timer()
        self._wait.deadline = math.inf if timer is None else timer
        self._notify()

    def _end(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


async def open_quic_transport(host: str, port: int, nursery: trio.Nursery, *,
                              options: QuicClientOptions, ssl_context: ssl.SSLContext | None,
                              peer: str) -> QuicClientTransport:
    """Connect, complete the TLS handshake, and return the transport (its driver runs in
    ``nursery``). Raises ``QuicConnectError`` (an OSError) when the handshake fails."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        # Connected: an ICMP "port unreachable" comes back as ConnectionRefusedError.
        sock.connect(address)
        configuration = client_configuration(options, options.server_name or host,
                                             ssl_context)
        transport = QuicClientTransport(QuicConnection(configuration=configuration), sock,
                                        address, peer=peer, send_buffer=options.send_buffer)
    except BaseException:
        sock.close()
        raise
    try:
        await nursery.start(transport.drive)
        await transport.wait_for_handshake()
    except BaseException:
        with trio.CancelScope(shield=True):
            await transport.aclose()
        raise
    return transport
