"""The same checks against a real vLLM, when ``NNRP_GATEWAY_LIVE_VLLM_URL`` is set (not in CI).

    ../shared/tools/real-vllm/setup.sh && ../shared/tools/real-vllm/serve.sh 8011 &
    NNRP_GATEWAY_LIVE_VLLM_URL=http://127.0.0.1:8011 .venv/bin/pytest -m live

The CPU build that installs on these machines is vLLM 0.32.0, outside the tested band,
so the gateway runs with allow_untested_vllm (nearest binding: 0.26.x).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio

from gateway.app import Gateway, GatewayConfig
from gateway.tools.client import connect
from tests.support.stack import chat, envelope, run_operation

LIVE_URL = os.environ.get("NNRP_GATEWAY_LIVE_VLLM_URL")
pytestmark = [pytest.mark.live,
              pytest.mark.skipif(not LIVE_URL, reason="NNRP_GATEWAY_LIVE_VLLM_URL is not set")]


@pytest.fixture
async def live_session(nursery: trio.Nursery) -> Any:
    assert LIVE_URL is not None
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",), vllm_url=LIVE_URL,
                                    allow_untested_vllm=True, probe_interval=0.2))
    endpoints = await nursery.start(gateway.run)
    with trio.fail_after(60):
        await gateway.probed.wait()
    async with connect(endpoints[0].uri) as client:
        yield gateway, await client.open_session()


async def test_live_stream_usage_and_completed(live_session: Any) -> None:
    gateway, session = live_session
    assert gateway.info.binding.family == "0.26.x"
    outcome = await run_operation(session, envelope(chat(
        "tiny", stream=True, max_tokens=8, stream_options={"include_usage": True})))
    assert outcome.final["type"] == "response.completed"
    assert outcome.types[-1] == "response.usage"
    assert outcome.partials[-1]["usage"]["completion_tokens"] == 8
    text = "".join(p["delta"] for p in outcome.partials if p["type"].endswith("text.delta"))
    assert outcome.final["body"]["choices"][0]["message"]["content"] == text


async def test_live_non_streaming_and_errors(live_session: Any) -> None:
    _, session = live_session
    unary = await run_operation(session, envelope(chat("example-model", max_tokens=4)))
    assert unary.final["body"]["object"] == "chat.completion"
    missing = await run_operation(session, envelope(chat("no-such-model", max_tokens=4)))
    assert missing.final["error"]["code"] == "unsupported_model"
    bad = await run_operation(session, envelope(chat("tiny", max_tokens=4, temperature=-1)))
    assert bad.final["error"]["code"] == "invalid_backend_request"
    assert bad.final["diagnostics"]["backend_status"] == 400


async def test_live_cancel_mid_stream(live_session: Any) -> None:
    _, session = live_session
    operation = await session.submit(envelope(chat("tiny", stream=True, max_tokens=400,
                                                   ignore_eos=True)))
    seen: list[Any] = []
    with trio.fail_after(30):
        async for event in operation.events():
            seen.append(event)
            if len(seen) == 3:
                await operation.cancel()
    assert type(seen[-1]).__name__ == "DropReceived"
    assert len(seen) < 400
