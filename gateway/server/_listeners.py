"""Binding every listener at once for ``--workers N`` (``bind_shared``).

With workers, the supervising process binds each listener once, before any worker
starts, and every worker inherits it (``Inherited``):

* tcp, tcps, ws, wss, quic: **one socket per worker, all on one port, with
  SO_REUSEPORT.** The kernel spreads new connections (and for QUIC, datagrams) over the
  group by a hash of their 4-tuple: evenly, whatever the arrival pattern. (One listening
  socket shared by all workers was tried first: a burst of 32 connections all went to
  the worker that woke first, which drains the accept queue before the other runs.) The
  hash keeps every datagram of a QUIC client's flow on one socket, so it reaches the
  worker holding that connection's state (a client that migrates its address would land
  elsewhere: migration is not supported, as on one process).
* unix: SO_REUSEPORT is an inet option, so **one socket shared by all workers**; each
  accepts from the same queue.

The supervisor keeps every socket open while a worker restarts: the group, and so the
hash, never changes, and connections that arrive for the restarting worker wait in its
queue (about a second) instead of being refused. Port 0 is resolved once, by the first
bind: every worker serves the same URI.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import attrs

from gateway.transport import Endpoint, open_unix_listener, parse_endpoint


def bound_uri(spec: Endpoint, sockname: Any) -> str:
    """The URI a client uses for a listener bound at ``sockname`` (port 0 resolved)."""
    if spec.scheme == "unix":
        return f"unix://{spec.path}"
    host, port = sockname[:2]
    if spec.scheme in ("ws", "wss"):  # the configured host: the name the path lives under
        return f"{spec.scheme}://{format_host(spec.host)}:{port}{spec.path}"
    return f"{spec.scheme}://{format_host(host)}:{port}"


def format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@attrs.frozen
class Inherited:
    """A listener bound by the supervisor, as one worker receives it.

    ``uri`` is the listener as configured (the key a worker looks it up by); ``fds`` are
    the listening stream sockets (tcp with no host may be two: IPv4 and IPv6) or the
    worker's own UDP socket (quic).
    """

    uri: str
    fds: tuple[int, ...]

    def sockets(self) -> list[socket.socket]:
        return [socket.socket(fileno=fd) for fd in self.fds]


@attrs.define
class SharedListener:
    """One configured listener, bound once for every worker (held by the supervisor)."""

    uri: str
    spec: Endpoint
    #: The sockets of each worker (index = worker); a unix listener's are all the same.
    per_worker: list[list[socket.socket]]

    @property
    def bound_uri(self) -> str:
        """The URI clients use (port 0 resolved), as every worker serves it."""
        return bound_uri(self.spec, self.per_worker[0][0].getsockname())

    def for_worker(self, index: int) -> Inherited:
        return Inherited(self.uri, tuple(sock.fileno() for sock in self.per_worker[index]))

    def close(self) -> None:
        for sockets in self.per_worker:
            for sock in sockets:
                if sock.fileno() != -1:
                    sock.close()


async def bind_shared(uri: str, workers: int) -> SharedListener:
    """Bind ``uri`` once for ``workers`` processes (see the module's rules)."""
    spec = parse_endpoint(uri)
    if spec.scheme == "unix":
        listener = await open_unix_listener(spec.path)
        shared = socket.socket(fileno=os.dup(listener.socket.fileno()))
        listener.socket.close()
        return SharedListener(uri, spec, [[shared]] * workers)
    kind = socket.SOCK_DGRAM if spec.scheme == "quic" else socket.SOCK_STREAM
    return SharedListener(uri, spec, _bind_reuseport_group(spec, kind, workers))


def _bind_reuseport_group(spec: Endpoint, kind: socket.SocketKind, workers: int
                          ) -> list[list[socket.socket]]:
    """Per worker, one socket per address ``spec.host`` resolves to (IPv4 and IPv6 for
    a wildcard host, as ``trio.open_tcp_listeners`` binds), all on one port."""
    infos = socket.getaddrinfo(spec.host or None, spec.port, type=kind,
                               flags=socket.AI_PASSIVE)
    if kind == socket.SOCK_DGRAM:
        infos = infos[:1]  # QUIC listens on the first address, as on one process
    port = spec.port
    group: list[list[socket.socket]] = []
    try:
        for _ in range(workers):
            sockets: list[socket.socket] = []
            group.append(sockets)
            for family, sock_kind, proto, _, address in infos:
                sock = socket.socket(family, sock_kind, proto)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((address[0], port, *address[2:]))
                port = sock.getsockname()[1]  # the first bind resolves port 0
                if kind == socket.SOCK_STREAM:
                    sock.listen(socket.SOMAXCONN)
    except BaseException:
        for sockets in group:
            for sock in sockets:
                sock.close()
        raise
    return group
