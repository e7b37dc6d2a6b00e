"""A real GatewayServer on free ports with a scripted handler (tests/server,
tests/transport and tests/interop).

The handler reads its script from the operation's JSON payload:
``{"events": N, "delay": seconds, "size": bytes, "hang": bool, "no_terminal": bool,
"batch": N, "hold_after": N, "await_operations": N}``; with ``batch`` the events are
flushed N at a time, as the pipeline flushes the events of one upstream read (the
outbox's direct path); with
``hold_after`` it sends N events and then nothing until it is cancelled (a stream still
running when a client's cancel lands, with no event in flight behind it); with
``await_operations`` it emits nothing until the handler has seen N operations (a test of
concurrent streams that proves they overlapped by order, not by a clock).
It records what it saw (trace context, deadlines, cancellation) for assertions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import trio

from gateway.nnrp import ServerConfig
from gateway.profile import EndCause
from gateway.server import BoundEndpoint, ConnectionLimits, GatewayServer, Operation


@attrs.define
class Seen:
    operations: list[Operation] = attrs.field(factory=list)
    cancelled: list[Operation] = attrs.field(factory=list)
    started: trio.Event = attrs.field(factory=trio.Event)
    arrived: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)


async def scripted_handler(op: Operation, seen: Seen) -> None:
    seen.operations.append(op)
    seen.started.set()
    seen.arrived.unpark_all()
    assert op.typed_body is not None
    script: dict[str, Any] = json.loads(bytes(op.typed_body.frames[0].payload))
    try:
        if script.get("hang"):
            await trio.sleep_forever()
        while len(seen.operations) < script.get("await_operations", 0):
            await seen.arrived.park()
        batch = script.get("batch")
        for index in range(script.get("events", 0)):
            body = json.dumps({"type": "response.output_text.delta", "index": 0,
                               "delta": "x" * script.get("size", 1), "n": index}).encode()
            await op.emit(body, flush=batch is None)
            if batch is not None and (index + 1) % batch == 0:
                op.flush()
            if index + 1 == script.get("hold_after"):
                op.flush()
                await trio.sleep_forever()
            if script.get("delay"):
                await trio.sleep(script["delay"])  # the script's pace
        op.flush()
        if script.get("no_terminal"):
            return
        trace = op.trace
        await op.close(EndCause.COMPLETED, json.dumps({
            "type": "response.completed",
            "trace": [trace.trace_id, trace.span_id] if trace else None,
            "header_trace_id": op.header_trace_id}).encode())
    except trio.Cancelled:
        seen.cancelled.append(op)
        raise


@attrs.define
class RunningServer:
    server: GatewayServer
    endpoints: list[BoundEndpoint]
    seen: Seen

    def uri(self, transport: str = "tcp") -> str:
        return next(e.uri for e in self.endpoints if e.transport == transport)


async def start_server(nursery: trio.Nursery, socket_dir: Path, **kwargs: Any) -> RunningServer:
    seen = Seen()
    limits = kwargs.pop("limits", ConnectionLimits(handshake_timeout=2.0))
    config = kwargs.pop("config", ServerConfig())

    async def handler(op: Operation) -> None:
        await scripted_handler(op, seen)

    server = GatewayServer(handler, config=config, limits=limits, **kwargs)
    endpoints = await nursery.start(server.serve, [
        "tcp://127.0.0.1:0", f"unix://{socket_dir}/gw.sock", "ws://127.0.0.1:0/nnrp"])
    return RunningServer(server, endpoints, seen)
