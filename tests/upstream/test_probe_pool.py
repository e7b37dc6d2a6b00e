"""Probes never queue behind streaming requests (found by the 1,000-stream soak)."""

from __future__ import annotations

import trio

from gateway.tools.replay import ReplayServer
from gateway.upstream import UpstreamConfig, VllmClient
from tests.support.waits import until

BODY = {"model": "example-model", "stream": True,
        "messages": [{"role": "user", "content": "hold the only pooled connection"}]}


async def test_health_answers_while_the_request_pool_is_full(nursery: trio.Nursery) -> None:
    url = await nursery.start(ReplayServer().serve)
    client = VllmClient(UpstreamConfig(url, pool_size=1))
    try:
        # Five tokens five seconds apart: the single pooled connection stays busy for
        # twenty seconds after the first (the test leaves the stream as soon as the probes
        # are answered, so the length costs nothing).
        headers = {"x-request-id": "replay:timestamped:5:5000000:pool"}
        async with client.chunks(BODY, headers, first_chunk=10, idle=10) as chunks:
            first = await chunks.__anext__()
            assert first
            with trio.fail_after(10):  # well under the stream's remaining twenty seconds
                assert await client.health()
                assert (await client.get_json("/version"))["version"]
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()


async def test_requests_beyond_the_pool_wait_their_turn(nursery: trio.Nursery) -> None:
    # Past the pool, a request waits (under the operation's own deadlines) instead of
    # failing after a pool timeout, and is served in its turn.
    url = await nursery.start(ReplayServer().serve)
    client = VllmClient(UpstreamConfig(url, pool_size=1, connect_timeout=0.5))
    finished: list[str] = []

    async def stream(name: str, interval_us: int) -> None:
        headers = {"x-request-id": f"replay:timestamped:3:{interval_us}:{name}"}
        async with client.chunks(BODY, headers, first_chunk=5, idle=5) as chunks:
            async for _ in chunks:
                pass
        finished.append(name)

    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as streams:
                streams.start_soon(stream, "first", 500_000)  # holds the slot ~1.5 s
                await until(lambda: client.slots_in_use == 1)
                streams.start_soon(stream, "second", 1_000)  # waits past connect_timeout
        assert finished == ["first", "second"]
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()
