"""Binding every listener at once for ``--workers N`` (``bind_shared``).

With workers, the supervising process binds each listener once, before any worker
starts, and every worker inherits it (``Inherited``):

* tcp, tcps, unix, ws, wss: **one listening socket shared by all workers.** Each worker
  accepts from the same kernel queue, so whichever worker is idle first takes the next
  connection (load-aware, unlike a blind hash), and a worker that restarts inherits the
  queue with nothing lost: the supervisor keeps the socket open meanwhile.
* quic: **one UDP socket per worker, on one port, with SO_REUSEPORT.** A QUIC
  connection's state lives in one process, and the kernel hashes each datagram's
  4-tuple to one socket of the group, so every datagram of a client's flow reaches the
  same worker (a client that migrates its address would land elsewhere: migration is
  not supported, as on one process). The supervisor keeps each worker's socket open
  across a restart of that worker, so the group, and with it the hash, never changes.

Port 0 is resolved once, by the supervisor: every worker serves the same URI.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import attrs
import trio

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
    #: Stream listeners: the sockets every worker shares. quic: empty.
    shared: list[socket.socket]
    #: quic: one SO_REUSEPORT socket per worker (index = worker). Others: empty.
    per_worker: list[socket.socket]

    @property
    def bound_uri(self) -> str:
        """The URI clients use (port 0 resolved), as every worker serves it."""
        sock = (self.per_worker or self.shared)[0]
        return bound_uri(self.spec, sock.getsockname())

    def for_worker(self, index: int) -> Inherited:
        sockets = [self.per_worker[index]] if self.per_worker else self.shared
        return Inherited(self.uri, tuple(s.fileno() for s in sockets))

    def close(self) -> None:
        for sock in (*self.shared, *self.per_worker):
            sock.close()


async def bind_shared(uri: str, workers: int) -> SharedListener:
    """Bind ``uri`` once for ``workers`` processes (see the module's rules)."""
    spec = parse_endpoint(uri)
    if spec.scheme == "quic":
        return SharedListener(uri, spec, [], _bind_udp_group(spec, workers))
    if spec.scheme == "unix":
        listeners = [await open_unix_listener(spec.path)]
    else:
        listeners = await trio.open_tcp_listeners(spec.port, host=spec.host or None)
    shared = [socket.socket(fileno=os.dup(listener.socket.fileno()))
              for listener in listeners]
    for listener in listeners:
        listener.socket.close()
    return SharedListener(uri, spec, shared, [])


def _bind_udp_group(spec: Endpoint, workers: int) -> list[socket.socket]:
    infos = socket.getaddrinfo(spec.host or None, spec.port, type=socket.SOCK_DGRAM,
                               flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    group: list[socket.socket] = []
    try:
        for _ in range(workers):
            sock = socket.socket(family, kind, proto)
            group.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            # The first bind resolves port 0; the others join its group on that port.
            address = (address[0], sock.getsockname()[1], *address[2:])
    except BaseException:
        for sock in group:
            sock.close()
        raise
    return group
