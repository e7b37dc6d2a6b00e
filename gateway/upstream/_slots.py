"""Upstream connection slots: one single-connection client per concurrent request."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Generic, Protocol, TypeVar

import trio

from ._errors import UpstreamOverloaded


class Closeable(Protocol):
    async def aclose(self) -> None: ...


#: A slot's client, built by ``_client``: a ``LoopbackTransport`` or an httpx client.
ClientT = TypeVar("ClientT", bound=Closeable)


class ConnectionSlots(Generic[ClientT]):
    """At most ``size`` requests at once, each on a client of its own that keeps one
    connection: checking out a slot is checking out a connection.

    Why not one httpx client with ``size`` connections: httpcore 1.0's pool rescans every
    connection on each request start and end, and its keep-alive check there is quadratic
    (encode/httpcore#1035); at 1,000 connections that scan was 59 % of the gateway's CPU
    (py-spy, 1,000-stream soak). A pass can also close an idle connection already handed
    to a request that has not started yet (encode/httpcore#1110): with no read timeout,
    that request waited out its first-chunk deadline. With one connection per client both
    are gone: the scan is O(1) and no other request ever shares the pool.

    Waiting for a slot is FIFO (a trio limiter), under the operation's own deadlines.
    Free slots are reused last-in first-out, so the warmest connections carry the load
    and the rest go idle. ``prune`` closes the ones idle for longer than vLLM keeps an
    idle connection open (uvicorn's keep-alive timeout, 5 s by default): otherwise vLLM
    closes them first and each sits in CLOSE-WAIT here until its slot is reused (31
    sockets after a 32-stream burst), since a client in the free list reads nothing.
    """

    def __init__(self, size: int, new_client: Callable[[], ClientT],
                 clock: Callable[[], float] = trio.current_time) -> None:
        self._limiter = trio.CapacityLimiter(size)
        self._new_client = new_client
        self._clock = clock
        #: Idle clients and when each was last put back, oldest first.
        self._free: list[tuple[float, ClientT]] = []
        self._clients: set[ClientT] = set()  # every open one, idle or not
        #: Checkouts that gave up: no slot came free within their ``wait``.
        self.wait_timeouts = 0

    @property
    def size(self) -> int:
        """Requests that may hold a connection at once (``--upstream-pool-size``)."""
        return int(self._limiter.total_tokens)

    @property
    def in_use(self) -> int:
        return int(self._limiter.borrowed_tokens)

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot now (every one busy)."""
        return self._limiter.statistics().tasks_waiting

    @property
    def idle(self) -> int:
        """Clients kept for reuse (each may hold one open connection)."""
        return len(self._free)

    @asynccontextmanager
    async def checkout(self, wait: float = math.inf) -> AsyncIterator[ClientT]:
        """A client of one's own; raises ``UpstreamOverloaded`` when none is free within
        ``wait`` seconds (every upstream connection busy: refuse, do not queue on)."""
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            with trio.move_on_after(wait) as waiting:
                await self._limiter.acquire()
            if waiting.cancelled_caught:
                self.wait_timeouts += 1
                raise UpstreamOverloaded(f"all {int(self._limiter.total_tokens)} upstream "
                                         f"connections busy for {wait:g} s") from None
        try:
            if self._free:
                client = self._free.pop()[1]
            else:
                client = self._new_client()
                self._clients.add(client)
            try:
                yield client
            finally:
                self._free.append((self._clock(), client))
        finally:
            self._limiter.release()

    async def prune(self, idle_for: float) -> int:
        """Close the clients idle for ``idle_for`` seconds or more; how many went."""
        cutoff = self._clock() - idle_for
        stale = 0
        while stale < len(self._free) and self._free[stale][0] <= cutoff:
            stale += 1
        expired, self._free = self._free[:stale], self._free[stale:]
        for _, client in expired:
            self._clients.discard(client)
            with trio.CancelScope(shield=True):
                await client.aclose()
        return len(expired)

    async def aclose(self) -> None:
        self._free = []
        clients, self._clients = self._clients, set()
        for client in clients:
            await client.aclose()
