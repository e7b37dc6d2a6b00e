"""The first-chunk and idle clocks of one stream (``ChunkStream.clocks``): one watchdog
per stream instead of a deadline scope per read, so these pin when each fires, and
that what the consumer raises leaves ``clocks`` as itself, never wrapped in a group."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from gateway.upstream import ChunkStream, UpstreamMalformed, UpstreamTimeout

CHUNK = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
         b'"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n')
DONE = b"data: [DONE]\n\n"


class PacedBody:
    """Raw reads, each after its delay (seconds)."""

    def __init__(self, *reads: tuple[float, bytes]) -> None:
        self._reads = list(reads)

    def __aiter__(self) -> PacedBody:
        return self

    def abort(self) -> bool:
        return False

    async def __anext__(self) -> bytes:
        if not self._reads:
            raise StopAsyncIteration
        delay, data = self._reads.pop(0)
        await trio.sleep(delay)  # the scripted upstream's pace (virtual time)
        return data


def stream(body: PacedBody, *, first_chunk: float, idle: float) -> ChunkStream:
    return ChunkStream(body, first_chunk_deadline=trio.current_time() + first_chunk,
                       first_chunk_timeout=first_chunk, idle_timeout=idle, max_event=4096)


async def consume(chunks: ChunkStream, pause: float = 0.0) -> int:
    seen = 0
    async with chunks.clocks():
        async for batch in chunks:
            seen += len(batch)
            await trio.sleep(pause)  # the consumer's pace
    return seen


async def test_the_first_chunk_clock_fires_at_its_deadline(autojump_clock: object) -> None:
    start = trio.current_time()
    with pytest.raises(UpstreamTimeout) as info:
        await consume(stream(PacedBody((50, CHUNK)), first_chunk=3, idle=60))
    assert info.value.kind == "first_chunk"
    assert trio.current_time() - start == pytest.approx(3)


async def test_a_gap_after_a_slow_first_chunk_is_timed_by_the_idle_clock(
        autojump_clock: object) -> None:
    # The first read may take up to 100 s; the watchdog, waiting for that deadline, must
    # still notice the second read's own 5 s one.
    start = trio.current_time()
    with pytest.raises(UpstreamTimeout) as info:
        await consume(stream(PacedBody((40, CHUNK), (30, CHUNK), (0, DONE)),
                             first_chunk=100, idle=5))
    assert info.value.kind == "idle"
    assert trio.current_time() - start == pytest.approx(45)


async def test_reads_within_the_clocks_and_a_slow_consumer_never_time_out(
        autojump_clock: object) -> None:
    body = PacedBody((0.9, CHUNK), (0.9, CHUNK), (0.9, CHUNK), (0, DONE))
    assert await consume(stream(body, first_chunk=1, idle=1), pause=30) == 3


async def test_an_upstream_error_beside_an_outer_cancel_leaves_unwrapped() -> None:
    # The body ends at once (no checkpoint: the read raises UpstreamMalformed) while the
    # outer scope is cancelled, so the watchdog is cancelled by it, not by its nursery:
    # the nursery's group holds both, and the consumer's error leaves alone.
    chunks = stream(PacedBody(), first_chunk=60, idle=60)

    async def read_in_a_cancelled_scope() -> None:
        with trio.CancelScope() as outer:
            async with chunks.clocks():
                outer.cancel()
                async for _ in chunks:
                    pass

    with pytest.raises(UpstreamMalformed):
        await read_in_a_cancelled_scope()


async def test_a_passed_first_chunk_deadline_yields_to_a_passed_outer_one() -> None:
    # Both passed before the first read began: the outer (the total timeout) ended it.
    chunks = stream(PacedBody((0, CHUNK)), first_chunk=-1, idle=1)
    with trio.CancelScope() as outer:
        outer.cancel()
        await consume(chunks)
    assert outer.cancelled_caught


async def test_an_outer_cancel_alone_is_delivered_to_its_scope() -> None:
    chunks = stream(PacedBody((math.inf, CHUNK)), first_chunk=60, idle=60)
    with trio.move_on_after(0.05) as outer:
        await consume(chunks)
    assert outer.cancelled_caught


class GatedBody:
    """A first chunk at once, then a read parked (like a socket read) until ``gate``."""

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.reads = 0

    def __aiter__(self) -> GatedBody:
        return self

    def abort(self) -> bool:
        return False

    async def __anext__(self) -> bytes:
        self.reads += 1
        if self.reads == 1:
            return CHUNK
        if self.reads == 2:
            await self.gate.wait()
            return CHUNK + DONE
        raise StopAsyncIteration


def test_bytes_that_came_before_the_deadline_win_over_it() -> None:
    """vLLM's bytes arrive 1 ms before the idle deadline, and the deadline passes before
    the reading task has run: not a timeout (the reader was woken in time). trio runs a
    batch of woken tasks in either order, so this runs it many times."""

    async def one(clock: trio.testing.MockClock) -> str:
        body = GatedBody()
        chunks = ChunkStream(body, first_chunk_deadline=trio.current_time() + 10,
                             first_chunk_timeout=10, idle_timeout=5, max_event=4096)
        result = "ok"

        async def consume() -> None:
            nonlocal result
            try:
                await consume_all(chunks)
            except UpstreamTimeout as timeout:
                result = f"timeout {timeout.kind}"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await trio.testing.wait_all_tasks_blocked()  # the second read is parked
            clock.jump(4.999)
            await trio.testing.wait_all_tasks_blocked()
            body.gate.set()  # the bytes, 1 ms before the deadline...
            clock.jump(0.002)  # ...which passes before the reader has run
        return result

    results = set()
    for _ in range(40):
        clock = trio.testing.MockClock()
        results.add(trio.run(one, clock, clock=clock))
    assert results == {"ok"}


async def consume_all(chunks: ChunkStream) -> None:
    async with chunks.clocks():
        async for _ in chunks:
            await trio.lowlevel.checkpoint()


async def test_reading_outside_the_clocks_is_refused() -> None:
    chunks = stream(PacedBody((0, CHUNK)), first_chunk=60, idle=60)
    with pytest.raises(RuntimeError, match="outside its clocks"):
        await chunks.__anext__()


async def test_leaving_early_stops_the_watchdog(autojump_clock: object) -> None:
    chunks = stream(PacedBody((0, CHUNK), (0, CHUNK), (100, CHUNK)), first_chunk=1, idle=1)
    async with chunks.clocks():
        async for _ in chunks:
            break  # the consumer leaves; no timeout may follow it out of the block
    await trio.sleep(10)  # nothing left running would fire now


def test_a_clock_must_run() -> None:
    with pytest.raises(ValueError, match="idle_timeout"):
        ChunkStream(PacedBody(), first_chunk_deadline=0, first_chunk_timeout=1,
                    idle_timeout=0, max_event=4096)


async def batch_sizes(chunks: ChunkStream, sizes: list[int]) -> None:
    async with chunks.clocks():
        async for batch in chunks:
            sizes.append(len(batch))


async def test_chunks_read_together_with_a_mid_stream_error_come_first() -> None:
    # With whole socket reads, a delta and vLLM's error chunk often arrive in one read:
    # the delta must reach the client before the error, as when they came apart.
    error = b'data: {"error":{"message":"EngineCore died","code":500}}\n\n'
    chunks = stream(PacedBody((0, CHUNK), (0, CHUNK + CHUNK + error + CHUNK)),
                    first_chunk=5, idle=5)
    batches: list[int] = []
    with pytest.raises(UpstreamMalformed, match="EngineCore died"):
        await batch_sizes(chunks, batches)
    assert batches == [1, 2]  # the two chunks before the error; none after it


async def test_chunks_read_together_with_a_broken_sse_line_come_first() -> None:
    chunks = stream(PacedBody((0, CHUNK + b"data: " + b"y" * 5000 + b"\n")),
                    first_chunk=5, idle=5)
    batches: list[int] = []
    with pytest.raises(UpstreamMalformed, match="exceeds"):
        await batch_sizes(chunks, batches)
    assert batches == [1]


# --------------------------------------------------------------------------- keep-alive
# vLLM 0.32's --sse-keep-alive-interval writes ": keep-alive\n\n" on a timer, whatever its
# engine does (vllm/entrypoints/serve/utils/sse_keep_alive.py): a comment restarts no clock.
KEEP_ALIVE = b": keep-alive\n\n"


async def test_keep_alive_comments_are_skipped_and_change_nothing(
        autojump_clock: object) -> None:
    body = PacedBody((0.5, KEEP_ALIVE), (0.2, CHUNK), (0.5, KEEP_ALIVE + CHUNK),
                     (0.1, KEEP_ALIVE), (0.1, CHUNK + KEEP_ALIVE), (0, DONE))
    batches: list[int] = []
    await batch_sizes(stream(body, first_chunk=5, idle=5), batches)
    assert batches == [1, 1, 1]


async def test_keep_alive_comments_do_not_hold_off_the_first_chunk_clock(
        autojump_clock: object) -> None:
    # A request queued in vLLM: the frontend says keep-alive every second, no token comes.
    start = trio.current_time()
    chunks = stream(PacedBody(*[(1, KEEP_ALIVE)] * 30, (1, CHUNK), (0, DONE)),
                    first_chunk=10, idle=60)
    with pytest.raises(UpstreamTimeout) as info:
        await consume(chunks)
    assert info.value.kind == "first_chunk"
    assert trio.current_time() - start == pytest.approx(10)
    assert chunks.first_byte_at is None  # a comment is not the first chunk


async def test_keep_alive_comments_do_not_restart_the_idle_clock(
        autojump_clock: object) -> None:
    start = trio.current_time()
    chunks = stream(PacedBody((1, CHUNK), *[(1, KEEP_ALIVE)] * 30, (0, DONE)),
                    first_chunk=10, idle=5)
    with pytest.raises(UpstreamTimeout) as info:
        await consume(chunks)
    assert info.value.kind == "idle"
    assert trio.current_time() - start == pytest.approx(6)  # 5 s after the chunk at 1 s


async def test_a_refusal_as_the_first_event_is_marked_before_output() -> None:
    # vLLM's admission check inside add_request, after its 200 (issue 23, seen live).
    refusal = (b'data: {"error": {"message": "The engine is currently busy and cannot '
               b'accept new requests. Please try again later or on a different instance.", '
               b'"type": "Service Unavailable", "param": null, "code": 503}}\n\n')
    with pytest.raises(UpstreamMalformed) as first:
        await consume(stream(PacedBody((0, refusal + DONE)), first_chunk=5, idle=5))
    assert first.value.before_output and first.value.status == 503
    with pytest.raises(UpstreamMalformed) as later:
        await consume(stream(PacedBody((0, CHUNK), (0, refusal + DONE)), first_chunk=5,
                             idle=5))
    assert not later.value.before_output


class BrokenClock:
    """What ``stream_clocks`` reads of a stream, its idle limit unreadable: a bug in the
    watchdog, which it never raises otherwise."""

    _first_chunk_timeout = _first_chunk_deadline = _read_deadline = math.inf
    _carried_deadline: float | None = None
    _clocked = False
    first_byte_at: float | None = 0.0

    @property
    def _idle_timeout(self) -> float:
        raise LookupError("the watchdog's own bug")


async def test_a_watchdog_bug_beside_the_readers_error_loses_neither() -> None:
    """The reader's error is kept out of the watchdog's nursery (so no cycle holds it);
    a watchdog that fails too is raised beside it, as the nursery would have."""
    from gateway.upstream._clocks import stream_clocks

    async def read() -> None:
        async with stream_clocks(BrokenClock()):
            try:
                await trio.sleep(1)  # the watchdog fails; its nursery cancels the reader
            finally:
                raise ValueError("the reader's cleanup failed")

    with pytest.raises(BaseExceptionGroup) as raised:
        await read()
    kinds = sorted(type(error).__name__ for error in raised.value.exceptions)
    assert kinds == ["LookupError", "ValueError"], raised.value.exceptions
