"""Every recorded transcript through the gateway with nnrp-py's Rust-backed native client,
compared with what the project's own client receives for the same request."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

pytest.importorskip("nnrp.client.native")

from gateway.tools.client import connect
from tests.support.native import (
    native_connection,
    open_session,
    openai_submit,
    poll_until,
)
from tests.support.scenarios import CHAT_SCENARIOS, request_for
from tests.support.stack import Stack, envelope, run_operation

pytestmark = pytest.mark.interop


def terminal(events: list[dict[str, Any]]) -> bool:
    return any(e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON") for e in events)


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
async def test_native_client_sees_what_our_client_sees(stack: Stack, transport: str) -> None:
    names = [n for n in CHAT_SCENARIOS if n != "engine_death_mid_stream"]
    payloads = {n: envelope(request_for(n), request_id=f"replay:{n}:native") for n in names}
    ours = {}
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        for name in names:
            outcome = await run_operation(session, payloads[name])
            ours[name] = (outcome.partials, outcome.status, outcome.final)

    uri = stack.uri(transport)

    def scenario() -> dict[str, Any]:
        results = {}
        with native_connection(transport, uri) as connection:
            session = open_session(connection)
            for number, name in enumerate(names, start=1):
                session.submit_operation(openai_submit(number, number, payloads[name]))
                events = [e for e in poll_until(session, terminal, timeout=15)
                          if e["kind"] != "lifecycle"]
                partials = [json.loads(e["body"]) for e in events
                            if e["kind"] == "PARTIAL_RESULT"]
                last = events[-1]
                results[name] = (partials, last.get("status"), last.get("payload"))
            session.close()
        return results

    with trio.fail_after(120):
        theirs = await trio.to_thread.run_sync(scenario)
    for name in names:
        assert theirs[name] == ours[name], name
