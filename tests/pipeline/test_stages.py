"""Pure pipeline stages: request building, traceparent, chunk checks, translation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.nnrp import TraceInfo
from gateway.pipeline import Translator, build_request, traceparent, vllm_priority
from gateway.pipeline._request import SESSION_HEADER
from gateway.pipeline._translate import forces_tool_choice
from gateway.profile import parse_envelope
from gateway.tools.replay import bundled_transcripts, derive, family_transcripts
from gateway.upstream import BINDINGS, UpstreamMalformed, parse_chunk, select_binding
from tests.support.transcripts import translate

B26 = BINDINGS[2]


def envelope(body: dict[str, Any], **extra: Any) -> Any:
    return parse_envelope(json.dumps({
        "schema_version": "openai-compatible/1", "operation": "chat.completions.create",
        "body": {"model": "m", "messages": [{"role": "user", "content": "x"}], **body},
        **extra}).encode())


# --------------------------------------------------------------------------- request


def test_traceparent_is_byte_exact() -> None:
    trace = TraceInfo(trace_id=0x0123456789ABCDEF, span_id=0xFEDCBA9876543210,
                      parent_span_id=7, trace_flags=0b11, attribute_bytes=12)
    assert traceparent(trace) == "00-00000000000000000123456789abcdef-fedcba9876543210-01"
    assert traceparent(TraceInfo(1, 2, 0, 0b10, 0)) == (
        "00-00000000000000000000000000000001-0000000000000002-00")
    assert traceparent(TraceInfo(0, 2, 0, 1, 0)) is None  # trace_id zero: not eligible
    assert traceparent(TraceInfo(1, 0, 0, 1, 0)) is None  # span_id zero: not eligible
    assert traceparent(None) is None


def test_stream_request_adds_include_usage_and_ids() -> None:
    request = build_request(envelope({"stream": True}, nnrp={"diagnostics": True}),
                            session_id=2, operation_id=9, connection_id=4,
                            trace=TraceInfo(5, 6, 0, 1, 0))
    # The body exactly as sent, plus include_usage: the nnrp policy never reaches vLLM.
    assert request.body == {"model": "m", "messages": [{"role": "user", "content": "x"}],
                            "stream": True, "stream_options": {"include_usage": True}}
    assert not request.usage_requested
    assert request.headers == {"x-request-id": "nnrp-4-2-9",
                               "traceparent": f"00-{5:032x}-{6:016x}-01"}
    asked = build_request(envelope({"stream": True, "stream_options": {
        "include_usage": True, "continuous_usage_stats": True}}, request_id="mine"),
        session_id=1, operation_id=1, connection_id=1, trace=None)
    assert asked.usage_requested
    assert asked.body["stream_options"]["continuous_usage_stats"] is True
    assert asked.headers == {"x-request-id": "mine"}


def test_the_session_uid_goes_as_x_session_id_and_nowhere_else() -> None:
    with_uid = build_request(envelope({"stream": True}), session_id=1, operation_id=2,
                             connection_id=3, trace=None, session_uid="0123456789abcdef")
    without = build_request(envelope({"stream": True}), session_id=1, operation_id=2,
                            connection_id=3, trace=None)
    assert SESSION_HEADER == "x-session-id"
    assert with_uid.headers == {"x-request-id": "nnrp-3-1-2",
                                "x-session-id": "0123456789abcdef"}
    assert without.headers == {"x-request-id": "nnrp-3-1-2"}
    assert with_uid.body == without.body  # a header only: the body stays the client's


def test_a_priority_class_becomes_vllms_priority() -> None:
    assert vllm_priority(0, 0) == -10  # interactive: one step ahead of vLLM's default
    assert vllm_priority(1, 0) is None  # balanced, what stock clients open: vLLM's default
    assert vllm_priority(2, -3) == 7  # background, fine-tuned by the delta
    assert vllm_priority(1, 4) == 4


def test_non_stream_body_is_sent_as_is() -> None:
    body = {"temperature": 0.3, "max_tokens": 4}
    request = build_request(envelope(body), session_id=1, operation_id=1, connection_id=1,
                            trace=None)
    assert request.body == {"model": "m", "messages": [{"role": "user", "content": "x"}], **body}
    assert not request.stream


# --------------------------------------------------------------------------- chunk checks

CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"content": "x"}}]}


@pytest.mark.parametrize(("change", "text"), [
    ({"id": ""}, "'id'"), ({"model": None}, "'model'"), ({"created": -1}, "'created'"),
    ({"created": "1"}, "'created'"), ({"object": "chat.completion"}, "'object'"),
    ({"choices": {}}, "'choices' is not a list"),
    ({"choices": [{"index": "0", "delta": {}}]}, "index"),
    ({"choices": [{"index": 0}]}, "'delta'"),
    ({"choices": [{"index": 0, "delta": {"content": 5}}]}, "delta.content"),
    ({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": -1}]}}]}, "tool call index"),
    ({"usage": 3}, "'usage'"),
])
def test_chunk_checks_name_the_problem(change: dict[str, Any], text: str) -> None:
    with pytest.raises(UpstreamMalformed, match=text):
        parse_chunk(json.dumps({**CHUNK, **change}))


def test_in_stream_error_and_non_json() -> None:
    with pytest.raises(UpstreamMalformed, match="EngineCore") as info:
        parse_chunk('{"error": {"message": "EngineCore encountered an issue.", '
                    '"type": "InternalServerError", "param": null, "code": 500}}')
    assert (info.value.kind, info.value.status, info.value.error_type) == (
        "in_stream_error", 500, "InternalServerError")
    with pytest.raises(UpstreamMalformed, match="not JSON"):
        parse_chunk("{oops")


# --------------------------------------------------------------------------- translation


def test_text_stream_with_usage() -> None:
    events, translator = translate("stream_usage")
    kinds = [e["type"] for e in events]
    assert kinds.count("response.output_text.delta") == 3  # "Z", "\ufffdct", "@" (finish chunk)
    assert kinds[-1] == "response.usage"
    assert events[-1]["usage"] == {"prompt_tokens": 4, "total_tokens": 9, "completion_tokens": 5}
    body = translator.completed_body()
    assert body["object"] == "chat.completion"
    assert body["id"] == "chatcmpl-cap-stream_usage"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["content"] == "".join(
        e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert body["system_fingerprint"] == "vllm-0.32.0-66f56952"


def test_usage_event_only_when_asked() -> None:
    events, translator = translate("stream_usage", usage_requested=False)
    assert "response.usage" not in [e["type"] for e in events]
    assert translator.usage is not None


@pytest.mark.parametrize("family", ["0.18", "0.22", "0.26"])
def test_single_tool_call_lifecycle_every_family(family: str) -> None:
    events, translator = translate("stream_tool_call_single", family)
    assert [e["type"] for e in events] == [
        "response.tool_call.started", "response.tool_call.delta", "response.tool_call.delta",
        "response.tool_call.delta", "response.tool_call.completed", "response.usage"]
    started, completed = events[0], events[4]
    assert started["call_id"] == "chatcmpl-tool-9f1c2a4b5d6e7f80"
    assert started["name"] == "get_weather"
    assert started["item_id"] == "tool-call-0-0"
    assert completed["arguments"] == '{"city": "Paris"}'
    message = translator.completed_body()["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [{"id": "chatcmpl-tool-9f1c2a4b5d6e7f80", "type": "function",
                                      "function": {"name": "get_weather",
                                                   "arguments": '{"city": "Paris"}'}}]


def test_parallel_tool_calls_interleave() -> None:
    events, translator = translate("stream_tool_call_parallel")
    completed = [e for e in events if e["type"] == "response.tool_call.completed"]
    assert [(e["index"], e["name"], e["arguments"]) for e in completed] == [
        (0, "get_weather", '{"city": "Oslo"}'), (1, "get_time", "{}")]
    assert len(translator.completed_body()["choices"][0]["message"]["tool_calls"]) == 2


def test_032_streams_recorded_parallel_calls_one_after_another() -> None:
    events, translator = translate("stream_tool_call_parallel", "0.32")
    completed = [e for e in events if e["type"] == "response.tool_call.completed"]
    assert [(e["index"], e["name"]) for e in completed] == [
        (0, "get_weather"), (1, "get_weather"), (2, "get_time")]
    for event in completed:  # strict schemas: the forced arguments are JSON
        json.loads(event["arguments"])
    deltas = [e["index"] for e in events if e["type"] == "response.tool_call.delta"]
    assert deltas == sorted(deltas)  # never interleaved
    assert translator.completed_body()["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(("family", "forced", "content"), [
    ("0.32", True, ""),    # 0.32's serving.py: content or "" for a named/required choice
    ("0.32", False, None),
    ("0.26", True, None),  # not recorded forcing a tool: the parser's null
])
def test_a_tool_call_without_text_rebuilds_vllms_content(family: str, forced: bool,
                                                         content: str | None) -> None:
    transcript = family_transcripts(family)["stream_tool_call_single"]
    translator = Translator(select_binding(transcript.vllm_version)[0],
                            usage_requested=False, forced_tool_choice=forced)
    for block in transcript.body.split(b"\n\n"):
        if block.startswith(b"data: ") and block != b"data: [DONE]":
            translator.feed(parse_chunk(block[6:].decode()))
    translator.finish()
    message = translator.completed_body()["choices"][0]["message"]
    assert message["tool_calls"]
    assert message["content"] == content


def test_forced_tool_choice_is_required_or_a_named_function() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert forces_tool_choice({"tools": tools, "tool_choice": "required"})
    assert forces_tool_choice({"tools": tools, "tool_choice": {
        "type": "function", "function": {"name": "f"}}})
    assert not forces_tool_choice({"tools": tools, "tool_choice": "auto"})
    assert not forces_tool_choice({"tools": tools})
    assert not forces_tool_choice({"tool_choice": "required"})


def test_tool_call_noise_of_old_families_yields_no_events() -> None:
    transcript = derive(bundled_transcripts()["stream_tool_call_single"], "0.22")
    assert b'"tool_calls":[]' not in transcript.body  # noise only goes on content deltas
    binding, _ = select_binding("0.22.1")
    translator = Translator(binding, usage_requested=False)
    noisy = {**CHUNK, "choices": [{"index": 0, "delta": {"content": "", "tool_calls": []}}]}
    assert translator.feed(noisy) == []
    with pytest.raises(UpstreamMalformed, match="starts without"):
        Translator(B26, usage_requested=False).feed(
            {**CHUNK, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]})


def test_broken_tool_call_gets_an_error_event() -> None:
    translator = Translator(B26, usage_requested=False)
    transcript = bundled_transcripts()["stream_tool_call_broken"]
    blocks = [block[6:].decode() for block in transcript.body.split(b"\n\n")
              if block.startswith(b"data: ") and block != b"data: [DONE]"]
    for block in blocks[:-1]:
        translator.feed(parse_chunk(block))
    with pytest.raises(UpstreamMalformed):
        parse_chunk(blocks[-1])
    aborted = translator.abort("engine died")
    assert [e["type"] for e in aborted] == ["response.tool_call.error"]
    assert aborted[0]["error"]["code"] == "tool_call_stream_interrupted"
    assert translator.abort("again") == []  # exactly one terminal per call


def test_n2_keeps_choices_apart_and_reasoning_is_an_extension() -> None:
    events, translator = translate("stream_n2_interleaved")
    body = translator.completed_body()
    assert [c["message"]["content"] for c in body["choices"]] == ["Hi!", "Hey there"]
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "stop"]
    events, translator = translate("stream_reasoning")
    assert [e["type"] for e in events][:2] == ["response.reasoning_text.delta"] * 2
    assert translator.completed_body()["choices"][0]["message"]["reasoning"] == (
        "The user greets me. Greet back.")


def test_empty_content_is_skipped_and_openai_chunk_copies() -> None:
    assert Translator(B26, usage_requested=False).feed(
        {**CHUNK, "choices": [{"index": 0, "delta": {"content": ""}}]}) == []
    translator = Translator(B26, usage_requested=False, include_openai_chunk=True)
    empty = {**CHUNK, "choices": [{"index": 0, "delta": {"content": ""}}]}
    # A chunk with no event of its own is still conveyed (extension vllm.openai_chunk).
    assert translator.feed(empty) == [{"type": "response.openai_chunk", "openai_chunk": empty}]
    (event,) = translator.feed(CHUNK)
    assert event["openai_chunk"] == CHUNK


def test_reasoning_then_tool_call_and_server_abort() -> None:
    events, translator = translate("stream_reasoning_then_tool_call")
    assert [e["type"] for e in events][:2] == ["response.reasoning_text.delta",
                                               "response.tool_call.started"]
    message = translator.completed_body()["choices"][0]["message"]
    assert message["reasoning"] == "I need the weather."
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Rome"}'
    events, translator = translate("stream_finish_abort")
    assert translator.completed_body()["choices"][0]["finish_reason"] == "abort"
    events, _ = translate("stream_reasoning_hidden")
    assert "response.reasoning_text.delta" not in [e["type"] for e in events]
