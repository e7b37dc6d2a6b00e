"""The upstream client alone, on transport-level faults, through respx (no sockets): what each
failure becomes, and that the first-chunk and idle clocks time reads only."""

from __future__ import annotations

from collections.abc import AsyncIterator

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

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
CHUNK = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
         b'"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n')
DONE = b"data: [DONE]\n\n"


class Body(httpx.AsyncByteStream):
    """A response body scripted as (delay, bytes-or-exception) steps."""

    def __init__(self, *steps: tuple[float, bytes | Exception]) -> None:
        self.steps = steps

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for delay, step in self.steps:
            await trio.sleep(delay)  # the scripted body's pace
            if isinstance(step, Exception):
                raise step
            yield step


def client_for(*, response: httpx.Response | None = None, error: Exception | None = None
               ) -> VllmClient:
    router = respx.Router(base_url="http://vllm", assert_all_called=False)
    route = router.post("/v1/chat/completions")
    if error is not None:
        route.mock(side_effect=error)
    else:
        route.mock(return_value=response)
    return VllmClient(UpstreamConfig("http://vllm"),
                      transport=httpx.MockTransport(router.async_handler))


def sse(*steps: tuple[float, bytes | Exception]) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"},
                          stream=Body(*steps))


async def read_all(client: VllmClient, *, first_chunk: float = 5, idle: float = 5
                   ) -> list[dict[str, object]]:
    chunks: list[dict[str, object]] = []
    try:
        async with client.chunks(BODY, {}, first_chunk=first_chunk, idle=idle) as stream:
            async for batch in stream:
                chunks += batch
    finally:
        await client.aclose()
    return chunks


async def test_connect_refused_is_unavailable() -> None:
    client = client_for(error=httpx.ConnectError("[Errno 111] Connection refused"))
    with pytest.raises(UpstreamUnavailable, match="ConnectError"):
        await read_all(client)


async def test_connect_timeout_is_overload_not_unavailable() -> None:
    """A port that does not accept in time is a vLLM too busy to (its accept queue is
    full), not one that is gone: recoverable overload, and readiness keeps it."""
    client = client_for(error=httpx.ConnectTimeout("timed out"))
    with pytest.raises(UpstreamOverloaded, match="did not accept"):
        await read_all(client)
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


async def test_a_status_is_parsed_before_any_chunk() -> None:
    client = client_for(response=httpx.Response(400, stream=Body((0, (
        b'{"error":{"message":"bad temperature","type":"BadRequestError",'
        b'"param":"temperature","code":400}}')))))
    with pytest.raises(UpstreamStatus) as info:
        await read_all(client)
    assert (info.value.status, info.value.param) == (400, "temperature")


async def test_a_reset_mid_stream_is_malformed_not_unavailable() -> None:
    client = client_for(response=sse((0, CHUNK), (0, httpx.ReadError("reset by peer"))))
    with pytest.raises(UpstreamMalformed, match="broke mid-response") as info:
        await read_all(client)
    assert info.value.kind == "connection_lost"


@pytest.mark.parametrize("tail", [b'data: {"id":"c","obj', b"data: [DONE]",
                                  b"data: [DONE]\n"])
async def test_a_truncated_body_without_done_is_malformed(tail: bytes) -> None:
    # An event exists once its blank line has come; the spec discards one the stream
    # ends inside, and vLLM always ends "data: [DONE]\n\n": a [DONE] without its blank
    # line is a body cut short, never the end of the answer.
    client = client_for(response=sse((0, CHUNK), (0, tail)))
    with pytest.raises(UpstreamMalformed, match=r"ended before data: \[DONE\]"):
        await read_all(client)


async def test_a_silent_first_chunk_is_a_first_chunk_timeout(autojump_clock: object) -> None:
    client = client_for(response=sse((60, CHUNK), (0, DONE)))
    with pytest.raises(UpstreamTimeout) as info:
        await read_all(client, first_chunk=2, idle=100)
    assert info.value.kind == "first_chunk"


async def test_a_silent_gap_is_an_idle_timeout(autojump_clock: object) -> None:
    client = client_for(response=sse((0, CHUNK), (30, CHUNK), (0, DONE)))
    with pytest.raises(UpstreamTimeout) as info:
        await read_all(client, first_chunk=100, idle=5)
    assert info.value.kind == "idle"


async def test_a_slow_consumer_never_counts_as_vllm_idle(autojump_clock: object) -> None:
    # The consumer takes 10 s per batch (a slow NNRP reader); vLLM answers each read at
    # once. The idle clock is 1 s: only time spent *waiting on vLLM* may count against it.
    client = client_for(response=sse((0, CHUNK), (0, CHUNK), (0, CHUNK), (0, DONE)))
    seen = 0
    async with client.chunks(BODY, {}, first_chunk=1, idle=1) as stream:
        async for batch in stream:
            seen += len(batch)
            await trio.sleep(10)  # the slow consumer (virtual time)
    await client.aclose()
    assert seen == 3


async def test_a_chunk_split_anywhere_gives_the_same_chunks() -> None:
    # Cuts inside "data:", inside the JSON, between the two newlines, inside [DONE]
    # (every cut is the SSE decoder's own test; these are the stream's seams).
    whole = CHUNK * 3 + DONE
    for cut in (1, 4, 6, 40, len(CHUNK) - 1, len(CHUNK), 2 * len(CHUNK) + 3, len(whole) - 5):
        client = client_for(response=sse((0, whole[:cut]), (0, whole[cut:])))
        chunks = await read_all(client)
        assert len(chunks) == 3, cut


async def test_a_non_streaming_body_is_checked() -> None:
    client = client_for(response=httpx.Response(200, stream=Body((0, b'{"object":"list"}'))))
    with pytest.raises(UpstreamMalformed, match=r"not 'chat\.completion'"):
        await client.completion({"model": "m", "messages": []}, {})
    await client.aclose()
