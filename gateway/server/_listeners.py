"""Binding listeners that trio does not open for us: unix stream sockets."""

from __future__ import annotations

import os
import socket
import stat

import trio

from gateway.transport import ListenError


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
