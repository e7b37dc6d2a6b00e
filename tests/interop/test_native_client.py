"""Interop acceptance: nnrp-py's Rust-backed native client against our trio server."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest
import trio

pytest.importorskip("nnrp.client.native")

from tests.support.native import (
    native_connection,
    open_session,
    openai_submit,
    poll_once,
    poll_until,
    trace_metadata,
)
from tests.support.servers import RunningServer
from tests.support.waits import until

if TYPE_CHECKING:
    from tests.support.servers import RunningServer

pytestmark = pytest.mark.interop
TRANSPORTS = ["tcp", "ipc", "websocket"]


def script(**kw: Any) -> bytes:
    return json.dumps(kw).encode()


def terminal(events: list[dict[str, Any]]) -> bool:
    return any(e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON") for e in events)


def frames_of(events: list[dict[str, Any]], frame_id: int) -> list[dict[str, Any]]:
    return [e for e in events if e.get("frame_id") == frame_id and e["kind"] != "lifecycle"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_two_sessions_stream_partials_then_typed_result(running: RunningServer,
                                                              transport: str) -> None:
    uri = running.uri(transport)

    def scenario() -> dict[str, Any]:
        with native_connection(transport, uri) as connection:
            first, second = open_session(connection), open_session(connection)
            first.send_trace_context(trace_metadata(0x1111, 0x2222, b"tenant=a"), b"tenant=a")
            first.submit_operation(openai_submit(101, 1, script(events=5), trace_id=0xABC))
            second.submit_operation(openai_submit(201, 1, script(events=3)))
            a = poll_until(first, terminal)
            b = poll_until(second, terminal)
            first.close()
            second.close()
            return {"a": a, "b": b}

    with trio.fail_after(30):
        result = await trio.to_thread.run_sync(scenario)
    a = frames_of(result["a"], 1)
    assert [e["sequence"] for e in a[:-1]] == [1, 2, 3, 4, 5]
    assert all(e["operation_id"] == 101 for e in a[:-1])
    assert a[-1]["kind"] == "RESULT_PUSH"
    assert a[-1]["status"] == 200
    assert a[-1]["payload"]["trace"] == [0x1111, 0x2222]
    assert a[-1]["payload"]["header_trace_id"] == 0xABC
    b = frames_of(result["b"], 1)
    assert [e["kind"] for e in b] == ["PARTIAL_RESULT"] * 3 + ["RESULT_PUSH"]
    assert {op.session_id for op in running.seen.operations} == {1, 2}
    seen_trace = next(op for op in running.seen.operations if op.operation_id == 101).trace
    assert seen_trace is not None
    assert seen_trace.attribute_bytes == len(b"tenant=a")


@pytest.mark.parametrize("how", ["runtime_cancel", "frame_cancel"])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_cancel_mid_stream(running: RunningServer, transport: str, how: str) -> None:
    uri = running.uri(transport)

    def scenario() -> list[dict[str, Any]]:
        with native_connection(transport, uri) as connection:
            session = open_session(connection)
            # Three events, then none until the cancel: nothing of the operation is on
            # the wire behind the cancel (nnrp-py's native client refuses a partial of an
            # operation it has frame-cancelled: NativeInvalidStateError).
            operation = session.submit_operation(
                openai_submit(0x65, 1, script(events=400, hold_after=3)))
            sent = []

            def on_event(event: dict[str, Any]) -> None:
                partials = [e for e in events if e["kind"] == "PARTIAL_RESULT"]
                if len(partials) >= 3 and not sent:
                    sent.append(time.monotonic())
                    if how == "frame_cancel":
                        connection.cancel_operation(operation)
                    else:
                        connection.cancel_runtime_operation(
                            session, operation_id=0x65, control_sequence=1, reason_code=1,
                            diagnostic=b"user hit stop")

            events: list[dict[str, Any]] = []

            def ended() -> bool:  # the server cancelled it; a runtime CANCEL's drop is in
                return bool(sent and running.seen.cancelled) and (
                    how == "frame_cancel"
                    or any(e["kind"] == "RESULT_DROP_REASON" for e in events))

            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not ended():
                for event in poll_once(session):
                    events.append(event)
                    on_event(event)
            # Then a window past the terminal: anything in it would be one frame too many.
            grace = time.monotonic() + 0.3
            while time.monotonic() < grace:
                events += poll_once(session)
            session.close()
            return events

    with trio.fail_after(30):
        events = await trio.to_thread.run_sync(scenario)
    (cancelled,) = running.seen.cancelled
    assert cancelled.operation_id == 0x65
    assert cancelled.end_cause == "peer_cancelled"
    assert cancelled.cancel_info is not None
    wire = frames_of(events, 1)
    drops = [e for e in wire if e["kind"] == "RESULT_DROP_REASON"]
    partials = [e for e in wire if e["kind"] == "PARTIAL_RESULT"]
    assert len(partials) == 3
    assert not any(e["kind"] == "RESULT_PUSH" for e in wire)
    if drops:  # the native client surfaces the drop for runtime CANCEL (and hides it for FRAME_CANCEL)
        (drop,) = drops
        assert drop["drop_reason"] == 3
        # The client's own words come back as the drop's diagnostic (the adapter's way);
        # FRAME_CANCEL has none, so the reason's name.
        assert drop["diagnostic"] == (b"user hit stop" if how == "runtime_cancel"
                                      else b"peer_cancelled")
        assert wire[-1] is drop  # no frame after the terminal
    else:
        assert how == "frame_cancel"
    if how == "runtime_cancel":
        assert drops
        assert cancelled.cancel_info.diagnostic == b"user hit stop"
    # The server ended the operation with exactly one drop and sent nothing after it.
    assert cancelled.outcome == "cancelled"
    assert cancelled.events_sent == len(partials)


async def test_session_close_is_acknowledged(running: RunningServer) -> None:
    uri = running.uri("tcp")

    def scenario() -> list[dict[str, Any]]:
        with native_connection("tcp", uri) as connection:
            session = open_session(connection)
            session.submit_operation(openai_submit(7, 1, script(events=2)))
            events = poll_until(session, terminal)
            session.close()  # blocks until SESSION_CLOSE_ACK arrives
            return events

    with trio.fail_after(30):
        events = await trio.to_thread.run_sync(scenario)
    assert frames_of(events, 1)[-1]["kind"] == "RESULT_PUSH"
    # The closed session is gone from the server (as is its connection, once closed).
    with trio.fail_after(5):
        await until(lambda: not any(c.sessions for c in running.server.connections))
