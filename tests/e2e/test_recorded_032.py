"""The scenarios first written by hand in 0.26's shape, as vLLM 0.32 really sends them
(``*_032``, recorded by ``nnrp-gateway record --forced``): a 0.32 replay plays the recorded
bytes under the scenario's own name, and the gateway must translate them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gateway.pipeline import PipelineLimits
from gateway.tools.client import ClientSession, connect
from gateway.tools.replay import ReplayServer, conform_body
from tests.support.scenarios import EXPECTED_TERMINAL, RECORDED_032_SCENARIOS, TRANSCRIPTS
from tests.support.stack import Stack, envelope, run_operation, scenario_id, start_stack
from tests.support.transcripts import translate

if TYPE_CHECKING:
    import trio


@pytest.fixture
async def stack(nursery: trio.Nursery, socket_dir: Path) -> Stack:
    # The recorded parallel calls took 1.6 s (0.03 s at speed 50).
    return await start_stack(nursery, socket_dir, allow_untested_vllm=True,
                             replay=ReplayServer(family="0.32", speed=50),
                             pipeline=PipelineLimits(first_chunk_timeout=3.0, idle_timeout=2.0))


@pytest.fixture
async def session(stack: Stack) -> AsyncIterator[ClientSession]:
    async with connect(stack.uri()) as client:
        yield await client.open_session()


def test_every_hand_written_real_shape_has_a_recording() -> None:
    expected = sorted(["nonstream_reasoning", "nonstream_tool_call", "stream_finish_abort",
                       "stream_n2_interleaved", "stream_reasoning", "stream_reasoning_hidden",
                       "stream_reasoning_then_tool_call", "stream_tool_call_parallel",
                       "stream_tool_call_single"])
    assert expected == RECORDED_032_SCENARIOS


@pytest.mark.parametrize("name", RECORDED_032_SCENARIOS)
async def test_the_032_recording_through_the_gateway(stack: Stack, session: Any, name: str
                                                     ) -> None:
    recorded = TRANSCRIPTS[f"{name}_032"]
    assert recorded.vllm_version == "0.32.0"
    assert name not in EXPECTED_TERMINAL  # a healthy vLLM's answer
    request = dict(recorded.request_body)
    outcome = await run_operation(session, envelope(request, request_id=scenario_id(name)))
    assert outcome.final is not None
    assert outcome.final["type"] == "response.completed", outcome.final
    body = outcome.final["body"]
    assert stack.gateway.info is not None
    shape = stack.gateway.info.binding.shape
    if recorded.streaming:
        asked = bool((request.get("stream_options") or {}).get("include_usage"))
        expected, _ = translate(name, "0.32", usage_requested=asked)
        assert outcome.partials == expected
        # Not the hand-written 0.26 shape: the recorded bytes were played.
        assert expected != translate(name, "0.26", usage_requested=asked)[0]
    else:
        vllms = conform_body(json.loads(recorded.body), shape)
        assert {k: v for k, v in body.items() if k not in ("id", "created")} == {
            k: v for k, v in vllms.items() if k not in ("id", "created")}


async def test_a_forced_tool_call_stream_rebuilds_vllms_own_body(stack: Stack, session: Any
                                                                 ) -> None:
    """Recorded with the same seed both ways, so vLLM generated the same tokens: the body
    the gateway rebuilds from the stream is vLLM's non-streaming body, ``content: ""``
    included (0.32 writes "" for a forced tool choice; the gateway once wrote null).

    The reasoning pair is not compared: there vLLM itself diverges (a byte-fallback token
    cut by ``</think>`` leaves a U+FFFD in the non-streaming reasoning that the stream
    never sends), which no gateway can rebuild."""
    streamed, plain = "stream_tool_call_single", "nonstream_tool_call"
    outcome = await run_operation(session, envelope(
        dict(TRANSCRIPTS[f"{streamed}_032"].request_body), request_id=scenario_id(streamed)))
    assert outcome.final is not None and stack.gateway.info is not None
    rebuilt = outcome.final["body"]["choices"][0]
    vllms = conform_body(json.loads(TRANSCRIPTS[f"{plain}_032"].body),
                         stack.gateway.info.binding.shape)["choices"][0]
    # vLLM streams a call's arguments as the model wrote them, and re-serializes them
    # (json.dumps) in a non-streaming body: equal as JSON, not as text.
    for calls in (rebuilt["message"].get("tool_calls") or [],
                  vllms["message"].get("tool_calls") or []):
        for call in calls:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
            call.pop("id")
    assert rebuilt == vllms
