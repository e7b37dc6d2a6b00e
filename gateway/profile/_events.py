"""Profile event builders: each returns the compact JSON body of one event.

Encoding follows the reference adapter (docs/reference/reference-adapter.md section 6 and the live
capture of docs/reference/nnrp-wire.md section 6): compact separators, sorted keys, UTF-8 as is.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._errors import ProfileError

_encoder = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False)


_string = json.JSONEncoder(ensure_ascii=False).encode
_TEXT_DELTA_KEYS = frozenset({"type", "index", "delta"})


def encode_event(event: dict[str, Any]) -> bytes:
    """Compact, sorted-key UTF-8 JSON. The plain text delta (most events) takes a direct
    path that produces the same bytes as the general encoder."""
    if (event.keys() == _TEXT_DELTA_KEYS and event["type"] == "response.output_text.delta"
            and type(event["index"]) is int and type(event["delta"]) is str):
        return encode_text_delta(event["index"], event["delta"])
    return _encoder.encode(event).encode("utf-8")


def encode_text_delta(index: int, delta: str) -> bytes:
    """``encode_event(text_delta(index, delta))``, without building the event first."""
    return (f'{{"delta":{_string(delta)},"index":{index},'
            '"type":"response.output_text.delta"}').encode()


def text_delta(index: int, delta: str) -> dict[str, Any]:
    """Extension ``vllm.logprobs`` may add ``logprobs`` and ``token_ids`` (ignorable)."""
    return {"type": "response.output_text.delta", "index": index, "delta": delta}


def reasoning_delta(index: int, delta: str) -> dict[str, Any]:
    """Declared non-critical extension ``vllm.reasoning``: clients may ignore it."""
    return {"type": "response.reasoning_text.delta", "index": index, "delta": delta}


def tool_call_started(index: int, item_id: str, call_id: str, name: str,
                      choice_index: int = 0) -> dict[str, Any]:
    return {"type": "response.tool_call.started", "index": index, "item_id": item_id,
            "call_id": call_id, "name": name, "choice_index": choice_index}


def tool_call_delta(index: int, item_id: str, call_id: str, arguments_delta: str,
                    choice_index: int = 0) -> dict[str, Any]:
    return {"type": "response.tool_call.delta", "index": index, "item_id": item_id,
            "call_id": call_id, "arguments_delta": arguments_delta,
            "choice_index": choice_index}


def tool_call_completed(index: int, item_id: str, call_id: str, name: str, arguments: str,
                        choice_index: int = 0) -> dict[str, Any]:
    return {"type": "response.tool_call.completed", "index": index, "item_id": item_id,
            "call_id": call_id, "name": name, "arguments": arguments,
            "choice_index": choice_index}


def tool_call_error(index: int, item_id: str, call_id: str, code: str, message: str,
                    choice_index: int = 0) -> dict[str, Any]:
    return {"type": "response.tool_call.error", "index": index, "item_id": item_id,
            "call_id": call_id, "choice_index": choice_index,
            "error": {"type": "backend_error", "code": code, "message": message}}


def openai_chunk(chunk: dict[str, Any]) -> dict[str, Any]:
    """Declared non-critical extension ``vllm.openai_chunk``: a vLLM chunk that maps to no
    other event, conveyed when the client set ``nnrp.include_openai_chunk``."""
    return {"type": "response.openai_chunk", "openai_chunk": chunk}


def usage(usage_object: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.usage", "usage": usage_object}


def completed(body: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.completed", "body": body}


#: JSON's whitespace (RFC 8259 section 2), which may surround a JSON text.
_JSON_WHITESPACE = b" \t\r\n"


def completed_text(body_json: bytes) -> bytes:
    """The encoded ``response.completed`` of a non-streaming answer, its body vLLM's
    JSON text as vLLM sent it: the profile changes none of a completion's fields
    (docs/reference/reference-adapter.md section 6: "vLLM's response for non-streaming"), so the
    body
    is passed through rather than decoded and encoded again. The event's own keys are
    compact and sorted as every event's; inside the body the order and spacing are
    vLLM's (it renders compact JSON: Starlette's JSONResponse). ``body_json`` must be
    a checked JSON object (``gateway.upstream.parse_completion``: strict UTF-8, no lone
    surrogate)."""
    return b'{"body":' + body_json.strip(_JSON_WHITESPACE) + b',"type":"response.completed"}'


def diagnostics(record: dict[str, Any]) -> dict[str, Any]:
    """Declared non-critical extension ``vllm.diagnostics``; unknown fields are ignorable."""
    return {"type": "response.diagnostics", "diagnostics": record}


def error_event(error: ProfileError) -> dict[str, Any]:
    body: dict[str, Any] = {"type": error.error_type, "code": str(error.code),
                            "message": error.message}
    if error.param is not None:
        body["param"] = error.param
    event: dict[str, Any] = {"type": "response.error", "error": body}
    if error.diagnostics:
        event["diagnostics"] = error.diagnostics
    return event
