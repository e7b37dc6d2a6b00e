"""The session's cache over the wire, against the whole gateway (replay vLLM behind it),
and against nnrp-py's native server (gateway/nnrp/_cache.py, rules C1-C8):

* raw frames over a real TCP socket (nnrp-py's native client has no CACHE_PUT, and no
  way to fill a submit's object-reference region): an image put once in the cache reaches
  vLLM from two requests, as the exact bytes (suite cases ``l1.cache.lifecycle.roundtrip``
  and ``l1.result_push.object_reference.resolve``, server side); an invalidation drops
  the streaming request that depends on it (vLLM's call aborted); what is gone misses;
* nnrp-py's native client negotiates ``cache.reference`` and meets a miss and an
  invalidation, its session serving on;
* the same raw frames to nnrp-py's native server: what it answers (nothing) and what a
  CACHE_PUT does to its session (fails it), beside the gateway's answers.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

pytest.importorskip("nnrp.client.native")

from nnrp.core.messages.control import CacheInvalidateMetadata
from nnrp.runtime.types import CacheReferenceMetadata

from gateway import nnrp
from gateway.tools.replay import ReplayServer
from tests.interop.test_runtime_objects import RawPeer, kinds
from tests.support.media import PNG, data_uri_bytes, image_part, sent_content, with_parts
from tests.support.native import (
    REFEREE_START_LIMIT,
    native_connection,
    negotiate_tokens,
    next_event,
    open_session,
    openai_submit,
    poll_until,
    result_metadata,
    serve_native_sessions,
    start_referee,
)
from tests.support.scenarios import request_for
from tests.support.stack import Stack, envelope, start_stack
from tests.support.waits import until

pytestmark = pytest.mark.interop

CAMERA = int(nnrp.CacheObjectKind.CAMERA_BLOCK)
KEY = (7, 0x0102030405060708, 0x1112131415161718)
URL = f"nnrp:cache/{KEY[0]}/{KEY[1]:016x}{KEY[2]:016x}"
TOKENS = ("cache.reference",)
#: What nnrp-py's native client sends (nnrp-wire.md, live exchange): nnrp-py's server
#: closes a connection whose hello leaves the rest out.
HELLO = nnrp.ClientHello(min_version=1, max_version=1, wire_format_bitmap=1,
                         profile_bitmap=0b11, payload_kind_bitmap=0x73, max_lane_count=1,
                         latency_budget_ms=500)
OPEN = nnrp.SessionOpen(profile_id=2, priority_class=1, schema_id=0x1001, schema_version=3,
                        default_deadline_ms=500, max_in_flight=4, lease_ttl_hint_ms=30_000)


@pytest.fixture
async def stack(nursery: trio.Nursery, socket_dir: Path) -> Stack:
    # 25 ms a token: the streaming request still runs when the invalidation lands.
    return await start_stack(nursery, socket_dir, replay=ReplayServer(token_interval_ms=25.0))


#: A streaming request the replay vLLM answers slowly (40 tokens, 25 ms each).
LONG = {"model": "example-model", "stream": True, "max_tokens": 40,
        "messages": [{"role": "user", "content": "Hello"}]}


def media_request(scenario: str, tag: str, reference: str = URL) -> bytes:
    body = LONG if scenario == "long_stream" else request_for(scenario)
    return envelope(with_parts(body, image_part(reference)),
                    request_id=f"replay:{scenario}:{tag}")


def submit_with_references(operation_id: int, payload: bytes,
                           blocks: list[nnrp.ObjectReference]) -> tuple[Any, bytes]:
    """A FRAME_SUBMIT whose object-reference region holds ``blocks`` (camera slot)."""
    body = nnrp.pack_typed_body([(nnrp.TypedDescriptor(), payload)], object_references=blocks)
    meta = nnrp.FrameSubmit(operation_id=operation_id,
                            submit_mode=int(nnrp.SubmitMode.MIXED) if blocks else 0,
                            object_ref_mask=0b1 if blocks else 0, payload_kind_bitmap=0x10,
                            payload_frame_count=1)
    return meta, body


async def open_raw(uri: str) -> RawPeer:
    host, port = uri.removeprefix("tcp://").rsplit(":", 1)
    peer = RawPeer(await trio.open_tcp_stream(host, int(port)))
    await peer.send(HELLO)
    await peer.send(OPEN)
    await peer.until(lambda got: any(isinstance(p.message, nnrp.SessionOpenAck) for p in got))
    return peer


def ended_on(frame_id: int) -> Callable[[list[nnrp.Packet]], bool]:
    return lambda got: any(p.frame_id == frame_id and p.msg_type in (
        nnrp.MsgType.RESULT_PUSH, nnrp.MsgType.RESULT_DROP_REASON) for p in got)


def cache_put(data: bytes, key: tuple[int, int, int] = KEY) -> nnrp.CachePut:
    return nnrp.CachePut(cache_namespace=key[0], object_kind=CAMERA, cache_key_hi=key[1],
                         cache_key_lo=key[2], ttl_ms=60_000, object_bytes=len(data))


async def test_a_cached_image_reaches_vllm_from_two_requests_then_is_invalidated(
        stack: Stack) -> None:
    peer = await open_raw(stack.uri())
    await peer.send(cache_put(PNG), session_id=1, body=PNG)
    (ack,) = await peer.until(bool)
    assert isinstance(ack.message, nnrp.CacheAck)
    assert (ack.message.status, ack.message.accepted_ttl_ms, ack.message.cache_key_lo) == (
        nnrp.CacheAckStatus.ACCEPTED, 60_000, KEY[2])
    # Listed in the object-reference region and named as media: resolved, no CACHE_MISS.
    block = nnrp.ObjectReference(CAMERA, *KEY)
    meta, body = submit_with_references(11, media_request("nonstream_pair_plain", "one"),
                                        [block])
    await peer.send(meta, session_id=1, frame_id=5, body=body)
    got = await peer.until(ended_on(5))
    assert kinds(got) == ["RESULT_PUSH"] and got[0].message.status_code == 200
    # Named as media only: the same bytes, read again from the cache.
    meta, body = submit_with_references(12, media_request("nonstream_pair_plain", "two"), [])
    await peer.send(meta, session_id=1, frame_id=6, body=body)
    got = await peer.until(ended_on(6))
    assert got[-1].message.status_code == 200
    posts = [r for r in stack.replay.requests if r.method == "POST"]
    assert len(posts) == 2
    for request in posts:  # put once on the client's link, delivered twice to vLLM
        assert data_uri_bytes(sent_content(request)[1]["image_url"]["url"]) == (
            "image/png", PNG)
    # A streaming request that depends on the entry is dropped when it is invalidated,
    # and its vLLM call aborted.
    meta, body = submit_with_references(13, media_request("long_stream", "held"), [block])
    await peer.send(meta, session_id=1, frame_id=7, body=body)
    await peer.until(lambda got: any(p.msg_type is nnrp.MsgType.PARTIAL_RESULT for p in got))
    await peer.send(nnrp.CacheInvalidate(scope=int(nnrp.CacheInvalidateScope.OBJECT_KEY),
                                         cache_namespace=KEY[0], cache_key_hi=KEY[1],
                                         cache_key_lo=KEY[2]), session_id=1)
    got = await peer.until(ended_on(7))
    (drop,) = [p for p in got if p.msg_type is nnrp.MsgType.RESULT_DROP_REASON]
    assert drop.message.drop_reason == nnrp.DropReason.OBJECT_INVALIDATED
    with trio.fail_after(5):
        await until(lambda: stack.replay.disconnects)
    # Gone: a reference misses, and a submit naming it is refused after its miss.
    await peer.send(nnrp.CacheReference(cache_namespace=KEY[0], profile_id=2,
                                        cache_key_hi=KEY[1], cache_key_lo=KEY[2]),
                    session_id=1)
    (miss,) = await peer.until(bool)
    assert miss.message.miss_reason == nnrp.CacheMissReason.NOT_FOUND
    meta, body = submit_with_references(14, media_request("nonstream_pair_plain", "gone"),
                                        [block])
    await peer.send(meta, session_id=1, frame_id=8, body=body)
    got = await peer.until(ended_on(8))
    assert kinds(got) == ["CACHE_MISS", "RESULT_PUSH"] and got[1].message.status_code == 404
    # Every refusal left the session serving: put again, use again.
    await peer.send(cache_put(PNG), session_id=1, body=PNG)
    await peer.until(bool)
    meta, body = submit_with_references(15, media_request("nonstream_pair_plain", "again"),
                                        [block])
    await peer.send(meta, session_id=1, frame_id=9, body=body)
    assert (await peer.until(ended_on(9)))[-1].message.status_code == 200
    await peer.stream.aclose()


async def test_a_request_naming_an_entry_not_held_is_refused_naming_the_part(
        stack: Stack) -> None:
    peer = await open_raw(stack.uri())
    meta, body = submit_with_references(1, media_request("nonstream_pair_plain", "no"), [])
    await peer.send(meta, session_id=1, frame_id=1, body=body)
    (result,) = await peer.until(ended_on(1))
    typed = nnrp.parse_typed_body(result.body, payload_kind_bitmap=0x10, payload_frame_count=1)
    assert b"messages[0].content[1].image_url.url: " + URL.encode() in typed.frames[0].payload
    assert b"CACHE_PUT it first" in typed.frames[0].payload
    assert not [r for r in stack.replay.requests if r.method == "POST"]
    await peer.stream.aclose()


# ------------------------------------------------------------------ nnrp-py's native client


def native_cache_session(uri: str) -> dict[str, list[dict[str, Any]]]:
    with native_connection("tcp", uri) as connection:
        session = open_session(connection)
        granted = negotiate_tokens(connection, session, TOKENS)
        session.reference_cache(CacheReferenceMetadata(KEY[0], KEY[1], KEY[2], 0, 1, 0, 0, 0,
                                                       0, 0))
        missed = poll_until(session, lambda events: any(
            e["kind"] == "CACHE_MISS" for e in events))
        session.invalidate_cache(CacheInvalidateMetadata(
            int(nnrp.CacheInvalidateScope.WHOLE_SESSION), 0, 0, 0, 1))
        session.submit_operation(openai_submit(1, 1, envelope(
            request_for("nonstream_pair_plain"), request_id="replay:nonstream_pair_plain:n")))
        after = poll_until(session, lambda events: any(
            e["kind"] == "RESULT_PUSH" for e in events), timeout=15)
        session.close()
    return {"granted": granted, "missed": missed, "after": after}


async def test_nnrp_pys_client_negotiates_the_cache_and_meets_a_miss(stack: Stack) -> None:
    with trio.fail_after(60):
        result = await trio.to_thread.run_sync(native_cache_session, stack.uri())
    (granted,) = [e for e in result["granted"] if e["kind"] == "CAPABILITY_NEGOTIATION"]
    assert nnrp.parse_tokens(granted["body"], 1) == TOKENS
    assert [e["kind"] for e in result["missed"]] == ["CACHE_MISS"]
    # The invalidation has no answer; the session serves the next request.
    assert [e["kind"] for e in result["after"] if e["kind"] != "lifecycle"] == [
        "RESULT_PUSH"]
    assert result["after"][-1]["status"] == 200


# ------------------------------------------------------------------ nnrp-py's native server


def run_referee(listening: Callable[[str], None], stop: threading.Event,
                seen: list[str]) -> None:
    """nnrp-py's native server: an application that notes every frame it is handed (and
    the failure of a session's poll), and answers each submit with one completed event."""

    async def serve_session(session: Any) -> None:
        while not stop.is_set():
            try:
                event = await next_event(session, 0.005)
            except Exception as error:  # the runtime failed the session
                seen.append(f"failed: {error}")
                return
            if event is None:
                continue
            if (operation := event.as_submit()) is not None:
                seen.append("FRAME_SUBMIT")
                await operation.send_result(
                    result_metadata(), nnrp.pack_single_frame(b'{"type":"response.completed"}'))
            elif (runtime := event.as_runtime()) is not None:
                seen.append(runtime.header.message_type.name)
                if runtime.header.message_type.name == "SESSION_CLOSE":
                    await asyncio.to_thread(session.close)
                    return

    serve_native_sessions(serve_session, listening, stop)


async def raw_exchange(uri: str) -> dict[str, list[str]]:
    """One raw sequence: what came back after each step (kinds; "quiet" when nothing came
    within a second)."""
    peer = await open_raw(uri)

    async def answers(message: Any, **kw: Any) -> list[str]:
        await peer.send(message, session_id=1, **kw)
        got: list[str] = []
        with trio.move_on_after(1.0):
            got = kinds(await peer.until(bool))
        return got or ["quiet"]

    meta, body = submit_with_references(1, b'{"a":1}', [])
    seen = {
        "reference": await answers(nnrp.CacheReference(
            cache_namespace=KEY[0], profile_id=2, cache_key_hi=KEY[1], cache_key_lo=KEY[2])),
        "invalidate": await answers(nnrp.CacheInvalidate(
            scope=int(nnrp.CacheInvalidateScope.WHOLE_SESSION))),
        "submit": await answers(meta, frame_id=1, body=body),
        "put": await answers(cache_put(b"object"), body=b"object"),
    }
    meta, body = submit_with_references(2, b'{"a":1}', [])
    seen["submit after the put"] = await answers(meta, frame_id=2, body=body)
    await peer.stream.aclose()
    return seen


async def test_the_referee_answers_no_cache_frame_and_fails_a_session_on_cache_put(
        stack: Stack) -> None:
    """nnrp-py's server keeps no cache: CACHE_REFERENCE and CACHE_INVALIDATE go to its
    application unanswered, and a client's CACHE_PUT fails the session (nothing on the
    wire; its next submit is never answered). The gateway answers the put with its
    spec's CACHE_ACK and a reference to what it does not hold with CACHE_MISS (the wire
    suite's capability-route-cache answer), and is as silent as nnrp-py to the
    invalidation."""
    stop = threading.Event()
    seen: list[str] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(REFEREE_START_LIMIT):
            uri = await nursery.start(start_referee, functools.partial(
                run_referee, stop=stop, seen=seen), stop)
        try:
            with trio.fail_after(60):
                theirs = await raw_exchange(uri)
                ours = await raw_exchange(stack.uri())
        finally:
            stop.set()
    assert theirs == {"reference": ["quiet"], "invalidate": ["quiet"],
                      "submit": ["RESULT_PUSH"], "put": ["quiet"],
                      "submit after the put": ["quiet"]}
    assert seen[:3] == ["CACHE_REFERENCE", "CACHE_INVALIDATE", "FRAME_SUBMIT"]
    assert seen[3].startswith("failed:") and "detail_code=105" in seen[3]
    assert ours == {"reference": ["CACHE_MISS"], "invalidate": ["quiet"],
                    "submit": ["RESULT_PUSH"], "put": ["CACHE_ACK"],
                    "submit after the put": ["RESULT_PUSH"]}
