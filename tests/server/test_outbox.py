"""The outbox alone (gateway/server/_outbox.py): what a take hands the writer, the high- and
low-water marks, flushing and closing, and the direct write a flush tries first. (Random
producers over a real socket are test_outbox_fuzz.py.)"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from gateway.server._outbox import Outbox


async def test_outbox_hands_everything_queued_to_one_take() -> None:
    outbox = Outbox(high_water=100)
    for packet in (b"a", b"bb", b"ccc"):
        outbox.put(packet)
    assert outbox.queued_bytes == 6
    assert await outbox.take() == [b"a", b"bb", b"ccc"]


async def _has_room(outbox: Outbox) -> bool:
    with trio.move_on_after(0.05):
        await outbox.wait_for_room()
        return True
    return False


async def test_outbox_blocks_producers_over_high_water_until_under_low_water() -> None:
    # Hysteresis: closed past high water, open again only at or under low water.
    outbox = Outbox(high_water=10, low_water=4)
    outbox.put(b"x" * 11)
    assert not await _has_room(outbox)
    first = await outbox.take()
    outbox.put(b"y" * 6)  # produced while the writer writes
    outbox.written(first)
    assert outbox.queued_bytes == 6
    assert not await _has_room(outbox)  # under high water, but not yet under low water
    outbox.written(await outbox.take())
    assert await _has_room(outbox)


async def test_outbox_flush_and_close() -> None:
    outbox = Outbox()
    await outbox.wait_flushed()  # nothing queued: flushed at once
    outbox.put(b"z")
    with trio.move_on_after(0.05) as scope:
        await outbox.wait_flushed()
    assert scope.cancelled_caught
    outbox.written(await outbox.take())
    await outbox.wait_flushed()
    outbox.close()
    outbox.put(b"ignored")
    assert await outbox.take() == []  # closed and empty: the writer stops


class FakeSocket:
    """A direct-write target: takes up to ``room`` bytes per call, or fails."""

    def __init__(self, room: int = 1 << 30) -> None:
        self.room = room
        self.writes: list[bytes] = []
        self.error: OSError | None = None
        self.attempts = 0

    def send_now(self, data: bytes) -> int:
        self.attempts += 1
        if self.error is not None:
            raise self.error
        taken = data[:self.room]
        if taken:
            self.writes.append(taken)
        return len(taken)


def counting_outbox(sock: FakeSocket, **kw: Any) -> tuple[Outbox, list[tuple[int, int]]]:
    counted: list[tuple[int, int]] = []
    outbox = Outbox(send_now=sock.send_now,
                    on_written=lambda nbytes, packets: counted.append((nbytes, packets)), **kw)
    return outbox, counted


async def _takes_at_once(outbox: Outbox) -> list[bytes] | None:
    with trio.move_on_after(0.05):
        return await outbox.take()
    return None


async def test_a_flush_writes_everything_queued_in_one_direct_write() -> None:
    sock = FakeSocket()
    outbox, counted = counting_outbox(sock)
    outbox.put(b"progress")  # a plain put: queued for the writer, not written
    assert sock.writes == []
    outbox.put(b"a", defer=True)
    outbox.put(b"bb", defer=True)
    outbox.flush()
    assert sock.writes == [b"progressabb"]  # in call order, one write
    assert counted == [(11, 3)]
    assert outbox.queued_bytes == 0
    await outbox.wait_flushed()
    assert await _takes_at_once(outbox) is None  # the writer has nothing left to do


async def test_a_partial_direct_write_leaves_the_rest_to_the_writer() -> None:
    sock = FakeSocket(room=3)
    outbox, counted = counting_outbox(sock)
    outbox.put(b"abcd", defer=True)
    outbox.put(b"ef", defer=True)
    outbox.flush()
    assert sock.writes == [b"abc"]
    assert counted == [(3, 0)]  # bytes now, packets when their ends are written
    assert outbox.queued_bytes == 3
    batch = await _takes_at_once(outbox)
    assert batch == [b"def"]
    outbox.put(b"g", defer=True)
    outbox.flush()  # the writer holds a batch: nothing may overtake it
    assert sock.writes == [b"abc"]
    outbox.written(batch)
    assert counted == [(3, 0), (3, 2)]
    assert await _takes_at_once(outbox) == [b"g"]


async def test_a_full_socket_or_a_failed_write_wakes_the_writer() -> None:
    sock = FakeSocket(room=0)
    outbox, counted = counting_outbox(sock)
    outbox.put(b"abc", defer=True)
    outbox.flush()
    outbox.put(b"d", defer=True)
    outbox.flush()  # the socket was full: no retry until the writer has written
    assert sock.attempts == 1
    assert await _takes_at_once(outbox) == [b"abc", b"d"]  # the writer waits for room
    outbox.written([b"abc", b"d"])
    assert counted == [(4, 2)]
    sock.room, sock.error = 10, BrokenPipeError()
    outbox.put(b"xyz", defer=True)
    outbox.flush()
    assert sock.attempts == 2  # direct again once the backlog was written
    assert await _takes_at_once(outbox) == [b"xyz"]  # its write meets the error and ends


async def test_a_partial_direct_write_under_low_water_lets_producers_on() -> None:
    sock = FakeSocket(room=8)
    outbox, _ = counting_outbox(sock, high_water=6, low_water=3)
    outbox.put(b"0123456789", defer=True)  # over high water: producers would wait
    outbox.flush()  # the kernel takes 8: two bytes left, under low water
    assert await _has_room(outbox)


async def test_deferred_packets_wait_for_a_flush_or_the_next_wake() -> None:
    sock = FakeSocket()
    outbox, _ = counting_outbox(sock, high_water=4, low_water=2)
    taken: list[list[bytes]] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            async def writer() -> None:
                taken.append(await outbox.take())

            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            outbox.put(b"ab", defer=True)
            await trio.testing.wait_all_tasks_blocked()
            assert taken == []  # deferred: the writer is not woken
            outbox.put(b"cde", defer=True)  # over high water: a waiting producer wakes it
            nursery.start_soon(outbox.wait_for_room)
            await trio.testing.wait_all_tasks_blocked()
            assert taken == [[b"ab", b"cde"]] and sock.writes == []
            outbox.written(taken[0])  # under low water: the producer goes on
    outbox.put(b"x", defer=True)
    outbox.flush()
    assert sock.writes == [b"x"]  # nothing held by the writer: a flush writes directly
    outbox.put(b"g", defer=True)
    outbox.flush(direct=False)  # the connection has several operations: the writer writes
    assert sock.writes == [b"x"]
    plain = Outbox()  # no direct path (WebSocket, TLS, QUIC): a flush wakes the writer
    plain.put(b"ws", defer=True)
    plain.flush()
    assert await _takes_at_once(plain) == [b"ws"]
    outbox.close()
    outbox.put(b"late", defer=True)
    outbox.flush()
    assert sock.writes == [b"x"]  # closed: nothing more is written
