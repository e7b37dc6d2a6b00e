"""Transcripts written by hand: fault injections a healthy vLLM never sends, and the
0.26-shaped originals of scenarios now also recorded from 0.32 (``<scenario>_032``,
``_record.record_forced``), which the 0.18-0.26 families keep playing. Each says which in
its note (``NOTES``).

These scenarios are built here in exactly vLLM's 0.26 wire shape (docs/reference/vllm-http.md
section
1): compact chunks with fields in declaration order, the role chunk first, one event per
HTTP chunk, the finish chunk carrying the last fragment, the usage chunk with
``"choices":[]``, then ``data: [DONE]``. Also the dynamic text stream used when a
request names no scenario.

Regenerate the files with ``python -m gateway.tools.replay._synthesize``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from ._transcripts import Transcript

CREATED = 1796034842
FINGERPRINT = "vllm-0.26.0-66f56952"
SSE_HEADERS = (("content-type", "text/event-stream; charset=utf-8"),
               ("transfer-encoding", "chunked"))
JSON_HEADERS = (("content-type", "application/json"),)
WORDS = ("The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog",
         " while", " NNRP", " streams", " every", " token", " in", " order", ".")


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _event(value: Any) -> bytes:
    return b"data: " + _dump(value) + b"\n\n"


def _chunk(request_id: str, model: str, choices: list[dict[str, Any]], **extra: Any
           ) -> bytes:
    return _event({"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk",
                   "created": CREATED, "model": model, "choices": choices, **extra})


def role_chunk(request_id: str, model: str, index: int = 0) -> bytes:
    return _chunk(request_id, model, [{"index": index,
                                       "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None}],
                  prompt_token_ids=None, prompt_text=None)


def delta_chunk(request_id: str, model: str, delta: dict[str, Any], index: int = 0,
                finish: str | None = None, stop_reason: Any = None) -> bytes:
    choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None,
                              "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = stop_reason
    choice["token_ids"] = None
    return _chunk(request_id, model, [choice])


def usage_chunk(request_id: str, model: str, prompt: int, completion: int) -> bytes:
    return _chunk(request_id, model, [], usage={
        "prompt_tokens": prompt, "total_tokens": prompt + completion,
        "completion_tokens": completion}, system_fingerprint=FINGERPRINT)


DONE = b"data: [DONE]\n\n"


def text_completion(request_id: str, model: str, prompt: str, tokens: int) -> bytes:
    """vLLM 0.32's ``text_completion`` body (captured live) for ``tokens`` words."""
    text = "".join(WORDS[i % len(WORDS)] for i in range(tokens))
    prompt_tokens = max(1, len(prompt.split()))
    return _dump({
        "id": f"cmpl-{request_id}", "object": "text_completion", "created": CREATED,
        "model": model, "choices": [{
            "index": 0, "text": text, "logprobs": None, "finish_reason": "length",
            "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
            "prompt_token_ids": None, "routed_experts": None}],
        "service_tier": None, "system_fingerprint": FINGERPRINT,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + tokens,
                  "completion_tokens": tokens, "prompt_tokens_details": None,
                  "completion_tokens_details": None},
        "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None})


def text_stream(request_id: str, model: str, tokens: int, interval_ms: float,
                ttft_ms: float = 5.0, word: str | None = None) -> list[tuple[float, bytes]]:
    """A plain text stream of ``tokens`` tokens (``word`` each, or the demo sentence),
    finishing with ``length``."""
    chunks = [(ttft_ms, role_chunk(request_id, model))]
    t = ttft_ms
    middle = delta_chunk(request_id, model, {"content": word}) if word is not None else b""
    for number in range(tokens):
        t += interval_ms
        last = number == tokens - 1
        if word is not None and not last:
            chunks.append((t, middle))
            continue
        chunks.append((t, delta_chunk(request_id, model,
                                      {"content": word or WORDS[number % len(WORDS)]},
                                      finish="length" if last else None)))
    chunks.append((t, usage_chunk(request_id, model, 9, tokens)))
    chunks.append((t, DONE))
    return chunks


def _tool_start(index: int, call_id: str, name: str) -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "type": "function", "index": index,
                            "function": {"name": name}}]}


def _tool_args(index: int, fragment: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}


def _stream(name: str, chunks: list[bytes], request: dict[str, Any], note: str,
            step_ms: float = 4.0) -> Transcript:
    timed = tuple((5.0 + step_ms * i, data) for i, data in enumerate(chunks))
    return Transcript(name, "0.26.0", 200, SSE_HEADERS, timed, request,
                      (("x-request-id", f"cap-{name}"),), note)


def _json(name: str, status: int, body: Any, request: dict[str, Any], note: str,
          t_ms: float) -> Transcript:
    """A non-streaming answer: one JSON body with its content-length."""
    data = _dump(body)
    return Transcript(name, "0.26.0", status, (("content-type", "application/json"),
                                               ("content-length", str(len(data)))),
                      ((t_ms, data),), request, (("x-request-id", f"cap-{name}"),), note)


def _completion(name: str, model: str, content: str | None, tool_calls: list[Any],
                reasoning: str | None, finish: str, prompt: int, completion: int
                ) -> dict[str, Any]:
    """vLLM 0.26's chat.completion body: every field it sends, nulls included, in its
    order."""
    return {"id": f"chatcmpl-cap-{name}", "object": "chat.completion",
            "created": CREATED, "model": model, "choices": [{
                "index": 0, "message": {
                    "role": "assistant", "content": content, "refusal": None,
                    "annotations": None, "audio": None, "function_call": None,
                    "tool_calls": tool_calls, "reasoning": reasoning},
                "logprobs": None, "finish_reason": finish, "stop_reason": None,
                "token_ids": None}],
            "service_tier": None, "system_fingerprint": FINGERPRINT,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                      "completion_tokens": completion, "prompt_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None,
            "ec_transfer_params": None, "metrics": None}


def _request(**body: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], **body}


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Local time", "parameters": {"type": "object",
                                                                    "properties": {}}}}


def synthesized() -> list[Transcript]:
    rid, m = "cap-{}", "tiny"
    out = []
    name = "stream_tool_call_single"
    r = rid.format(name)
    out.append(_stream(name, [
        role_chunk(r, m),
        delta_chunk(r, m, _tool_start(0, "chatcmpl-tool-9f1c2a4b5d6e7f80", "get_weather")),
        delta_chunk(r, m, _tool_args(0, '{"ci')),
        delta_chunk(r, m, _tool_args(0, 'ty": "Par')),
        delta_chunk(r, m, _tool_args(0, 'is"}'), finish="tool_calls"),
        usage_chunk(r, m, 41, 12), DONE,
    ], _request(stream=True, tools=[WEATHER_TOOL], tool_choice="auto"),
        "one tool call, the last fragment on the finish chunk"))
    name = "stream_tool_call_parallel"
    r = rid.format(name)
    out.append(_stream(name, [
        role_chunk(r, m),
        delta_chunk(r, m, _tool_start(0, "chatcmpl-tool-a1a1a1a1a1a1a1a1", "get_weather")),
        delta_chunk(r, m, _tool_args(0, '{"city": ')),
        delta_chunk(r, m, _tool_start(1, "chatcmpl-tool-b2b2b2b2b2b2b2b2", "get_time")),
        delta_chunk(r, m, _tool_args(0, '"Oslo"}')),
        delta_chunk(r, m, _tool_args(1, "{}"), finish="tool_calls"),
        usage_chunk(r, m, 60, 20), DONE,
    ], _request(stream=True, tools=[WEATHER_TOOL, TIME_TOOL]),
        "two parallel calls whose fragments interleave"))
    name = "stream_tool_call_broken"
    r = rid.format(name)
    out.append(_stream(name, [
        role_chunk(r, m),
        delta_chunk(r, m, _tool_start(0, "chatcmpl-tool-c3c3c3c3c3c3c3c3", "get_weather")),
        delta_chunk(r, m, _tool_args(0, '{"city": "Li')),
        b'data: {"error": {"message": "EngineCore encountered an issue. See stack trace '
        b'(above) for the root cause.", "type": "InternalServerError", "param": null, '
        b'"code": 500}}\n\n',
        DONE,
    ], _request(stream=True, tools=[WEATHER_TOOL]), "engine failure in the middle of a call"))
    name = "stream_reasoning"
    r = rid.format(name)
    out.append(_stream(name, [
        role_chunk(r, m),
        delta_chunk(r, m, {"reasoning": "The user greets me."}),
        delta_chunk(r, m, {"reasoning": " Greet back."}),
        delta_chunk(r, m, {"content": "Hello"}),
        delta_chunk(r, m, {"content": "!"}, finish="stop"),
        usage_chunk(r, m, 8, 9), DONE,
    ], _request(stream=True), "--reasoning-parser: reasoning deltas, then content"))
    name = "stream_n2_interleaved"
    r = rid.format(name)
    out.append(_stream(name, [
        role_chunk(r, m, 0), role_chunk(r, m, 1),
        delta_chunk(r, m, {"content": "Hi"}, 0), delta_chunk(r, m, {"content": "Hey"}, 1),
        delta_chunk(r, m, {"content": " there"}, 1, finish="stop"),
        delta_chunk(r, m, {"content": "!"}, 0, finish="length"),
        usage_chunk(r, m, 4, 6), DONE,
    ], _request(stream=True, n=2), "n=2: choice indices interleave"))
    name = "stream_malformed_chunk"
    r = rid.format(name)
    out.append(_stream(name, [
        role_chunk(r, m),
        delta_chunk(r, m, {"content": "ok"}),
        _event({"id": "", "object": "chat.completion.chunk", "created": CREATED, "model": m,
                "choices": []}),
        DONE,
    ], _request(stream=True), "a chunk with an empty id (not something vLLM sends)"))
    name = "stream_reasoning_then_tool_call"
    r = rid.format(name)
    out.append(_stream(name, [
        role_chunk(r, m),
        delta_chunk(r, m, {"reasoning": "I need the weather."}),
        delta_chunk(r, m, _tool_start(0, "chatcmpl-tool-e5e5e5e5e5e5e5e5", "get_weather")),
        delta_chunk(r, m, _tool_args(0, '{"city": "Rome"}'), finish="tool_calls"),
        usage_chunk(r, m, 50, 14), DONE,
    ], _request(stream=True, tools=[WEATHER_TOOL]),
        "tool parsing starts only after reasoning ends (docs/reference/vllm-http.md section 1)"))
    name = "stream_reasoning_hidden"
    r = rid.format(name)
    out.append(_stream(name, [
        role_chunk(r, m),
        delta_chunk(r, m, {"content": "Hello"}),
        delta_chunk(r, m, {"content": "!"}, finish="stop"),
        usage_chunk(r, m, 8, 9), DONE,
    ], _request(stream=True, include_reasoning=False),
        "include_reasoning:false: the reasoning tokens are produced but not sent"))
    name = "stream_finish_abort"
    r = rid.format(name)
    out.append(_stream(name, [
        role_chunk(r, m),
        delta_chunk(r, m, {"content": "Partial"}),
        delta_chunk(r, m, {}, finish="abort"),
        usage_chunk(r, m, 8, 1), DONE,
    ], _request(stream=True), "server-side abort (pause, abort_requests) ends normally"))
    out.append(_json("nonstream_reasoning", 200, _completion(
        "nonstream_reasoning", m, "Hello!", [], "The user greets me.", "stop", 8, 9),
        _request(), "non-streaming with --reasoning-parser", 25.0))
    out.append(_json("error_501_not_implemented", 501, {"error": {
        "message": "The model does not support this endpoint",
        "type": "NotImplementedError", "param": None, "code": 501}},
        _request(), "not implemented: a real status before any stream", 3.0))
    name = "stream_lone_surrogate"
    r = rid.format(name)
    out.append(_stream(name, [
        role_chunk(r, m),
        delta_chunk(r, m, {"content": "ok"}),
        delta_chunk(r, m, {"content": "SURROGATE"}).replace(b"SURROGATE", b"\\ud800"),
        DONE,
    ], _request(stream=True), "valid JSON, but a lone surrogate: not encodable as UTF-8"))
    out.append(_json("nonstream_tool_call", 200, _completion(
        "nonstream_tool_call", m, None, [{
            "id": "chatcmpl-tool-d4d4d4d4d4d4d4d4", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
        None, "tool_calls", 41, 12),
        _request(tools=[WEATHER_TOOL]), "non-streaming tool call, content null", 30.0))
    return out


def _recorded_from_032(name: str, what: str) -> str:
    return (f"synthesized in 0.26's shape, which the 0.18-0.26 families play; 0.32 on "
            f"plays {name}_032, recorded live from vLLM 0.32.0 (a random-weight model "
            f"forced into it): {what}")
#: Why each stays synthesized (the replay server's transcripts say whether they are
#: recorded or synthesized, and why: tests/tools/test_transcript_notes.py).
NOTES = {name: _recorded_from_032(name, what) for name, what in {
    "stream_tool_call_single": "one tool call, the last fragment on the finish chunk",
    "stream_tool_call_parallel": "two parallel calls whose fragments interleave (vLLM 0.32 "
                                 "streams calls one after another)",
    "nonstream_tool_call": "non-streaming tool call, content null",
    "stream_reasoning": "--reasoning-parser: reasoning deltas, then content",
    "stream_reasoning_hidden": "include_reasoning:false: the reasoning tokens are produced "
                               "but not sent",
    "stream_reasoning_then_tool_call": "tool parsing starts only after reasoning ends "
                                       "(docs/reference/vllm-http.md section 1)",
    "nonstream_reasoning": "non-streaming with --reasoning-parser",
    "stream_n2_interleaved": "n=2: choice indices interleave",
    "stream_finish_abort": "server-side abort (POST /pause?mode=abort) ends the stream "
                           "normally, finish_reason abort",
}.items()}
NOTES.update({
    "stream_tool_call_broken": "synthesized (fault injection): an engine failure in the "
                               "middle of a tool call's arguments; the engine death recorded "
                               "from 0.32 (engine_death_mid_stream) came in a text stream",
    "stream_malformed_chunk": "synthesized (fault injection): a chunk with an empty id, "
                              "which vLLM never writes (its ids come from the request id)",
    "stream_lone_surrogate": "synthesized (fault injection): valid JSON holding a lone "
                             "surrogate; vLLM's text is decoded from UTF-8 with U+FFFD for "
                             "bad bytes, so it never holds one",
    "error_501_not_implemented": "synthesized (impossible from 0.32's chat route): "
                                 "NotImplementedError's 501 needs a chat route without a "
                                 "chat handler, but 0.32 registers the route and sets the "
                                 "handler only for a generating model "
                                 "(launchers/api_server/routers.py, generate/api_router.py); "
                                 "a pooling model answers 404 {\"detail\":\"Not Found\"} "
                                 "(seen live); the message is 0.26's guess",
})


def main() -> None:
    folder = Path(__file__).parent / "transcripts"
    for transcript in synthesized():
        transcript = attrs.evolve(transcript, note=NOTES.get(transcript.scenario,
                                                             transcript.note))
        (folder / f"{transcript.scenario}.jsonl").write_text(transcript.to_jsonl())


if __name__ == "__main__":
    main()
