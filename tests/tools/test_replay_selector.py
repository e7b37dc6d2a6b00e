"""The replay vLLM's one scenario selector: which reply a chat request gets, in order."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.tools.replay import SERVED_MODELS, choose_scenario

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
LONG = {"model": "tiny", "messages": [{"role": "user", "content": "Start a long answer."}]}


@pytest.mark.parametrize(("headers", "body", "expected"), [
    # 1. a header names it (beats everything, even a body that is not JSON)
    ({"x-replay-scenario": "stall_first_chunk", "x-request-id": "replay:other:1"}, None,
     "stall_first_chunk"),
    # 2. the request id names it (through the gateway)
    ({"x-request-id": "replay:long_stream:7"}, {**CHAT, "model": "backend-error"},
     "long_stream"),
    # 3. the suite's backend-error model
    ({}, {**CHAT, "model": "backend-error", "stream": True}, "backend_error"),
    # 4. what vLLM would answer
    ({}, None, "error_400_bad_json"),
    ({}, [1, 2], "error_400_bad_json"),
    ({}, {**CHAT, "model": "nope"}, "error_404_model"),
    ({}, {"model": "tiny"}, "error_400_missing_messages"),
    ({}, {**CHAT, "stream_options": {"include_usage": True}},
     "error_400_stream_options_without_stream"),
    ({}, {**CHAT, "tools": [{}]}, "nonstream_tool_call"),
    ({}, {**CHAT, "stream": True, "tools": [{}]}, "stream_tool_call_single"),
    ({}, {**CHAT, "stream": True, "tools": [{}, {}]}, "stream_tool_call_parallel"),
    ({}, {**CHAT, "stream": True, "n": 2}, "stream_n2_interleaved"),
    # the suite's cancellation recipe: a long answer is still running when its cancel lands
    ({}, {**LONG, "stream": True}, "long_stream"),
    ({}, LONG, "nonstream_length"),  # not streamed: answered whole, as any other
    ({}, {**LONG, "stream": True, "messages": [*LONG["messages"], CHAT["messages"][0]]},
     "text_stream"),  # the last message decides
    ({}, {**CHAT, "stream": True}, "text_stream"),
    ({}, CHAT, "nonstream_length"),
])
def test_the_first_matching_rule_decides(headers: dict[str, str], body: Any,
                                         expected: str) -> None:
    assert choose_scenario(headers, body, SERVED_MODELS) == expected


def test_without_long_answers_the_long_answer_prompt_is_a_short_stream() -> None:
    """``long_answers=False`` (``replay-server --no-long-answers``): a fast backend whose
    model stops early, which the suite's cancellation recipe's CANCEL may miss."""
    assert choose_scenario({}, {**LONG, "stream": True}, SERVED_MODELS,
                           long_answers=False) == "text_stream"
    # A scenario named by the request still wins (the project's cancel recipe).
    assert choose_scenario({"x-request-id": "replay:long_stream:1"}, {**LONG, "stream": True},
                           SERVED_MODELS, long_answers=False) == "long_stream"
