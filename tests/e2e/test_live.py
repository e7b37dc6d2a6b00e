"""The same checks against a real vLLM, when ``NNRP_GATEWAY_LIVE_VLLM_URL`` is set (not in CI).

    ../shared/tools/real-vllm/setup.sh && ../shared/tools/real-vllm/serve.sh 8011 &
    NNRP_GATEWAY_LIVE_VLLM_URL=http://127.0.0.1:8011 .venv/bin/pytest -m live

The CPU build that installs on these machines is vLLM 0.32.0, bound as the 0.32.x family
(issue 23): the gateway serves it without allow_untested_vllm.

``test_live_parity`` is the fidelity rule against the real thing: 50 requests, each sent
directly over HTTP and through the gateway, answers compared field by field.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
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
                                    probe_interval=0.2))
    endpoints = await nursery.start(gateway.run)
    with trio.fail_after(60):
        await gateway.probed.wait()
    async with connect(endpoints[0].uri) as client:
        yield gateway, await client.open_session()


async def test_live_stream_usage_and_completed(live_session: Any) -> None:
    gateway, session = live_session
    assert gateway.info.binding.family == "0.32.x"
    assert not gateway.info.untested
    assert gateway.capabilities()["backend"]["evidence"] == "live_cpu"
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


#: Sampling and output options of vLLM's chat API, each sent streaming and not. Seeded
#: (or greedy): vLLM then generates the same tokens both ways, so the gateway's stream must
#: rebuild exactly vLLM's own non-streaming body.
OPTIONS: dict[str, dict[str, Any]] = {
    "plain": {}, "greedy": {"temperature": 0}, "logprobs": {"logprobs": True, "top_logprobs": 2},
    "logprobs_only": {"logprobs": True}, "top_logprobs_0": {"logprobs": True, "top_logprobs": 0},
    "n2": {"n": 2}, "n2_logprobs": {"n": 2, "logprobs": True, "top_logprobs": 3},
    "token_ids": {"return_token_ids": True},
    "greedy_logprobs_token_ids": {"temperature": 0, "logprobs": True, "top_logprobs": 1,
                                  "return_token_ids": True},
    "stop_string": {"stop": ["in", "e"]}, "stop_token_ids": {"stop_token_ids": [21, 30]},
    "max_completion_tokens": {"max_completion_tokens": 3},
    "penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.5},
    "repetition_penalty": {"repetition_penalty": 1.2}, "top_p_k": {"top_p": 0.5, "top_k": 5},
    "min_p": {"min_p": 0.1}, "min_tokens": {"min_tokens": 5}, "ignore_eos": {"ignore_eos": True},
    "json_object": {"response_format": {"type": "json_object"}},
    "unicode": {"messages": [{"role": "user", "content": "héllo 世界 🙂"}]},
    "system": {"messages": [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Hi"}]},
    "kv_transfer_params": {"kv_transfer_params": {"do_remote_decode": False}},
    "special_tokens": {"skip_special_tokens": False},
    "other_seed": {"seed": 123},
    "lax_values": {"logprobs": "yes", "top_logprobs": 2.0, "n": "1"},
}
#: vLLM's refusals: the gateway must give vLLM's status, message and param.
ERRORS: dict[str, dict[str, Any]] = {
    "top_logprobs_21": {"logprobs": True, "top_logprobs": 21},
    "n2_greedy": {"n": 2, "temperature": 0}, "max_tokens_over": {"max_tokens": 600},
    "tools_empty": {"tools": []}, "tool_choice_without_tools": {"tool_choice": "auto"},
    "stream_prompt_logprobs": {"stream": True, "prompt_logprobs": 1},
}


def _request(options: dict[str, Any], *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}],
                            "max_tokens": 6, "temperature": 1.0, "seed": 7, **options}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def _fields(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


async def test_live_parity(live_session: Any) -> None:
    assert LIVE_URL is not None
    _, session = live_session
    compared = 0
    async with httpx.AsyncClient(base_url=LIVE_URL, timeout=120) as http:
        for name, options in OPTIONS.items():
            direct = (await http.post("/v1/chat/completions",
                                      json=_request(options, stream=False))).json()
            for stream in (False, True):
                outcome = await run_operation(session, envelope(_request(options,
                                                                         stream=stream)))
                assert outcome.final is not None, name
                assert outcome.final["type"] == "response.completed", (name, outcome.final)
                assert _fields(outcome.final["body"]) == _fields(direct), (name, stream)
                if stream:
                    for choice in direct["choices"]:
                        text = "".join(p["delta"] for p in outcome.partials
                                       if p["type"] == "response.output_text.delta"
                                       and p["index"] == choice["index"])
                        assert text == choice["message"]["content"], name
                compared += 1
        for name, options in ERRORS.items():
            body = _request(options, stream=bool(options.get("stream")))
            answer = await http.post("/v1/chat/completions", json=body)
            outcome = await run_operation(session, envelope(body))
            assert outcome.final is not None and outcome.final["type"] == "response.error"
            error = answer.json()["error"]
            assert outcome.status == answer.status_code, name
            assert outcome.final["error"]["message"] == error["message"], name
            assert outcome.final["error"].get("param") == error["param"], name
            compared += 1
    assert compared >= 40
    print(json.dumps({"compared": compared}))


async def test_live_token_profile(live_session: Any) -> None:
    """NNRP's token profile against a real vLLM: a text completion of the chunks."""
    from gateway import nnrp
    from gateway.tools.conformance import runner_token_submit

    _, session = live_session
    meta, body = runner_token_submit(77)
    operation = await session.submit_frame(meta, body)
    with trio.fail_after(60):
        (result,) = [event async for event in operation.events()]
    assert isinstance(result, nnrp.ResultReceived) and result.meta.status_code == 200
    (frame,) = result.typed_body.frames
    assert frame.descriptor.payload_kind == nnrp.PayloadKind.TOKEN_CHUNK
    assert frame.payload  # vLLM's (random-weight) completion text
