"""NNRP's token profile read as a prompt (gateway.profile._token's rules)."""

from __future__ import annotations

import pytest

from gateway import nnrp
from gateway.profile import ProfileError, is_token_request, token_prompt


def body(*frames: tuple[bytes, dict[str, int]]) -> nnrp.TypedBody:
    shapes = []
    for payload, overrides in frames:
        fields = {"profile_id": 2, "payload_kind": int(nnrp.PayloadKind.TOKEN_CHUNK),
                  "descriptor_flags": 2, "schema_id": nnrp.TOKEN_SCHEMA_ID,
                  "schema_version": nnrp.TOKEN_SCHEMA_VERSION, "stream_semantics": 2,
                  "offset": 0, "length": 0, **overrides}
        shapes.append((nnrp.TypedDescriptor(**fields), payload))
    packed = nnrp.pack_typed_body(shapes)
    return nnrp.parse_typed_body(packed, payload_kind_bitmap=int(nnrp.PayloadKind.TOKEN_CHUNK),
                                 payload_frame_count=len(shapes))


def test_the_chunks_are_the_prompt() -> None:
    typed = body((b"Hello, ", {}), ("wörld".encode(), {}))
    assert is_token_request(typed)
    assert token_prompt(typed) == "Hello, wörld"
    assert not is_token_request(None)
    openai = nnrp.parse_typed_body(nnrp.pack_single_frame(b"{}"), payload_kind_bitmap=0x10,
                                   payload_frame_count=1)
    assert not is_token_request(openai)


@pytest.mark.parametrize(("typed", "reason"), [
    (body((b"\xff", {})), "not UTF-8"),
    (body((b"", {})), "no text"),
    (body((b"a", {}), (b"b", {"schema_id": 7})), "schema"),
])
def test_what_is_not_a_prompt_is_refused(typed: nnrp.TypedBody, reason: str) -> None:
    with pytest.raises(ProfileError, match=reason) as info:
        token_prompt(typed)
    assert info.value.code == "invalid_submit_body"
