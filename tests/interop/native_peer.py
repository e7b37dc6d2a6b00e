"""Driving nnrp-py's Rust-backed native client and server from trio tests.

Rules from nnrp-py.md: the native API is asyncio-only, so each scenario runs in a
worker thread with its own event loop; poll and send from that one thread; treat
``NativeWouldBlockError`` as a timeout; close off the loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from nnrp.client.native import (
    NativeClientOptions,
    NativeClientProviderRoute,
    NativeClientSessionOptions,
    connect_native_client_connection,
)
from nnrp.client.transport import (
    SubmitHeaderContext,
    SubmitIdentity,
    SubmitPolicy,
    SubmitRequest,
    TypedPayloadInputFrame,
    TypedPayloadSubmitInput,
)
from nnrp.core.enums import MessageType, PayloadKind
from nnrp.core.messages import TransportPolicy
from nnrp.runtime.types import TraceContextMetadata
from nnrp.schema import StreamSemantics

from gateway import nnrp as ours


def client_options(transport: str, uri: str) -> NativeClientOptions:
    """Native client options reaching one of our listeners."""
    if transport == "tcp":
        return NativeClientOptions("nnrp://" + uri.removeprefix("tcp://"),
                                   transport_policy=TransportPolicy.FORCE_TCP)
    name = {"ipc": "ipc", "websocket": "websocket"}[transport]
    policy = TransportPolicy.FORCE_IPC if name == "ipc" else TransportPolicy.FORCE_WEBSOCKET
    return NativeClientOptions(
        "nnrp://gateway.local",
        provider_routes={name: NativeClientProviderRoute(provider_endpoint=uri)},
        transport_policy=policy)


def openai_submit(operation_id: int, frame_id: int, payload: bytes, *,
                  trace_id: int = 0) -> SubmitRequest:
    """The openai-compatible/1 request mapping: one STRUCTURED_EVENT frame, SNAPSHOT."""
    frame = TypedPayloadInputFrame(0, PayloadKind.STRUCTURED_EVENT, payload,
                                   stream_semantics=StreamSemantics.SNAPSHOT)
    return SubmitRequest.typed_payload(TypedPayloadSubmitInput(
        SubmitIdentity(operation_id, frame_id, SubmitHeaderContext(trace_id=trace_id)),
        SubmitPolicy(), (frame,)))


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
    return [describe(event) for event in session.poll_events(timeout_ms=timeout_ms)]


def poll_until(session: Any, done: Callable[[list[dict[str, Any]]], bool],
               timeout: float = 10.0, on_event: Callable[[dict[str, Any]], None] | None = None
               ) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done(events):
        for event in session.poll_events(timeout_ms=20):
            described = describe(event)
            events.append(described)
            if on_event is not None:
                on_event(described)
    return events


@contextmanager
def native_connection(transport: str, uri: str) -> Iterator[Any]:
    with connect_native_client_connection(client_options(transport, uri)) as connection:
        yield connection


def open_session(connection: Any) -> Any:
    return asyncio.run(connection.open_session(NativeClientSessionOptions()))


def trace_metadata(trace_id: int, span_id: int, body: bytes) -> TraceContextMetadata:
    return TraceContextMetadata(trace_id, span_id, 0, 0, 1, len(body))
