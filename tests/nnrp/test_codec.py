"""The packet codec, tested whole, byte by byte and with trailing bytes (h11's reader rule)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from gateway import nnrp
from tests.support.strategies import ALL_CLASSES, packets
from tests.support.tiers import examples


def feed_three_ways(data: bytes) -> list[nnrp.Packet]:
    """Decode ``data`` whole, one byte at a time, and followed by a partial packet."""
    whole = nnrp.Decoder().feed(data)
    decoder = nnrp.Decoder()
    bytewise: list[nnrp.Packet] = []
    for index in range(len(data)):
        bytewise += decoder.feed(data[index:index + 1])
    assert decoder.buffered == 0
    trailing_decoder = nnrp.Decoder()
    # Trailing bytes: the start of another header must be buffered, not decoded.
    trailing = trailing_decoder.feed(data + data[:39])
    assert trailing_decoder.buffered == min(39, len(data))
    assert whole == bytewise == trailing
    return whole


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.MSG_TYPE.name)
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_roundtrip_every_message(cls: type[Any], data: st.DataObject) -> None:
    packet = data.draw(packets(cls))
    raw = nnrp.encode(packet)
    assert len(raw) == 40 + cls.LAYOUT.size + len(packet.body)
    assert feed_three_ways(raw) == [packet]
    assert nnrp.decode_packet(raw) == packet


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(packets(), min_size=1, max_size=6), st.data())
def test_stream_of_packets_any_chunking(batch: list[nnrp.Packet], data: st.DataObject) -> None:
    raw = b"".join(nnrp.encode(p) for p in batch)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    decoder = nnrp.Decoder()
    out: list[nnrp.Packet] = []
    previous = 0
    for cut in [*cuts, len(raw)]:
        out += decoder.feed(raw[previous:cut])
        previous = cut
    assert out == batch
    assert feed_three_ways(raw) == batch


def test_partial_result_fast_path_matches_generic_encoder() -> None:
    body = b'{"type":"response.output_text.delta","index":0,"delta":"hi"}'
    generic = nnrp.encode(nnrp.Packet(
        nnrp.PartialResult(operation_id=0x65, result_sequence=7, delta_sequence=7,
                           body_bytes=len(body)), session_id=3, frame_id=9, body=body))
    assert nnrp.encode_partial_result(3, 9, 0x65, 7, body) == generic


def test_encode_refuses_body_that_contradicts_metadata() -> None:
    with pytest.raises(nnrp.LocalProtocolError, match="announces a 3-byte body"):
        nnrp.encode(nnrp.Packet(nnrp.Cancel(operation_id=1, diagnostic_bytes=3), body=b"ab"))


# --------------------------------------------------------------------------- rejections

PING = nnrp.encode(nnrp.Packet(nnrp.Ping()))


def _patched(raw: bytes, offset: int, fmt: str, value: int) -> bytes:
    data = bytearray(raw)
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


CANCEL = nnrp.encode(nnrp.Packet(nnrp.Cancel(operation_id=5, reason=1, source_role=1),
                                 session_id=1, frame_id=1))

HEADER_REJECTIONS = {
    "bad magic": (b"XNRP" + PING[4:], nnrp.ErrorCode.MALFORMED_HEADER, "bad magic"),
    "version 2": (_patched(PING, 4, "<B", 2), nnrp.ErrorCode.UNSUPPORTED_VERSION, "version"),
    "wire format 1": (_patched(PING, 5, "<B", 1), nnrp.ErrorCode.UNSUPPORTED_VERSION, "version"),
    "header_len 41": (_patched(PING, 7, "<B", 41), nnrp.ErrorCode.MALFORMED_HEADER,
                      "header_len"),
    "reserved flag bit": (_patched(PING, 8, "<I", 0x40), nnrp.ErrorCode.MALFORMED_HEADER,
                          "reserved header flag"),
    "unknown type": (_patched(PING, 6, "<B", 0x7F), nnrp.ErrorCode.MALFORMED_HEADER,
                     "unknown msg_type"),
    "just past the registry": (_patched(PING, 6, "<B", 0x4A), nnrp.ErrorCode.MALFORMED_HEADER,
                               "unknown msg_type 0x4a"),
    "a known type with another's metadata": (_patched(PING, 6, "<B", 0x14),
                                             nnrp.ErrorCode.MALFORMED_HEADER,
                                             "CACHE_PUT: meta_len 0, must be 40"),
    "wrong meta_len": (_patched(PING, 12, "<I", 8), nnrp.ErrorCode.MALFORMED_HEADER,
                       "meta_len 8, must be 0"),
    "reserved metadata field": (_patched(CANCEL, 40 + 24, "<Q", 1),
                                nnrp.ErrorCode.MALFORMED_BODY, "reserved field at byte 24"),
    "enum out of range": (_patched(CANCEL, 40 + 16, "<H", 99), nnrp.ErrorCode.MALFORMED_BODY,
                          "cancel.reason"),
    "reserved flags in metadata": (_patched(CANCEL, 40 + 19, "<B", 0x80),
                                   nnrp.ErrorCode.MALFORMED_BODY, "cancel.flags"),
    "body_len vs diag_bytes": (_patched(CANCEL, 40 + 20, "<I", 4) + b"", nnrp.ErrorCode.MALFORMED_BODY,
                               "body_len 0, metadata announces 4"),
}


@pytest.mark.parametrize("name", HEADER_REJECTIONS)
def test_decoder_rejects(name: str) -> None:
    raw, code, text = HEADER_REJECTIONS[name]
    decoder = nnrp.Decoder()
    with pytest.raises(nnrp.RemoteProtocolError, match=text) as info:
        decoder.feed(raw)
    assert info.value.code == code
    assert info.value.fatal
    # The decoder stays broken: a framing error poisons the stream.
    with pytest.raises(nnrp.RemoteProtocolError):
        decoder.feed(PING)
    with pytest.raises(nnrp.RemoteProtocolError):
        nnrp.decode_packet(raw)


def test_size_cap_is_enforced_before_the_body_is_buffered() -> None:
    decoder = nnrp.Decoder(max_packet=1024)
    # A header announcing a 4 GiB - 1 body: refused from its 40 header bytes alone.
    huge = _patched(nnrp.encode(nnrp.Packet(nnrp.PartialResult(operation_id=1))), 16, "<I",
                    0xFFFFFFFF)[:40]
    with pytest.raises(nnrp.RemoteProtocolError, match="exceeds the 1024-byte limit") as info:
        decoder.feed(huge)
    assert info.value.code == nnrp.ErrorCode.LIMIT_EXCEEDED
    assert decoder.buffered == 0


def _submit(operation_id: int, body: bytes) -> bytes:
    return nnrp.encode(nnrp.Packet(nnrp.FrameSubmit(
        operation_id=operation_id, payload_kind_bitmap=0x10, payload_frame_count=1),
        session_id=3, frame_id=operation_id, body=body))


@pytest.mark.parametrize("step", [None, 1, 7, 1000])
def test_an_oversized_submit_is_discarded_and_the_stream_goes_on(step: int | None) -> None:
    """Over the cap but within the protocol's 64 MiB: its metadata comes out, its body is
    dropped as it arrives (never buffered), and the next packets decode as ever."""
    decoder = nnrp.Decoder(max_packet=1024)
    big = _submit(7, bytes(5000))
    stream = PING + big + _submit(8, b"x" * 100) + PING
    if step is None:
        packets = decoder.feed(stream)
    else:
        packets = []
        for start in range(0, len(stream), step):
            packets += decoder.feed(stream[start:start + step])
            assert decoder.buffered <= 1024  # the cap still bounds what is held
    assert [p.msg_type for p in packets] == [nnrp.MsgType.PING, nnrp.MsgType.FRAME_SUBMIT,
                                             nnrp.MsgType.FRAME_SUBMIT, nnrp.MsgType.PING]
    oversized, whole = packets[1], packets[2]
    assert (oversized.message.operation_id, oversized.frame_id, oversized.session_id) == (7, 7, 3)
    assert (oversized.body, oversized.discarded) == (b"", 5000)
    assert (whole.body, whole.discarded) == (b"x" * 100, 0)
    assert decoder.buffered == 0 and decoder.error is None


@pytest.mark.parametrize("step", [None, 1, 4093, 65536])
def test_a_big_body_is_a_view_of_the_bytes_it_arrived_in_never_a_copy(step: int | None
                                                                      ) -> None:
    """A body of VIEW_MIN_BODY bytes or more comes out as a read-only view of the
    decoder's buffer, which the decoder then gives up: later feeds do not touch it, and
    the packets after it decode as ever (the trailing bytes go to a new buffer)."""
    big_body = bytes(range(256)) * (nnrp.VIEW_MIN_BODY // 256 + 3)
    small_body = b"s" * (nnrp.VIEW_MIN_BODY - 1)
    stream = PING + _submit(7, big_body) + _submit(8, small_body) + PING + _submit(9, big_body)
    decoder = nnrp.Decoder()
    packets = []
    chunks = [stream] if step is None else [stream[i:i + step]
                                            for i in range(0, len(stream), step)]
    for chunk in chunks:
        packets += decoder.feed(chunk)
    assert [p.msg_type for p in packets] == [nnrp.MsgType.PING, nnrp.MsgType.FRAME_SUBMIT,
                                             nnrp.MsgType.FRAME_SUBMIT, nnrp.MsgType.PING,
                                             nnrp.MsgType.FRAME_SUBMIT]
    first, small, last = packets[1], packets[2], packets[4]
    for packet in (first, last):
        assert isinstance(packet.body, memoryview) and packet.body.readonly
        assert packet.body == big_body  # untouched by every feed after it
        with pytest.raises(TypeError):
            packet.body[0] = 0  # type: ignore[index]
    assert type(small.body) is bytes and small.body == small_body  # a small body: bytes
    assert decoder.buffered == 0 and decoder.error is None


def test_a_big_packet_arriving_holds_what_arrived_and_stops_at_its_end() -> None:
    """Its own memory is filled read by read: what is held is what came (never what the
    header announced), and the bytes after it, in the same read, decode as ever."""
    body = bytes(range(256)) * 1024
    packet = _submit(7, body)
    decoder = nnrp.Decoder()
    assert decoder.feed(packet[:100]) == [] and decoder.buffered == 100
    assert decoder.feed(packet[100:-10]) == [] and decoder.buffered == len(packet) - 10
    (big, ping) = decoder.feed(packet[-10:] + PING)
    assert big.body == body and ping.msg_type is nnrp.MsgType.PING
    assert decoder.buffered == 0


def test_a_big_packet_completed_in_the_decoders_buffer_is_a_view_of_it() -> None:
    """The buffer branch: a header split across reads is buffered, and the read that
    completes the packet (a big body in one read) leaves it a view of that buffer, which
    the decoder gives up; what follows decodes from a new one."""
    body = b"v" * nnrp.VIEW_MIN_BODY
    stream = _submit(7, body) + PING
    decoder = nnrp.Decoder()
    assert decoder.feed(stream[:10]) == [] and decoder.buffered == 10
    (big, ping) = decoder.feed(stream[10:])
    assert isinstance(big.body, memoryview) and big.body.readonly and big.body == body
    assert ping.msg_type is nnrp.MsgType.PING and decoder.buffered == 0
    decoder.feed(PING[:5])  # the new buffer: the old one stays as the packet's
    assert big.body == body and decoder.feed(PING[5:])[0].msg_type is nnrp.MsgType.PING


def test_no_memory_for_a_big_packet_fails_its_connection_cleanly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import mmap

    def refused(*args: object) -> mmap.mmap:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refused)
    decoder = nnrp.Decoder()
    packet = _submit(7, bytes(nnrp.VIEW_MIN_BODY))
    with pytest.raises(nnrp.RemoteProtocolError, match="no memory for a packet") as info:
        decoder.feed(packet[:1000])
    assert info.value.code is nnrp.ErrorCode.SERVER_BUSY
    with pytest.raises(nnrp.RemoteProtocolError):
        decoder.feed(PING)  # broken for good, as after any framing error


def test_a_big_body_of_a_message_passed_whole_is_a_view_only_of_immutable_bytes() -> None:
    """A WebSocket message (``decode_packet``) or a whole read: a view of ``bytes``; a
    ``bytearray`` or a view the caller passed may change after, so it is copied."""
    body = b"b" * nnrp.VIEW_MIN_BODY
    message = _submit(7, body)
    for data, viewed in ((message, True), (bytearray(message), False),
                         (memoryview(message), False)):
        for packet in (nnrp.decode_packet(data), nnrp.Decoder().feed(data)[0]):
            assert isinstance(packet.body, memoryview) is viewed
            assert packet.body == body


def test_a_message_given_away_is_viewed_not_copied() -> None:
    """A carrier's message buffer, given away (gateway/transport/_websocket.py): a big
    body is a view of that very bytearray; a small one is bytes; a view passed is still
    copied (its owner may change it)."""
    body = b"g" * nnrp.VIEW_MIN_BODY
    message = bytearray(_submit(7, body))
    packet = nnrp.decode_packet(message, given_away=True)
    assert isinstance(packet.body, memoryview) and packet.body.readonly
    assert packet.body.obj is message and packet.body == body
    small = nnrp.decode_packet(bytearray(_submit(7, b"s")), given_away=True)
    assert small.body == b"s" and isinstance(small.body, bytes)
    view = nnrp.decode_packet(memoryview(_submit(7, body)), given_away=True)
    assert not isinstance(view.body, memoryview)


def test_typed_frames_of_a_viewed_body_are_views_of_it() -> None:
    payloads = [b"{}", b"\x89PNG" + bytes(nnrp.VIEW_MIN_BODY)]
    descriptors = [nnrp.TypedDescriptor(payload_kind=kind, stream_semantics=1)
                   for kind in (0x10, 0x40)]
    body = nnrp.pack_typed_body(list(zip(descriptors, payloads, strict=True)))
    for passed, viewed in ((body, False), (memoryview(body).toreadonly(), True)):
        typed = nnrp.parse_typed_body(passed, payload_kind_bitmap=0x50, payload_frame_count=2)
        assert [frame.payload for frame in typed.frames] == payloads
        assert all(isinstance(frame.payload, memoryview) is viewed for frame in typed.frames)


def test_other_oversized_packets_and_submits_past_the_protocols_cap_stay_fatal() -> None:
    with pytest.raises(nnrp.RemoteProtocolError, match="PARTIAL_RESULT: packet of"):
        nnrp.Decoder(max_packet=1024).feed(nnrp.encode(nnrp.Packet(
            nnrp.PartialResult(operation_id=1, body_bytes=2000), body=bytes(2000))))
    past = _patched(_submit(1, b""), 16, "<I", 64 * 1024 * 1024)[:40]
    with pytest.raises(nnrp.RemoteProtocolError, match="exceeds the 1024-byte limit"):
        nnrp.Decoder(max_packet=1024).feed(past)
    # A WebSocket message arrives whole (its carrier bounds it): refused the same way.
    packet = nnrp.decode_packet(_submit(1, bytes(2000)), max_packet=1024)
    assert (packet.message.operation_id, packet.body, packet.discarded) == (1, b"", 2000)


def test_default_cap_and_protocol_bounds() -> None:
    assert nnrp.Decoder().max_packet == 64 * 1024 * 1024
    with pytest.raises(ValueError, match="max_packet"):
        nnrp.Decoder(max_packet=64 * 1024 * 1024 + 1)


def test_valid_packets_before_a_bad_one_are_delivered() -> None:
    decoder = nnrp.Decoder()
    assert decoder.feed(PING + PING + b"garbage" + b"\0" * 40) == [
        nnrp.decode_packet(PING), nnrp.decode_packet(PING)]
    with pytest.raises(nnrp.RemoteProtocolError, match="bad magic"):
        decoder.feed(b"")


def test_websocket_message_must_hold_exactly_one_packet() -> None:
    with pytest.raises(nnrp.RemoteProtocolError, match="holds a 40-byte packet"):
        nnrp.decode_packet(PING + b"x")
    with pytest.raises(nnrp.RemoteProtocolError, match="shorter than a header"):
        nnrp.decode_packet(PING[:39])


@pytest.mark.parametrize(("message", "text"), [
    (nnrp.FrameSubmit(operation_id=0), "operation_id must be non-zero"),
    (nnrp.FrameSubmit(operation_id=1, src_width=8), "tensor fields must be 0"),
    (nnrp.FrameSubmit(operation_id=1, loss_tolerance=7), "loss_tolerance"),
    (nnrp.ResultPush(result_class=2), "stale semantics and a non-zero reused_frame_id"),
    (nnrp.ResultPush(reused_frame_id=3), "stale semantics and a non-zero reused_frame_id"),
    (nnrp.ResultPush(tile_count=3), "tensor fields must be 0"),
    (nnrp.ResultPush(payload_kind_bitmap=1, tile_count=3, covered_tiles=1),
     "covered_tiles \\+ dropped_tiles"),
    (nnrp.FlowUpdate(scope=1, connection_credit=1), "session scope may only set"),
    (nnrp.FlowUpdate(scope=2, operation_id=1, session_credit=1), "operation scope may only"),
    (nnrp.FrameSubmit(operation_id=1, camera_bytes=4), "tensor fields must be 0"),
    (nnrp.FlowUpdate(scope=0, session_credit=1), "connection scope may only set"),
    (nnrp.FlowUpdate(scope=2), "operation scope needs an operation_id"),
    (nnrp.FlowUpdate(retry_after_ms=5), "retry_after_ms without retry_after_valid"),
    (nnrp.Deadline(operation_id=1), "deadline_unix_ms must be non-zero"),
    (nnrp.Progress(percent_x100=10001), "percent_x100"),
    (nnrp.Progress(stage=0x0C), "progress.stage"),
    (nnrp.Error(code=0), "error.code"),
    (nnrp.SessionOpen(session_flags=0x10), "session_flags"),
    (nnrp.ResultHint(reason=5), "result_hint.reason"),
])
def test_metadata_rules(message: Any, text: str) -> None:
    with pytest.raises(nnrp.RemoteProtocolError, match=text):
        message.validate()
