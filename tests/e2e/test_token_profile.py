"""NNRP's token profile (TOKEN_CHUNK on profile 2), served as vLLM's text completion."""

from __future__ import annotations

import json
from typing import Any

import trio

from gateway import nnrp
from gateway.tools.conformance import runner_token_submit
from tests.support.stack import Stack  # noqa: TC001 - fixtures


def token_request(operation_id: int, text: bytes) -> tuple[nnrp.FrameSubmit, bytes]:
    meta, _ = runner_token_submit(operation_id)
    return meta, nnrp.pack_single_frame(
        text, profile_id=2, kind=int(nnrp.PayloadKind.TOKEN_CHUNK),
        flags=int(nnrp.DescriptorFlag.PARTIAL), schema_id=nnrp.TOKEN_SCHEMA_ID,
        schema_version=nnrp.TOKEN_SCHEMA_VERSION, stream_semantics=2)


async def test_a_token_request_is_a_text_completion(stack: Stack, session: Any) -> None:
    """The wire runner's own request: a completion of its text, as one TOKEN_CHUNK."""
    meta, body = runner_token_submit(7)
    operation = await session.submit_frame(meta, body)
    with trio.fail_after(10):
        (result,) = [event async for event in operation.events()]
    assert isinstance(result, nnrp.ResultReceived)
    assert result.meta.status_code == 200
    assert result.meta.payload_kind_bitmap == nnrp.PayloadKind.TOKEN_CHUNK
    (frame,) = result.typed_body.frames
    assert frame.descriptor.profile_id == 2
    assert (frame.descriptor.schema_id, frame.descriptor.schema_version) == (0x1001, 3)
    assert frame.descriptor.descriptor_flags == nnrp.DescriptorFlag.TERMINAL
    (sent,) = [r for r in stack.replay.requests if r.method == "POST"]
    assert sent.path == "/v1/completions"
    request = json.loads(sent.body)
    assert request == {"model": "tiny", "prompt": "wire-external-request", "max_tokens": 64}
    assert frame.payload.decode().startswith("The quick brown fox")


async def test_a_token_request_is_cancelled_like_any(stack: Stack, session: Any) -> None:
    # vLLM is still generating the completion (held: its answer cannot come first) when
    # the cancel lands.
    stack.replay.hold(lambda request: request.path == "/v1/completions")
    meta, body = token_request(8, b"Count to a thousand")
    operation = await session.submit_frame(meta, body)
    with trio.fail_after(5):
        await stack.replay.wait_for_requests(1)  # the completion request itself
    await operation.cancel()
    with trio.fail_after(10):
        (drop,) = [event async for event in operation.events()]
    assert isinstance(drop, nnrp.DropReceived)
    assert drop.drop_reason == nnrp.DropReason.PEER_CANCELLED
    with trio.fail_after(5):
        await stack.replay.wait_until(lambda: stack.replay.disconnects)
    (sent,) = [r for r in stack.replay.requests if r.method == "POST"]
    assert sent.path == "/v1/completions"
    assert [d.request_id for d in stack.replay.disconnects] == [sent.headers["x-request-id"]]
    assert sent.headers["x-request-id"] not in stack.replay.completed


async def test_token_chunks_that_are_not_text_are_refused(session: Any) -> None:
    meta, body = token_request(9, b"\xff\xfe")
    operation = await session.submit_frame(meta, body)
    (result,) = [event async for event in operation.events()]
    assert result.meta.status_code == 400
    event = json.loads(result.typed_body.frames[0].payload)
    assert event["error"]["code"] == "invalid_submit_body"
