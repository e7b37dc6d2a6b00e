"""The openai-compatible/1 request envelope (docs/reference/nnrp-wire.md section 4,
docs/reference/reference-adapter.md 6).

    {"schema_version": "openai-compatible/1", "operation": "chat.completions.create",
     "request_id"?: str, "body": {OpenAI request}, "nnrp"?: {"timeout_ms", "diagnostics",
     "include_openai_chunk", "progress", "cancel_after_events"}}

Validation order decides which error a doubly-broken request gets: typed body first,
then JSON, then schema_version, operation, body fields, request_id, nnrp policy.
The ``nnrp`` object is removed here: it never reaches vLLM.

The ``nnrp`` policy is structured by cattrs (an edge: JSON in, a frozen attrs class out)
with unknown keys forbidden and strict JSON types: ``true`` is not an integer and ``1``
is not a boolean. Every refusal names the field (``nnrp.timeout_ms must be ...``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator
from typing import Any

import attrs
import cattrs

from gateway.nnrp import PayloadKind, StreamSemantics, TypedBody

from ._errors import ProfileError
from ._literals import (
    CUT_THRESHOLD,
    PLACEHOLDER_PREFIX,
    Text,
    copy_steps,
    cut_steps,
    finish,
)
from ._media import DEFAULT_MAX_MEDIA_BYTES, MediaFrame, media_frames

SCHEMA_VERSION = "openai-compatible/1"
CHAT_COMPLETIONS = "chat.completions.create"
#: Level 2/3 operations of the profile; refused with unsupported_operation until served.
KNOWN_OPERATIONS = frozenset({CHAT_COMPLETIONS, "responses.create", "models.list",
                              "embeddings.create"})
#: The gateway's own extension operation: the capability document over NNRP.
CAPABILITIES_OPERATION = "gateway.capabilities"

DEFAULT_MAX_ENVELOPE_BYTES = 64 << 20  # big base64 stays off the parse (_literals)
DEFAULT_MAX_DEPTH = 64
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")


class _PolicyFieldError(ValueError):
    def __init__(self, field: str) -> None:
        super().__init__(field)
        self.field = field


def _non_negative(_: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and value < 0:
        raise _PolicyFieldError(attribute.name)


@attrs.frozen
class NnrpPolicy:
    """The envelope's ``nnrp`` object: per-request gateway behaviour."""

    timeout_ms: int | None = attrs.field(default=None, validator=_non_negative)
    diagnostics: bool = False
    include_openai_chunk: bool = False
    #: PROGRESS frames for this operation (as if control.progress_partial was negotiated).
    progress: bool = False
    #: The suite runner's directive (a CANCEL after N events); accepted, never acted on.
    cancel_after_events: int | None = attrs.field(default=None, validator=_non_negative)
    #: On a resubmission after a resume: the last result_sequence the client holds of
    #: this operation; the gateway replays only what comes after it (docs/resume.md;
    #: the capability document lists it). Ignored on a first submission.
    resume_after_sequence: int | None = attrs.field(default=None, validator=_non_negative)


#: What each policy field must be, for the refusal message.
_POLICY_RULES = {"timeout_ms": "an integer >= 0", "cancel_after_events": "an integer >= 0",
                 "diagnostics": "a boolean", "include_openai_chunk": "a boolean",
                 "progress": "a boolean", "resume_after_sequence": "an integer >= 0"}


def _strict(kind: type) -> Any:
    def structure(value: Any, _: type) -> Any:
        if type(value) is not kind:  # JSON: no bool for int, no 0/1 for bool
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return value
    return structure


_policy_converter = cattrs.Converter(forbid_extra_keys=True)
_policy_converter.register_structure_hook(int, _strict(int))
_policy_converter.register_structure_hook(bool, _strict(bool))


@attrs.frozen
class Envelope:
    operation: str
    body: dict[str, Any]
    request_id: str | None = None
    policy: NnrpPolicy = NnrpPolicy()

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))



def _depth(value: Any, limit: int) -> int:
    """Nesting depth, stopping early past ``limit``."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest


@attrs.frozen
class SubmitBody:
    """What a chat submit carries: the envelope's JSON and its media frames (``_media``)."""

    #: A view of the submit's body when that is one (``nnrp._codec``: a big submit).
    envelope: bytes | memoryview = attrs.field(repr=False)
    media: tuple[MediaFrame, ...] = ()


def read_typed_body(typed_body: TypedBody | None, body_error: str | None, *,
                    max_media_bytes: int = DEFAULT_MAX_MEDIA_BYTES) -> SubmitBody:
    """The request mapping: frame 0 is the envelope, a STRUCTURED_EVENT frame, profile 0,
    schema 0/0, SNAPSHOT (docs/reference/nnrp-wire.md section 4); any frames after it are media, the
    gateway's extension (``_media`` rule M1)."""
    if typed_body is None:
        raise ProfileError("invalid_submit_body", f"typed body is malformed: {body_error}")
    if not typed_body.frames:
        raise ProfileError("invalid_submit_body", "the submit carries no typed frame")
    descriptor, payload = typed_body.frames[0]
    expected = (0, int(PayloadKind.STRUCTURED_EVENT), 0, 0, 0, int(StreamSemantics.SNAPSHOT))
    actual = (descriptor.profile_id, descriptor.payload_kind, descriptor.descriptor_flags,
              descriptor.schema_id, descriptor.schema_version, descriptor.stream_semantics)
    if actual != expected:
        raise ProfileError(
            "invalid_submit_body",
            "typed frame 0 must be profile 0, STRUCTURED_EVENT, flags 0, schema 0/0, SNAPSHOT; "
            f"got profile {actual[0]}, kind {actual[1]:#x}, flags {actual[2]}, "
            f"schema {actual[3]}/{actual[4]}, semantics {actual[5]}")
    # Object references were resolved by the session before the operation existed
    # (gateway.nnrp._cache C6): they are its dependencies, and a content part reads one
    # by naming it (nnrp:cache/NS/KEY, ``_media`` M9).
    if typed_body.inline_object or typed_body.extension_payload:
        raise ProfileError("invalid_submit_body",
                           "inline-object and extension regions are not allowed")
    if len(typed_body.frames) == 1:
        return SubmitBody(payload)
    return SubmitBody(payload, media_frames(typed_body.frames, max_bytes=max_media_bytes))


def parse_envelope(payload: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
                   max_depth: int = DEFAULT_MAX_DEPTH,
                   operations: frozenset[str] = frozenset({CHAT_COMPLETIONS})) -> Envelope:
    """Validate a UTF-8 JSON envelope; raise ProfileError with the profile's code."""
    _check_size(payload, max_bytes)
    return _validate(_decode(payload), max_depth, operations)


def read_envelope(payload: bytes | memoryview, *, nonce: str,
                  max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
                  max_depth: int = DEFAULT_MAX_DEPTH,
                  operations: frozenset[str] = frozenset({CHAT_COMPLETIONS})
                  ) -> tuple[Envelope, dict[str, memoryview]]:
    """``parse_envelope`` for a chat request: a big envelope's long literals are cut out
    first and returned beside it (``_literals``: they go to vLLM as they came)."""
    return finish(read_envelope_steps(payload, nonce=nonce, max_bytes=max_bytes,
                                      max_depth=max_depth, operations=operations))


def read_envelope_steps(payload: bytes | memoryview, *, nonce: str,
                        max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
                        max_depth: int = DEFAULT_MAX_DEPTH,
                        operations: frozenset[str] = frozenset({CHAT_COMPLETIONS})
                        ) -> Generator[None, None, tuple[Envelope, dict[str, memoryview]]]:
    """``read_envelope`` in steps (``_literals`` L5): the caller may let others run
    between two, so a big envelope never holds the event loop for its length."""
    _check_size(payload, max_bytes)
    text: Text
    if not isinstance(payload, memoryview):
        text = payload
    elif len(payload) >= CUT_THRESHOLD:  # a big submit's: searched in a copy (L5)
        text = yield from copy_steps(payload)
    else:
        text = bytes(payload)
    shortened, cuts = yield from cut_steps(text, nonce=nonce)
    if not cuts:  # nothing cut: ``shortened`` is the whole document
        return _validate(_decode(shortened), max_depth, operations), cuts
    try:
        document = _decode(shortened)
    except ProfileError:  # a cut that was no string (_literals L3): parse it all
        cuts = {}
    else:
        if _cut_where_read(document):  # _literals L3: checked as written
            cuts = {}
    if not cuts:  # parsed whole (slow, but right: _literals L3)
        document = _decode(text if isinstance(text, bytes) else text[:])
    return _validate(document, max_depth, operations), cuts


def _cut_where_read(document: Any) -> bool:
    """Whether a placeholder stands in a field the gateway reads (``_literals`` L3)."""
    if not isinstance(document, dict):
        return False
    body = document.get("body")
    read = [document.get(name) for name in ("schema_version", "operation", "request_id")]
    read += [body.get("model") if isinstance(body, dict) else None, document.get("nnrp")]
    return PLACEHOLDER_PREFIX in json.dumps(read)


def _check_size(payload: bytes | memoryview, max_bytes: int) -> None:
    if len(payload) > max_bytes:
        raise ProfileError("invalid_body",
                           f"envelope of {len(payload)} bytes exceeds the {max_bytes}-byte limit")


def _decode(payload: bytes) -> Any:
    try:
        return json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError("invalid_body", f"envelope is not UTF-8 JSON: {exc}") from exc


def _validate(document: Any, max_depth: int, operations: frozenset[str]) -> Envelope:
    if not isinstance(document, dict):
        raise ProfileError("invalid_body", "envelope must be a JSON object")
    if _depth(document, max_depth) > max_depth:
        raise ProfileError("invalid_body", f"envelope nests deeper than {max_depth} levels")
    if document.get("schema_version") != SCHEMA_VERSION:
        raise ProfileError("unsupported_schema_version",
                           f"schema_version must be {SCHEMA_VERSION!r}, "
                           f"got {document.get('schema_version')!r}")
    operation = document.get("operation")
    if not isinstance(operation, str) or operation not in operations:
        raise ProfileError("unsupported_operation",
                           f"operation {operation!r} is not supported; supported: "
                           f"{', '.join(sorted(operations))}")
    body = document.get("body", {} if operation == CAPABILITIES_OPERATION else None)
    if not isinstance(body, dict):
        raise ProfileError("invalid_body", "body must be a JSON object")
    if operation == CHAT_COMPLETIONS:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ProfileError("missing_model", "body.model must be a non-empty string")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ProfileError("missing_messages", "body.messages must be a non-empty array")
    request_id = document.get("request_id")
    if request_id is not None and (not isinstance(request_id, str)
                                   or not _REQUEST_ID.match(request_id)):
        raise ProfileError("invalid_request_id",
                           "request_id must be 1-128 characters of [A-Za-z0-9._:@/+=-]")
    return Envelope(operation, body, request_id, _parse_policy(document.get("nnrp")))


def _parse_policy(raw: Any) -> NnrpPolicy:
    if raw is None:
        return NnrpPolicy()
    if not isinstance(raw, dict):
        raise ProfileError("invalid_nnrp_policy", "nnrp must be a JSON object")
    try:
        return _policy_converter.structure(raw, NnrpPolicy)
    except cattrs.ClassValidationError as exc:
        raise ProfileError("invalid_nnrp_policy", _policy_problem(exc)) from None


def _policy_problem(error: cattrs.ClassValidationError) -> str:
    """The first problem, naming its field the way the envelope spells it."""
    for exception in error.exceptions:
        if isinstance(exception, cattrs.ForbiddenExtraKeysError):
            return f"unknown nnrp fields: {', '.join(sorted(exception.extra_fields))}"
    for exception in error.exceptions:
        names = [exception.field] if isinstance(exception, _PolicyFieldError) else [
            str(note).rpartition("@ attribute ")[2] for note in getattr(exception, "__notes__", ())]
        for name in names:
            if name in _POLICY_RULES:
                return f"nnrp.{name} must be {_POLICY_RULES[name]}"
    return "nnrp policy is invalid"
