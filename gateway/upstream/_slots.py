"""Upstream connection slots: one single-connection client per concurrent request.

Who gets a slot when every one is busy (rules; docs/resume.md):

1. Waiting is FIFO, under the waiter's own deadlines; past ``wait`` it is refused
   (backend_overload) rather than queued on.
2. A slot held for a client that is not there (an operation of a detached session, or
   one awaiting its resubmission: ``SlotHolder.standing`` says) is the first to give way
   when a request waits: one that is paused at its journal's bound gives its slot back
   at once (it reads nothing from vLLM anyway); and while detached operations hold more
   than ``detached_share`` of the slots, the oldest of them gives way too. Giving way
   ends that operation (its upstream closed: vLLM stops generating for nobody); its
   client, if it comes back, gets what was produced and a drop (backpressure).
3. A holder that pauses while someone waits is asked at once (``make_room``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Generic, Protocol, TypeVar

import trio

from ._errors import UpstreamOverloaded


class Closeable(Protocol):
    async def aclose(self) -> None: ...


#: A slot's client, built by ``_client``: one connection of its own (http://) or an httpx
#: client of one connection (https://).
ClientT = TypeVar("ClientT", bound=Closeable)


class Standing(enum.IntEnum):
    """How readily a holder gives its slot up (rule 2): higher gives way first."""

    LIVE = 0  # its client reads what it produces
    DETACHED = 1  # nobody reads it now
    PAUSED = 2  # nobody reads it, and it waits for its journal's bound


class SlotHolder(Protocol):
    """What holds a slot, as the pool sees it (the pipeline's operation)."""

    def standing(self) -> Standing: ...

    def give_way(self) -> None:
        """End now, giving the slot back (rule 2)."""
        ...


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
                 clock: Callable[[], float] = trio.current_time, *,
                 detached_share: float = 0.5) -> None:
        self._limiter = trio.CapacityLimiter(size)
        self.detached_share = detached_share
        #: Who holds a slot now, oldest first (rule 2), and who was asked to give way.
        self._holders: dict[int, SlotHolder] = {}
        self._holder_ids = 0
        self._giving_way: set[int] = set()
        #: Holders that gave their slot to a waiting request.
        self.given_way = 0
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
    async def checkout(self, wait: float = math.inf, holder: SlotHolder | None = None
                       ) -> AsyncIterator[ClientT]:
        """A client of one's own; raises ``UpstreamOverloaded`` when none is free within
        ``wait`` seconds (every upstream connection busy: refuse, do not queue on).
        ``holder``: who holds it, for rule 2 (None: never asked to give way)."""
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            with trio.move_on_after(wait) as waiting:
                self._make_room(extra_waiter=True)
                await self._limiter.acquire()
            if waiting.cancelled_caught:
                self.wait_timeouts += 1
                raise UpstreamOverloaded(f"all {int(self._limiter.total_tokens)} upstream "
                                         f"connections busy for {wait:g} s") from None
        holder_id = self._holder_ids = self._holder_ids + 1
        if holder is not None:
            self._holders[holder_id] = holder
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
            self._holders.pop(holder_id, None)
            self._giving_way.discard(holder_id)
            self._limiter.release()

    def make_room(self) -> None:
        """A holder paused while requests may wait (rule 3): let the rules look again."""
        self._make_room()

    def _make_room(self, *, extra_waiter: bool = False) -> None:
        """Rule 2: one holder gives way per request waiting, at most."""
        waiting = self.waiting + (1 if extra_waiter else 0) - len(self._giving_way)
        if waiting <= 0 or not self._holders:
            return
        standings = {holder_id: holder.standing() for holder_id, holder in self._holders.items()
                     if holder_id not in self._giving_way}
        paused = [h for h, standing in standings.items() if standing is Standing.PAUSED]
        detached = [h for h, standing in standings.items() if standing >= Standing.DETACHED]
        chosen = paused[:waiting]
        # The detached holders still holding once the chosen have gone, past their share.
        over_share = len(detached) - len(chosen) - int(self.detached_share * self.size)
        if len(chosen) < waiting and over_share > 0:
            chosen += [h for h in detached if h not in chosen][
                :min(waiting - len(chosen), over_share)]
        for holder_id in chosen:
            self._giving_way.add(holder_id)
            self.given_way += 1
            self._holders[holder_id].give_way()

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
