"""The outbox under random producers, over a real socket with a tiny send buffer and a
reader that stalls: what reaches the wire is exactly what was put, in put order.

Each seed runs several producer tasks that put numbered packets every way a connection
does (``put``, ``put_all``, deferred then ``flush`` direct or not, with or without a
checkpoint between), each waiting for room first as ``Operation.emit`` does; the writer
is ``run_writer`` with the transport's ``send``, and direct writes go through the
transport's ``send_now`` (``gateway._sockio``), as on a plain unix socket. The socket's
send buffer is a few KiB and the reader stops at random, so direct writes fall short,
the writer waits, and producers meet the high-water mark.
"""

from __future__ import annotations

import random
import socket
import struct
from typing import NamedTuple

import trio

from gateway.server._outbox import Outbox
from gateway.transport import StreamTransport

SEEDS = 40
#: A packet: producer, sequence number, payload length; the payload repeats the first
#: two, so a packet cut or interleaved with another cannot parse back.
HEADER = struct.Struct("!BIH")


def packet(producer: int, seq: int, size: int) -> bytes:
    tag = HEADER.pack(producer, seq, size)[:5]
    return HEADER.pack(producer, seq, size) + (tag * (size // len(tag) + 1))[:size]


class Paths(NamedTuple):
    """How the bytes went, counted over a run: every path must have been taken, or
    the run proved less than it claims."""

    direct_whole: int  # a flush's direct write the kernel took whole
    direct_short: int  # a direct write (flush or writer) the kernel took part of
    writer_waits: int  # the writer had to wait for the socket (``send``)
    producer_waits: int  # a producer found the outbox over its high-water mark


async def one_run(seed: int) -> Paths:
    rng = random.Random(seed)
    sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, rng.choice([2048, 4096, 8192]))
    transport = StreamTransport(trio.SocketStream(trio.socket.from_stdlib_socket(sender)),
                                "unix", "fuzz")
    reader_socket = trio.socket.from_stdlib_socket(receiver)
    assert transport.send_now is not None
    raw_send_now, raw_send = transport.send_now, transport.send

    handed = 0  # bytes the kernel has taken, direct or through send
    in_flush = False
    paths = {"direct_whole": 0, "direct_short": 0, "writer_waits": 0, "producer_waits": 0}

    def send_now(data: bytes) -> int:
        nonlocal handed
        sent = raw_send_now(data)
        handed += sent
        if sent < len(data):
            paths["direct_short"] += 1
        elif in_flush:
            paths["direct_whole"] += 1
        return sent

    async def send(packets: list[bytes]) -> None:
        nonlocal handed
        paths["writer_waits"] += 1
        await raw_send(packets)
        handed += sum(map(len, packets))

    order: list[bytes] = []  # every packet, in the order of the put calls
    ends: list[int] = []  # where each packet of ``order`` ends on the wire
    reported = [0, 0]  # bytes, packets, as on_written told them

    def on_written(nbytes: int, packets: int) -> None:
        reported[0] += nbytes
        reported[1] += packets
        # Bytes are counted as the kernel takes them, packets once their ends are taken.
        assert reported[0] == handed, (seed, reported, handed)
        complete = sum(1 for end in ends if end <= handed)
        assert reported[1] <= complete, (seed, reported, complete)

    high_water = rng.choice([1024, 4096, 16384])
    outbox = Outbox(high_water=high_water, low_water=rng.choice([0, high_water // 2]),
                    send_now=send_now, on_written=on_written)

    def queued(packets: list[bytes]) -> None:
        """The put calls just made, in their order."""
        for p in packets:
            order.append(p)
            ends.append((ends[-1] if ends else 0) + len(p))

    def flush(direct: bool) -> None:
        nonlocal in_flush
        in_flush = True
        try:
            outbox.flush(direct=direct)
        finally:
            in_flush = False

    async def producer(index: int, count: int) -> None:
        seq = 0
        while seq < count:
            if outbox.queued_bytes > high_water:  # it waits (and to under low water)
                paths["producer_waits"] += 1
            await outbox.wait_for_room()
            sizes = [rng.choice([rng.randint(1, 200), rng.randint(1, 12000)])
                     for _ in range(min(rng.randint(1, 4), count - seq))]
            batch = [packet(index, seq + i, size) for i, size in enumerate(sizes)]
            seq += len(batch)
            before = outbox.queued_bytes
            how = rng.choice(["put", "put_all", "defer", "defer_all", "defer_yield"])
            if how == "put":
                for p in batch:
                    outbox.put(p)
            elif how == "put_all":
                outbox.put_all(batch)
            elif how in ("defer", "defer_yield"):
                for p in batch:
                    outbox.put(p, defer=True)
            else:
                outbox.put_all(batch, defer=True)
            queued(batch)
            # Backpressure: room was there (at most high water queued), then one batch.
            assert before <= high_water, (seed, before, high_water)
            if how == "defer_yield":
                await trio.lowlevel.checkpoint()  # others run while this batch waits
            if how.startswith("defer"):
                flush(direct=rng.random() < 0.7)
            if rng.random() < 0.4:
                await trio.lowlevel.checkpoint()

    received = bytearray()

    async def reader() -> None:
        while True:
            if rng.random() < 0.3:
                await trio.sleep(rng.choice([0, 0.0005, 0.002]))  # the client stalls
            data = await reader_socket.recv(rng.choice([7, 512, 4096, 65536]))
            if not data:
                return
            received.extend(data)

    producers = rng.randint(2, 4)
    counts = [rng.randint(10, 40) for _ in range(producers)]
    with trio.fail_after(20):
        async with trio.open_nursery() as outer:
            outer.start_soon(reader)
            async with trio.open_nursery() as writing:
                writing.start_soon(outbox.run_writer, send, 30.0)
                async with trio.open_nursery() as producing:
                    for index, count in enumerate(counts):
                        producing.start_soon(producer, index, count)
                await outbox.wait_flushed()
                outbox.close()  # the writer ends once it has written everything
            await transport.aclose()
    reader_socket.close()

    wire = bytes(received)
    assert wire == b"".join(order), seed  # exactly the packets, in put order
    seen: dict[int, int] = {}
    position = 0
    while position < len(wire):  # and, read back, each packet whole and in its order
        producer_index, seq, size = HEADER.unpack_from(wire, position)
        assert wire[position:position + HEADER.size + size] == packet(
            producer_index, seq, size), (seed, position)
        assert seq == seen.get(producer_index, -1) + 1, (seed, producer_index, seq)
        seen[producer_index] = seq
        position += HEADER.size + size
    assert seen == {i: count - 1 for i, count in enumerate(counts)}, seed
    assert reported == [len(wire), len(order)], seed
    return Paths(**paths)


async def test_random_producers_reach_a_stalling_reader_whole_and_in_order() -> None:
    totals = [0, 0, 0, 0]
    for seed in range(SEEDS):
        paths = await one_run(seed)
        totals = [a + b for a, b in zip(totals, paths, strict=True)]
    taken = Paths(*totals)
    assert all(taken), taken
