"""The SSE decoder: line ends, chunking, caps (tested whole, byte by byte, trailing)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from gateway.upstream import SSEDecoder, SSEError, SSEEvent

STREAM = (b'data: {"a":1}\n\n'
          b'data: {"t":"line\xe2\x80\xa8sep \xc2\x85 \x1c"}\r\n\r\n'  # U+2028, U+0085, \x1c raw
          b": comment\n"
          b"event: custom\ndata: x\ndata: y\r\r"
          b"data: [DONE]\n\n")
EXPECTED = ['{"a":1}', '{"t":"line\u2028sep \u0085 \x1c"}', "x\ny", "[DONE]"]


def decode(chunks: list[bytes]) -> list[str]:
    decoder = SSEDecoder()
    out = []
    for chunk in chunks:
        out += [event.data for event in decoder.feed(chunk)]
    return out


def test_whole_bytewise_and_trailing() -> None:
    assert decode([STREAM]) == EXPECTED
    assert decode([STREAM[i:i + 1] for i in range(len(STREAM))]) == EXPECTED
    assert decode([STREAM + b"data: partial"]) == EXPECTED  # unterminated event not emitted


@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    pieces = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert decode(pieces) == EXPECTED


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    assert decode([b"data: a\r", b"\n\r", b"\ndata: b\n\n"]) == ["a", "b"]


def test_event_type_and_done() -> None:
    events = SSEDecoder().feed(b"event: e\ndata: 1\n\ndata: [DONE]\n\n")
    assert (events[0].event, events[0].data, events[1].is_done) == ("e", "1", True)


def test_caps() -> None:
    with pytest.raises(SSEError, match="line"):
        SSEDecoder(max_line=16).feed(b"data: " + b"x" * 40 + b"\n")
    with pytest.raises(SSEError, match="without an end"):
        SSEDecoder(max_line=16).feed(b"data: " + b"x" * 40)
    with pytest.raises(SSEError, match="event exceeds"):
        SSEDecoder(max_event=10).feed(b"data: 123456\ndata: 123456\n\n")
    with pytest.raises(SSEError, match="UTF-8"):
        SSEDecoder().feed(b"data: \xff\n\n")


def test_events_before_a_fault_travel_with_it() -> None:
    decoder = SSEDecoder(max_line=64)
    with pytest.raises(SSEError, match="exceeds 64") as raised:
        decoder.feed(b"data: a\n\ndata: b\n\n" + b"x" * 100 + b"\n")
    assert [event.data for event in raised.value.events] == ["a", "b"]


def test_keep_alive_comments_leave_nothing_pending_byte_by_byte() -> None:
    """vLLM 0.32's keep-alive comment (``: keep-alive\\n\\n``) yields no event and, once
    its line has ended, leaves nothing of an event begun; trailing bytes of the next
    event do."""
    data = b": keep-alive\n\n"
    decoder = SSEDecoder()
    for index in range(len(data)):
        assert decoder.feed(data[index:index + 1]) == []
        assert decoder.pending == (index < len(b": keep-alive"))
    assert decoder.feed(b'data: {"a"') == []
    assert decoder.pending
    assert decoder.feed(b":1}\n") == []
    assert decoder.pending  # data lines held until the blank line
    assert decoder.feed(b"\n: keep-alive\n\n") == [SSEEvent('{"a":1}')]
    assert not decoder.pending
