"""Resumable sessions end to end (issue 21): nnrp-py's native client opens a session with
resume, streams from the replay vLLM through a proxy the test controls, loses its
connection mid-stream (the proxy resets it), resumes with its ticket on a new connection,
resubmits the operation with the same ids, and gets every result: the sequences across
both connections cover 1..n without a gap (repeats identical), the terminal is a 200, and
vLLM saw one request and no disconnect."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import trio

pytest.importorskip("nnrp.client.native")

from nnrp.client.native import NativeClientSessionOptions, connect_native_client_connection

from gateway.tools.conformance import native_client_options
from gateway.tools.replay import ReplayServer
from tests.support.cut import StreamCutProxy
from tests.support.native import describe, openai_submit
from tests.support.quic import until
from tests.support.stack import chat, envelope, records_of, start_stack

pytestmark = pytest.mark.interop

RESUME = NativeClientSessionOptions(allow_resume=True)


def partials_of(events: list[dict[str, Any]]) -> dict[int, bytes]:
    """sequence -> body; a repeat must be identical."""
    seen: dict[int, bytes] = {}
    for event in events:
        if event["kind"] == "PARTIAL_RESULT":
            previous = seen.setdefault(event["sequence"], event["body"])
            assert previous == event["body"], f"sequence {event['sequence']} changed"
    return seen


async def test_a_native_client_resumes_a_stream_after_a_reset(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir,
                              replay=ReplayServer(speed=1.0, token_interval_ms=5.0))
    host, _, port = stack.uri("tcp").removeprefix("tcp://").rpartition(":")
    proxy = StreamCutProxy((host, int(port)))
    address = await nursery.start(proxy.serve)
    records = records_of(stack)
    registry = stack.gateway.server.registry
    assert registry is not None
    token = trio.lowlevel.current_trio_token()
    payload = envelope(chat(stream=True, max_tokens=200), request_id="resume-1")

    def first_connection() -> tuple[Any, list[dict[str, Any]]]:
        opened = connect_native_client_connection(native_client_options(f"tcp://{address}"))
        connection = opened.__enter__()
        session = asyncio.run(connection.open_session(RESUME))
        session.submit_operation(openai_submit(7001, 1, payload))
        events: list[dict[str, Any]] = []
        while sum(e["kind"] == "PARTIAL_RESULT" for e in events) < 20:
            events += [describe(e) for e in session.poll_events(timeout_ms=20)]
        trio.from_thread.run_sync(proxy.cut, trio_token=token)
        ticket = session.recovery_ticket()
        with contextlib.suppress(Exception):  # its connection is gone: closing it fails
            opened.__exit__(None, None, None)
        return ticket, events

    with trio.fail_after(30):
        ticket, before = await trio.to_thread.run_sync(first_connection)
        assert ticket is not None
        await until(lambda: registry.detached == 1)

    def second_connection() -> list[dict[str, Any]]:
        with connect_native_client_connection(native_client_options(stack.uri("tcp"))) as c:
            session = asyncio.run(c.resume_session(ticket, RESUME))
            session.submit_operation(openai_submit(7001, 1, payload))
            events: list[dict[str, Any]] = []
            while not any(e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON") for e in events):
                events += [describe(e) for e in session.poll_events(timeout_ms=20)]
            session.close()
            return events

    with trio.fail_after(30):
        after = await trio.to_thread.run_sync(second_connection)
    seen = partials_of(before + after)
    assert sorted(seen) == list(range(1, len(seen) + 1))
    terminal = [e for e in after if e["kind"] == "RESULT_PUSH"]
    assert terminal[-1]["status"] == 200
    text = "".join(json.loads(body)["delta"] for body in seen.values()
                   if json.loads(body)["type"] == "response.output_text.delta")
    assert text == terminal[-1]["payload"]["body"]["choices"][0]["message"]["content"]
    assert len([r for r in stack.replay.requests if r.method == "POST"]) == 1
    assert stack.replay.disconnects == []
    await until(lambda: records)
    assert records[0].outcome == "ok" and records[0].resumed == 1
