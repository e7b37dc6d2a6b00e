"""NNRP's token profile, served as a text completion.

A submit whose typed frames are all TOKEN_CHUNK of the token profile (profile 2, the
token-delta schema 0x1001 v3: what stock NNRP clients and nnrp-rs's wire runner send)
is not an openai-compatible envelope. It is read as a prompt and answered as vLLM's text
completion of it:

* request: every frame's payload, in order, joined: the prompt (UTF-8 text; chunk
  flags and stream semantics say how the client cut it, not what it means);
* upstream: ``POST /v1/completions`` with the served model, the prompt and the
  configured output cap, not streamed;
* result: RESULT_PUSH status 200, one TOKEN_CHUNK frame (profile 2, schema 0x1001 v3,
  SNAPSHOT, terminal) holding the completion text;
* everything else is the operation's as for chat: runtime controls (cancel, deadlines,
  supersede, priority, budget) and failures, which end with the profile's
  ``response.error`` event as for chat.

Rules for the request (``token_prompt``; a violation is ``invalid_submit_body``): at
least one frame; every frame TOKEN_CHUNK, profile 2, schema 0x1001 v3; the payload
UTF-8 and not empty; no object or extension regions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.nnrp import TOKEN_SCHEMA_ID, TOKEN_SCHEMA_VERSION, PayloadKind, StandardProfile

from ._errors import ProfileError

if TYPE_CHECKING:
    from gateway.nnrp import TypedBody

#: The operation label of a token-profile request (metrics, logs).
TOKEN_COMPLETION = "token.completion"


def is_token_request(typed_body: TypedBody | None) -> bool:
    """Whether a submit speaks the token profile (its first frame says so)."""
    if typed_body is None or not typed_body.frames:
        return False
    descriptor = typed_body.frames[0].descriptor
    return (descriptor.profile_id == StandardProfile.TOKEN
            and descriptor.payload_kind == PayloadKind.TOKEN_CHUNK)


def token_prompt(typed_body: TypedBody) -> str:
    """The prompt a token-profile submit carries (module rules)."""
    # Object references were resolved by the session before the operation existed
    # (gateway.nnrp._cache C6): they are its dependencies, and a content part reads one
    # by naming it (nnrp:cache/NS/KEY, ``_media`` M9).
    if typed_body.inline_object or typed_body.extension_payload:
        raise ProfileError("invalid_submit_body",
                           "inline-object and extension regions are not allowed")
    pieces = []
    for descriptor, payload in typed_body.frames:
        if (descriptor.profile_id, descriptor.payload_kind, descriptor.schema_id,
                descriptor.schema_version) != (StandardProfile.TOKEN, PayloadKind.TOKEN_CHUNK,
                                               TOKEN_SCHEMA_ID, TOKEN_SCHEMA_VERSION):
            raise ProfileError(
                "invalid_submit_body", "a token-profile request is TOKEN_CHUNK frames of "
                f"profile 2, schema {TOKEN_SCHEMA_ID:#x} v{TOKEN_SCHEMA_VERSION}; got profile "
                f"{descriptor.profile_id}, kind {descriptor.payload_kind:#x}, schema "
                f"{descriptor.schema_id:#x} v{descriptor.schema_version}")
        pieces.append(payload)
    try:
        prompt = b"".join(pieces).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError("invalid_submit_body",
                           f"the token chunks are not UTF-8 text: {exc.reason}") from None
    if not prompt:
        raise ProfileError("invalid_submit_body", "the token chunks hold no text")
    return prompt
