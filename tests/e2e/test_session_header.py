"""``X-Session-ID`` on vLLM's requests (issue 35, item 5), through a real gateway.

A router in front of data-parallel vLLM engines hashes ``X-Session-ID`` to keep one
session's requests (and their shared prefixes, in that engine's cache) on one engine. The
gateway sends its NNRP session's opaque id there: drawn at random once per session, so
the same on every request of the session, across a resume too, and different between
sessions, even between two gateways' session 1. ``--no-vllm-session-header`` sends none.
What the replay vLLM received is read back from its request log.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import trio

from gateway import nnrp
from gateway.pipeline import PipelineLimits
from gateway.tools.client import ClientSession, connect
from gateway.tools.conformance import runner_token_submit
from tests.support.stack import (
    Stack,
    chat,
    envelope,
    registry_of,
    run_operation,
    start_stack,
)
from tests.support.waits import until


def posts(stack: Stack) -> list[Any]:
    return [r for r in stack.replay.requests if r.method == "POST"]


def session_ids(stack: Stack) -> dict[str, str | None]:
    """Each upstream request's X-Session-ID (None: not sent), by its x-request-id."""
    return {r.headers["x-request-id"]: r.headers.get("x-session-id") for r in posts(stack)}


async def completed(session: ClientSession, request_id: str, *, ids: dict[str, int] | None = None,
                    **body: Any) -> None:
    outcome = await run_operation(session, envelope(chat(**body), request_id=request_id),
                                  **(ids or {}))
    assert outcome.status == 200, outcome.final


async def token_completion(session: ClientSession, operation_id: int) -> None:
    """NNRP's token profile: vLLM's text completion, another path to vLLM."""
    meta, body = runner_token_submit(operation_id)
    operation = await session.submit_frame(meta, body)
    (result,) = [event async for event in operation.events()]
    assert isinstance(result, nnrp.ResultReceived) and result.meta.status_code == 200


async def test_the_operations_of_one_session_share_its_id_and_two_sessions_differ(
        stack: Stack) -> None:
    with trio.fail_after(20):
        async with connect(stack.uri()) as client:
            first = await client.open_session()
            second = await client.open_session()
            await completed(first, "a-1", stream=True, max_tokens=3)
            await completed(second, "b-1", stream=True, max_tokens=3)
            await completed(first, "a-2", max_tokens=3)  # non-streaming, same session
            await token_completion(first, 50)
    ids = session_ids(stack)
    (token_path,) = [r for r in posts(stack) if r.path == "/v1/completions"]
    assert re.fullmatch(r"[0-9a-f]{16}", ids["a-1"] or "")  # opaque, not "1" or "2"
    assert ids["a-1"] == ids["a-2"] == token_path.headers["x-session-id"]
    assert ids["b-1"] is not None and ids["b-1"] != ids["a-1"]


async def test_session_one_of_two_gateways_carries_two_ids(nursery: trio.Nursery,
                                                           socket_dir: Path) -> None:
    """Session ids are numbered from 1 in every gateway: the header must not be one."""
    stacks = []
    for name in ("pod-a", "pod-b"):
        (socket_dir / name).mkdir()
        stacks.append(await start_stack(nursery, socket_dir / name))
    with trio.fail_after(20):
        for stack in stacks:
            async with connect(stack.uri()) as client:
                session = await client.open_session()
                assert session.session_id == 1
                await completed(session, "one", max_tokens=2)
    (first,), (second,) = (list(session_ids(stack).values()) for stack in stacks)
    assert first is not None and second is not None and first != second


async def test_a_resumed_session_keeps_its_id(stack: Stack) -> None:
    """The client's connection goes; it resumes the session on another (WebSocket, this
    time): its next request carries the id its first did; a new session's does not."""
    registry = registry_of(stack)
    with trio.fail_after(20):
        async with connect(stack.uri()) as client:
            session = await client.open_session(resume=True)
            ticket = session.ticket
            assert ticket is not None
            await completed(session, "before", stream=True, max_tokens=3)
        await until(lambda: registry.detached == 1)  # gone without a SESSION_CLOSE
        async with connect(stack.uri("websocket")) as client:
            resumed = await client.resume_session(ticket)
            assert resumed.session_id == session.session_id
            # A new operation: the resumed client object numbers from 1 again, and the
            # session still holds operation 1 and its frame for a resubmission.
            await completed(resumed, "after", ids={"operation_id": 2, "frame_id": 2},
                            stream=True, max_tokens=3)
            other = await client.open_session(resume=True)
            await completed(other, "other", max_tokens=2)
            await resumed.close()
    assert registry.stats.resumed_total == 1
    ids = session_ids(stack)
    assert ids["before"] is not None
    assert ids["after"] == ids["before"]
    assert ids["other"] is not None and ids["other"] != ids["before"]


async def test_turned_off_no_request_carries_the_header(nursery: trio.Nursery,
                                                        socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir,
                              pipeline=PipelineLimits(session_header=False))
    with trio.fail_after(20):
        async with connect(stack.uri()) as client:
            session = await client.open_session()
            await completed(session, "s", stream=True, max_tokens=3)
            await completed(session, "n", max_tokens=3)
            await token_completion(session, 50)
    sent = posts(stack)
    assert {r.path for r in sent} == {"/v1/chat/completions", "/v1/completions"}
    assert len(sent) == 3
    assert all("x-session-id" not in r.headers and r.headers["x-request-id"] for r in sent)
