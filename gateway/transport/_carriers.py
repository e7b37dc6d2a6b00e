"""Packet transports: how NNRP packets ride each carrier, for the server and the client.

* Stream transports (TCP, unix sockets) carry packets back to back: reads return any
  number of bytes, and a burst of packets leaves in one ``send_all``.
* WebSocket carries one packet per binary message; a text message is a protocol
  error (docs/reference/nnrp-wire.md section 1): ``_websocket.WebSocketTransport``.
* QUIC carries packets back to back on the client's first bidirectional stream, a byte
  stream as TCP is: ``_quic_listener.QuicTransport`` (server) and
  ``_quic_client.QuicClientTransport`` (client) are stream transports too.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import socket
from collections.abc import Callable
from typing import Protocol

import trio

from gateway import _sockio
from gateway.nnrp import PeerCredentials, TransportId

#: Bytes asked for per read: large enough that a burst of submits is one syscall.
READ_SIZE = 64 * 1024
#: The most a stream transport reads at once while a big packet arrives (``receive``):
#: a millisecond or so of copying on this VM, so no read holds the loop for longer.
BIG_READ = 1 << 20
#: The SESSION_MIGRATE transport id of each carrier kind (docs/reference/nnrp-wire.md section 1).
TRANSPORT_IDS = {"quic": TransportId.QUIC, "tcp": TransportId.TCP, "ipc": TransportId.IPC,
                 "websocket": TransportId.WEBSOCKET}


class TextMessageError(Exception):
    """A WebSocket text message arrived; NNRP allows binary messages only."""


class PacketTransport(Protocol):
    """What a connection needs from its carrier."""

    kind: str  # "tcp", "ipc", "websocket" or "quic": a bounded metrics label
    message_based: bool  # True: each receive() is exactly one packet
    peer: str
    #: Writes bytes without waiting and says how many the kernel took (a plain socket),
    #: or None: then every write goes through ``send`` (gateway/server/_outbox.py).
    send_now: Callable[[bytes], int] | None

    async def receive(self, awaited: int = 0) -> bytes | bytearray | None:
        """Next bytes (or message); None at end of stream. ``awaited``: the bytes a big
        packet being read still needs (``nnrp.Decoder.awaited``): a stream transport
        reads up to that much at once (at most ``BIG_READ``), not a read's usual size. A
        message may come as the carrier's own buffer (a bytearray), the caller's from then
        on: a copy of a 63 MiB message was one 46 ms step of the loop."""
        ...

    async def send(self, packets: list[bytes]) -> None:
        """Write encoded packets in order."""
        ...

    async def aclose(self) -> None: ...

    def credentials(self) -> PeerCredentials:
        """What the carrier says about the client (a resume token is bound to it:
        gateway/nnrp/_resumption.py R3); complete once the client's first bytes came."""
        ...


def peer_address(peer: str) -> str:
    """The host of a ``host:port`` peer (an IPv6 host keeps its colons); a unix peer as
    it is."""
    host, colon, port = peer.rpartition(":")
    return host.strip("[]") if colon and port.isdigit() else peer


def stream_credentials(stream: trio.abc.Stream | None, peer: str) -> PeerCredentials:
    """A stream's: encrypted when it is TLS, with the SHA-256 of the client's certificate
    when it presented one (mutual TLS)."""
    secure = isinstance(stream, trio.SSLStream)
    certificate = b""
    if isinstance(stream, trio.SSLStream):
        try:
            der = stream.getpeercert(binary_form=True)
        except (ValueError, trio.BrokenResourceError):  # the handshake is not done
            der = None
        if der:
            certificate = hashlib.sha256(der).digest()
    return PeerCredentials(peer_address(peer), secure, certificate)


async def read_until_closed(transport: PacketTransport) -> None:
    """Discard what the peer still sends until it closes, or its carrier breaks or sends
    what NNRP cannot carry (a WebSocket text message): the caller's time bound decides
    how long. Used where the server has said its last word (a fatal ERROR, a refusal)
    and leaves the connection for the client to close first: NNRP has no GOAWAY."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError,
                             TextMessageError):
        while await transport.receive() is not None:
            pass


class StreamTransport:
    """TCP or unix-socket stream."""

    message_based = False

    def __init__(self, stream: trio.abc.Stream, kind: str, peer: str) -> None:
        self.stream = stream
        self.kind = kind
        self.peer = peer
        #: The plain socket (None through TLS): reads and direct writes use it.
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._drained = False
        self.send_now: Callable[[bytes], int] | None = (
            None if self._socket is None else functools.partial(_sockio.send_now,
                                                                 self._socket))

    async def receive(self, awaited: int = 0) -> bytes | None:
        # A big packet is read in big reads: a 63 MiB submit in 64 KiB ones cost a
        # thousand passes through the loop (docs/benchmarks.md, "Media").
        size = min(max(awaited, READ_SIZE), BIG_READ)
        try:
            if self._socket is None:  # TLS
                data = bytes(await self.stream.receive_some(size))
            else:
                # A CANCEL is read the moment it lands, with the fewest layers between
                # (gateway/_sockio.py); after a short read the socket is most likely empty.
                data = await _sockio.receive_some(self._socket, size,
                                                  likely_empty=self._drained)
                self._drained = len(data) < size
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return None
        return data or None

    async def send(self, packets: list[bytes]) -> None:
        await self.stream.send_all(packets[0] if len(packets) == 1 else b"".join(packets))

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)

    def credentials(self) -> PeerCredentials:
        return stream_credentials(self.stream, self.peer)


#: Unacknowledged data older than this ends a TCP connection (``tune_tcp``).
PEER_GONE_MS = 60_000


def tune_tcp(stream: trio.abc.Stream) -> None:
    """Small packets (one token event each) must not wait for Nagle (docs/reference/nnrp-py.md
    section 5),
    and a peer that vanishes without a FIN is found within about a minute, which ends its
    operations (or detaches its resumable sessions): by TCP keepalive when the connection
    is idle (30 s, then 3 probes 10 s apart), and by ``TCP_USER_TIMEOUT`` while results
    are in flight (keepalive does not probe then, and retransmissions alone would go on
    for up to 15 minutes, during which a client that came back on a new connection could
    not resume: its session would still be attached). A live peer that keeps its receive
    window shut for that long is ended too (the server's write timeout, 30 s, ends it
    sooner anyway)."""
    if isinstance(stream, trio.SocketStream) and stream.socket.family in (
            socket.AF_INET, socket.AF_INET6):
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, True)
        for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10),
                              ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", PEER_GONE_MS)):
            if hasattr(socket, option):
                stream.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def describe_peer(stream: trio.abc.Stream) -> str:
    if isinstance(stream, trio.SocketStream):
        try:
            name = stream.socket.getpeername()
        except OSError:
            return "unknown"
        if isinstance(name, tuple):
            return f"{name[0]}:{name[1]}"
        return str(name) or "unix"
    return "unknown"


