"""The key of a request (``gateway.profile._resubmission``, rules K1-K4): the same request
has one key however it is written, cut or parsed whole; another request has another;
the resume position is never part of it."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from gateway import nnrp
from gateway.profile import EnvelopeResubmission, _resubmission as resubmission

GOOD = {"schema_version": "openai-compatible/1", "operation": "chat.completions.create",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}
IMAGE = nnrp.TypedDescriptor(payload_kind=int(nnrp.PayloadKind.OPAQUE), stream_semantics=0)

RULE = EnvelopeResubmission()
#: K2/K3 made small: strings of 4 characters are long; runs of 48 bytes are cut, from
#: any size of envelope (CUT) or none (WHOLE). Both must key every request alike.
CUT = EnvelopeResubmission(cut_threshold=0, min_literal=48, long_string=4)
WHOLE = EnvelopeResubmission(cut_threshold=1 << 62, min_literal=48, long_string=4)


def body(envelope: bytes, *media: bytes, view: bool = False) -> nnrp.TypedBody:
    """A typed body as the server parses it: frames are views of a view (a big submit)."""
    frames = [(nnrp.TypedDescriptor(), envelope)] + [(IMAGE, data) for data in media]
    packed = nnrp.pack_typed_body(frames)
    kinds = 0
    for descriptor, _ in frames:
        kinds |= descriptor.payload_kind
    return nnrp.parse_typed_body(memoryview(packed) if view else packed,
                                 payload_kind_bitmap=kinds, payload_frame_count=len(frames))


def key(envelope: bytes, *media: bytes, rule: EnvelopeResubmission = RULE) -> bytes:
    return rule.read(body(envelope, *media)).key


def resubmitted(document: dict[str, Any], position: Any) -> bytes:
    return json.dumps({**document, "nnrp": {"resume_after_sequence": position}}).encode()


def same_request(original: bytes, resubmission: bytes) -> bool:
    return RULE.read(body(resubmission)).key == key(original)


def with_image(size: int, seed: int = 1) -> dict[str, Any]:
    """A chat request with a base64 image of ``size`` bytes in its envelope."""
    data = base64.b64encode(bytes((seed + i) % 251 for i in range(256)) * (size // 256))
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + data.decode()}}
    return {**GOOD, "body": {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "what is it?"}, part]}]}}


# ---------------------------------------------------------------------- K1: the value


def test_a_resubmission_is_the_same_request_with_a_position_added() -> None:
    original = {**GOOD, "body": {**GOOD["body"], "stream": True, "temperature": 0.5}}
    # Keys in another order, other whitespace: the same JSON.
    reordered = json.dumps(dict(reversed(list(original.items()))), indent=2).encode()
    assert same_request(json.dumps(original).encode(), reordered)
    read = RULE.read(body(resubmitted(original, 7)))
    assert read.key == key(json.dumps(original).encode())
    assert (read.position, read.problem) == (7, None)


@pytest.mark.parametrize("position", [-1, 1.5, "7", True, None, [1]])
def test_a_malformed_position_is_a_problem_naming_the_field_not_another_request(
        position: Any) -> None:
    """Finding 12 of issue 34: such a resubmission is refused 400 naming the field, and
    the operation it names goes on waiting (not abandoned as another request)."""
    original = {**GOOD, "body": {**GOOD["body"], "stream": True}}
    read = RULE.read(body(resubmitted(original, position)))
    assert read.key == key(json.dumps(original).encode())
    assert read.position is None
    assert read.problem is not None and "nnrp.resume_after_sequence" in read.problem


@pytest.mark.parametrize(("field", "value"), [
    ("stream", 1),  # Python's == takes true for 1
    ("temperature", 1),  # ... and 1 for 1.0
    ("max_tokens", 16.0),
    ("model", "other"),
])
def test_a_resubmission_that_changes_a_value_or_its_json_type_is_another_request(
        field: str, value: Any) -> None:
    original = {**GOOD, "body": {**GOOD["body"], "stream": True, "temperature": 1.0,
                                 "max_tokens": 16}}
    changed = {**original, "body": {**original["body"], field: value}}
    assert not same_request(json.dumps(original).encode(), resubmitted(changed, 3))


def test_a_payload_that_is_not_json_is_keyed_by_its_bytes() -> None:
    assert same_request(b"\xff not json", b"\xff not json")
    assert not same_request(b"\xff not json", b"\xff not json ")
    assert key(b"[1]") != key(b"[1] ")  # not an object: bytes


def test_a_resubmission_python_cannot_read_back_is_another_request_not_a_crash() -> None:
    original = json.dumps(GOOD).encode()
    too_deep = b'{"nnrp": {"resume_after_sequence": 1}, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    too_long = b'{"nnrp": {"resume_after_sequence": 1}, "x": ' + b"9" * 5000 + b"}"
    for payload in (too_deep, too_long):
        assert not same_request(original, payload)


def test_a_string_cannot_stand_for_a_long_ones_digest() -> None:
    """K2: a short string that spells what a long one is keyed as is another string."""
    rule = EnvelopeResubmission(min_literal=12 * 100, long_string=100)
    long = "x" * 100
    spelled = "\0sha256:" + hashlib.sha256(long.encode()).hexdigest()
    assert len(spelled) < rule.long_string
    assert key(json.dumps({"a": long}).encode(), rule=rule) != key(
        json.dumps({"a": spelled}).encode(), rule=rule)
    assert key(json.dumps({"a": "\0b"}).encode(), rule=rule) != key(
        json.dumps({"a": "\0\0b"}).encode(), rule=rule)


# ---------------------------------------------------------------------- K1: media frames


def test_media_frames_are_keyed_by_their_bytes_and_the_position_is_still_read() -> None:
    """Before: the envelope and the frames were keyed joined, so a resubmission that
    declared its position was another request (409), and every byte was copied."""
    image = os.urandom(4096)
    envelope = json.dumps(GOOD).encode()
    read = RULE.read(body(resubmitted(GOOD, 5), image, view=True))
    assert (read.key, read.position) == (key(envelope, image), 5)
    changed = bytearray(image)
    changed[2048] ^= 1
    assert key(envelope, bytes(changed)) != read.key
    assert key(envelope, image, image) != read.key  # one more frame
    assert key(envelope) != read.key  # one fewer
    other_kind = body(envelope, image)._replace(frames=(
        body(envelope).frames[0], nnrp.TypedFrame(IMAGE._replace(
            payload_kind=int(nnrp.PayloadKind.AUDIO)), image)))
    assert RULE.read(other_kind).key != read.key


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=1, max_size=300), st.data())
def test_any_byte_changed_in_a_media_frame_is_another_request(image: bytes,
                                                              data: st.DataObject) -> None:
    index = data.draw(st.integers(0, len(image) - 1))
    flip = data.draw(st.integers(1, 255))
    changed = bytearray(image)
    changed[index] ^= flip
    envelope = json.dumps(GOOD).encode()
    assert key(envelope, image) != key(envelope, bytes(changed))
    assert key(envelope, image) == RULE.read(body(resubmitted(GOOD, 0), image)).key


# ---------------------------------------------------------------------- K2, K3: cut or whole

_SHORT = st.text(alphabet=st.sampled_from('ab"\\/é\n\0 '), max_size=6)
_RUN = st.text(alphabet=st.sampled_from('AB+/=:;,é\U0001f600'), min_size=50, max_size=90)
#: Long strings: a run alone (cut when written raw), after an escaped quote (the run is
#: cut, what is before it is not), or with escapes in it (never cut).
_LONG = (_RUN | st.builds(lambda before, run: before + '"' + run, _SHORT, _RUN)
         | st.text(alphabet=st.sampled_from('AB"\\é\n'), min_size=40, max_size=90))
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False,
                                                              allow_infinity=False)
    | _SHORT | _LONG,
    lambda children: st.lists(children, min_size=1, max_size=4)
    | st.dictionaries(_SHORT | _LONG, children, min_size=1, max_size=4), max_leaves=12)
_WRITTEN = st.fixed_dictionaries({"ensure_ascii": st.booleans(),
                                  "indent": st.none() | st.just(1),
                                  "sort_keys": st.booleans()})


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_SHORT.filter(lambda k: k != "nnrp") | _LONG, _JSON, max_size=4),
       _WRITTEN, _WRITTEN, st.none() | st.integers(0, 1 << 40))
def test_the_same_request_has_one_key_cut_or_whole_however_written(
        document: dict[str, Any], first: dict[str, Any], second: dict[str, Any],
        position: int | None) -> None:
    """Every place a run can be (a value, a key, after an escaped quote, JSON structure)
    and every way to write it (escaped: not cut; raw UTF-8: cut): the original under one
    rule and its resubmission (with or without a position) under the other agree."""
    original = json.dumps(document, **first).encode()
    again = document if position is None else {**document,
                                               "nnrp": {"resume_after_sequence": position}}
    resubmission = json.dumps(again, **second).encode()
    keys = {rule.read(body(payload, view=view)).key
            for rule in (CUT, WHOLE) for payload in (original, resubmission)
            for view in (False, True)}
    assert len(keys) == 1
    assert CUT.read(body(resubmission)).position == position


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_SHORT.filter(lambda k: k != "nnrp"), _JSON, min_size=1, max_size=4),
       st.data())
def test_another_request_has_another_key_cut_or_whole(document: dict[str, Any],
                                                      data: st.DataObject) -> None:
    other = data.draw(st.dictionaries(_SHORT.filter(lambda k: k != "nnrp"), _JSON,
                                      min_size=1, max_size=4))
    if json.dumps(other, sort_keys=True) == json.dumps(document, sort_keys=True):
        return
    one = json.dumps(document, ensure_ascii=False).encode()
    two = json.dumps(other, ensure_ascii=False).encode()
    assert key(one, rule=CUT) != key(two, rule=WHOLE)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from("AB+/=é"), min_size=50, max_size=120), st.data())
def test_any_character_changed_in_a_cut_literal_is_another_request(
        literal: str, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, len(literal) - 1))
    other = data.draw(st.sampled_from("AB+/=é").filter(lambda c: c != literal[index]))
    changed = literal[:index] + other + literal[index + 1:]
    one, two = ({**GOOD, "image": value} for value in (literal, changed))
    written = [json.dumps(document, ensure_ascii=False).encode() for document in (one, two)]
    assert key(written[0], rule=CUT) != key(written[1], rule=CUT)
    assert key(written[0], rule=CUT) == key(written[0], rule=WHOLE)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_are_keyed_never_raise(payload: bytes) -> None:
    for rule in (CUT, WHOLE, RULE):
        assert rule.read(body(payload)).key
    assert RULE.read(None).key


def test_a_big_envelope_is_keyed_from_its_cut_literal_and_any_byte_of_it_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The real sizes: a 2 MiB image in base64 is cut (K3) and searched a chunk at a
    time (K4: made small here, so runs cross chunks); its key is the whole parse's."""
    monkeypatch.setattr(resubmission, "CHUNK", 4099)
    document = with_image(2 << 20)
    envelope = json.dumps(document).encode()
    whole = EnvelopeResubmission(cut_threshold=1 << 62)
    assert len(envelope) > resubmission.CUT_THRESHOLD
    original = RULE.read(body(envelope, view=True)).key
    assert original == whole.read(body(envelope)).key
    read = RULE.read(body(resubmitted(document, 3), view=True))
    assert (read.key, read.position) == (original, 3)
    url = envelope.index(b"base64,") + 7
    for where in (url, url + (1 << 20), envelope.index(b'"', url) - 1):
        changed = bytearray(envelope)
        changed[where] = ord("A") if changed[where] != ord("A") else ord("B")
        assert RULE.read(body(bytes(changed), view=True)).key != original


def test_a_literal_with_escapes_is_parsed_whole_and_keys_as_its_value() -> None:
    """K3: ``\\/`` (as some JSON writers put every slash) is no cut, and the same value."""
    document = with_image(1 << 20)
    plain = json.dumps(document).encode()
    escaped = plain.replace(b"/", b"\\/")
    assert escaped != plain
    assert key(plain) == key(escaped)


def test_rule_sizes_that_would_cut_a_short_string_are_refused() -> None:
    with pytest.raises(ValueError, match="12 x long_string"):
        EnvelopeResubmission(min_literal=100, long_string=10)


def test_a_submit_naming_other_cached_objects_is_another_request() -> None:
    """K1: the object_reference region is what a submit depends on (gateway/nnrp/_cache.py
    C6); a review found it left out of the key, so a resubmission naming other objects
    was replayed as the same request."""
    envelope = json.dumps({"body": {"model": "m"}}).encode()
    plain = body(envelope)
    references = [nnrp.ObjectReference(int(nnrp.CacheObjectKind.CAMERA_BLOCK), 7, 1, key_lo)
                  for key_lo in (2, 3)]
    keys = {RULE.key(plain._replace(object_references=(reference,)))
            for reference in references}
    assert len(keys | {RULE.key(plain)}) == 3
    assert RULE.key(plain._replace(object_references=(references[0],))) == RULE.key(
        body(envelope)._replace(object_references=(references[0],)))
