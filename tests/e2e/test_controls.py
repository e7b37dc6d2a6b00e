"""Runtime controls through the whole stack, where timing matters: a supersede whose
replacement never comes (its upstream closed as the hold begins, its drop at the hold's
end), and one whose replacement does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from gateway import nnrp
from gateway.nnrp import ServerConfig
from gateway.pipeline import PipelineLimits
from gateway.profile import EndCause
from gateway.tools.client import connect
from tests.support.stack import chat, envelope, live_operations, records_of, start_stack


def supersede(session_id: int, old: int, new: int) -> bytes:
    return nnrp.encode(nnrp.Packet(nnrp.Supersede(
        old_operation_id=old, new_operation_id=new, control_sequence=1,
        diagnostic_bytes=5), session_id=session_id, body=b"newer"))


async def test_a_replacement_that_never_comes(nursery: trio.Nursery, tmp_path: Path) -> None:
    stack = await start_stack(nursery, tmp_path, server=ServerConfig(supersede_hold_ms=300),
                              pipeline=PipelineLimits(first_chunk_timeout=5))
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        operation = await session.submit(envelope(chat(stream=True), request_id=(
            "replay:long_stream:held")), operation_id=1)
        events: list[Any] = []
        with trio.fail_after(10):
            async for event in operation.events():
                events.append(event)
                if len(events) == 3:
                    await client.send(supersede(session.session_id, 1, 99))
                    held_at = trio.current_time()
        ended = trio.current_time()
    drop = events[-1]
    assert isinstance(drop, nnrp.DropReceived)
    # The server's own decision (the wait is over), so the reason's name, not the client's.
    assert (drop.drop_reason, drop.diagnostic) == (nnrp.DropReason.SUPERSEDED, b"superseded")
    assert 0.25 < ended - held_at < 3  # the hold, then the drop
    # Nothing of it reached the client while it waited for the replacement.
    assert all(isinstance(e, nnrp.PartialReceived) for e in events[:-1])
    with trio.fail_after(5):
        await stack.replay.wait_until(lambda: stack.replay.disconnects)
    assert stack.replay.disconnects[0].request_id == "replay:long_stream:held"


async def test_a_held_supersede_closes_the_upstream_at_once(nursery: trio.Nursery,
                                                             tmp_path: Path) -> None:
    """Issue 26: while a SUPERSEDE waits for its replacement (the default 5 s hold),
    nothing of the old operation can reach the client, so vLLM must not go on generating
    it: the upstream is closed as the hold begins. The replay vLLM sees the disconnect
    while the gateway still holds the operation (no terminal yet, on either side); the
    superseded drop comes only when the hold is over."""
    hold_s = ServerConfig().supersede_hold_ms / 1000
    stack = await start_stack(nursery, tmp_path, pipeline=PipelineLimits(first_chunk_timeout=5))
    records = records_of(stack)
    request_id = "replay:long_stream:held-upstream"
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        operation = await session.submit(envelope(chat(stream=True), request_id=request_id),
                                         operation_id=1)
        events: list[Any] = []
        with trio.fail_after(10):
            async for event in operation.events():
                events.append(event)
                if len(events) == 3:
                    break
        (held,) = live_operations(stack.gateway)
        superseded_at = trio.current_time()
        await client.send(supersede(session.session_id, 1, 99))
        with trio.fail_after(hold_s * 4):  # bounds the wait; the order below is the test
            await stack.replay.wait_until(lambda: any(
                d.request_id == request_id for d in stack.replay.disconnects))
        # vLLM was told while the operation still waits for its replacement.
        assert held.end_cause is None and not held.is_terminal
        assert held.superseded
        assert operation.terminal is None
        with trio.fail_after(hold_s * 4):
            async for event in operation.events():
                events.append(event)
        ended = trio.current_time()
    drop = events[-1]
    assert isinstance(drop, nnrp.DropReceived)
    assert (drop.drop_reason, drop.diagnostic) == (nnrp.DropReason.SUPERSEDED, b"superseded")
    # The drop still waited for the whole hold (the replacement might have come).
    assert ended - superseded_at >= hold_s
    (record,) = [r for r in records if r.operation_id == 1]
    assert record.end_cause is EndCause.SUPERSEDED
    assert record.upstream_aborted


async def test_a_replacement_that_comes(nursery: trio.Nursery, tmp_path: Path) -> None:
    stack = await start_stack(nursery, tmp_path)
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        old = await session.submit(envelope(chat(stream=True), request_id=(
            "replay:long_stream:old"), nnrp_policy={"progress": True}), operation_id=1)
        seen: list[Any] = []
        with trio.fail_after(10):
            async for event in old.events():
                seen.append(event)
                if len(seen) == 3:
                    await client.send(supersede(session.session_id, 1, 2))
                    new = await session.submit(envelope(chat(stream=True, max_tokens=3)),
                                               operation_id=2)
        assert isinstance(seen[-1], nnrp.DropReceived)
        assert seen[-1].drop_reason == nnrp.DropReason.SUPERSEDED
        replacement = [event async for event in new.events()]
    assert isinstance(replacement[-1], nnrp.ResultReceived)
    assert replacement[-1].meta.status_code == 200
    # No PROGRESS for the old operation after the SUPERSEDE (its client holds it ended).
    progress = [e.packet for e in client.others if isinstance(e, nnrp.OtherReceived)
                and e.packet.msg_type is nnrp.MsgType.PROGRESS
                and e.packet.message.operation_id == 1]
    assert all(p.message.stage != int(nnrp.Stage.DROPPED) for p in progress)
