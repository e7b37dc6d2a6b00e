"""The upstream client alone on transport-level faults, on both request paths (the
client's rule 4): http:// against a scripted loopback server (the project's own HTTP/1.1
client, as production runs it), https:// through respx under the slot's httpx client (no
sockets: the one request path on httpx). What each failure becomes, and that the
first-chunk and idle clocks time reads only."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import respx
import trio
import trio.testing

from gateway.profile import EndCause
from gateway.upstream import (
    UpstreamConfig,
    UpstreamMalformed,
    UpstreamOverloaded,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamUnavailable,
    VllmClient,
    to_profile_error,
)
from gateway.upstream._slots import ConnectionSlots
from tests.support.scripted_http import RESET, Step, fixed_reply, scripted, sse_reply

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
CHUNK = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
         b'"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n')
DONE = b"data: [DONE]\n\n"
SCHEMES = ["http", "https"]


class Body(httpx.AsyncByteStream):
    """A response body scripted as (delay, bytes-or-exception) steps, for respx; the
    exception ``RESET`` is httpx's ReadError there (what a reset is under httpx)."""

    def __init__(self, *steps: Step) -> None:
        self.steps = steps

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for delay, step in self.steps:
            await trio.sleep(delay)  # the scripted body's pace
            if isinstance(step, Exception):
                raise httpx.ReadError("reset by peer") if step is RESET else step
            yield step


@asynccontextmanager
async def answering(scheme: str, status: int = 200, *steps: Step, whole: bytes | None = None
                    ) -> AsyncIterator[VllmClient]:
    """A client whose vLLM answers every POST with ``status`` and a body: ``whole``
    (Content-Length), or else ``steps``, streamed (one HTTP chunk, or one body part,
    per step)."""
    if scheme == "https":
        router = respx.Router(base_url="https://vllm", assert_all_called=False)
        response = (httpx.Response(status, stream=Body((0, whole))) if whole is not None
                    else httpx.Response(status, headers={"content-type": "text/event-stream"},
                                        stream=Body(*steps)))
        router.post(path__regex=r"^/v1/").mock(return_value=response)
        client = VllmClient(UpstreamConfig("https://vllm"),
                            transport=httpx.MockTransport(router.async_handler))
        try:
            yield client
        finally:
            await client.aclose()
        return
    reply = (fixed_reply(status, whole) if whole is not None
             else sse_reply(*steps, head=b"HTTP/1.1 %d X\r\ncontent-type: text/event-stream"
                            b"\r\ntransfer-encoding: chunked\r\n\r\n" % status))
    async with scripted([reply]) as server:
        client = VllmClient(UpstreamConfig(server.url))
        try:
            yield client
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()


async def read_all(client: VllmClient, *, first_chunk: float = 5, idle: float = 5
                   ) -> list[dict[str, object]]:
    chunks: list[dict[str, object]] = []
    async with client.chunks(BODY, {}, first_chunk=first_chunk, idle=idle) as stream:
        async for batch in stream:
            chunks += batch
    return chunks


async def streamed(scheme: str, *steps: Step, first_chunk: float = 5, idle: float = 5,
                   status: int = 200) -> list[dict[str, object]]:
    async with answering(scheme, status, *steps) as client:
        return await read_all(client, first_chunk=first_chunk, idle=idle)


def respx_client(error: Exception) -> VllmClient:
    router = respx.Router(base_url="https://vllm", assert_all_called=False)
    router.post("/v1/chat/completions").mock(side_effect=error)
    return VllmClient(UpstreamConfig("https://vllm"),
                      transport=httpx.MockTransport(router.async_handler))


def unused_port() -> int:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        return int(unused.getsockname()[1])


async def test_connect_refused_is_unavailable() -> None:
    for client in (VllmClient(UpstreamConfig(f"http://127.0.0.1:{unused_port()}")),
                   respx_client(httpx.ConnectError("[Errno 111] Connection refused"))):
        try:
            with pytest.raises(UpstreamUnavailable, match=r"ConnectError: "):
                await read_all(client)
        finally:
            await client.aclose()


async def test_connect_timeout_is_overload_not_unavailable(
        autojump_clock: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A port that does not accept in time is a vLLM too busy to (its accept queue is
    full), not one that is gone: recoverable overload, and readiness keeps it."""
    async def never_accepted(*args: object, **kwargs: object) -> trio.SocketStream:
        await trio.sleep_forever()
        raise AssertionError

    monkeypatch.setattr(trio, "open_tcp_stream", never_accepted)
    for client in (VllmClient(UpstreamConfig("http://127.0.0.1:9")),
                   respx_client(httpx.ConnectTimeout("timed out"))):
        try:
            with pytest.raises(UpstreamOverloaded, match="did not accept"):
                await read_all(client)
        finally:
            await client.aclose()
    assert to_profile_error(UpstreamOverloaded("x")).code is EndCause.BACKEND_OVERLOAD


async def test_busy_slots_refuse_after_the_queue_wait(autojump_clock: object) -> None:
    slots = ConnectionSlots(1, lambda: httpx.AsyncClient())
    held, release = trio.Event(), trio.Event()

    async def holder() -> None:
        async with slots.checkout():
            held.set()
            await release.wait()

    async def gives_up() -> None:
        with pytest.raises(UpstreamOverloaded, match="all 1 upstream connections busy"):
            async with slots.checkout(wait=2.0):
                pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(holder)
        await held.wait()
        nursery.start_soon(gives_up)
        await trio.testing.wait_all_tasks_blocked()
        # What the metrics' pool gauges read (gateway/observe/_metrics.py, POOL_GAUGES).
        assert (slots.size, slots.in_use, slots.waiting, slots.wait_timeouts) == (1, 1, 1, 0)
        await trio.sleep(2.5)
        assert (slots.waiting, slots.wait_timeouts) == (0, 1)
        release.set()
    async with slots.checkout(wait=0.0):  # free again: no wait needed
        assert slots.in_use == 1
    assert slots.wait_timeouts == 1
    await slots.aclose()


async def test_idle_clients_are_pruned_oldest_first(autojump_clock: object) -> None:
    slots = ConnectionSlots(4, lambda: httpx.AsyncClient())
    async with trio.open_nursery() as nursery:
        for delay in (0.0, 1.0, 2.0):
            async def hold(delay: float = delay) -> None:
                async with slots.checkout():
                    await trio.sleep(delay)  # each holds its slot this long (virtual time)
            nursery.start_soon(hold)
    assert slots.idle == 3
    await trio.sleep(3.0)  # idle for 5, 4 and 3 s now
    assert await slots.prune(3.5) == 2 and slots.idle == 1
    await slots.aclose()


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_status_is_parsed_before_any_chunk(scheme: str) -> None:
    error = (b'{"error":{"message":"bad temperature","type":"BadRequestError",'
             b'"param":"temperature","code":400}}')
    async with answering(scheme, 400, whole=error) as client:
        with pytest.raises(UpstreamStatus) as info:
            await read_all(client)
    assert (info.value.status, info.value.param) == (400, "temperature")


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_reset_mid_stream_is_malformed_not_unavailable(scheme: str) -> None:
    with pytest.raises(UpstreamMalformed, match="broke mid-response") as info:
        await streamed(scheme, (0, CHUNK), (0.05, RESET))
    assert info.value.kind == "connection_lost"


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("tail", [b'data: {"id":"c","obj', b"data: [DONE]",
                                  b"data: [DONE]\n"])
async def test_a_truncated_body_without_done_is_malformed(scheme: str, tail: bytes) -> None:
    # An event exists once its blank line has come; the spec discards one the stream
    # ends inside, and vLLM always ends "data: [DONE]\n\n": a [DONE] without its blank
    # line is a body cut short, never the end of the answer.
    with pytest.raises(UpstreamMalformed, match=r"ended before data: \[DONE\]"):
        await streamed(scheme, (0, CHUNK), (0, tail))


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_silent_first_chunk_is_a_first_chunk_timeout(
        scheme: str, autojump_clock: object) -> None:
    with pytest.raises(UpstreamTimeout) as info:
        await streamed(scheme, (60, CHUNK), (0, DONE), first_chunk=2, idle=100)
    assert info.value.kind == "first_chunk"


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_silent_gap_is_an_idle_timeout(scheme: str, autojump_clock: object) -> None:
    with pytest.raises(UpstreamTimeout) as info:
        await streamed(scheme, (0, CHUNK), (30, CHUNK), (0, DONE), first_chunk=100, idle=5)
    assert info.value.kind == "idle"


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_slow_consumer_never_counts_as_vllm_idle(
        scheme: str, autojump_clock: object) -> None:
    # The consumer takes 10 s per batch (a slow NNRP reader); vLLM answers each read at
    # once. The idle clock is 1 s: only time spent *waiting on vLLM* may count against it.
    seen = 0
    steps = ((0, CHUNK), (0, CHUNK), (0, CHUNK), (0, DONE))
    async with (answering(scheme, 200, *steps) as client,
                client.chunks(BODY, {}, first_chunk=1, idle=1) as stream):
        async for batch in stream:
            seen += len(batch)
            await trio.sleep(10)  # the slow consumer (virtual time)
    assert seen == 3


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_chunk_split_anywhere_gives_the_same_chunks(scheme: str) -> None:
    # Cuts inside "data:", inside the JSON, between the two newlines, inside [DONE]
    # (every cut is the SSE decoder's own test; these are the stream's seams). The
    # second part comes a little later, so it is a read of its own.
    whole = CHUNK * 3 + DONE
    for cut in (1, 4, 6, 40, len(CHUNK) - 1, len(CHUNK), 2 * len(CHUNK) + 3, len(whole) - 5):
        chunks = await streamed(scheme, (0, whole[:cut]), (0.005, whole[cut:]))
        assert len(chunks) == 3, cut


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_non_streaming_body_is_checked(scheme: str) -> None:
    async with answering(scheme, 200, whole=b'{"object":"list"}') as client:
        with pytest.raises(UpstreamMalformed, match=r"not 'chat\.completion'"):
            await client.completion({"model": "m", "messages": []}, {})
