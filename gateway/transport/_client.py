"""The client side of every transport: ``connect(uri)`` opens a ``PacketTransport``."""

from __future__ import annotations

import ssl

import trio
import trio_websocket

from ._carriers import PacketTransport, StreamTransport, WebSocketTransport, tune_tcp
from ._endpoints import QuicClientOptions, parse_endpoint


async def connect(uri: str, nursery: trio.Nursery,
                  ssl_context: ssl.SSLContext | None = None, *,
                  quic: QuicClientOptions | None = None) -> PacketTransport:
    """Open a client transport to ``uri``.

    ``nursery`` hosts a WebSocket's reader task or a QUIC connection's driver. ``tcps://``,
    ``wss://`` and ``quic://`` trust ``ssl_context`` (default: the system's trust store;
    for QUIC its CA certificates are read, see ``_quic_client.py``); ``quic``
    sets the QUIC-only options. A QUIC handshake that fails raises an ``OSError``
    (``QuicConnectError``), as a refused TCP connect does.
    """
    endpoint = parse_endpoint(uri)
    if endpoint.scheme == "quic":
        from ._quic_client import open_quic_transport  # aioquic: for quic:// only

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


