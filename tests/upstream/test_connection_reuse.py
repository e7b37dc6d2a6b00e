"""A finished stream gives its connection back to the pool (found by the 1,000-stream soak:
breaking off at ``data: [DONE]`` left each response unfinished, so every request paid a
new connect, and 1,000 streams reconnecting together met connect timeouts)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import respx
import trio

from gateway.tools.replay import ReplayServer
from gateway.upstream import UpstreamConfig, VllmClient
from tests.support.scripted_http import ScriptedServer, scripted

BODY = {"model": "example-model", "stream": True,
        "messages": [{"role": "user", "content": "reuse"}]}


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


async def _read_to_done(client: VllmClient, request_id: str) -> int:
    chunks = 0
    async with client.chunks(BODY, {"x-request-id": request_id}, first_chunk=5,
                             idle=5) as stream:
        async for batch in stream:
            chunks += len(batch)
        assert stream.done
    return chunks


async def test_a_stream_read_to_done_keeps_its_connection(nursery: trio.Nursery) -> None:
    async with backend_and_client(nursery) as (replay, client):
        for number in range(3):
            assert await _read_to_done(client, f"replay:timestamped:4:0:reuse-{number}") >= 4
        assert replay.connections == 1


async def test_a_stream_left_before_done_closes_its_connection(nursery: trio.Nursery) -> None:
    # Leaving early is vLLM's abort: the socket must close, never go back to the pool.
    async with backend_and_client(nursery) as (replay, client):
        headers = {"x-request-id": "replay:timestamped:20:20000:left"}
        async with client.chunks(BODY, headers, first_chunk=5, idle=5) as stream:
            assert await stream.__anext__()
        await _read_to_done(client, "replay:timestamped:2:0:after")
        assert replay.connections == 2


CHUNK = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
         b'"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n')
DONE = b"data: [DONE]\n\n"


class StallsAfterDone(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield CHUNK
        yield DONE
        await trio.sleep(30)  # the stall: the terminator never comes


async def stalls_after_done(stream: trio.SocketStream) -> None:
    await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                          b"transfer-encoding: chunked\r\n\r\n")
    for event in (CHUNK, DONE):
        await stream.send_all(b"%x\r\n%s\r\n" % (len(event), event))
    await trio.sleep(30)  # the stall: the terminator never comes


@asynccontextmanager
async def stalling_vllm(scheme: str) -> AsyncIterator[tuple[VllmClient, ScriptedServer | None]]:
    """A vLLM that stalls after [DONE]: over the project's own http:// client, or through
    respx under an https:// slot's httpx client."""
    if scheme == "https":
        router = respx.Router(base_url="https://vllm")
        router.post("/v1/chat/completions").mock(side_effect=lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=StallsAfterDone()))
        client = VllmClient(UpstreamConfig("https://vllm"), transport=httpx.MockTransport(
            router.async_handler))
        try:
            yield client, None
        finally:
            await client.aclose()
        return
    async with scripted([stalls_after_done, stalls_after_done]) as server:
        client = VllmClient(UpstreamConfig(server.url))
        try:
            yield client, server
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_a_body_that_stalls_after_done_is_given_up_quickly(scheme: str) -> None:
    # vLLM sends the chunked terminator right after [DONE]; a server that does not is not
    # waited for past TRAILER_WAIT (and its connection is then closed, not pooled).
    async with stalling_vllm(scheme) as (client, server):
        for _ in range(2):
            # TRAILER_WAIT (0.25 s), not the body's remaining 30 s: the bound is a third of
            # the stall, forty trailer waits, for a busy host.
            with trio.fail_after(10):
                async with client.chunks(BODY, {}, first_chunk=5, idle=5) as stream:
                    batches = [batch async for batch in stream]
            assert [chunk["choices"][0]["delta"]["content"] for [chunk] in batches] == ["hi"]
        if server is not None:
            assert server.connections == 2  # not reused


async def test_concurrent_streams_never_open_more_than_the_pool(nursery: trio.Nursery) -> None:
    # Ten streams through four slots: four connections, each reused in turn (one client
    # per connection, see ConnectionSlots), and every slot returned at the end.
    finished: list[int] = []

    async def stream(client: VllmClient, number: int) -> None:
        await _read_to_done(client, f"replay:timestamped:3:20000:slots-{number}")
        finished.append(number)

    async with backend_and_client(nursery, pool_size=4) as (replay, client):
        with trio.fail_after(10):
            async with trio.open_nursery() as streams:
                for number in range(10):
                    streams.start_soon(stream, client, number)
        assert sorted(finished) == list(range(10))
        assert replay.connections == 4
        assert client.slots_in_use == 0


async def test_credentials_in_the_url_are_sent_as_basic_auth(nursery: trio.Nursery) -> None:
    # The http:// request slots are the project's own client, not httpx's, which turned
    # http://user:pass@host into an Authorization header; the static headers do it now.
    replay = ReplayServer()
    url = await nursery.start(replay.serve)
    client = VllmClient(UpstreamConfig(url.replace("http://", "http://us%40er:p%3Ass@")))
    try:
        await _read_to_done(client, "replay:timestamped:2:0:credentials")
        answer = await client.completion({**BODY, "stream": False},
                                         {"x-request-id": "unary"})
        assert answer.body["object"] == "chat.completion"
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()
    expected = "Basic " + base64.b64encode(b"us@er:p:ss").decode()
    posts = [r for r in replay.requests if r.method == "POST"]
    assert [r.headers["authorization"] for r in posts] == [expected, expected]
