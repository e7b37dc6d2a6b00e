"""A bounded, coalescing outbox: the only path from a connection to its transport, and
the one owner of every write to it.

Operation tasks and the reader append encoded packets; one writer task
(``run_writer``) takes everything queued at once and writes it in one call, so a burst
of events leaves in few syscalls. Memory is bounded: ``wait_for_room`` blocks producers
while more than ``high_water`` bytes wait, until the writer brings it under
``low_water``. A client
that never reads therefore stalls its own operations (TCP backpressure reaches the
operation tasks, and through them the upstream streams), never the process.

The direct path. When the transport can write without waiting
(``send_now``: a plain TCP or unix socket) and the writer is idle with nothing queued,
a producer that knows where its batch ends (the events of one upstream read, a
terminal's packets) queues it with ``defer=True`` and calls ``flush()``, which writes it
at once, synchronously: a streamed token then costs no wake-up of the writer task and no
pass of the scheduler. Whatever the kernel does not take at once is left for the writer,
which keeps the order (a flush writes directly only while the writer holds nothing) and
owns every wait and every failure: a direct write that fails wakes the writer, which
meets the same error and ends the connection. A plain ``put`` still only wakes the
writer, so a producer that emits in a tight loop is coalesced into one write, as
before. The connection writes directly only for its lone operation
(``flush(direct=...)``): with several in flight the writer, woken once, takes what all
of them queued in a pass and writes it at once, so a client reading many streams on one
connection gets one segment per pass, not one per stream.

What is written is told to ``on_written`` (bytes, packets), in order: a packet counts once
all of it is on the socket. An observer may wrap that hook (a benchmark's residence
probe does, from outside: ``gateway.residence``); the write path itself carries nothing
for one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

#: Writes what the kernel takes of the bytes at once and returns how many; 0 when its
#: buffer is full; raises OSError for a broken socket (``gateway._sockio.send_now``).
SendNow = Callable[[bytes], int]
#: Writes packets in order, waiting as long as it must (``PacketTransport.send``).
Send = Callable[[list[bytes]], Awaitable[None]]
#: Told (bytes, packets) as they reach the transport (the connection's counters).
WrittenHook = Callable[[int, int], None]


def _ignore_written(nbytes: int, packets: int) -> None:
    pass


class Outbox:
    def __init__(self, high_water: int = 1 << 20, low_water: int | None = None, *,
                 send_now: SendNow | None = None,
                 on_written: WrittenHook = _ignore_written) -> None:
        self.high_water = high_water
        self.low_water = high_water // 2 if low_water is None else low_water
        self._send_now = send_now
        #: Told (bytes, packets) as they reach the transport, packets in the order put.
        self.on_written = on_written
        self._queue: list[bytes] = []
        self._bytes = 0
        #: Packets queued (a partly written one stays counted until its end is written).
        self._packets = 0
        self._taken_packets = 0
        #: The writer holds a batch it has not finished writing.
        self._writing = False
        #: A direct write fell short (the socket is full): until the writer has written
        #: a batch, flushes leave everything to it instead of retrying the write.
        self._backlogged = False
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
    def packets_unwritten(self) -> int:
        """Packets put and not yet told to ``on_written`` (queued, or being written)."""
        return self._packets + (self._taken_packets if self._writing else 0)

    @property
    def closed(self) -> bool:
        """The writer has stopped: nothing put from now on reaches the peer."""
        return self._closed

    @property
    def has_room(self) -> bool:
        """Open and taking packets: ``wait_for_room`` would not wait (after the queue
        passed its high-water mark, not until it is back under the low-water mark)."""
        return self._has_room.is_set() and not self._closed

    def put(self, packet: bytes, *, defer: bool = False) -> None:
        """Queue a packet for the writer (synchronous: order equals call order). Never
        blocks. ``defer`` does not wake the writer: the caller owes a ``flush()``, which
        may write it directly."""
        if self._closed:
            return
        self._queue.append(packet)
        self._bytes += len(packet)
        self._packets += 1
        self._flushed = trio.Event() if self._flushed.is_set() else self._flushed
        if self._bytes > self.high_water and self._has_room.is_set():
            self._has_room = trio.Event()
        if not defer:
            self._has_data.set()

    def put_all(self, packets: list[bytes], *, defer: bool = False) -> None:
        """Queue several packets, in order (each stays its own WebSocket message), as
        ``put`` does."""
        for packet in packets:
            self.put(packet, defer=True)
        if packets and not defer:
            self._has_data.set()

    def flush(self, *, direct: bool = True) -> None:
        """Write what is queued now, from the calling task, if the direct path is open
        (the transport can, the writer is idle, the caller allows it: ``direct``);
        otherwise wake the writer for it."""
        queue = self._queue
        if not queue:
            return
        if (not direct or self._send_now is None or self._writing or self._backlogged
                or self._closed):
            self._has_data.set()
            return
        data = queue[0] if len(queue) == 1 else b"".join(queue)
        try:
            sent = self._send_now(data)
        except OSError:
            self._has_data.set()  # the writer meets the same error and ends the connection
            return
        if sent == len(data):
            self._queue = []
            self._bytes -= sent
            packets, self._packets = self._packets, 0
            self._done_writing(sent, packets)
            return
        # The kernel took part or nothing: the rest waits for the writer (who waits for
        # room). Packet boundaries do not matter here: a direct path is a byte stream.
        self._backlogged = True
        if sent:
            self._queue = [data[sent:]]
            self._bytes -= sent
            self.on_written(sent, 0)
            if self._bytes <= self.low_water:
                self._has_room.set()
        self._has_data.set()

    async def run_writer(self, send: Send, write_timeout: float) -> None:
        """The writer: take what is queued, write it, until closed and empty. A write
        that fails or waits longer than ``write_timeout`` closes the outbox (every
        producer is released) and raises: the connection is over."""
        while True:
            batch = await self.take()
            if not batch:
                return
            try:
                await self._write(batch, send, write_timeout)
            except BaseException:
                self.close()
                raise
            self.written(batch)

    async def _write(self, batch: list[bytes], send: Send, write_timeout: float) -> None:
        """Write a batch in order; bounded by the write timeout only when it must wait.
        On a plain socket what the kernel takes at once goes without trio's send layers
        (most batches: the writer runs once per pass with what the pass queued)."""
        if self._send_now is not None:
            data = batch[0] if len(batch) == 1 else b"".join(batch)
            sent = self._send_now(data)
            if sent == len(data):
                return
            batch = [data[sent:]]
        with trio.fail_after(write_timeout):
            await send(batch)

    async def wait_for_room(self) -> None:
        """Block while the queue is over its high-water mark."""
        if not self._has_room.is_set():
            self.flush(direct=False)  # a deferred batch must reach the writer first
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
        self._taken_packets, self._packets = self._packets, 0
        self._writing = True
        return batch

    def written(self, batch: list[bytes]) -> None:
        """The writer finished writing ``batch``."""
        self._writing = self._backlogged = False
        nbytes = sum(map(len, batch))
        self._bytes -= nbytes
        self._done_writing(nbytes, self._taken_packets)

    def _done_writing(self, nbytes: int, packets: int) -> None:
        self.on_written(nbytes, packets)
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
