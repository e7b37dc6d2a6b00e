"""Issue 23's refusals through nnrp-py's native client (the protocol authors' client):
vLLM's own 503, and load-aware admission's refusal before vLLM, each arrive as
ERROR_RECOVERABLE + RETRY_AFTER before a 503 RESULT_PUSH, and the session the client
holds keeps serving the next operation."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

pytest.importorskip("nnrp")

from gateway.app import LoadSettings
from gateway.tools.replay import ReplayServer
from tests.support.native import (
    native_connection,
    open_session,
    openai_submit,
    poll_once,
)
from tests.support.stack import chat, envelope, scenario_id, start_stack


def _two_operations(uri: str, first: bytes,
                    between: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
    """Operation 1 (the refused one), ``between``, then operation 2, on one native
    session."""
    with native_connection("tcp", uri) as connection:
        session = open_session(connection)
        events: list[dict[str, Any]] = []

        def ended(frame_id: int) -> bool:
            return any(e.get("frame_id") == frame_id and e["kind"] == "RESULT_PUSH"
                       for e in events)

        end = time.monotonic() + 20
        session.submit_operation(openai_submit(1, 1, first))
        while time.monotonic() < end and not ended(1):
            events.extend(poll_once(session))
        between()
        session.submit_operation(openai_submit(2, 2, envelope(chat(stream=True))))
        while time.monotonic() < end and not ended(2):
            events.extend(poll_once(session))
        session.close()
    return [e for e in events if e["kind"] != "lifecycle"]


def _check(events: list[dict[str, Any]], code: str) -> None:
    refused = [e for e in events if e["frame_id"] == 1]
    assert [e["kind"] for e in refused] == ["ERROR_RECOVERABLE", "RETRY_AFTER", "RESULT_PUSH"]
    assert refused[-1]["status"] == 503
    assert refused[-1]["payload"]["error"]["code"] == code
    (second,) = [e for e in events if e["frame_id"] == 2 and e["kind"] == "RESULT_PUSH"]
    assert second["status"] == 200 and second["payload"]["type"] == "response.completed"


async def test_vllms_own_503_reaches_nnrp_pys_client_as_a_retry_hint(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, replay=ReplayServer(family="0.32",
                                                                       speed=50))
    first = envelope(chat(), request_id=scenario_id("error_503_queue_full"))
    with trio.fail_after(40):
        events = await trio.to_thread.run_sync(_two_operations, stack.uri(), first)
    _check(events, "backend_overload")


async def test_load_aware_refusal_reaches_nnrp_pys_client_as_a_retry_hint(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir,
                              load=LoadSettings(admission=True, interval=0.05, max_waiting=4,
                                                stale_after=3600))
    monitor = stack.gateway.load
    assert monitor is not None
    stack.replay.set_load(waiting=10, running=2)
    with trio.fail_after(10):  # a scrape that began after the queue filled
        await monitor.scraped()
        await monitor.scraped()
    token = trio.lowlevel.current_trio_token()

    def queue_drained() -> None:  # between the refusal and operation 2, in trio's thread
        async def drain() -> None:
            stack.replay.set_load(waiting=0, running=2)
            await monitor.scraped()
            await monitor.scraped()

        trio.from_thread.run(drain, trio_token=token)

    with trio.fail_after(40):
        events = await trio.to_thread.run_sync(_two_operations, stack.uri(),
                                               envelope(chat(stream=True)), queue_drained)
    _check(events, "scheduler_rejected")
