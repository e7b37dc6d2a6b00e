"""The recorded exchanges, as the end-to-end tests replay them through the gateway."""

from __future__ import annotations

from typing import Any

from gateway.tools.replay import bundled_transcripts

from .stack import chat

TRANSCRIPTS = bundled_transcripts()
CHAT_SCENARIOS = sorted(name for name in TRANSCRIPTS if not name.startswith("get_"))

#: What each recorded exchange must end as through the gateway.
EXPECTED_TERMINAL = {
    "engine_death_mid_stream": "backend_error",
    "error_400_bad_json": "invalid_backend_request",
    "error_400_context_length": "invalid_backend_request",
    "error_400_context_length_stream": "invalid_backend_request",
    "error_400_max_tokens": "invalid_backend_request",
    "error_400_missing_messages": "invalid_backend_request",
    "error_400_stream_options_without_stream": "invalid_backend_request",
    "error_400_temperature": "invalid_backend_request",
    "error_400_validation": "invalid_backend_request",
    "error_404_model": "unsupported_model",
    # vLLM would refuse this "stream" too; the gateway refuses it first, naming the field.
    "error_400_lax_stream_maybe": "invalid_body",
    "error_501_not_implemented": "backend_error",
    "stream_malformed_chunk": "backend_error",
    # Valid JSON whose text is not Unicode (a lone surrogate, which no UTF-8 frame can
    # carry): malformed upstream output, not a gateway bug.
    "stream_lone_surrogate": "backend_error",
    # Recorded by a client that hung up after 3 chunks: replayed, the body ends without
    # data: [DONE], which the gateway must treat as a broken stream.
    "stream_client_abort": "backend_error",
    "stream_tool_call_broken": "backend_error",
}


def request_for(name: str) -> dict[str, Any]:
    body = dict(TRANSCRIPTS[name].request_body)
    if "raw" in body or not isinstance(body.get("messages"), list):
        body = chat(stream=TRANSCRIPTS[name].streaming)
    if not body.get("stream"):
        body.pop("stream_options", None)
    return body
