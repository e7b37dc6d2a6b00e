"""Packet transports and endpoint URIs, shared by the server, the client and the tools.

* Stream transports (TCP, unix sockets) carry packets back to back: reads return any
  number of bytes, and a burst of packets leaves in one ``send_all``.
* WebSocket carries one packet per binary message; a text message is a protocol
  error (nnrp-wire.md section 1).
* QUIC carries packets back to back on the client's first bidirectional stream, a byte
  stream as TCP is. The listener is ``gateway/server/_quic.py``; the client side
  (``connect``) is ``gateway/_quic_client.py``, imported for quic:// URIs only.

Endpoints: ``tcp://host:port``, ``unix:///path``, ``ws://host:port/path``, the TLS forms
``tcps://host:port`` and ``wss://host:port/path``, and ``quic://host:port`` (always TLS
1.3). Port 0 asks the OS for a free port (a listener) and is refused by ``connect``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import ssl
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import attrs
import trio
import trio_websocket

from gateway import _sockio
from gateway.errors import ConfigError

#: Bytes asked for per read: large enough that a burst of submits is one syscall.
READ_SIZE = 64 * 1024


class ListenError(ConfigError):
    """An endpoint URI that cannot be used."""


@attrs.frozen
class Endpoint:
    """A parsed endpoint URI."""

    scheme: str  # "tcp", "tcps", "unix", "ws", "wss" or "quic"
    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def transport(self) -> str:
        """The bounded transport label: ``tcp``, ``ipc``, ``websocket`` or ``quic``."""
        return {"tcp": "tcp", "tcps": "tcp", "unix": "ipc", "ws": "websocket",
                "wss": "websocket", "quic": "quic"}[self.scheme]

    @property
    def tls(self) -> bool:
        return self.scheme in ("tcps", "wss")  # quic:// is always TLS (its own stack)


@attrs.frozen
class QuicClientOptions:
    """How ``connect`` opens a ``quic://`` connection (trust comes from its ssl_context).

    Args:
        alpn: the ALPN protocols offered; empty offers none, as nnrp-py's native client
            does and the listener's default policy (``--quic-alpn none``) requires.
            ``("nnrp/1",)`` for a listener that requires it.
        server_name: the name checked against the server's certificate (and sent as
            SNI); default: the URI's host.
        ca_file: PEM trust anchors, before anything ``ssl_context`` holds. aioquic keeps
            its own store and an ``ssl.SSLContext`` only lists its CA certificates
            (``get_ca_certs``), so a self-signed server certificate without the CA flag
            must be given here.
        idle_timeout: the QUIC idle timeout this client asks for (the connection ends
            after the shorter of both sides'; the gateway pings while it is open).
        send_buffer: unacknowledged bytes beyond which ``send()`` waits.
    """

    alpn: tuple[str, ...] = ()
    server_name: str | None = None
    ca_file: Path | None = None
    idle_timeout: float = 30.0
    send_buffer: int = 512 * 1024


def parse_endpoint(uri: str) -> Endpoint:
    """Parse one ``--listen`` value or client endpoint."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "unix":
        path = parts.path if not parts.netloc else f"/{parts.netloc}{parts.path}"
        if not path:
            raise ListenError(f"{uri}: a unix listener needs a path (unix:///run/nnrp.sock)")
        return Endpoint("unix", path=path)
    if scheme not in ("tcp", "tcps", "ws", "wss", "quic"):
        raise ListenError(f"{uri}: scheme must be tcp://, unix:// or ws:// (or tcps://, wss://, "
                          "quic://)")
    try:
        port = parts.port
    except ValueError as exc:
        raise ListenError(f"{uri}: {exc}") from exc
    if parts.hostname is None or port is None:
        raise ListenError(f"{uri}: needs host and port (use port 0 for any free port)")
    return Endpoint(scheme, parts.hostname, port, parts.path or "/")


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

    async def receive(self) -> bytes | None:
        """Next bytes (or message); None at end of stream."""
        ...

    async def send(self, packets: list[bytes]) -> None:
        """Write encoded packets in order."""
        ...

    async def aclose(self) -> None: ...


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

    async def receive(self) -> bytes | None:
        try:
            if self._socket is None:  # TLS
                data = bytes(await self.stream.receive_some(READ_SIZE))
            else:
                # A CANCEL is read the moment it lands, with the fewest layers between
                # (gateway/_sockio.py); after a short read the socket is most likely empty.
                data = await _sockio.receive_some(self._socket, READ_SIZE,
                                                  likely_empty=self._drained)
                self._drained = len(data) < READ_SIZE
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return None
        return data or None

    async def send(self, packets: list[bytes]) -> None:
        await self.stream.send_all(packets[0] if len(packets) == 1 else b"".join(packets))

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


class WebSocketTransport:
    """One packet per binary WebSocket message."""

    message_based = True
    kind = "websocket"
    #: One message per packet, framed by trio-websocket: no direct writes.
    send_now: Callable[[bytes], int] | None = None

    def __init__(self, connection: trio_websocket.WebSocketConnection, peer: str) -> None:
        self.connection = connection
        self.peer = peer

    async def receive(self) -> bytes | None:
        try:
            message = await self.connection.get_message()
        except trio_websocket.ConnectionClosed:
            return None
        if isinstance(message, str):
            raise TextMessageError("WebSocket text message: NNRP packets are binary messages")
        return message

    async def send(self, packets: list[bytes]) -> None:
        try:
            for packet in packets:
                await self.connection.send_message(packet)
        except trio_websocket.ConnectionClosed as exc:
            raise trio.BrokenResourceError("WebSocket closed") from exc

    async def aclose(self) -> None:
        with trio.move_on_after(1) as scope:
            scope.shield = True
            await self.connection.aclose()


def tune_tcp(stream: trio.abc.Stream) -> None:
    """Small packets (one token event each) must not wait for Nagle (nnrp-py.md section 5),
    and a peer that vanishes without a FIN is found by TCP keepalive within ~1 minute (idle
    30 s, then 3 probes 10 s apart), which ends its operations and aborts their upstreams."""
    if isinstance(stream, trio.SocketStream) and stream.socket.family in (
            socket.AF_INET, socket.AF_INET6):
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, True)
        for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10),
                              ("TCP_KEEPCNT", 3)):
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


async def connect(uri: str, nursery: trio.Nursery,
                  ssl_context: ssl.SSLContext | None = None, *,
                  quic: QuicClientOptions | None = None) -> PacketTransport:
    """Open a client transport to ``uri``.

    ``nursery`` hosts a WebSocket's reader task or a QUIC connection's driver. ``tcps://``,
    ``wss://`` and ``quic://`` trust ``ssl_context`` (default: the system's trust store;
    for QUIC its CA certificates are read, see ``gateway/_quic_client.py``); ``quic``
    sets the QUIC-only options. A QUIC handshake that fails raises an ``OSError``
    (``QuicConnectError``), as a refused TCP connect does.
    """
    endpoint = parse_endpoint(uri)
    if endpoint.scheme == "quic":
        from gateway._quic_client import open_quic_transport  # aioquic: for quic:// only

        return await open_quic_transport(endpoint.host, endpoint.port, nursery,
                                         options=quic or QuicClientOptions(),
                                         ssl_context=ssl_context, peer=uri)
    tls = (ssl_context or ssl.create_default_context()) if endpoint.tls else None
    if endpoint.scheme in ("tcp", "tcps"):
        stream: trio.abc.Stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
        tune_tcp(stream)
        if tls is not None:
            ssl_stream = trio.SSLStream(stream, tls, server_hostname=endpoint.host)
            await ssl_stream.do_handshake()
            stream = ssl_stream
        return StreamTransport(stream, "tcp", uri)
    if endpoint.scheme == "unix":
        return StreamTransport(await trio.open_unix_socket(endpoint.path), "ipc", uri)
    scheme = "wss" if endpoint.tls else "ws"
    connection = await trio_websocket.connect_websocket_url(
        nursery, f"{scheme}://{endpoint.host}:{endpoint.port}{endpoint.path}",
        message_queue_size=4096, ssl_context=tls)
    return WebSocketTransport(connection, uri)


async def open_unix_listener(path: str) -> trio.SocketListener:
    """Bind a unix stream socket, replacing a stale socket file (never a regular file)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise ListenError(f"unix://{path}: exists and is not a socket")
        os.unlink(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(path)
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)
