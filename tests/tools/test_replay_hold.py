"""The replay vLLM's holds: a reply waits where it is told until released, or until its
client leaves; tests that act while a reply runs rely on exactly that."""

from __future__ import annotations

import functools
import json

import httpx
import pytest
import trio

from gateway.tools.replay import ReplayServer

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "max_tokens": 6}


@pytest.fixture
async def replay(nursery: trio.Nursery) -> ReplayServer:
    server = ReplayServer(speed=50.0)
    await nursery.start(server.serve)
    return server


async def stream(replay: ReplayServer, request_id: str, chunks: list[bytes]) -> None:
    async with httpx.AsyncClient(base_url=replay.url, trust_env=False) as client, \
            client.stream("POST", "/v1/chat/completions", json=CHAT,
                          headers={"x-request-id": request_id}) as response:
        async for chunk in response.aiter_raw():
            chunks.append(chunk)


async def test_a_stream_waits_after_its_nth_chunk_until_released(
        replay: ReplayServer) -> None:
    hold = replay.hold(lambda request: request.headers.get("x-request-id") == "held",
                       after=3)
    chunks: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream, replay, "held", chunks)
        with trio.fail_after(5):
            await replay.wait_until(lambda: hold.waiting == ["held"])
        assert replay.playing["held"].sent == 3  # the role chunk and two tokens
        assert "held" not in replay.completed
        other: list[bytes] = []
        with trio.fail_after(5):
            await stream(replay, "other", other)  # not matched: not held
        hold.release()
    assert b"".join(chunks).endswith(b"data: [DONE]\n\n")
    with trio.fail_after(5):
        await replay.wait_until(lambda: "held" in replay.completed)
    assert not hold.waiting and not replay.disconnects


async def test_a_held_answer_sends_nothing_and_its_client_leaving_is_a_disconnect(
        replay: ReplayServer) -> None:
    hold = replay.hold(lambda request: request.path == "/v1/completions")
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 4}
    async with httpx.AsyncClient(base_url=replay.url, trust_env=False) as client, \
            trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(client.post, "/v1/completions", json=body))
        with trio.fail_after(5):
            await replay.wait_for_requests(1)  # routed, though not answered
            await replay.wait_until(lambda: hold.waiting)
        assert replay.playing  # answering, and nothing of the answer sent
        nursery.cancel_scope.cancel()  # the client leaves
    with trio.fail_after(5):
        await replay.wait_until(lambda: replay.disconnects)
    (disconnect,) = replay.disconnects
    assert (disconnect.scenario, disconnect.chunks_sent) == ("text_completion", 0)
    assert not hold.released and not hold.waiting


async def test_a_released_hold_holds_nothing_more(replay: ReplayServer) -> None:
    hold = replay.hold(lambda request: request.method == "POST", after=1)
    hold.release()
    chunks: list[bytes] = []
    with trio.fail_after(5):
        await stream(replay, "later", chunks)
    events = [json.loads(line[6:]) for line in b"".join(chunks).split(b"\n\n")
              if line.startswith(b"data: {")]
    assert len(events) == 1 + 6 + 1  # role, six tokens, usage

