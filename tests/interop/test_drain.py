"""A drain that loses nothing for nnrp-py's native client (issue 17).

The native client raises on the end of stream before it hands over frames it has
received but not yet polled. So after SIGTERM the gateway finishes what is in flight,
refuses new work recoverably, and leaves each connection for its client to close before
it closes it itself (bounded by the drain time).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

pytest.importorskip("nnrp.client.native")

from gateway.tools.replay import ReplayServer
from tests.support.native import native_connection, open_session, openai_submit, poll_once
from tests.support.quic import Pki, start_quic_stack
from tests.support.stack import Stack, chat, envelope
from tests.support.waits import until

pytestmark = pytest.mark.interop
TOKENS = 30
#: Chunks (the role chunk, then tokens) the stream sends before it is held until the drain
#: has begun: the stream is in flight when it begins, whatever the host's speed.
HELD_AFTER = 6


async def drained_stack(nursery: trio.Nursery, tmp_path: Path, **config: Any
                        ) -> tuple[Stack, Pki]:
    """The whole stack on tcp, unix, ws and quic (its certificate: the client's trust)."""
    return await start_quic_stack(nursery, tmp_path,
                                  replay=ReplayServer(token_interval_ms=25.0), **config)


def slow_reader(uri: str, transport: str, trusted_der: bytes, started: trio.Event,
                token: trio.lowlevel.TrioToken) -> dict[str, Any]:
    """Stream one request, polling only every 150 ms (a busy application), then try a
    second submit and a second session while draining, then close."""
    with native_connection(transport, uri, trusted_der=trusted_der) as connection:
        session = open_session(connection)
        session.submit_operation(openai_submit(1, 1, envelope(
            chat(stream=True, max_tokens=TOKENS), request_id="replay:text_stream:drain")))
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
                e.get("frame_id") == 1 and e["kind"] == "RESULT_PUSH" for e in events):
            events += poll_once(session, timeout_ms=5)
            if len(events) >= 3 and not started.is_set():
                trio.from_thread.run_sync(started.set, trio_token=token)
            time.sleep(0.15)  # the slow reader's pace: what this test is about
        # The drain is on: new work is refused in a form that says "try again elsewhere".
        session.submit_operation(openai_submit(2, 2, envelope(chat(stream=True))))
        later: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not any(
                e.get("frame_id") == 2 and e["kind"] == "RESULT_PUSH" for e in later):
            later += poll_once(session)
        session.close()
    return {"events": [e for e in events if e["kind"] != "lifecycle"],
            "later": [e for e in later if e["kind"] != "lifecycle"]}


@pytest.mark.parametrize("transport", ["tcp", "ipc", "websocket", "quic"])
async def test_every_in_flight_frame_reaches_a_slow_reader(nursery: trio.Nursery,
                                                           tmp_path: Path,
                                                           transport: str) -> None:
    stack, pki = await drained_stack(nursery, tmp_path, drain_timeout=20.0)
    hold = stack.replay.hold(
        lambda request: request.headers.get("x-request-id") == "replay:text_stream:drain",
        after=HELD_AFTER)
    started = trio.Event()
    result: dict[str, Any] = {}
    drained = trio.Event()

    async def client() -> None:
        result.update(await trio.to_thread.run_sync(
            slow_reader, stack.uri(transport), transport, pki.der, started,
            trio.lowlevel.current_trio_token()))

    async def drain() -> None:
        await stack.gateway.drain()
        drained.set()

    async with trio.open_nursery() as inner:
        inner.start_soon(client)
        with trio.fail_after(30):
            await started.wait()
            await stack.replay.wait_until(lambda: hold.waiting)
            # The stream is held mid-way: in flight as the drain begins.
            assert stack.gateway.server.stats.inflight == 1
            began = trio.current_time()
            inner.start_soon(drain)
            await until(lambda: not stack.gateway.server.accepting)
            hold.release()
            await drained.wait()
        drained_after = trio.current_time() - began
    first = [e for e in result["events"] if e["frame_id"] == 1]
    assert [e["kind"] for e in first] == ["PARTIAL_RESULT"] * TOKENS + ["RESULT_PUSH"]
    assert first[-1]["status"] == 200
    refused = [e["kind"] for e in result["later"] if e["frame_id"] == 2]
    assert refused == ["ERROR_RECOVERABLE", "RETRY_AFTER", "RESULT_PUSH"]
    # The gateway waited for the client to close, and no longer than the drain allows.
    assert drained_after < 20


@pytest.mark.parametrize("transport", ["tcp", "quic"])
async def test_a_client_that_never_closes_is_closed_after_the_grace(nursery: trio.Nursery,
                                                                    tmp_path: Path,
                                                                    transport: str) -> None:
    stack, pki = await drained_stack(nursery, tmp_path, drain_timeout=10.0,
                                     drain_close_grace=0.5)
    uri = stack.uri(transport)
    release = trio.Event()
    drained = threading.Event()
    token = trio.lowlevel.current_trio_token()

    def idle_client() -> list[dict[str, Any]]:
        try:
            return hold_open()
        except Exception:
            return []

    def hold_open() -> list[dict[str, Any]]:
        with native_connection(transport, uri, trusted_der=pki.der) as connection:
            session = open_session(connection)
            session.submit_operation(openai_submit(1, 1, envelope(chat(stream=True,
                                                                       max_tokens=3))))
            events: list[dict[str, Any]] = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(
                    e["kind"] == "RESULT_PUSH" for e in events):
                events += poll_once(session)
            trio.from_thread.run_sync(release.set, trio_token=token)
            # Holds the connection open until the drain is over, never closes it itself
            # first (a fixed 3 s hold ended the drain by itself at 3 s, which held the
            # bound below to 2 s: a busy host missed it).
            drained.wait(60)
            return events

    async with trio.open_nursery() as inner:
        inner.start_soon(trio.to_thread.run_sync, idle_client)
        try:
            with trio.fail_after(30):
                await release.wait()
                began = trio.current_time()
                await stack.gateway.drain()
            took = trio.current_time() - began
        finally:
            drained.set()
    # The grace (0.5 s), then closed: the bound is ten graces, half the drain time (what
    # a gateway that ignored the grace would take), so a busy host cannot miss it.
    assert 0.4 < took < 5.0
