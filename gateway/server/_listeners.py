"""Listener URIs: ``tcp://host:port``, ``unix:///path``, ``ws://host:port/path``, and the
TLS forms ``tcps://host:port`` and ``wss://host:port/path``."""

from __future__ import annotations

import os
import socket
import stat
from urllib.parse import urlsplit

import attrs
import trio


class ListenError(ValueError):
    """A listener URI that cannot be used."""


@attrs.frozen
class ListenSpec:
    scheme: str  # "tcp", "tcps", "unix", "ws" or "wss"
    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def transport(self) -> str:
        return {"tcp": "tcp", "tcps": "tcp", "unix": "ipc", "ws": "websocket",
                "wss": "websocket"}[self.scheme]

    @property
    def tls(self) -> bool:
        return self.scheme in ("tcps", "wss")


def parse_listen_uri(uri: str) -> ListenSpec:
    """Parse one ``--listen`` value; port 0 asks the OS for a free port."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "unix":
        path = parts.path if not parts.netloc else f"/{parts.netloc}{parts.path}"
        if not path:
            raise ListenError(f"{uri}: a unix listener needs a path (unix:///run/nnrp.sock)")
        return ListenSpec("unix", path=path)
    if scheme not in ("tcp", "tcps", "ws", "wss"):
        raise ListenError(f"{uri}: scheme must be tcp://, unix:// or ws:// (or tcps://, wss://)")
    try:
        port = parts.port
    except ValueError as exc:
        raise ListenError(f"{uri}: {exc}") from exc
    if parts.hostname is None or port is None:
        raise ListenError(f"{uri}: needs host and port (use port 0 for any free port)")
    return ListenSpec(scheme, parts.hostname, port, parts.path or "/")


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
