"""Binding every listener at once for ``--workers N`` (``bind_shared``).

With workers, the supervising process binds each listener once, before any worker
starts, and every worker inherits it (``Inherited``):

* tcp, tcps, ws, wss, quic: **one socket per worker, all on one port, with
  SO_REUSEPORT.** The kernel spreads new connections (and for QUIC, datagrams) over the
  group by a hash of their 4-tuple: evenly, whatever the arrival pattern. (One listening
  socket shared by all workers was tried first: a burst of 32 connections all went to
  the worker that woke first, which drains the accept queue before the other runs.) The
  hash keeps every datagram of a QUIC client's flow on one socket, so it reaches the
  worker holding that connection's state. Unlike one process, which routes datagrams by
  connection ID, a client whose address changes (NAT rebinding, migration) lands on
  another worker and loses its connection.
* unix: SO_REUSEPORT is an inet option, so **one socket shared by all workers**; each
  accepts from the same queue (so a burst tends to go to one worker).

A port already in use is an error, as for one process (a bare SO_REUSEPORT bind would
join the group holding it). When a worker exits, its TCP sockets are closed at once
(``SharedListener.release``): the hash then spreads new connections over the workers
still running, and the restarted worker gets fresh sockets in the group (``renew``).
Its QUIC socket is kept, since the hash must not change under established flows. Port 0
is resolved once, by the first bind: every worker serves the same URI.

What a failed ``accept()`` means (``ACCEPT_FAILURES``, used by every stream listener of
``gateway.server``): running out of descriptors, buffers or memory is the machine's
state, which passes, so the listener backs off and accepts again (as ``trio``'s own
``serve_listeners`` does); trio's ``SocketListener`` already retries what a client's
aborted connection reports (ECONNABORTED, EPROTO, ...). Anything else (EBADF, ENOTSOCK,
EINVAL: a socket closed, replaced or shut down under the listener) will fail the same
way forever: it is **terminal**, and the server closes the whole listener set
(``ListenerFailed``) instead of spinning on it or serving on fewer listeners than it was
configured with.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from typing import Any

import attrs
import trio

from ._endpoints import Endpoint, ListenError, bound_uri, parse_endpoint

#: accept() failures after which the listener backs off and accepts again (module rules);
#: every other failure is terminal.
ACCEPT_FAILURES: dict[int, str] = {
    errno.EMFILE: "back off: this process is out of descriptors",
    errno.ENFILE: "back off: the system is out of descriptors",
    errno.ENOBUFS: "back off: the kernel is out of socket buffers",
    errno.ENOMEM: "back off: the kernel is out of memory",
}
#: How long a listener waits after a passing accept() failure.
ACCEPT_BACKOFF = 0.1


def accept_failure_is_terminal(error: BaseException) -> bool:
    """Whether a failed ``accept()`` will fail forever (``ACCEPT_FAILURES``)."""
    if isinstance(error, trio.ClosedResourceError):
        return True  # closed under the listener: nothing to accept from any more
    return not (isinstance(error, OSError) and error.errno in ACCEPT_FAILURES)


@attrs.frozen
class Inherited:
    """A listener bound by the supervisor, as one worker receives it.

    ``uri`` is the listener as configured (the key a worker looks it up by); ``fds`` are
    the worker's sockets for it (tcp on a wildcard host may be two: IPv4 and IPv6).
    """

    uri: str
    fds: tuple[int, ...]

    def adopt(self) -> list[socket.socket]:
        """The sockets, owned by the caller from now on (call it once: they close)."""
        return [socket.socket(fileno=fd) for fd in self.fds]


#: A QUIC listener's receive buffer: room for bursts (the kernel may cap it).
UDP_RECEIVE_BUFFER = 4 << 20


@attrs.define
class SharedListener:
    """One configured listener, bound once for every worker (held by the supervisor)."""

    uri: str
    spec: Endpoint
    #: The sockets of each worker (index = worker); a unix listener's are all the same.
    per_worker: list[list[socket.socket]]
    #: What each inet socket binds (family, type, proto, address), port resolved.
    addresses: list[tuple[Any, ...]] = attrs.field(factory=list)

    @property
    def bound_uri(self) -> str:
        """The URI clients use (port 0 resolved), as every worker serves it."""
        return bound_uri(self.spec, self.per_worker[0][0].getsockname())

    def for_worker(self, index: int) -> Inherited:
        return Inherited(self.uri, tuple(sock.fileno() for sock in self.per_worker[index]))

    def release(self, index: int) -> None:
        """A worker exited: close its TCP sockets, so that the group's hash sends new
        connections to the workers still running instead of queueing them for a worker
        that may be down for a while (connections already queued for it are reset). A
        QUIC socket stays (the hash must not change under established flows); a unix
        socket is shared."""
        if self.spec.scheme in ("tcp", "tcps", "ws", "wss"):
            for sock in self.per_worker[index]:
                sock.close()

    def renew(self, index: int) -> None:
        """Before a worker's restart: fresh sockets in the group for those released."""
        if self.spec.scheme in ("tcp", "tcps", "ws", "wss") and all(
                sock.fileno() == -1 for sock in self.per_worker[index]):
            self.per_worker[index] = _bind_one_of_each(self.addresses)

    def close(self) -> None:
        for sockets in self.per_worker:
            for sock in sockets:
                if sock.fileno() != -1:
                    sock.close()


async def bind_shared(uri: str, workers: int) -> SharedListener:
    """Bind ``uri`` once for ``workers`` processes (see the module's rules). A port in use
    raises ListenError (EADDRINUSE), as it does for one process: a SO_REUSEPORT bind alone
    would join whatever group holds the port, another gateway's or this one's."""
    spec = parse_endpoint(uri)
    try:
        return await _bind_shared(uri, spec, workers)
    except OSError as exc:
        raise ListenError.cannot_bind(uri, exc) from exc


async def _bind_shared(uri: str, spec: Endpoint, workers: int) -> SharedListener:
    if spec.scheme == "unix":
        listener = await open_unix_listener(spec.path)
        shared = socket.socket(fileno=os.dup(listener.socket.fileno()))
        listener.socket.close()
        return SharedListener(uri, spec, [[shared]] * workers)
    kind = socket.SOCK_DGRAM if spec.scheme == "quic" else socket.SOCK_STREAM
    infos = socket.getaddrinfo(spec.host or None, spec.port, type=kind,
                               flags=socket.AI_PASSIVE)
    if kind == socket.SOCK_DGRAM:
        infos = infos[:1]  # QUIC listens on the first address, as on one process
    addresses = [(family, sock_kind, proto, address)
                 for family, sock_kind, proto, _, address in infos]
    if spec.port:
        _check_port_free(addresses)
    group: list[list[socket.socket]] = []
    try:
        for _ in range(workers):
            group.append(_bind_one_of_each(addresses))
            # The first bind resolves port 0; the others join its group on that port.
            port = group[0][0].getsockname()[1]
            addresses = [(family, sock_kind, proto, (address[0], port, *address[2:]))
                         for family, sock_kind, proto, address in addresses]
    except BaseException:
        for sockets in group:
            for sock in sockets:
                sock.close()
        raise
    return SharedListener(uri, spec, group, addresses)


def _check_port_free(addresses: list[tuple[Any, ...]]) -> None:
    """Bind each address once without SO_REUSEPORT: EADDRINUSE if anything holds it.
    TCP keeps SO_REUSEADDR (connections in TIME_WAIT from an earlier run are no clash)."""
    for family, kind, proto, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            if kind == socket.SOCK_STREAM:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and kind == socket.SOCK_STREAM:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            probe.bind(address)


def _bind_one_of_each(addresses: list[tuple[Any, ...]]) -> list[socket.socket]:
    """One socket per address, in the port's SO_REUSEPORT group, with the options one
    process's own bind would set (``trio.open_tcp_listeners``; ``QuicListener.bind``)."""
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, address in addresses:
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if kind == socket.SOCK_STREAM:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:  # trio binds IPv4 and IPv6 apart
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            else:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_RECEIVE_BUFFER)
            sock.bind(address)
            if kind == socket.SOCK_STREAM:
                sock.listen(socket.SOMAXCONN)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


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
