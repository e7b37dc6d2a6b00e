"""A finished stream gives its connection back to the pool (found by the 1,000-stream soak:
breaking off at ``data: [DONE]`` left each response unfinished, so every request paid a
new connect, and 1,000 streams reconnecting together met connect timeouts)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from gateway.replay import ReplayServer
from gateway.upstream import UpstreamConfig, VllmClient

BODY = {"model": "example-model", "stream": True,
        "messages": [{"role": "user", "content": "reuse"}]}


async def _until_done(chunks: object) -> None:
    async for raw in chunks:  # type: ignore[attr-defined]
        if b"data: [DONE]" in raw:
            return
    raise AssertionError("the stream ended without [DONE]")


@asynccontextmanager
async def backend_and_client(nursery: trio.Nursery, pool_size: int = 256
                             ) -> AsyncIterator[tuple[ReplayServer, VllmClient]]:
    replay = ReplayServer()
    url = await nursery.start(replay.serve)
    client = VllmClient(UpstreamConfig(url, pool_size=pool_size))
    try:
        yield replay, client
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()


async def test_reading_the_trailer_keeps_the_connection(nursery: trio.Nursery) -> None:
    async with backend_and_client(nursery) as (replay, client):
        for number in range(3):
            headers = {"x-request-id": f"replay:timestamped:4:0:reuse-{number}"}
            async with client.stream_chat(BODY, headers) as chunks:
                await _until_done(chunks)
                assert await chunks.read_trailer()
        assert replay.connections == 1


async def test_a_body_that_goes_on_past_the_limit_closes_the_connection(
        nursery: trio.Nursery) -> None:
    async with backend_and_client(nursery) as (replay, client):
        headers = {"x-request-id": "replay:timestamped:20:20000:long"}
        async with client.stream_chat(BODY, headers) as chunks:
            assert await chunks.__anext__()
            # More than max_bytes follows: not a trailer, so the connection is not kept.
            assert not await chunks.read_trailer(max_bytes=0)
        headers = {"x-request-id": "replay:timestamped:2:0:after"}
        async with client.stream_chat(BODY, headers) as chunks:
            await _until_done(chunks)
            assert await chunks.read_trailer()
        assert replay.connections == 2


async def test_a_body_that_stalls_after_done_is_given_up_quickly(
        nursery: trio.Nursery) -> None:
    async with backend_and_client(nursery) as (_, client):
        headers = {"x-request-id": "replay:timestamped:30:100000:slow"}
        async with client.stream_chat(BODY, headers) as chunks:
            assert await chunks.__anext__()
            with trio.fail_after(1):  # TRAILER_WAIT, not the stream's remaining 3 s
                assert not await chunks.read_trailer()


async def test_concurrent_streams_never_open_more_than_the_pool(nursery: trio.Nursery) -> None:
    # Ten streams through four slots: four connections, each reused in turn (one client
    # per connection, see ConnectionSlots), and every slot returned at the end.
    finished: list[int] = []

    async def stream(client: VllmClient, number: int) -> None:
        headers = {"x-request-id": f"replay:timestamped:3:20000:slots-{number}"}
        async with client.stream_chat(BODY, headers) as chunks:
            await _until_done(chunks)
            await chunks.read_trailer()
        finished.append(number)

    async with backend_and_client(nursery, pool_size=4) as (replay, client):
        with trio.fail_after(10):
            async with trio.open_nursery() as streams:
                for number in range(10):
                    streams.start_soon(stream, client, number)
        assert sorted(finished) == list(range(10))
        assert replay.connections == 4
        assert client.slots_in_use == 0
