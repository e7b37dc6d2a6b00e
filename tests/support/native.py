"""Driving nnrp-py's Rust-backed native client and server from trio tests.

Rules from nnrp-py.md: the native API is asyncio-only, so each scenario runs in a
worker thread with its own event loop; poll and send from that one thread; treat
``NativeWouldBlockError`` as a timeout; close off the loop.

Found here: nnrp-py's ``next_event()`` polls in 100 ms slices, so a control sent from
another thread can be up to a slice late while nothing arrives (docs/runtime-controls.md,
"A control while the window is at 0").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import trio
from nnrp.client.native import NativeClientSessionOptions, connect_native_client_connection
from nnrp.core import PayloadKind, ResultPushMetadata
from nnrp.core.enums import MessageType
from nnrp.native import NativeRuntimeError, NativeWouldBlockError
from nnrp.runtime.types import TraceContextMetadata
from nnrp.server.native import NativeServerAcceptOptions, listen_native_server

from gateway import nnrp as ours
from gateway.tools.conformance import native_client_options, native_openai_submit


def native_client_options_for(transport: str, uri: str) -> Any:
    """Options for our listener ``uri`` (``transport`` is implied by its scheme)."""
    return native_client_options(uri)


#: The shared helpers (also used by the conformance runner and the benchmarks).
client_options = native_client_options_for
openai_submit = native_openai_submit


def describe(event: Any) -> dict[str, Any]:
    """A plain-data view of a native runtime event."""
    header = getattr(event, "header", None)
    if header is None:  # a lifecycle notice, not a frame
        return {"kind": "lifecycle", "state": getattr(event, "kind_name", repr(event))}
    value = event.metadata.value
    out: dict[str, Any] = {"kind": header.message_type.name, "session_id": header.session_id,
                           "frame_id": header.frame_id, "body": bytes(event.tail.body),
                           "diagnostic": bytes(event.tail.diagnostic)}
    if header.message_type is MessageType.PARTIAL_RESULT:
        out["sequence"] = value.result_sequence
        out["operation_id"] = value.operation_id
    elif header.message_type is MessageType.RESULT_PUSH:
        out["status"] = value.status_code
        typed = ours.parse_typed_body(bytes(event.tail.body),
                                      payload_kind_bitmap=int(value.payload_kind_bitmap),
                                      payload_frame_count=value.payload_frame_count)
        out["payload"] = json.loads(typed.frames[0].payload)
    elif header.message_type is MessageType.RESULT_DROP_REASON:
        out["drop_reason"] = int(value.drop_reason_code)
        out["operation_id"] = value.operation_id
    return out


def poll_once(session: Any, timeout_ms: int = 20) -> list[dict[str, Any]]:
    return [describe(event) for event in session.poll_events(max_events=256,
                                                             timeout_ms=timeout_ms)]


def poll_until(session: Any, done: Callable[[list[dict[str, Any]]], bool],
               timeout: float = 10.0, on_event: Callable[[dict[str, Any]], None] | None = None
               ) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done(events):
        for event in session.poll_events(max_events=256, timeout_ms=20):
            described = describe(event)
            events.append(described)
            if on_event is not None:
                on_event(described)
    return events


@contextmanager
def native_connection(transport: str, uri: str, *, trusted_der: bytes | None = None
                      ) -> Iterator[Any]:
    """``trusted_der``: the certificate a quic:// listener is trusted by."""
    options = native_client_options(uri, trusted_der=trusted_der)
    with connect_native_client_connection(options) as connection:
        yield connection


def open_session(connection: Any) -> Any:
    return asyncio.run(connection.open_session(NativeClientSessionOptions()))


def negotiate_tokens(connection: Any, session: Any, tokens: tuple[str, ...]
                     ) -> list[dict[str, Any]]:
    """CAPABILITY_NEGOTIATION of ``tokens``, and the events up to the server's answer."""
    connection.negotiate_runtime_capabilities(
        session, profile_id=0, capability_count=len(tokens), body=ours.pack_tokens(tokens))
    return poll_until(session, lambda events: any(
        e["kind"] == "CAPABILITY_NEGOTIATION" for e in events))


def trace_metadata(trace_id: int, span_id: int, body: bytes) -> TraceContextMetadata:
    return TraceContextMetadata(trace_id, span_id, 0, 0, 1, len(body))


def native_server_options() -> Any:
    """nnrp-py's native server on loopback TCP, on a port the OS picks. (Its endpoint's
    port is not the one bound: without a tcp route nnrp-py binds its default, 4433, and
    two tests, or anything else there, collide: a listen error, detail 106.)"""
    from nnrp.core.messages import TransportPolicy
    from nnrp.server.native import NativeServerBootstrapOptions, NativeServerProviderRoute

    return NativeServerBootstrapOptions(
        "nnrp://127.0.0.1:0",
        provider_routes={"tcp": NativeServerProviderRoute("tcp://127.0.0.1:0")},
        transport_policy=TransportPolicy.FORCE_TCP)


#: Bounds a referee's start (loading nnrp-py's four native libraries, on a loaded host);
#: the wait itself is for the listener, or for the error that kept it from listening.
REFEREE_START_LIMIT = 120



def waiting_accept(server: Any) -> asyncio.Task[Any]:
    """One accept on a native server, left waiting until a session comes (on its worker
    thread, as ``accept`` always runs), rather than a short one polled in a loop: an
    accept that times out releases its accept ticket, and with a 2 ms accept about one run
    in ten under CPU load had a session go wrong under its client (the client's next call
    failing, detail 105), a session arriving as the ticket went, it seems; none in 80 runs
    like this (tests/interop/test_resume_differential.py)."""
    return asyncio.create_task(server.accept(NativeServerAcceptOptions(timeout_ms=60_000)))


async def close_serving(server: Any, accepting: asyncio.Task[Any]) -> None:
    """Close a native server with ``waiting_accept``'s accept still waiting: closing ends
    that accept (it raises), and the close itself may report the handle the accept held.
    Teardown either way."""
    with contextlib.suppress(NativeRuntimeError):
        server.close()
    with contextlib.suppress(NativeRuntimeError):
        await accepting

async def next_event(session: Any, poll_s: float) -> Any | None:
    """A referee session's next event, or None when nothing came within one poll of
    ``poll_s`` seconds (nnrp-py says so with ``NativeWouldBlockError``). Its own event
    loop's call (asyncio, in the referee's thread), not a deadline of ours."""
    try:
        return await session.next_event(timeout=poll_s)
    except NativeWouldBlockError:
        return None


def serve_native_sessions(serve_session: Callable[[Any], Awaitable[None]],
                          listening: Callable[[str], None], stop: threading.Event,
                          options: Any = None) -> None:
    """nnrp-py's native server, in this thread's own event loop: ``listening`` is told its
    endpoint once it listens (``listen_native_server`` returns with the socket bound and
    listening: the FFI's listen call, then the bound endpoint read back); then each
    session it accepts is served by ``serve_session``, one at a time, until ``stop``."""

    async def serve() -> None:
        with listen_native_server(options or native_server_options()) as server:
            listening(server.bound_provider_endpoints["tcp"].uri)
            while not stop.is_set():
                try:
                    session = await server.accept(NativeServerAcceptOptions(timeout_ms=200))
                except NativeWouldBlockError:
                    continue
                await serve_session(session)

    asyncio.run(serve())


async def start_referee(run: Callable[[Callable[[str], None]], None], stop: threading.Event,
                        *, task_status: trio.TaskStatus[str]) -> None:
    """Run a referee, ``run(listening)``, in a thread; started (its ``tcp://`` endpoint)
    once it listens. A referee that fails to start raises its own error here at once,
    and a cancelled start stops the thread (``stop``) instead of leaving it serving."""

    def listening(endpoint: str) -> None:
        trio.from_thread.run_sync(task_status.started, "tcp://" + endpoint.split("://", 1)[1])

    try:
        await trio.to_thread.run_sync(run, listening, abandon_on_cancel=True)
    finally:
        stop.set()


def result_metadata() -> Any:
    """A native server's RESULT_PUSH metadata for one structured event, status 200."""
    return ResultPushMetadata(
        status_code=200, result_flags=0, section_count=0, tile_count=0, active_profile_id=0,
        reserved0=0, inference_ms=0, queue_ms=0, server_total_ms=0, reserved1=0, tile_base_id=0,
        tile_index_bytes=0, payload_kind_bitmap=PayloadKind.STRUCTURED_EVENT,
        payload_frame_count=1)
