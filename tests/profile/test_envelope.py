"""The envelope stage: every error code of the profile, and what reaches vLLM."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway import nnrp
from gateway.profile import (
    ProfileError,
    events,
    parse_envelope,
    read_typed_body,
)

GOOD = {"schema_version": "openai-compatible/1", "operation": "chat.completions.create",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}


def envelope(**changes: Any) -> bytes:
    document = {**GOOD, **changes}
    return json.dumps({k: v for k, v in document.items() if v is not ...}).encode()


def code_of(payload: bytes) -> str:
    with pytest.raises(ProfileError) as info:
        parse_envelope(payload)
    return info.value.code


def test_good_envelope_keeps_body_and_strips_nnrp() -> None:
    parsed = parse_envelope(envelope(request_id="r-1", nnrp={"timeout_ms": 5, "diagnostics": True}))
    assert parsed.body == GOOD["body"]  # the policy is the envelope's, never the body's
    assert parsed.request_id == "r-1"
    assert parsed.policy.timeout_ms == 5
    assert parsed.policy.diagnostics


def test_nnrp_key_inside_body_is_an_openai_field_not_policy() -> None:
    # Found by the envelope fuzz target: only the top-level "nnrp" object is gateway policy;
    # a key of the same name inside body belongs to the OpenAI request and is forwarded as is.
    body = {**GOOD["body"], "nnrp": {"timeout_ms": 1}}
    parsed = parse_envelope(envelope(body=body))
    assert parsed.body == body
    assert parsed.policy.timeout_ms is None


@pytest.mark.parametrize(("payload", "code"), [
    (b"\xff\xfe", "invalid_body"),
    (b"[1,2]", "invalid_body"),
    (b"{not json", "invalid_body"),
    (envelope(schema_version="openai-compatible/2"), "unsupported_schema_version"),
    (envelope(schema_version=...), "unsupported_schema_version"),
    (envelope(operation="responses.create"), "unsupported_operation"),
    (envelope(operation="embeddings.create"), "unsupported_operation"),
    (envelope(operation="models.list"), "unsupported_operation"),
    (envelope(body=[1]), "invalid_body"),
    (envelope(body={"messages": [{"role": "user", "content": "x"}]}), "missing_model"),
    (envelope(body={"model": "", "messages": [{"role": "user", "content": "x"}]}), "missing_model"),
    (envelope(body={"model": "m"}), "missing_messages"),
    (envelope(body={"model": "m", "messages": []}), "missing_messages"),
    (envelope(request_id=7), "invalid_request_id"),
    (envelope(request_id="has space"), "invalid_request_id"),
    (envelope(request_id="x" * 129), "invalid_request_id"),
    (envelope(nnrp=[]), "invalid_nnrp_policy"),
    (envelope(nnrp={"timeout_ms": -1}), "invalid_nnrp_policy"),
    (envelope(nnrp={"timeout_ms": True}), "invalid_nnrp_policy"),
    (envelope(nnrp={"diagnostics": "yes"}), "invalid_nnrp_policy"),
    (envelope(nnrp={"surprise": 1}), "invalid_nnrp_policy"),
])
def test_error_codes(payload: bytes, code: str) -> None:
    assert code_of(payload) == code


def test_size_and_depth_limits() -> None:
    with pytest.raises(ProfileError, match="exceeds the 100-byte limit"):
        parse_envelope(envelope(), max_bytes=100)
    deep: Any = "x"
    for _ in range(70):
        deep = [deep]
    assert code_of(envelope(body={"model": "m", "messages": deep})) == "invalid_body"


def _typed(descriptor: nnrp.TypedDescriptor, payload: bytes = b"{}") -> nnrp.TypedBody:
    return nnrp.TypedBody((nnrp.TypedFrame(descriptor, payload),))


@pytest.mark.parametrize("descriptor", [
    nnrp.TypedDescriptor(profile_id=2),
    nnrp.TypedDescriptor(payload_kind=int(nnrp.PayloadKind.TOKEN_CHUNK)),
    nnrp.TypedDescriptor(schema_id=0x1001, schema_version=3),
    nnrp.TypedDescriptor(stream_semantics=2),
    nnrp.TypedDescriptor(descriptor_flags=2),
])
def test_typed_body_must_be_the_frozen_mapping(descriptor: nnrp.TypedDescriptor) -> None:
    with pytest.raises(ProfileError) as info:
        read_typed_body(_typed(descriptor), None)
    assert info.value.code == "invalid_submit_body"


def test_typed_body_frame_count_and_parse_errors() -> None:
    # A second structured frame is no media frame (the media rules: tests/profile/test_media.py).
    two = nnrp.TypedBody((nnrp.TypedFrame(nnrp.TypedDescriptor(), b"{}"),) * 2)
    with pytest.raises(ProfileError, match="typed frame 1 must be a whole media frame"):
        read_typed_body(two, None)
    with pytest.raises(ProfileError, match="no typed frame"):
        read_typed_body(nnrp.TypedBody(()), None)
    with pytest.raises(ProfileError, match="prelude"):
        read_typed_body(None, "prelude body_flags and reserved must be 0")
    assert read_typed_body(_typed(nnrp.TypedDescriptor(), b"abc"), None).envelope == b"abc"


def test_error_event_shape_and_status() -> None:
    error = ProfileError("invalid_backend_request", "bad temperature", param="temperature",
                         diagnostics={"backend_status": 400})
    event = events.error_event(error)
    assert event == {"type": "response.error",
                     "error": {"type": "invalid_request_error", "code": "invalid_backend_request",
                               "message": "bad temperature", "param": "temperature"},
                     "diagnostics": {"backend_status": 400}}
    assert error.status == 400
    assert ProfileError("request_timeout", "x").status == 504
    assert ProfileError("backend_error", "x").status == 500
    # Compact, sorted keys, UTF-8 as is (the reference adapter's encoding).
    assert events.encode_event(events.text_delta(0, "é")) == (
        '{"delta":"é","index":0,"type":"response.output_text.delta"}'.encode())
    with pytest.raises(ValueError, match="unknown profile error code"):
        ProfileError("nope", "x")


@pytest.mark.parametrize("delta", ["", "plain", 'quote " and \\ backslash', "é\u2028\x1c\n",
                                   "\U0001f600 emoji", "\x00"])
def test_text_delta_fast_path_matches_the_general_encoder(delta: str) -> None:
    event = events.text_delta(3, delta)
    assert events.encode_event(event) == events._encoder.encode(event).encode("utf-8")
    with_chunk = {**events.text_delta(0, delta), "openai_chunk": {"id": "x"}}
    assert json.loads(events.encode_event(with_chunk))["openai_chunk"] == {"id": "x"}
