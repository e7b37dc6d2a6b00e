"""The fidelity rule through the whole stack: recorded vLLM answers in, over real sockets,
compared field by field with what vLLM itself answered (tests/pipeline/test_fidelity.py
holds the pure half)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.tools.replay import bundled_transcripts, conform_body
from tests.support.stack import Stack, envelope, run_operation, scenario_id

TRANSCRIPTS = bundled_transcripts()
PAIRS = sorted(name.removeprefix("stream_") for name in TRANSCRIPTS
               if name.startswith("stream_pair_"))


def recorded_body(name: str, stack: Stack) -> dict[str, Any]:
    """vLLM's recorded non-streaming body, in the shape of the family the replay plays."""
    assert stack.gateway.info is not None
    body = json.loads(TRANSCRIPTS[name].body)
    return conform_body(body, stack.gateway.info.binding.shape)


def without_ids(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


@pytest.mark.parametrize("pair", PAIRS)
async def test_streamed_and_not_both_give_vllms_body(stack: Stack, session: Any,
                                                     pair: str) -> None:
    plain = await run_operation(session, envelope(
        TRANSCRIPTS[f"nonstream_{pair}"].request_body,
        request_id=scenario_id(f"nonstream_{pair}")))
    streamed = await run_operation(session, envelope(
        TRANSCRIPTS[f"stream_{pair}"].request_body, request_id=scenario_id(f"stream_{pair}")))
    expected = recorded_body(f"nonstream_{pair}", stack)
    assert plain.final is not None and streamed.final is not None
    # Non-streaming: vLLM's body as vLLM sent it (only the id is the replay's).
    assert without_ids(plain.final["body"]) == without_ids(expected)
    # Streaming: the rebuilt body has the same fields with the same values.
    assert without_ids(streamed.final["body"]) == without_ids(expected)
    # And a streaming client had every token's logprobs and ids, in order.
    for choice in expected["choices"]:
        mine = [p for p in streamed.partials if p.get("index") == choice["index"]]
        entries = [e for p in mine for e in (p.get("logprobs") or {}).get("content") or []]
        assert entries == ((choice["logprobs"] or {}).get("content") or [])
        assert [i for p in mine for i in p.get("token_ids") or []] == (
            choice["token_ids"] or [])


async def test_prompt_logprobs_and_every_vllm_field_of_a_plain_answer(stack: Stack,
                                                                      session: Any) -> None:
    name = "nonstream_prompt_logprobs"
    outcome = await run_operation(session, envelope(TRANSCRIPTS[name].request_body,
                                                    request_id=scenario_id(name)))
    assert outcome.final is not None
    body = outcome.final["body"]
    assert body["prompt_logprobs"] == recorded_body(name, stack)["prompt_logprobs"]
    assert body["prompt_logprobs"][1]  # one entry per prompt token after the first


async def test_a_plain_answer_reaches_the_client_in_vllms_own_bytes(stack: Stack,
                                                                  session: Any) -> None:
    """Not decoded and encoded again (issue 25 item 5): the body inside the terminal is in
    vLLM's key order (``id`` first; the gateway's encoder sorts keys), equal to vLLM's."""
    from gateway import nnrp

    name = "nonstream_pair_logprobs_n2"
    operation = await session.submit(envelope(TRANSCRIPTS[name].request_body,
                                              request_id=scenario_id(name)))
    terminal = [event async for event in operation.events()][-1]
    assert isinstance(terminal, nnrp.ResultReceived)
    assert terminal.typed_body is not None
    payload = terminal.typed_body.frames[0].payload
    assert payload.startswith(b'{"body":{"id":"')
    assert payload.endswith(b'},"type":"response.completed"}')
    final = json.loads(payload)
    assert without_ids(final["body"]) == without_ids(recorded_body(name, stack))


@pytest.mark.parametrize("name", ["stream_lax_true_string", "stream_lax_int_1",
                                  "stream_lax_yes"])
async def test_lax_stream_values_stream(stack: Stack, session: Any, name: str) -> None:
    """vLLM streams for "true", 1, "yes": so does the gateway (it used to wait for a JSON
    body and fail with backend_error)."""
    outcome = await run_operation(session, envelope(TRANSCRIPTS[name].request_body,
                                                    request_id=scenario_id(name)))
    assert outcome.status == 200
    assert outcome.final is not None and outcome.final["type"] == "response.completed"
    assert any(p["type"] == "response.output_text.delta" for p in outcome.partials)
    sent = json.loads(stack.replay.requests[-1].body)
    assert sent["stream"] == TRANSCRIPTS[name].request_body["stream"]  # forwarded as is
    assert sent["stream_options"] == {"include_usage": True}


async def test_lax_false_is_not_streamed(stack: Stack, session: Any) -> None:
    name = "nonstream_lax_false_string"
    outcome = await run_operation(session, envelope(TRANSCRIPTS[name].request_body,
                                                    request_id=scenario_id(name)))
    assert outcome.status == 200 and not outcome.partials
    assert "stream_options" not in json.loads(stack.replay.requests[-1].body)


@pytest.mark.parametrize(("field", "body"), [
    ("stream", {"stream": "maybe"}), ("stream", {"stream": 2}),
    ("stream_options", {"stream": True, "stream_options": "yes"}),
    ("stream_options.include_usage", {"stream": True,
                                      "stream_options": {"include_usage": "maybe"}}),
])
async def test_unreadable_values_are_refused_before_vllm(stack: Stack, session: Any,
                                                          field: str,
                                                          body: dict[str, Any]) -> None:
    request = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], **body}
    outcome = await run_operation(session, envelope(request))
    assert outcome.status == 400
    assert outcome.final is not None
    assert outcome.final["error"]["code"] == "invalid_body"
    assert outcome.final["error"]["param"] == field
    assert not [r for r in stack.replay.requests if r.method == "POST"]  # never generated
