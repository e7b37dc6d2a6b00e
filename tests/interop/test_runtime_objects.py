"""Runtime objects over the wire, against the whole gateway (replay vLLM behind it):

* nnrp-py's native client drives every object API it has (declare_object,
  reference_object, patch_object, send_object_delta, release_object), after negotiating
  the object tokens, over TCP, unix, WebSocket and QUIC: suite cases
  ``l1.object.lifecycle`` and ``l1.object.delta``; a release that invalidates dependents drops the streaming
  operation that referenced the object with object_invalidated, and vLLM's request is
  aborted (its socket closed);
* raw frames over a real TCP socket for what that client cannot send: a FRAME_SUBMIT whose
  object_reference region names cached objects (answered CACHE_MISS per block, then the
  refusal on its frame: suite case ``l1.result_push.object_reference.resolve``, server
  side), and references the table refuses;
* nnrp-py's native server as the referee for the same object frames: it takes each one
  without a reply and keeps the session serving, as the gateway does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

pytest.importorskip("nnrp.client.native")

from nnrp.core.enums import MessageType
from nnrp.runtime.types import (
    ObjectDeltaMetadata,
    ObjectDescriptorMetadata,
    ObjectReferenceMetadata,
    ObjectReleaseMetadata,
)

from gateway import nnrp
from gateway.tools.replay import ReplayServer
from tests.support.native import (
    REFEREE_START_LIMIT,
    native_connection,
    next_event,
    open_session,
    openai_submit,
    poll_until,
    result_metadata,
    serve_native_sessions,
    start_referee,
)
from tests.support.quic import Pki, start_quic_stack
from tests.support.stack import Stack, chat, envelope
from tests.support.waits import until

pytestmark = pytest.mark.interop

OBJECT_TOKENS = ("object.cost", "object.delta", "object.lifecycle", "object.ownership")


@pytest.fixture
async def quic_stack(nursery: trio.Nursery, socket_dir: Path) -> tuple[Stack, Pki]:
    # 25 ms a token: the long stream is still running when the client acts on it.
    return await start_quic_stack(nursery, socket_dir,
                                  replay=ReplayServer(token_interval_ms=25.0))


@pytest.fixture
def stack(quic_stack: tuple[Stack, Pki]) -> Stack:
    return quic_stack[0]


def request(name: str, scenario: str, tokens: int = 40) -> bytes:
    return envelope(chat(stream=True, max_tokens=tokens), request_id=f"replay:{scenario}:{name}")


def negotiate(connection: Any, session: Any) -> None:
    connection.negotiate_runtime_capabilities(
        session, profile_id=0, capability_count=len(OBJECT_TOKENS),
        body=nnrp.pack_tokens(OBJECT_TOKENS))


def declaration(object_id: int, session_id: int, byte_size: int = 64) -> ObjectDescriptorMetadata:
    return ObjectDescriptorMetadata(object_id, 7, 1, 2, session_id, byte_size, 3, 1, 3, 0, 0)


def terminal_of(frame_id: int) -> Any:
    return lambda events: any(e.get("frame_id") == frame_id and e["kind"] in (
        "RESULT_PUSH", "RESULT_DROP_REASON") for e in events)


# ------------------------------------------------------------------ nnrp-py's native client


def lifecycle_and_delta(uri: str, trusted_der: bytes | None
                        ) -> dict[str, list[dict[str, Any]]]:
    """Declare, patch and delta an object, reference it from a streaming operation and the
    session, release it with invalidation (the operation is dropped), use a second object
    the same way without invalidation (its operation completes), and meet one refusal."""
    with native_connection("tcp", uri, trusted_der=trusted_der) as connection:
        session = open_session(connection)
        negotiate(connection, session)
        granted = poll_until(session, lambda events: any(
            e["kind"] == "CAPABILITY_NEGOTIATION" for e in events))
        (sid,) = {e["session_id"] for e in granted if e["kind"] == "CAPABILITY_NEGOTIATION"}
        session.declare_object(declaration(7, sid))
        session.declare_object(declaration(8, sid))
        session.patch_object(ObjectDeltaMetadata(7, 1, 0, 8, 8, 0x01, 0), b"12345678")
        session.send_object_delta(ObjectDeltaMetadata(7, 2, 8, 8, 8, 0x04, 0), b"abcdefgh")
        session.submit_operation(openai_submit(1, 1, request("held", "long_stream")))
        first = poll_until(session, lambda events: any(
            e["kind"] == "PARTIAL_RESULT" for e in events))
        session.reference_object(ObjectReferenceMetadata(7, 1, 2, 0, 16, 0x05, 0))
        session.reference_object(ObjectReferenceMetadata(7, 0, 0, 0, 0, 0, 0))
        session.release_object(ObjectReleaseMetadata(7, 0, 4, 1, 0x03, 0))
        dropped = first + poll_until(session, terminal_of(1), timeout=15)
        # Object 8: referenced by a completing operation, released without invalidation.
        session.submit_operation(openai_submit(2, 2, request("kept", "text_stream", 4)))
        session.reference_object(ObjectReferenceMetadata(8, 2, 0, 0, 0, 0, 0))
        completed = poll_until(session, terminal_of(2), timeout=15)
        session.release_object(ObjectReleaseMetadata(8, 0, 0, 1, 0x01, 0))
        # A delta for the released object: refused, and the session goes on.
        session.send_object_delta(ObjectDeltaMetadata(7, 3, 0, 1, 1, 0, 0), b"z")
        refused = poll_until(session, lambda events: any(
            e["kind"] == "ERROR_RECOVERABLE" for e in events))
        session.submit_operation(openai_submit(3, 3, request("after", "text_stream", 3)))
        after = poll_until(session, terminal_of(3), timeout=15)
        session.close()
    return {"granted": granted, "dropped": dropped, "completed": completed,
            "refused": refused, "after": after}


def ending(events: list[dict[str, Any]], frame_id: int) -> tuple[str, int]:
    (end,) = [e for e in events if e.get("frame_id") == frame_id
              and e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON")]
    return ("push", end["status"]) if end["kind"] == "RESULT_PUSH" else (
        "drop", end["drop_reason"])


@pytest.mark.parametrize("transport", ["tcp", "ipc", "websocket", "quic"])
async def test_native_client_object_lifecycle_and_delta(quic_stack: tuple[Stack, Pki],
                                                        transport: str) -> None:
    """Suite cases l1.object.lifecycle and l1.object.delta, driven by nnrp-py's client."""
    stack, pki = quic_stack
    with trio.fail_after(60):
        result = await trio.to_thread.run_sync(lifecycle_and_delta, stack.uri(transport),
                                               pki.der)
    (granted,) = [e for e in result["granted"] if e["kind"] == "CAPABILITY_NEGOTIATION"]
    assert nnrp.parse_tokens(granted["body"], 4) == OBJECT_TOKENS
    assert ending(result["dropped"], 1) == ("drop", int(nnrp.DropReason.OBJECT_INVALIDATED))
    assert not [e for e in result["dropped"] if e["kind"] == "ERROR_RECOVERABLE"]
    assert ending(result["completed"], 2) == ("push", 200)
    (refusal,) = [e for e in result["refused"] if e["kind"] == "ERROR_RECOVERABLE"]
    assert b"unknown_object" in refusal["diagnostic"]
    assert ending(result["after"], 3) == ("push", 200)
    # The dropped operation's vLLM request was aborted: its stream closed early.
    with trio.fail_after(5):
        await until(lambda: stack.replay.disconnects)
    assert not any(connection.sessions for connection in stack.gateway.server.connections)


# ------------------------------------------------------------------ raw frames

class RawPeer:
    """One TCP connection speaking NNRP with our own codec: what nnrp-py's client cannot
    send (an object_reference region, references the table refuses)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = nnrp.Decoder()
        self.received: list[nnrp.Packet] = []

    async def send(self, message: Any, **kw: Any) -> None:
        await self.stream.send_all(nnrp.encode(nnrp.Packet(message, **kw)))

    async def until(self, done: Any) -> list[nnrp.Packet]:
        """The packets received from now until ``done`` holds for them (bounded: 10 s)."""
        start = len(self.received)
        with trio.fail_after(10):
            while not done(self.received[start:]):
                data = await self.stream.receive_some(65536)
                assert data, "the gateway closed the connection"
                self.received += self.decoder.feed(data)
        return self.received[start:]


async def raw_session(uri: str) -> RawPeer:
    host, port = uri.removeprefix("tcp://").rsplit(":", 1)
    peer = RawPeer(await trio.open_tcp_stream(host, int(port)))
    await peer.send(nnrp.ClientHello(profile_bitmap=0b10))
    await peer.send(nnrp.SessionOpen(profile_id=2, schema_id=0x1001, schema_version=3,
                                     max_in_flight=4))
    await peer.until(lambda got: any(isinstance(p.message, nnrp.SessionOpenAck) for p in got))
    body = nnrp.pack_tokens(OBJECT_TOKENS)
    await peer.send(nnrp.CapabilityNegotiation(profile_id=2, capability_count=4,
                                               body_bytes=len(body)), session_id=1, body=body)
    await peer.until(lambda got: any(isinstance(p.message, nnrp.CapabilityNegotiation)
                                     for p in got))
    return peer


def kinds(packets: list[nnrp.Packet]) -> list[str]:
    return [p.msg_type.name for p in packets]


async def test_a_submit_referencing_cached_objects_over_the_wire(stack: Stack) -> None:
    peer = await raw_session(stack.uri())
    references = [nnrp.ObjectReference(int(nnrp.CacheObjectKind.CAMERA_BLOCK), 7, 1, 2),
                  nnrp.ObjectReference(int(nnrp.CacheObjectKind.TILE_INDEX_BLOCK), 7,
                                       0x11223344, 0x55667788)]
    body = nnrp.pack_typed_body([(nnrp.TypedDescriptor(), request("refs", "text_stream", 3))],
                                object_references=references)
    await peer.send(nnrp.FrameSubmit(operation_id=11, submit_mode=int(nnrp.SubmitMode.MIXED),
                                     object_ref_mask=0b11, payload_kind_bitmap=0x10,
                                     payload_frame_count=1),
                    session_id=1, frame_id=5, body=body)
    got = await peer.until(lambda got: any(p.msg_type is nnrp.MsgType.RESULT_PUSH for p in got))
    assert kinds(got) == ["CACHE_MISS", "CACHE_MISS", "RESULT_PUSH"]
    assert [(m.message.cache_key_hi, m.message.cache_key_lo, m.message.miss_reason)
            for m in got[:2]] == [(1, 2, 1), (0x11223344, 0x55667788, 1)]
    # Each miss names the submit it answers: its frame, and the session's profile.
    assert [(m.session_id, m.frame_id, m.message.profile_id) for m in got[:2]] == [
        (1, 5, 2), (1, 5, 2)]
    result = got[2]
    assert (result.frame_id, result.message.status_code) == (5, 404)
    typed = nnrp.parse_typed_body(result.body, payload_kind_bitmap=0x10, payload_frame_count=1)
    error = json.loads(typed.frames[0].payload)["error"]
    assert error["code"] == "object_reference_unresolved"
    assert "CACHE_MISS" in error["message"]
    assert not [r for r in stack.replay.requests if r.method == "POST"]  # vLLM never asked
    # The same request inline, on the next frame, runs.
    await peer.send(nnrp.FrameSubmit(operation_id=11, payload_kind_bitmap=0x10,
                                     payload_frame_count=1), session_id=1, frame_id=6,
                    body=nnrp.pack_single_frame(request("inline", "text_stream", 3)))
    got = await peer.until(lambda got: any(p.msg_type is nnrp.MsgType.RESULT_PUSH for p in got))
    assert got[-1].message.status_code == 200
    await peer.stream.aclose()


async def test_refused_object_frames_over_the_wire(stack: Stack) -> None:
    peer = await raw_session(stack.uri())
    await peer.send(nnrp.ObjectDeclare(object_id=5, session_id=1, byte_size=16,
                                       ownership_hint=3), session_id=1)
    await peer.send(nnrp.ObjectRef(object_id=5, operation_id=77), session_id=1)
    await peer.send(nnrp.ObjectDelta(object_id=5, delta_sequence=1, region_offset=12,
                                     region_bytes=8, delta_bytes=1), session_id=1, body=b"x")
    await peer.send(nnrp.ObjectDeclare(object_id=5, session_id=1), session_id=1)
    got = await peer.until(lambda got: len(got) >= 3)
    assert kinds(got) == ["ERROR_RECOVERABLE"] * 3
    assert [(p.message.error_code, p.body.split(b":")[1].strip()) for p in got] == [
        (nnrp.ErrorCode.INVALID_STATE, b"unknown_operation"),
        (nnrp.ErrorCode.MALFORMED_BODY, b"region_out_of_bounds"),
        (nnrp.ErrorCode.INVALID_STATE, b"already_declared")]
    # Nothing was broken: a PING still gets its PONG on this connection.
    await peer.send(nnrp.Ping(), session_id=1)
    assert kinds(await peer.until(lambda got: bool(got))) == ["PONG"]
    await peer.stream.aclose()


# ------------------------------------------------------------------ the referee


def run_referee(listening: Callable[[str], None], stop: threading.Event,
                seen: list[str]) -> None:
    """nnrp-py's native server: an application that notes every runtime frame it is
    handed and answers each submit with one completed event."""

    async def serve_session(session: Any) -> None:
        while not stop.is_set():
            event = await next_event(session, 0.005)
            if event is None:
                continue
            if (operation := event.as_submit()) is not None:
                await operation.send_result(
                    result_metadata(), nnrp.pack_single_frame(b'{"type":"response.completed"}'))
            elif (runtime := event.as_runtime()) is not None:
                seen.append(runtime.header.message_type.name)
                if runtime.header.message_type is MessageType.SESSION_CLOSE:
                    await asyncio.to_thread(session.close)
                    return

    serve_native_sessions(serve_session, listening, stop)


@pytest.fixture
async def referee() -> Any:
    stop = threading.Event()
    seen: list[str] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(REFEREE_START_LIMIT):
            uri = await nursery.start(start_referee, functools.partial(
                run_referee, stop=stop, seen=seen), stop)
        try:
            yield uri, seen
        finally:
            stop.set()


def objects_then_submit(uri: str) -> list[dict[str, Any]]:
    with native_connection("tcp", uri) as connection:
        session = open_session(connection)
        negotiate(connection, session)
        # Both servers give a connection's first session the lowest free id, 1 (the wire
        # digest, section 1); the native client does not expose it.
        session.declare_object(declaration(9, 1))
        session.patch_object(ObjectDeltaMetadata(9, 1, 0, 4, 4, 0x01, 0), b"abcd")
        session.send_object_delta(ObjectDeltaMetadata(9, 2, 4, 4, 4, 0, 0), b"efgh")
        session.reference_object(ObjectReferenceMetadata(9, 0, 2, 0, 0, 0, 0))
        session.release_object(ObjectReleaseMetadata(9, 0, 0, 1, 0x01, 0))
        session.submit_operation(openai_submit(1, 1, request("ref", "text_stream", 3)))
        events = poll_until(session, terminal_of(1), timeout=15)
        # A window after the terminal: a reply to an object frame would land in it.
        events += poll_until(session, lambda _events: False, timeout=0.3)
        session.close()
    return [e for e in events if e["kind"] != "lifecycle"]


async def test_the_referee_takes_the_same_object_frames_silently(stack: Stack,
                                                                referee: Any) -> None:
    """The native server hands object frames to its application and answers none; the
    gateway answers none either when they apply. The same client sequence against both:
    no reply frame, the session still serves."""
    uri, seen = referee
    with trio.fail_after(60):
        theirs = await trio.to_thread.run_sync(objects_then_submit, uri)
        ours = await trio.to_thread.run_sync(objects_then_submit, stack.uri())
    assert ending(theirs, 1) == ending(ours, 1) == ("push", 200)
    for events in (theirs, ours):  # nothing answers an object frame
        assert [e["kind"] for e in events if e["kind"] not in (
            "CAPABILITY_NEGOTIATION", "PARTIAL_RESULT")] == ["RESULT_PUSH"], events
    assert [kind for kind in seen if kind.startswith("OBJECT_")] == [
        "OBJECT_DECLARE", "OBJECT_PATCH", "OBJECT_DELTA", "OBJECT_REF", "OBJECT_RELEASE"]
