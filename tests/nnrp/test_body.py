"""Typed bodies: prelude, 24-byte descriptors, region checks."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, strategies as st

from gateway import nnrp

SE = int(nnrp.PayloadKind.STRUCTURED_EVENT)


@given(st.lists(st.tuples(st.sampled_from([2, 4, 8, 0x10, 0x20, 0x40]), st.binary(max_size=64)),
                min_size=1, max_size=5))
def test_pack_parse_roundtrip(frames: list[tuple[int, bytes]]) -> None:
    body = nnrp.pack_typed_body([(nnrp.TypedDescriptor(payload_kind=kind), payload)
                                 for kind, payload in frames])
    bitmap = 0
    for kind, _ in frames:
        bitmap |= kind
    parsed = nnrp.parse_typed_body(body, payload_kind_bitmap=bitmap,
                                   payload_frame_count=len(frames))
    assert [(f.descriptor.payload_kind, f.payload) for f in parsed.frames] == frames


def test_single_frame_fast_path_matches_general_packer() -> None:
    payload = b'{"type":"response.completed"}'
    assert nnrp.pack_single_frame(payload) == nnrp.pack_typed_body(
        [(nnrp.TypedDescriptor(), payload)])


def test_openai_submit_body_matches_live_capture() -> None:
    """nnrp-wire.md section 6: prelude 00.. 18 len | descriptor 0000 10 00 ... 0100 ... len."""
    payload = b"x" * 0x9D
    body = nnrp.pack_single_frame(payload)
    assert body[:32].hex() == "0000000000000000180000009d000000" + "00" * 16
    assert body[32:56].hex() == "0000100000000000000000000100000000000000" + "9d000000"


def _body(payload: bytes = b"{}") -> bytearray:
    return bytearray(nnrp.pack_single_frame(payload))


@pytest.mark.parametrize(("mutate", "count", "bitmap", "text"), [
    (lambda b: b[:20], 1, SE, "shorter than the 32-byte prelude"),
    (lambda b: b + b"x", 1, SE, "add up to"),
    (lambda b: struct.pack_into("<I", b, 24, 1) or b, 1, SE, "body_flags and reserved"),
    (lambda b: b, 2, SE, "payload_frame_count 2 needs 48"),
    (lambda b: b, 1, SE | 0x02, "differ from payload_kind_bitmap"),
    (lambda b: struct.pack_into("<B", b, 32 + 2, 0x30) or b, 1, SE, "not one non-tensor kind"),
    (lambda b: struct.pack_into("<B", b, 32 + 2, 0x01) or b, 1, SE, "not one non-tensor kind"),
    (lambda b: struct.pack_into("<H", b, 32 + 12, 3) or b, 1, SE, "stream_semantics"),
    (lambda b: struct.pack_into("<H", b, 32 + 14, 1) or b, 1, SE, "reserved field"),
    (lambda b: struct.pack_into("<I", b, 32 + 20, 99) or b, 1, SE, "past the"),
])
def test_region_violations_are_typed_body_errors(mutate, count, bitmap, text) -> None:  # type: ignore[no-untyped-def]
    body = bytes(mutate(_body()))
    with pytest.raises(nnrp.TypedBodyError, match=text) as info:
        nnrp.parse_typed_body(body, payload_kind_bitmap=bitmap, payload_frame_count=count)
    assert not info.value.fatal  # operation-level: the connection survives


def test_overlapping_descriptors_are_rejected() -> None:
    body = bytearray(nnrp.pack_typed_body([(nnrp.TypedDescriptor(), b"abcd"),
                                           (nnrp.TypedDescriptor(), b"efgh")]))
    struct.pack_into("<I", body, 32 + 24 + 16, 2)  # second frame starts inside the first
    with pytest.raises(nnrp.TypedBodyError, match="overlaps"):
        nnrp.parse_typed_body(bytes(body), payload_kind_bitmap=SE, payload_frame_count=2)
