"""A bounded, coalescing outbox: the only path from a connection to its transport.

Operation tasks and the reader append encoded packets; one writer task takes
everything queued at once and writes it in one call, so a burst of events leaves in
few syscalls. Memory is bounded: ``wait_for_room`` blocks producers while more than
``high_water`` bytes wait, until the writer brings it under ``low_water``. A client
that never reads therefore stalls its own operations (TCP backpressure reaches the
operation tasks, and through them the upstream streams), never the process.

Under a benchmark's residence probe (``gateway.residence``) a packet may carry when its
upstream bytes were read; ``written`` reports those once the batch is on the socket.
"""

from __future__ import annotations

import trio

from gateway import residence


class Outbox:
    def __init__(self, high_water: int = 1 << 20, low_water: int | None = None) -> None:
        self.high_water = high_water
        self.low_water = high_water // 2 if low_water is None else low_water
        self._queue: list[bytes] = []
        self._bytes = 0
        #: Read times of the queued packets that carry one (residence probe only).
        self._read_at: list[int] = []
        self._taken_read_at: list[int] = []
        self._closed = False
        self._has_data = trio.Event()
        self._has_room = trio.Event()
        self._has_room.set()
        self._flushed = trio.Event()
        self._flushed.set()

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    @property
    def closed(self) -> bool:
        """The writer has stopped: nothing put from now on reaches the peer."""
        return self._closed

    def put(self, packet: bytes, *, read_at: int | None = None) -> None:
        """Queue a packet now (synchronous: order equals call order). Never blocks."""
        if self._closed:
            return
        if read_at is not None:
            self._read_at.append(read_at)
        self._queue.append(packet)
        self._bytes += len(packet)
        self._has_data.set()
        self._flushed = trio.Event() if self._flushed.is_set() else self._flushed
        if self._bytes > self.high_water and self._has_room.is_set():
            self._has_room = trio.Event()

    def put_all(self, packets: list[bytes]) -> None:
        """Queue several packets, in order (each stays its own WebSocket message)."""
        for packet in packets:
            self.put(packet)

    async def wait_for_room(self) -> None:
        """Block while the queue is over its high-water mark."""
        while not self._has_room.is_set() and not self._closed:
            await self._has_room.wait()

    async def take(self) -> list[bytes]:
        """Everything queued, waiting for at least one packet; [] once closed and empty."""
        while not self._queue:
            if self._closed:
                return []
            self._has_data = trio.Event()
            await self._has_data.wait()
        batch, self._queue = self._queue, []
        if self._read_at:
            self._taken_read_at, self._read_at = self._read_at, []
        return batch

    def written(self, batch: list[bytes]) -> None:
        """The writer finished writing ``batch``."""
        if self._taken_read_at:
            if residence.PROBE is not None:
                residence.PROBE.written(self._taken_read_at)
            self._taken_read_at = []
        self._bytes -= sum(map(len, batch))
        if self._bytes <= self.low_water:
            self._has_room.set()
        if not self._queue:
            self._flushed.set()

    async def wait_flushed(self) -> None:
        await self._flushed.wait()

    def close(self) -> None:
        """No more packets; wakes the writer and every blocked producer."""
        self._closed = True
        self._has_data.set()
        self._has_room.set()
        self._flushed.set()
