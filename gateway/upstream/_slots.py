"""Upstream connection slots: one single-connection httpx client per concurrent request."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:  # the clients are built by _client, the only module that uses httpx
    import httpx


class ConnectionSlots:
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
    and the rest expire idle.
    """

    def __init__(self, size: int, new_client: Callable[[], httpx.AsyncClient]) -> None:
        self._limiter = trio.CapacityLimiter(size)
        self._new_client = new_client
        self._free: list[httpx.AsyncClient] = []
        self._clients: list[httpx.AsyncClient] = []

    @property
    def in_use(self) -> int:
        return int(self._limiter.borrowed_tokens)

    @asynccontextmanager
    async def checkout(self) -> AsyncIterator[httpx.AsyncClient]:
        async with self._limiter:
            if self._free:
                client = self._free.pop()
            else:
                client = self._new_client()
                self._clients.append(client)
            try:
                yield client
            finally:
                self._free.append(client)

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()
