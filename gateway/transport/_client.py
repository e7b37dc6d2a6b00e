"""The client side of every transport: ``connect(uri)`` opens a ``PacketTransport``."""

from __future__ import annotations

import ssl

import trio

from ._carriers import PacketTransport, StreamTransport, tune_tcp
from ._endpoints import QuicClientOptions, format_host, parse_endpoint
from ._websocket import open_websocket_client


async def connect(uri: str, nursery: trio.Nursery,
                  ssl_context: ssl.SSLContext | None = None, *,
                  quic: QuicClientOptions | None = None) -> PacketTransport:
    """Open a client transport to ``uri``.

    ``nursery`` hosts a QUIC connection's driver. ``tcps://``,
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
    if endpoint.scheme == "unix":
        return StreamTransport(await trio.open_unix_socket(endpoint.path), "ipc", uri)
    tls = (ssl_context or ssl.create_default_context()) if endpoint.tls else None
    stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]
    stream = plain = await trio.open_tcp_stream(endpoint.host, endpoint.port)
    try:
        tune_tcp(plain)
        if tls is not None:
            stream = trio.SSLStream(plain, tls, server_hostname=endpoint.host)
            await stream.do_handshake()
        if endpoint.scheme in ("tcp", "tcps"):
            return StreamTransport(stream, "tcp", uri)
        return await open_websocket_client(
            stream, f"{format_host(endpoint.host)}:{endpoint.port}", endpoint.path, uri)
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


