"""Flow control through the whole stack: the client's pause holds the gateway's output and
reaches the replay vLLM's socket; resume delivers everything, in order."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import trio

from gateway import nnrp
from gateway.tools.replay._synthesize import WORDS
from tests.support.stack import Stack, chat, envelope
from tests.support.waits import until_steady

if TYPE_CHECKING:
    from gateway.tools.client import ClientSession



class Received(list[tuple[float, Any]]):
    """An operation's events with their arrival times, and a way to wait for more."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = trio.Event()

    async def consume(self, operation: Any) -> None:
        async for event in operation.events():
            self.append((trio.current_time(), event))
            self._changed.set()
            self._changed = trio.Event()

    async def until(self, done: Callable[[], bool]) -> None:
        while not done():
            await self._changed.wait()

    async def quiet_for(self, seconds: float) -> None:
        """Return once no event has arrived for `seconds`: what was already on the wire (the
        sockets between the processes hold megabytes) has been read, however slow the host."""
        while True:
            with trio.move_on_after(seconds):
                await self._changed.wait()
                continue
            return

    @property
    def partials(self) -> list[nnrp.PartialReceived]:
        return [e for _, e in self if isinstance(e, nnrp.PartialReceived)]

    @property
    def ended(self) -> bool:
        return bool(self) and not isinstance(self[-1][1], nnrp.PartialReceived)


async def test_pause_holds_output_resume_loses_nothing(stack: Stack,
                                                       session: ClientSession) -> None:
    # A stream that never ends by itself: the pause holds it however long it lasts and
    # however fast the host; the test ends it (a cancel) once it has resumed.
    request_id = "replay:long_stream:pause"
    operation = await session.submit(envelope(chat(stream=True), request_id=request_id))
    received = Received()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(received.consume, operation)
        with trio.fail_after(10):
            await received.until(lambda: len(received.partials) >= 50)
        await session.backpressure(nnrp.PressureLevel.PAUSED)
        with trio.fail_after(60):
            # vLLM's side is held too: its writes stop once the sockets between it and
            # the client are full (what was already on the wire has then been read).
            await until_steady(lambda: (stack.replay.playing[request_id].sent,
                                        len(received)), steady_for=0.5)
        settled = len(received.partials)
        sent_then = stack.replay.playing[request_id].sent
        await trio.sleep(1.0)  # a window in which nothing may move while paused
        assert len(received.partials) == settled
        assert stack.replay.playing[request_id].sent == sent_then
        await session.resume()
        with trio.fail_after(30):
            # Output flows again, past everything vLLM had written while paused.
            await received.until(lambda: len(received.partials) > sent_then + 100)
        await operation.cancel()
        with trio.fail_after(10):
            await received.until(lambda: received.ended)
    partials = received.partials
    assert [p.sequence for p in partials] == list(range(1, len(partials) + 1))
    deltas = [json.loads(p.body) for p in partials]
    text = [d["delta"] for d in deltas if d["type"] == "response.output_text.delta"]
    assert len(text) > sent_then + 50
    # Every token vLLM wrote, in its order (the replay cycles through its sentence).
    assert text == [WORDS[i % len(WORDS)] for i in range(len(text))]
    assert isinstance(received[-1][1], nnrp.DropReceived)
    assert received[-1][1].drop_reason == nnrp.DropReason.PEER_CANCELLED


async def test_credit_window_sends_exactly_the_grant(stack: Stack,
                                                     session: ClientSession) -> None:
    """A session window of N lets exactly N more partials out; a new grant N more."""
    await session.credit(5)
    operation = await session.submit(envelope(chat(stream=True, max_tokens=40),
                                              request_id="replay:text_stream:credit"))
    received = Received()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(received.consume, operation)
        with trio.fail_after(10):
            await received.until(lambda: len(received.partials) >= 5)
            await received.quiet_for(0.5)
        assert len(received.partials) == 5
        await session.credit(7)
        with trio.fail_after(10):
            await received.until(lambda: len(received.partials) >= 12)
            await received.quiet_for(0.5)
        assert len(received.partials) == 12
        await session.credit(1000)
        with trio.fail_after(10):
            await received.until(lambda: received.ended)
    partials = received.partials
    assert [p.sequence for p in partials] == list(range(1, len(partials) + 1))
    assert isinstance(received[-1][1], nnrp.ResultReceived)


@pytest.mark.parametrize("window", ["session", "operation", "paused"])
@pytest.mark.parametrize("control", ["cancel", "deadline"])
async def test_a_cancel_or_deadline_ends_an_operation_held_at_zero_credit(
        stack: Stack, session: ClientSession, window: str, control: str) -> None:
    """Issue 26: while the client holds the window at 0, a CANCEL or an expired DEADLINE
    ends the operation as it would unpaused: its drop comes, and vLLM's request is
    aborted, without any further credit (the wait on credit is the operation's own
    cancel scope, which both end)."""
    request_id = f"replay:long_stream:zero-{window}-{control}"
    granted = 4
    if window == "session":
        await session.credit(granted)
    operation = await session.submit(envelope(chat(stream=True), request_id=request_id))
    if window == "operation":
        await session.credit(granted, operation_id=operation.operation_id)
    received = Received()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(received.consume, operation)
        with trio.fail_after(10):
            await received.until(lambda: len(received.partials) >= granted)
        if window == "paused":
            await session.backpressure(nnrp.PressureLevel.PAUSED)
        client = session.client
        if control == "cancel":
            await operation.cancel()
        else:  # already passed when it arrives: it applies at once
            await client.send(client.sans_io.deadline(
                session.session_id, operation.operation_id, int(time.time() * 1000)))
        # No credit is granted from here on: only the control can end it.
        with trio.fail_after(10):
            await received.until(lambda: received.ended)
            await stack.replay.wait_until(lambda: any(
                d.request_id == request_id for d in stack.replay.disconnects))
    ended = received[-1][1]
    assert isinstance(ended, nnrp.DropReceived)
    assert ended.drop_reason == (nnrp.DropReason.PEER_CANCELLED if control == "cancel"
                                 else nnrp.DropReason.DEADLINE_EXPIRED)
    if window != "paused":  # (a pause lands after whatever was already on its way)
        assert len(received.partials) == granted
