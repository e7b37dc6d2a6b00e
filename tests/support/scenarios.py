"""The recorded exchanges, as the end-to-end tests replay them through the gateway."""

from __future__ import annotations

from typing import Any

from gateway.tools.replay import bundled_transcripts

from .stack import chat

TRANSCRIPTS = bundled_transcripts()
#: 0.33's own transcripts (``*_033``, synthesized) are played as 0.33 answers them, in
#: tests/e2e/test_vllm_today.py; an older family has no such fields. The 0.32 recordings
#: of hand-written scenarios (``*_032``) are played by the 0.32 family under their
#: scenario's name (``RECORDED_032_SCENARIOS``).
CHAT_SCENARIOS = sorted(name for name in TRANSCRIPTS
                        if not name.startswith("get_") and not name.endswith(("_033", "_032")))
RECORDED_032_SCENARIOS = sorted(name.removesuffix("_032") for name in TRANSCRIPTS
                                if name.endswith("_032"))

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
    # vLLM's own admission refusals (0.29+), before the first byte or as a 200 stream's
    # only event: recoverable overload (issue 23).
    "error_503_queue_full": "backend_overload",
    "error_503_queued_tokens": "backend_overload",
    "error_503_retryable": "backend_overload",
    "stream_refused_in_stream": "backend_overload",
}


def request_for(name: str) -> dict[str, Any]:
    body = dict(TRANSCRIPTS[name].request_body)
    if "raw" in body or not isinstance(body.get("messages"), list):
        body = chat(stream=TRANSCRIPTS[name].streaming)
    if not body.get("stream"):
        body.pop("stream_options", None)
    return body
