"""The reverse direction: the project's trio client against nnrp-py's native server.

The native server runs as a single actor (poll, then reply, on one thread with its
own asyncio loop), as nnrp-py.md's rules require.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from typing import Any

import pytest
import trio

pytest.importorskip("nnrp.server.native")

from nnrp.core.enums import MessageType
from nnrp.runtime.types import PartialResultMetadata, ResultDropReasonMetadata
from nnrp.server.native import (
    NativeServerAcceptOptions,
    listen_native_server,
)

from gateway import nnrp
from gateway.tools.client import connect
from tests.support.native import native_server_options, next_event, result_metadata

pytestmark = pytest.mark.interop


def run_native_server(ready: queue.Queue[str], stop: threading.Event,
                      log: list[str]) -> None:
    """Serve one session: stream ``events`` partials per submit, honour CANCEL and close."""

    async def serve() -> None:
        with listen_native_server(native_server_options()) as server:
            ready.put(server.bound_provider_endpoints["tcp"].uri)
            session = await server.accept(NativeServerAcceptOptions(timeout_ms=10_000))
            active: dict[int, tuple[Any, int, int]] = {}  # op -> (operation, sent, total)
            while not stop.is_set():
                event = await next_event(session, 0.01)
                if event is not None and (operation := event.as_submit()) is not None:
                    body = bytes(operation.submit.tail.body)
                    typed = nnrp.parse_typed_body(body, payload_kind_bitmap=0x10,
                                                  payload_frame_count=1)
                    script = json.loads(typed.frames[0].payload)
                    log.append(f"submit {operation.operation_id} trace={operation.submit.header.trace_id}")
                    active[operation.operation_id] = (operation, 0, script["events"])
                elif event is not None and (runtime := event.as_runtime()) is not None:
                    kind = runtime.header.message_type
                    log.append(kind.name)
                    if kind is MessageType.CANCEL:
                        op_id = runtime.metadata.value.operation_id
                        operation, sent, _ = active.pop(op_id)
                        await operation.send_result_drop(
                            ResultDropReasonMetadata(op_id, sent + 1, 3, 3, 0, 14),
                            b"peer_cancelled")
                    elif kind is MessageType.SESSION_CLOSE:
                        await asyncio.to_thread(session.close)
                        return
                for op_id, (operation, sent, total) in list(active.items()):
                    if sent < total:
                        body = json.dumps({"type": "response.output_text.delta",
                                           "delta": f"t{sent}"}).encode()
                        await operation.send_partial_result(
                            PartialResultMetadata(op_id, sent + 1, 0, sent + 1, len(body), 0),
                            body)
                        active[op_id] = (operation, sent + 1, total)
                    elif total < 1000:
                        await operation.send_result(
                            result_metadata(),
                            nnrp.pack_single_frame(b'{"type":"response.completed"}'))
                        del active[op_id]

    asyncio.run(serve())


async def test_our_client_against_the_native_server() -> None:
    ready: queue.Queue[str] = queue.Queue()
    stop = threading.Event()
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, run_native_server, ready, stop, log)
        endpoint = await trio.to_thread.run_sync(ready.get, True, 30)
        uri = "tcp://" + endpoint.split("://", 1)[1]
        try:
            with trio.fail_after(30):
                async with connect(uri) as client:
                    session = await client.open_session()
                    operation = await session.submit(json.dumps({"events": 4}).encode(),
                                                     trace_id=0xABC)
                    events = [e async for e in operation.events()]
                    assert [e.sequence for e in events[:-1]] == [1, 2, 3, 4]
                    assert isinstance(events[-1], nnrp.ResultReceived)
                    assert events[-1].typed_body is not None
                    assert events[-1].typed_body.frames[0].payload == b'{"type":"response.completed"}'
                    # A long stream, cancelled with a real CANCEL after two partials.
                    long = await session.submit(json.dumps({"events": 100_000}).encode())
                    seen: list[Any] = []
                    async for event in long.events():
                        seen.append(event)
                        if len(seen) == 2:
                            await long.cancel()
                    assert isinstance(seen[-1], nnrp.DropReceived)
                    assert seen[-1].drop_reason == nnrp.DropReason.PEER_CANCELLED
                    await session.close()
        finally:
            stop.set()
    assert log[0] == "submit 1 trace=2748"
    assert "CANCEL" in log
    assert log[-1] == "SESSION_CLOSE"
