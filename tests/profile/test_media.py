"""Media frames referenced from content parts (gateway/profile/_media.py, rules M1-M7):
each refusal names what it refuses, and a plan leaves nothing of the bytes in the body."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, strategies as st

from gateway import nnrp
from gateway.profile import (
    MediaFrame,
    ProfileError,
    media_frames,
    plan_media,
    read_typed_body,
    sniff,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 20
SAMPLES = {
    "image/png": PNG,
    "image/jpeg": b"\xff\xd8\xff\xe0\x00\x10JFIF",
    "image/gif": b"GIF89a\x01\x00\x01\x00",
    "image/webp": b"RIFF\x00\x00\x00\x00WEBPVP8 ",
    "audio/wav": WAV,
    "audio/flac": b"fLaC\x00\x00\x00\x22",
    "audio/mpeg": b"ID3\x04\x00\x00\x00\x00",
    "video/mp4": b"\x00\x00\x00\x18ftypisom",
    "video/webm": b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81",
}
OPAQUE, AUDIO, VIDEO = (int(nnrp.PayloadKind.OPAQUE), int(nnrp.PayloadKind.AUDIO),
                        int(nnrp.PayloadKind.VIDEO))


def _part(kind: str, value: str) -> dict[str, Any]:
    field = "data" if kind == "input_audio" else "url"
    return {"type": kind, kind: {field: value}}


def _body(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, *parts]}]}


def _plan(body: dict[str, Any], *frames: tuple[int, bytes]) -> Any:
    media = tuple(MediaFrame(index, kind, data)
                  for index, (kind, data) in enumerate(frames, start=1))
    return plan_media(body, media, nonce="n0nce")


def _refused(body: dict[str, Any], *frames: tuple[int, bytes]) -> ProfileError:
    with pytest.raises(ProfileError) as info:
        _plan(body, *frames)
    return info.value


@pytest.mark.parametrize("media_type", sorted(SAMPLES))
def test_each_signature_is_recognised(media_type: str) -> None:
    assert sniff(SAMPLES[media_type]) == media_type
    assert sniff(memoryview(SAMPLES[media_type] + b"trailing")) == media_type


@pytest.mark.parametrize("data", [b"", b"\x89PN", b"RIFF\x00\x00\x00\x00AVI ", b"plain text",
                                  b"\xff\xd8", b"\xff\xf0\x00"])
def test_unknown_or_short_bytes_are_not_guessed(data: bytes) -> None:
    assert sniff(data) is None


def test_a_reference_becomes_a_placeholder_with_the_sniffed_type() -> None:
    body = _body(_part("image_url", "nnrp:frame/1"))
    plan = _plan(body, (OPAQUE, PNG))
    (slot,) = plan.slots
    assert (slot.frame, slot.media_type, slot.inline) == (1, "image/png", False)
    assert body["messages"][1]["content"][1]["image_url"]["url"] == slot.placeholder
    assert "n0nce" in slot.placeholder
    assert "nnrp:" not in json.dumps(body)  # nothing of the reference is left for vLLM
    assert plan.total_bytes == len(PNG)


def test_a_declared_type_wins_over_the_bytes() -> None:
    plan = _plan(_body(_part("image_url", "nnrp:frame/1;type=Image/AVIF")), (OPAQUE, b"????"))
    assert plan.slots[0].media_type == "image/avif"


def test_input_audio_is_inline_and_gets_its_format() -> None:
    body = _body(_part("input_audio", "nnrp:frame/1"))
    plan = _plan(body, (AUDIO, WAV))
    assert plan.slots[0].inline
    assert body["messages"][1]["content"][1]["input_audio"]["format"] == "wav"
    kept = _body({"type": "input_audio", "input_audio": {"data": "nnrp:frame/1",
                                                         "format": "x-custom"}})
    _plan(kept, (AUDIO, WAV))
    assert kept["messages"][1]["content"][1]["input_audio"]["format"] == "x-custom"


def test_one_frame_may_serve_several_parts_and_other_urls_are_untouched() -> None:
    body = _body(_part("image_url", "nnrp:frame/1"), _part("image_url", "https://x/y.png"),
                 _part("image_url", "nnrp:frame/1"), _part("video_url", "nnrp:frame/2"))
    plan = _plan(body, (OPAQUE, PNG), (VIDEO, SAMPLES["video/mp4"]))
    assert [(s.frame, s.media_type) for s in plan.slots] == [
        (1, "image/png"), (1, "image/png"), (2, "video/mp4")]
    assert len({s.placeholder for s in plan.slots}) == 3
    assert body["messages"][1]["content"][2]["image_url"]["url"] == "https://x/y.png"


def test_a_body_without_references_plans_nothing_and_is_unchanged() -> None:
    body = _body(_part("image_url", "data:image/png;base64,AAAA"))
    before = copy.deepcopy(body)
    assert _plan(body).slots == ()
    assert body == before
    assert plan_media({"model": "m", "messages": "not a list"}, (), nonce="n").slots == ()


@pytest.mark.parametrize(("value", "says"), [
    ("nnrp:frame/0", "is not a media reference"),
    ("nnrp:frame/01", "is not a media reference"),
    ("nnrp:object/03", "is not a media reference"),
    ("nnrp:object/3", "nnrp:object/3: this request has no session objects to read"),
    ("nnrp:frame/1;type=", "is not a media type"),
    ("nnrp:frame/1;type=png", "is not a media type"),
    ("nnrp:frame/2", "nnrp:frame/2 names a media frame the submit does not carry"),
    ("nnrp:cache/7/" + "0" * 31, "is not a media reference"),
    ("nnrp:cache/07/" + "0" * 32, "is not a media reference"),
    ("nnrp:cache/4294967296/" + "0" * 32, "cache namespace 4294967296 is not a u32"),
    ("nnrp:cache/7/" + "0" * 32, "this request has no session cache to read"),
])
def test_bad_references_are_refused_naming_the_part(value: str, says: str) -> None:
    error = _refused(_body(_part("image_url", value)), (OPAQUE, PNG))
    assert error.code == "invalid_body"
    assert "messages[1].content[1].image_url.url" in error.message
    assert says in error.message


@pytest.mark.parametrize(("part", "kind", "data", "says"), [
    ("image_url", AUDIO, PNG, "frame 1 is AUDIO; a image part takes OPAQUE"),
    ("audio_url", VIDEO, WAV, "a audio part takes AUDIO or OPAQUE"),
    ("image_url", OPAQUE, WAV, "frame 1 is audio/wav; a image part takes image/*"),
    ("video_url", VIDEO, b"unknown bytes", "add ;type=TYPE/SUBTYPE"),
])
def test_kind_and_type_must_fit_the_part(part: str, kind: int, data: bytes, says: str
                                         ) -> None:
    error = _refused(_body(_part(part, "nnrp:frame/1")), (kind, data))
    assert f"messages[1].content[1].{part}" in error.message
    assert says in error.message


def test_a_frame_no_part_references_is_refused() -> None:
    error = _refused(_body(_part("image_url", "nnrp:frame/1")), (OPAQUE, PNG), (OPAQUE, PNG))
    assert error.code == "invalid_submit_body"
    assert "media frame 2 is not referenced" in error.message


def _descriptor(**fields: int) -> nnrp.TypedDescriptor:
    return nnrp.TypedDescriptor(**{"payload_kind": OPAQUE, "stream_semantics": 0, **fields})


def test_media_frames_are_checked_and_bounded() -> None:
    envelope = (nnrp.TypedDescriptor(), b"{}")
    frames = media_frames([envelope, (_descriptor(), PNG),
                           (_descriptor(payload_kind=AUDIO, descriptor_flags=1,
                                        stream_semantics=1), WAV)], max_bytes=1 << 20)
    assert [(f.index, f.kind, f.data) for f in frames] == [(1, OPAQUE, PNG), (2, AUDIO, WAV)]
    with pytest.raises(ProfileError, match="media frames of 96 bytes exceed the 95-byte"):
        media_frames([envelope, (_descriptor(), PNG), (_descriptor(), PNG + PNG)],
                     max_bytes=95)
    with pytest.raises(ProfileError, match="65 media frames; at most 64"):
        media_frames([envelope, *[(_descriptor(), b"x")] * 65], max_bytes=1 << 20)


@pytest.mark.parametrize("fields", [
    {"payload_kind": int(nnrp.PayloadKind.STRUCTURED_EVENT)},
    {"payload_kind": int(nnrp.PayloadKind.TOKEN_CHUNK)},
    {"profile_id": 2}, {"schema_id": 1}, {"schema_version": 1},
    {"descriptor_flags": int(nnrp.DescriptorFlag.PARTIAL)},
    {"stream_semantics": int(nnrp.StreamSemantics.APPEND)},
])
def test_a_frame_that_is_not_whole_media_is_refused_by_index(fields: dict[str, int]) -> None:
    with pytest.raises(ProfileError, match="typed frame 2 must be a whole media frame") as info:
        media_frames([(nnrp.TypedDescriptor(), b"{}"), (_descriptor(), PNG),
                      (_descriptor(**fields), PNG)], max_bytes=1 << 20)
    assert info.value.code == "invalid_submit_body"


def test_the_typed_body_carries_the_envelope_then_media() -> None:
    body = nnrp.parse_typed_body(nnrp.pack_typed_body([
        (nnrp.TypedDescriptor(), b'{"x": 1}'), (_descriptor(), PNG)]),
        payload_kind_bitmap=0x10 | OPAQUE, payload_frame_count=2)
    submit = read_typed_body(body, None)
    assert submit.envelope == b'{"x": 1}'
    assert [(f.index, f.data) for f in submit.media] == [(1, PNG)]
    with pytest.raises(ProfileError, match="exceed the 10-byte limit"):
        read_typed_body(body, None, max_media_bytes=10)
    media_first = nnrp.parse_typed_body(nnrp.pack_typed_body([
        (_descriptor(), PNG), (nnrp.TypedDescriptor(), b"{}")]),
        payload_kind_bitmap=0x10 | OPAQUE, payload_frame_count=2)
    with pytest.raises(ProfileError, match="typed frame 0 must be profile 0, STRUCTURED_EVENT"):
        read_typed_body(media_first, None)


_PARTS = st.sampled_from(["image_url", "video_url", "audio_url", "input_audio", "text"])


@given(st.lists(st.tuples(_PARTS, st.integers(1, 3)), max_size=8))
def test_planning_either_refuses_or_accounts_for_every_reference(
        parts: list[tuple[str, int]]) -> None:
    """Whatever the parts, a plan names each reference once, leaves no ``nnrp:`` value,
    and uses every frame; anything else is a ProfileError, never another exception."""
    frames = ((OPAQUE, PNG), (AUDIO, WAV), (VIDEO, SAMPLES["video/webm"]))
    content = [{"type": "text", "text": "nnrp:frame/1"} if kind == "text"
               else _part(kind, f"nnrp:frame/{index}") for kind, index in parts]
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    try:
        plan = _plan(body, *frames)
    except ProfileError as error:
        code = error.code
        assert code in {"invalid_body", "invalid_submit_body"}
        return
    assert len(plan.slots) == sum(kind != "text" for kind, _ in parts)
    assert {slot.frame for slot in plan.slots} == {1, 2, 3}
    for part in content:
        if part["type"] != "text":
            value = next(iter(part[part["type"]].values()))
            assert not value.startswith("nnrp:")


def test_session_objects_are_read_once_per_version_and_typed_by_their_bytes() -> None:
    reads: list[tuple[int, int]] = []

    def objects(object_id: int, version: int) -> bytes | str:
        reads.append((object_id, version))
        return {(7, 0): PNG, (7, 2): WAV, (8, 0): b"plain"}.get(
            (object_id, version), f"object {object_id} is not declared in this session")

    body = _body(_part("image_url", "nnrp:object/7"), _part("image_url", "nnrp:object/7"),
                 _part("audio_url", "nnrp:object/7@2"),
                 _part("video_url", "nnrp:object/8;type=video/mp4"))
    plan = plan_media(body, (), nonce="n", objects=objects)
    assert reads == [(7, 0), (7, 2), (8, 0)]  # each (object, version) once
    assert [s.media_type for s in plan.slots] == ["image/png", "image/png", "audio/wav",
                                                  "video/mp4"]
    frames = {frame.index: frame.data for frame in plan.frames}
    assert [frames[slot.frame] for slot in plan.slots] == [PNG, PNG, WAV, b"plain"]
    error = _refused_with(objects, _part("image_url", "nnrp:object/9"))
    assert error.message == ("messages[1].content[1].image_url.url: nnrp:object/9: object 9 "
                             "is not declared in this session")
    error = _refused_with(objects, _part("image_url", "nnrp:object/7@2"))
    assert "nnrp:object/7@2 is audio/wav; a image part takes image/*" in error.message


def test_cached_objects_are_read_by_namespace_and_key_once_per_request() -> None:
    """M9: ``nnrp:cache/NS/KEY``, KEY being cache_key_hi then cache_key_lo in hex."""
    reads: list[tuple[int, int, int]] = []

    def cached(namespace: int, key_hi: int, key_lo: int) -> bytes | str:
        reads.append((namespace, key_hi, key_lo))
        return {(7, 1, 0xABCDEF): PNG, (0, 0, 0): WAV}.get(
            (namespace, key_hi, key_lo), "the session's cache holds no such entry")

    key = "0000000000000001" + "0000000000abcdef"
    body = _body(_part("image_url", f"nnrp:cache/7/{key}"),
                 _part("image_url", f"nnrp:cache/7/{key.upper()}"),
                 _part("audio_url", "nnrp:cache/0/" + "0" * 32),
                 _part("image_url", "nnrp:object/7"))
    plan = plan_media(body, (), nonce="n", objects=lambda _i, _v: PNG, cached=cached)
    assert reads == [(7, 1, 0xABCDEF), (0, 0, 0)]  # each entry once
    assert [s.media_type for s in plan.slots] == ["image/png", "image/png", "audio/wav",
                                                  "image/png"]
    assert plan.slots[0].frame == plan.slots[1].frame != plan.slots[3].frame
    with pytest.raises(ProfileError) as info:
        plan_media(_body(_part("image_url", "nnrp:cache/7/" + "f" * 32)), (), nonce="n",
                   cached=cached)
    assert info.value.message == (
        "messages[1].content[1].image_url.url: nnrp:cache/7/" + "f" * 32
        + ": the session's cache holds no such entry")


def _refused_with(objects: Any, *parts: dict[str, Any]) -> ProfileError:
    with pytest.raises(ProfileError) as info:
        plan_media(_body(*parts), (), nonce="n", objects=objects)
    return info.value


def test_what_the_parts_deliver_is_bounded_per_part() -> None:
    """A frame named many times is delivered many times (a data URI each): counted so."""
    def parts(count: int) -> dict[str, Any]:
        return _body(*[_part("image_url", "nnrp:frame/1") for _ in range(count)])

    assert len(_plan(parts(3), (OPAQUE, PNG)).slots) == 3
    with pytest.raises(ProfileError, match="deliver 96 bytes to vLLM, past the 95-byte"):
        plan_media(parts(3), (MediaFrame(1, OPAQUE, PNG),), nonce="n", max_bytes=95)
    assert len(plan_media(parts(64), (MediaFrame(1, OPAQUE, PNG),), nonce="n").slots) == 64
    with pytest.raises(ProfileError, match="more than 64 content parts name media"):
        plan_media(parts(65), (MediaFrame(1, OPAQUE, PNG),), nonce="n")
