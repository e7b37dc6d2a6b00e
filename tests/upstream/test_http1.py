"""The sans-IO HTTP/1.1 reader (``_http1``), whole, byte by byte, and with trailing bytes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from gateway.upstream._http1 import (
    BodyDecoder,
    ProtocolError,
    parse_head,
    request_bytes,
)
from tests.support.build import pure_only
from tests.support.http1 import read_in_parts

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n")
EVENTS = [b"data: {\"a\": 1}\n\n", b"data: {\"b\": 22}\n\n", b"data: [DONE]\n\n"]
CHUNKED = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n"


def decode(parts: list[bytes]) -> tuple[bytes, BodyDecoder]:
    body, decoder = read_in_parts(parts)
    assert decoder is not None
    return body, decoder


def test_a_whole_response_in_one_read() -> None:
    body, decoder = decode([HEAD + CHUNKED])
    assert body == b"".join(EVENTS)
    assert decoder.done and decoder.reusable


@given(st.lists(st.integers(min_value=1, max_value=len(HEAD + CHUNKED) - 1), unique=True))
def test_any_split_of_the_bytes_gives_the_same_body(cuts: list[int]) -> None:
    data = HEAD + CHUNKED
    points = [0, *sorted(cuts), len(data)]
    body, decoder = decode([data[a:b] for a, b in itertools.pairwise(points)])
    assert body == b"".join(EVENTS) and decoder.done and decoder.reusable


def test_byte_by_byte() -> None:
    data = HEAD + CHUNKED
    body, decoder = decode([data[i:i + 1] for i in range(len(data))])
    assert body == b"".join(EVENTS) and decoder.reusable


def test_bytes_after_the_end_make_the_connection_unusable() -> None:
    body, decoder = decode([HEAD + CHUNKED + b"HTTP/1.1 200"])
    assert body == b"".join(EVENTS)
    assert decoder.done and decoder.extra == len(b"HTTP/1.1 200") and not decoder.reusable


def test_extensions_and_trailers_are_read_and_ignored() -> None:
    body, decoder = decode([HEAD + b"5;name=value\r\nhello\r\n0\r\nx-trailer: 1\r\n\r\n"])
    assert body == b"hello" and decoder.reusable
    head, _ = parse_head(HEAD)  # type: ignore[misc]
    endless = BodyDecoder(head)
    endless.feed(b"0\r\n")
    trailers = b"".join(b"x-trailer: " + b"y" * 1000 + b"\r\n" for _ in range(100))
    with pytest.raises(ProtocolError, match="trailer section too large"):
        endless.feed(trailers)


@pytest.mark.parametrize("bad", [
    b"zz\r\nhello\r\n",                     # not hex
    b"5\r\nhelloXX",                        # data not followed by CRLF
    b"\r\n",                                # empty size
    b"1" * 5000,                            # a size line that never ends
    b"11111111111111111\r\n",               # more than 16 hex digits
    b"5;a\nb\r\nhello\r\n",                  # a bare LF in the extensions
    b"0\r\nx: a\rb\r\n\r\n",                  # a bare CR in a trailer field
    b"0\r\nx: a\0b\r\n\r\n",                  # a NUL in a trailer field
])
def test_bad_chunked_bodies_are_errors(bad: bytes) -> None:
    head, _length = parse_head(HEAD)  # type: ignore[misc]
    with pytest.raises(ProtocolError):
        BodyDecoder(head).feed(bad)


@st.composite
def chunk_streams(draw: st.DrawFn) -> bytes:
    """A chunked body mostly as vLLM frames it (lowercase hex, nothing else on the line:
    ``_feed_chunked``'s lean loop), some chunks in the shapes only the strict loop reads
    (an extension, OWS, uppercase hex, leading zeros), then the last chunk, trailers,
    sometimes bytes after the end; half the time one byte changed, often a line end's."""
    framed = b""
    for piece in draw(st.lists(st.binary(min_size=1, max_size=300), max_size=8)):
        size = b"%x" % len(piece)
        shape = draw(st.sampled_from(["canonical"] * 4 + ["ext", "ows", "upper", "zeros"]))
        line = {"canonical": size, "ext": size + b";a=b", "ows": size + b" \t",
                "upper": size.upper(), "zeros": b"00" + size}[shape]
        framed += line + b"\r\n" + piece + b"\r\n"
    framed += b"0\r\n" + draw(st.sampled_from([b"", b"x-t: 1\r\n"])) + b"\r\n"
    framed += draw(st.sampled_from([b"", b"", b"HTTP/1.1"]))
    if framed and draw(st.booleans()):
        line_ends = [index for index, byte in enumerate(framed) if byte in b"\r\n"]
        at = draw(st.sampled_from(line_ends) | st.integers(0, len(framed) - 1))
        framed = framed[:at] + bytes([draw(st.integers(0, 255))]) + framed[at + 1:]
    return framed


def _outcome(reads: list[bytes]) -> tuple[object, ...]:
    head, _ = parse_head(HEAD)  # type: ignore[misc]
    decoder = BodyDecoder(head)
    body = b""
    try:
        for data in reads:
            body += decoder.feed(data)
    except ProtocolError:
        return ("error",)  # what a read that failed held is not delivered, however cut
    return (body, decoder.done, decoder.extra)


@settings(max_examples=300)
@given(st.data(), chunk_streams())
def test_the_lean_loop_reads_as_the_strict_one(data: st.DataObject, framed: bytes) -> None:
    """Reads of whole chunks (the lean loop's) and reads cut anywhere, against the same
    bytes a byte at a time (a byte never holds a size line: the strict loop alone): the
    same body, end and trailing bytes, or an error both ways."""
    bounds = [index + 2 for index in range(len(framed)) if framed[index:index + 2] == b"\r\n"]
    cuts = data.draw(st.lists(st.sampled_from(bounds) if bounds else st.nothing(), max_size=6)
                     | st.lists(st.integers(1, max(len(framed) - 1, 1)), max_size=6))
    points = sorted({0, *(c for c in cuts if 0 < c < len(framed)), len(framed)})
    reads = [framed[a:b] for a, b in itertools.pairwise(points) if b > a]
    assert _outcome(reads) == _outcome([framed[i:i + 1] for i in range(len(framed))])


@pure_only("it replaces BodyDecoder._feed_chunked_strictly, which the compiled class "
           "calls directly")
def test_whole_chunks_skip_the_strict_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lean loop is taken: a read of canonical whole chunks never reaches the strict
    one, and a read with an extension reaches it once, at the extension, with the
    chunks before it already taken."""
    head, _ = parse_head(HEAD)  # type: ignore[misc]
    strict = BodyDecoder._feed_chunked_strictly
    handed: list[tuple[bytes, list[bytes]]] = []

    def spy(self: BodyDecoder, data: bytes, pieces: list[bytes], position: int = 0
            ) -> bytes:
        handed.append((data[position:], list(pieces)))  # what the strict loop reads
        return strict(self, data, pieces, position)

    monkeypatch.setattr(BodyDecoder, "_feed_chunked_strictly", spy)
    decoder = BodyDecoder(head)
    events = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS)
    assert decoder.feed(events) == b"".join(EVENTS)
    assert decoder.feed(events[:4]) == b""  # a size line, its data yet to come: strict
    assert handed == [(events[:4], [])]
    handed.clear()
    decoder = BodyDecoder(head)
    assert decoder.feed(events + b"5;x=y\r\nhello\r\n" + CHUNKED) == (
        b"".join(EVENTS) + b"hello" + b"".join(EVENTS))
    assert handed == [(b"5;x=y\r\nhello\r\n" + CHUNKED, EVENTS)]
    assert decoder.done and decoder.reusable


def test_a_connection_closed_mid_body_is_an_error_unless_the_body_runs_to_it() -> None:
    head, _ = parse_head(HEAD)  # type: ignore[misc]
    decoder = BodyDecoder(head)
    decoder.feed(b"5\r\nhel")
    with pytest.raises(ProtocolError, match="complete message body"):
        decoder.end_of_stream()
    head, _ = parse_head(b"HTTP/1.1 200 OK\r\n\r\n")  # type: ignore[misc]
    until_close = BodyDecoder(head)
    assert until_close.feed(b"anything") == b"anything"
    until_close.end_of_stream()
    assert until_close.done and not until_close.reusable and not head.keep_alive


def test_framing_by_the_rfc() -> None:
    def framing(head: bytes) -> tuple[str, int, bool]:
        parsed = parse_head(head + b"\r\n")
        assert parsed is not None
        return parsed[0].framing, parsed[0].length, parsed[0].keep_alive

    assert framing(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n") == ("length", 12, True)
    assert framing(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 3\r\n") == (
        "length", 3, True)
    assert framing(b"HTTP/1.1 204 No Content\r\n") == ("none", 0, True)
    assert framing(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: , chunked\r\n")[0] == "chunked"
    assert framing(b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\n"
                   b"Content-Length: 0\r\n") == ("length", 0, False)
    assert framing(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n") == ("length", 1, False)
    # Chunked wins over a length (RFC 9112 6.3), in any header case, and the connection
    # is not reused after such a message.
    assert framing(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nTransfer-Encoding: Chunked\r\n"
                   ) == ("chunked", 0, False)
    for bad in (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n",
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n",
                b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n",
                b"HTTP/1.1 200 OK\r\nbad header\r\n",
                b"HTTP/1.1 200 OK\r\nname : value\r\n",
                # One field to a reader ending lines at CRLF only, two (and a length) to
                # one taking a bare LF as a line end: refused, whatever it would mean.
                b"HTTP/1.1 200 OK\r\nx: a\ncontent-length: 0\r\n",
                b"HTTP/1.1 200 OK\r\nx: a\rb\r\n",
                b"HTTP/1.1 200 OK\r\nx: a\0b\r\n",
                b"HTTP/1.1 200 O\nK\r\n",
                b"HTTP/2 200 OK\r\n",
                b"HTTP/1.1 099 Odd\r\n",
                b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n",
                b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 19 + b"\r\n",
                b"HTTP/1.1 2000 OK\r\n"):
        with pytest.raises(ProtocolError):
            parse_head(bad + b"\r\n")


def test_a_fixed_length_body_and_its_trailing_bytes() -> None:
    head, _ = parse_head(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 5\r\n\r\n")  # type: ignore[misc]
    decoder = BodyDecoder(head)
    assert decoder.feed(b"he") == b"he" and not decoder.done
    assert decoder.feed(b"llo!!") == b"llo"
    assert decoder.done and decoder.extra == 2 and not decoder.reusable


def test_head_limits() -> None:
    assert parse_head(b"HTTP/1.1 200 OK\r\n") is None  # not complete yet
    with pytest.raises(ProtocolError, match="too large"):
        parse_head(b"HTTP/1.1 200 OK\r\n" + b"x: " + b"y" * 70_000)


def test_request_bytes() -> None:
    data = request_bytes("POST", b"/v1/chat/completions",
                         [(b"Host", b"127.0.0.1:8000"), (b"Content-Length", b"2")], b"{}")
    assert data == (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
                    b"Content-Length: 2\r\n\r\n{}")
    with pytest.raises(ValueError, match="line break or NUL"):
        request_bytes("GET", b"/", [(b"x", b"a\r\nb")], b"")
