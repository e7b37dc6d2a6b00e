"""``_http1`` against h11 on the same response bytes.

h11 is the sans-IO reference (conventions.md B) and reads what vLLM's own server (uvicorn
on h11 or httptools) writes. Both readers get the same bytes, in the same parts or split
differently, and must agree: on the head (version, status, reason, headers), the body,
whether the message ended, whether the connection may carry the next request, the bytes
after the message, and on refusing what is not HTTP/1.1.

Where they legitimately differ, the difference is asserted both ways, with its reason,
so that either reader changing is seen: in ``DIFFERENCES`` and beside it, and, for the
two that random inputs meet (bytes after a message), in ``agree`` and in
``test_bytes_after_a_message``, each marked DIFFERENCE. Nothing is skipped silently.

Representation, not behaviour: h11 rewrites the framing headers it interprets
(duplicate Content-Length headers become one, Transfer-Encoding is lowercased), ours
hands them on as received; those two headers are compared by what they do (framing,
body, end), every other header as received.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import h11
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gateway.upstream._http1 import MAX_HEAD, MAX_LINE, ProtocolError
from tests.support.http1 import read_response

FRAMING_HEADERS = (b"content-length", b"transfer-encoding")


class Reading(NamedTuple):
    """What a reader made of the bytes, in terms both readers have."""

    head: tuple[bytes, int, bytes, tuple[tuple[bytes, bytes], ...]] | None
    body: bytes
    ended: bool  # the message is complete
    refused: bool  # the bytes are not HTTP/1.1 (before the message's end)
    keep_alive: bool | None  # known once ended: may the connection carry another request
    trailing: bytes  # bytes after the message's end


def _head(version: bytes, status: int, reason: bytes,
          headers: list[tuple[bytes, bytes]]) -> tuple[bytes, int, bytes,
                                                      tuple[tuple[bytes, bytes], ...]]:
    kept = tuple((bytes(n), bytes(v)) for n, v in headers if n not in FRAMING_HEADERS)
    return bytes(version), status, bytes(reason), kept


def ours(parts: list[bytes], *, eof: bool, method: str = "POST") -> Reading:
    """``_http1`` as the transport drives it; ``eof``: the server closed after the bytes."""
    everything = b"".join(parts)
    try:
        head, body, decoder = read_response(parts, request_method=method)
        if eof:
            if decoder is None:  # the transport: "server disconnected without a response"
                raise ProtocolError("no response")
            decoder.end_of_stream()
    except ProtocolError:
        return Reading(None, b"", False, True, None, b"")
    if head is None or decoder is None:
        return Reading(None, b"", False, False, None, b"")
    ended = decoder.done
    trailing = everything[len(everything) - decoder.extra:] if decoder.extra else b""
    return Reading(_head(head.http_version, head.status, head.reason, head.headers), body,
                   ended, False, head.keep_alive if ended else None, trailing)


class Theirs(NamedTuple):
    reading: Reading
    #: h11 refused bytes that came after a message which ends the connection.
    refused_after_end: bool


def theirs(parts: list[bytes], *, eof: bool, method: str = "POST",
           connection: h11.Connection | None = None) -> Theirs:
    """h11 as a client that sent one request; ``connection`` continues one that did."""
    if connection is None:
        connection = h11_client(method)
    head = None
    body = bytearray()
    ended = refused = after_end = stopped = False
    keep_alive = None
    for part in [*parts, *([b""] if eof else [])]:
        connection.receive_data(part)  # b"": the connection's end
        while not stopped:
            try:
                event = connection.next_event()
            except h11.RemoteProtocolError:
                stopped = True
                after_end, refused = ended, not ended
                break
            if event is h11.NEED_DATA or event is h11.PAUSED:
                break
            if isinstance(event, h11.Response):
                head = _head(event.http_version, event.status_code, event.reason,
                             list(event.headers))
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                ended = True
                # A message read to the connection's end leaves h11 in DONE too; gone
                # with its connection, it can carry no other request.
                keep_alive = connection.their_state is h11.DONE and bool(part)
            elif isinstance(event, h11.ConnectionClosed):
                stopped = True
    if refused:
        return Theirs(Reading(None, b"", False, True, None, b""), False)
    trailing = bytes(connection.trailing_data[0]) if ended else b""
    return Theirs(Reading(head, bytes(body), ended, False, keep_alive, trailing), after_end)


def h11_client(method: str = "POST") -> h11.Connection:
    # Ours refuses a head over MAX_HEAD; h11 gets the same bound (its default is 16 KiB).
    connection = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    headers = [("Host", "127.0.0.1:8000")]
    if method == "POST":
        headers.append(("Content-Length", "0"))
    connection.send(h11.Request(method=method, target="/v1/chat/completions",
                                headers=headers))
    connection.send(h11.EndOfMessage())
    return connection


def agree(parts: list[bytes], *, eof: bool, method: str = "POST") -> Reading:
    """Both readers on ``parts``: the same reading, or the test fails. Returns it."""
    mine, reference = ours(parts, eof=eof, method=method), theirs(parts, eof=eof, method=method)
    # DIFFERENCE (bytes after a message that ends the connection: HTTP/1.0, "Connection:
    # close"): h11 expects the connection's end there and refuses them; ours has read the
    # response whole and counts them (``BodyDecoder.extra``): the transport closes such a
    # connection anyway (R4), so the response is delivered, and then nothing else.
    expect_after_end = mine.ended and mine.keep_alive is False and bool(mine.trailing)
    assert reference.refused_after_end == expect_after_end, (mine, reference)
    assert mine == reference.reading
    return mine


# --------------------------------------------------------------------------- strategies

TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
FIELD_VCHAR = [bytes([b]) for b in [*range(0x21, 0x7F), *range(0x80, 0x100)]]
tokens = st.text(TOKEN_CHARS, min_size=1, max_size=10).map(str.encode)
ows = st.sampled_from([b"", b" ", b"\t", b"  \t"])
words = st.lists(st.lists(st.sampled_from(FIELD_VCHAR), min_size=1, max_size=6).map(b"".join),
                 max_size=4)


@st.composite
def field_values(draw: st.DrawFn) -> bytes:
    """A field value (RFC 9110 5.5): visible bytes and obs-text, SP/HTAB inside, OWS
    around it."""
    inside = b"".join(w + draw(st.sampled_from([b" ", b"\t", b" \t "])) for w in draw(words))
    return draw(ows) + inside.rstrip(b" \t") + draw(ows)


@st.composite
def plain_headers(draw: st.DrawFn) -> list[bytes]:
    """Header lines that do not touch framing or the connection."""
    names = tokens.filter(lambda n: n.lower() not in (*FRAMING_HEADERS, b"connection"))
    return [draw(names) + b":" + draw(field_values()) + b"\r\n"
            for _ in range(draw(st.integers(0, 4)))]


@st.composite
def status_lines(draw: st.DrawFn, version: bytes, status: int) -> bytes:
    reason = draw(st.one_of(
        st.none(),
        st.lists(st.sampled_from([b" ", b"\t", *FIELD_VCHAR]), max_size=12).map(b"".join)))
    # h11 and ours both take a status line without its reason, as many servers send it.
    tail = b"" if reason is None else b" " + reason
    return b"HTTP/" + version + b" %03d" % status + tail + b"\r\n"


def hex_size(size: int, draw: st.DrawFn) -> bytes:
    digits = draw(st.sampled_from([b"%x", b"%X"])) % size
    return b"0" * draw(st.integers(0, 16 - len(digits))) + digits


chunk_extensions = st.lists(
    st.tuples(tokens, st.one_of(st.none(), tokens, st.text(
        "abc ,;=\t", max_size=6).map(lambda s: b'"' + s.encode() + b'"')))
    .map(lambda e: b";" + e[0] + (b"" if e[1] is None else b"=" + e[1])),
    max_size=2).map(b"".join)


@st.composite
def chunked_bodies(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(the body, its chunked framing): sizes in either case with leading zeros,
    extensions, OWS before the line end, trailer fields."""
    pieces = draw(st.lists(st.binary(min_size=1, max_size=40), max_size=5))
    framed = b""
    for piece in [*pieces, b""]:
        framed += hex_size(len(piece), draw) + draw(chunk_extensions) + draw(ows) + b"\r\n"
        framed += piece + b"\r\n" if piece else b""
    framed += b"".join(draw(plain_headers())) + b"\r\n"  # trailer fields, then the end
    return b"".join(pieces), framed


class Message(NamedTuple):
    data: bytes
    method: str
    body: bytes  # what the message carries, whatever its framing
    rest: bytes  # bytes in ``data`` after the message's end (a body on a bodiless answer)
    delimited: bool  # the message ends by its own framing, not at the connection's end


@st.composite
def messages(draw: st.DrawFn) -> Message:
    """One response as vLLM (or any HTTP/1.1 server) may frame it: interim heads first,
    HTTP/1.0 or 1.1, any status, Connection tokens, Content-Length, chunked or
    read-to-close framing, or no body by status or request method."""
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    method = draw(st.sampled_from(["POST"] * 9 + ["HEAD"]))
    status = draw(st.one_of(st.sampled_from([200, 204, 304, 400, 404, 500, 503]),
                            st.integers(200, 999)))
    data = b""
    if version == b"1.1":
        for _ in range(draw(st.integers(0, 2))):
            data += draw(status_lines(b"1.1", draw(st.sampled_from([100, 102, 103]))))
            data += b"".join(draw(plain_headers())) + b"\r\n"
    data += draw(status_lines(version, status))
    headers = draw(plain_headers())
    connection = draw(st.lists(st.sampled_from([b"close", b"Close", b"keep-alive",
                                                b"upgrade"]), max_size=2))
    if connection:
        headers.append(b"Connection: " + b", ".join(connection) + b"\r\n")
    framings = ["length", "close"] + (["chunked"] if version == b"1.1" else [])
    framing = draw(st.sampled_from(framings))
    body = draw(st.binary(max_size=60))
    if framing == "chunked":
        body, framed = draw(chunked_bodies())
        name = draw(st.sampled_from([b"transfer-encoding", b"Transfer-Encoding"]))
        te = draw(st.sampled_from([b"chunked", b"Chunked", b"CHUNKED"]))
        headers.append(name + b":" + draw(ows) + te + draw(ows) + b"\r\n")
    elif framing == "length":
        framed = body
        name = draw(st.sampled_from([b"content-length", b"Content-Length"]))
        value = b"0" * draw(st.integers(0, 3)) + b"%d" % len(body)
        for _ in range(draw(st.integers(1, 2))):  # a repeated identical length is one
            headers.append(name + b":" + draw(ows) + value + draw(ows) + b"\r\n")
    else:
        framed = body
    data += b"".join(draw(st.permutations(headers))) + b"\r\n" + framed
    if method != "HEAD" and status not in (204, 304):
        return Message(data, method, body, b"", framing != "close")
    return Message(data, method, b"", framed, True)


@st.composite
def splits(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=8))
    points = sorted({0, *cuts, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]  # no empty part: a read of
    # nothing is the connection's end


# --------------------------------------------------------------------------- agreement


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.data(), messages())
def test_a_response_reads_the_same_whole_split_or_cut(data: st.DataObject,
                                                      message: Message) -> None:
    """A whole message, a random split and byte by byte; then the same bytes cut short,
    with the connection left open or closed there."""
    whole = agree([message.data], eof=True, method=message.method)
    assert (whole.ended, whole.body, whole.trailing) == (True, message.body, message.rest)
    for parts in (data.draw(splits(message.data)), [bytes([b]) for b in message.data]):
        assert agree(parts, eof=True, method=message.method) == whole
    cut = data.draw(st.integers(0, len(message.data)))
    eof = data.draw(st.booleans())
    agree(data.draw(splits(message.data[:cut])), eof=eof, method=message.method)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.data(), messages(), st.one_of(messages(), st.binary(min_size=1, max_size=30)))
def test_bytes_after_a_message(data: st.DataObject, first: Message,
                               after: Message | bytes) -> None:
    """Bytes after a message: a pipelined next response, or anything. Both find the same
    end and the same trailing bytes; ours then refuses to reuse the connection."""
    following = after.data if isinstance(after, Message) else after
    stream = first.data + following
    reading = agree(data.draw(splits(stream)), eof=data.draw(st.booleans()),
                    method=first.method)
    if not first.delimited:
        return  # read to the connection's end: the bytes after were its body
    assert reading.ended and reading.trailing == first.rest + following
    # DIFFERENCE (pipelining): h11 keeps the bytes for the next request's response and
    # reuses the connection; the gateway never pipelines, so bytes it asked nothing for
    # make ours close the connection (R4), however well-formed they are.
    head, _body, decoder = read_response([stream], request_method=first.method)
    assert head is not None and decoder is not None and not decoder.reusable
    if not (isinstance(after, Message) and reading.keep_alive and not first.rest):
        return
    # Read as a response of its own, the rest is what h11 makes of it on the next cycle.
    connection = h11_client(first.method)
    theirs([first.data], eof=False, method=first.method, connection=connection)
    connection.start_next_cycle()
    connection.send(h11.Request(method=after.method, target="/", headers=[
        ("Host", "127.0.0.1:8000"), ("Content-Length", "0")]))
    connection.send(h11.EndOfMessage())
    second = theirs([following], eof=True, connection=connection)
    assert second.reading == ours([reading.trailing], eof=True, method=after.method)


# --------------------------------------------------------------------------- refusals

RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
CHUNKED = RESPONSE + b"transfer-encoding: chunked\r\n\r\n"

#: Bytes both readers must refuse, each with the connection closed after them.
REFUSED = {
    # status line (RFC 9112 4)
    "lowercase version": b"http/1.1 200 OK\r\n\r\n",
    "no version": b"200 OK\r\n\r\n",
    "two-digit status": b"HTTP/1.1 20 OK\r\n\r\n",
    "four-digit status": b"HTTP/1.1 2000 OK\r\n\r\n",
    "status not digits": b"HTTP/1.1 2x0 OK\r\n\r\n",
    "status under 100": b"HTTP/1.1 099 Odd\r\n\r\n",
    "two spaces before the status": b"HTTP/1.1  200 OK\r\n\r\n",
    "tab before the status": b"HTTP/1.1\t200 OK\r\n\r\n",
    "reason without a space": b"HTTP/1.1 200OK\r\n\r\n",
    "empty line before the status line": b"\r\nHTTP/1.1 200 OK\r\n\r\n",
    "status line that never ends": b"HTTP/1.1 200 OK",
    "101 never asked for": b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n",
    "nothing at all": b"",
    # header lines (RFC 9112 5, RFC 9110 5.5)
    "header without colon": RESPONSE + b"no colon here\r\n\r\n",
    "empty header name": RESPONSE + b": value\r\n\r\n",
    "space before the colon": RESPONSE + b"name : value\r\n\r\n",
    "tab before the colon": RESPONSE + b"name\t: value\r\n\r\n",
    "space inside the name": RESPONSE + b"na me: value\r\n\r\n",
    "continuation as the first header": b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
    "CR inside a value": RESPONSE + b"x: a\rb\r\n\r\n",
    "NUL inside a value": RESPONSE + b"x: a\0b\r\n\r\n",
    "bare LF then no field": RESPONSE + b"x: a\nno colon\r\n\r\n",
    "head that never ends": RESPONSE + b"x: y\r\n",
    # Content-Length (RFC 9110 8.6)
    "negative length": b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
    "signed length": b"HTTP/1.1 200 OK\r\ncontent-length: +1\r\n\r\nx",
    "hex length": b"HTTP/1.1 200 OK\r\ncontent-length: 0x1\r\n\r\nx",
    "empty length": b"HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
    "two lengths": b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nxy",
    "a list of two lengths": b"HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\nxy",
    "same length spelt twice": b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 01\r\n\r\nx",
    "body shorter than its length": b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nabc",
    # Transfer-Encoding (RFC 9112 6.1, 7)
    "gzip": b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
    "gzip then chunked": b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "chunked then gzip": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
    "chunked twice": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
    "two chunked headers": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n"
                            b"transfer-encoding: chunked\r\n\r\n0\r\n\r\n"),
    "identity": b"HTTP/1.1 200 OK\r\ntransfer-encoding: identity\r\n\r\n",
    # chunked framing (RFC 9112 7.1)
    "chunk size not hex": CHUNKED + b"zz\r\nhello\r\n0\r\n\r\n",
    "chunk size with 0x": CHUNKED + b"0x5\r\nhello\r\n0\r\n\r\n",
    "negative chunk size": CHUNKED + b"-5\r\nhello\r\n0\r\n\r\n",
    "empty chunk size": CHUNKED + b"\r\nhello\r\n0\r\n\r\n",
    "extension without size": CHUNKED + b";a=b\r\nhello\r\n0\r\n\r\n",
    "chunk size line with a bare LF": CHUNKED + b"5\nhello\r\n0\r\n\r\n",
    "extension with a bare LF": CHUNKED + b"5;a\nb\r\nhello\r\n0\r\n\r\n",
    "data longer than its size": CHUNKED + b"5\r\nhelloXX\r\n0\r\n\r\n",
    "data without its CRLF": CHUNKED + b"5\r\nhello0\r\n\r\n",
    "no last chunk": CHUNKED + b"5\r\nhello\r\n",
    "no end after the last chunk": CHUNKED + b"5\r\nhello\r\n0\r\n",
    "trailer section not ended": CHUNKED + b"0\r\nx-trailer: 1\r\n",
    "trailer field with a bare CR": CHUNKED + b"0\r\nx: a\rb\r\n\r\n",
    "trailer field with NUL": CHUNKED + b"0\r\nx: a\0b\r\n\r\n",
}


@pytest.mark.parametrize("stream", REFUSED.values(), ids=REFUSED.keys())
def test_what_both_refuse(stream: bytes) -> None:
    # h11 refuses a head whose first byte is a space or control at once, ours when the
    # head is complete: with the connection closed after the bytes both have refused.
    for parts in ([stream], [stream[i:i + 1] for i in range(len(stream))]):
        assert ours(parts, eof=True).refused
        assert theirs(parts, eof=True).reading.refused


# --------------------------------------------------------------------------- differences


class Difference(NamedTuple):
    stream: bytes
    ours: str  # "refused" or "read"
    h11: str
    method: str = "POST"


def _outcome(reading: Reading) -> str:
    assert reading.refused or reading.ended, reading
    return "refused" if reading.refused else "read"


#: Where the two legitimately differ: what each does with the same bytes, and why ours
#: does what it does. A change on either side fails here and must be documented.
DIFFERENCES = {
    # A folded header line (obs-fold): h11 joins it to the line before, as RFC 9112 5.2
    # asks of a user agent. Ours refuses it (R1): vLLM's servers never fold, and a reader
    # that joins lines and one that does not see different fields.
    "obs-fold": Difference(RESPONSE + b"x: a\r\n b\r\ncontent-length: 0\r\n\r\n",
                           "refused", "read"),
    # A bare LF as a line end: h11 takes it as one (RFC 9112 2.2, a MAY); ours reads lines
    # by CRLF only and refuses a bare CR or LF anywhere in a head (RFC 9110 5.5: reject or
    # replace), else a field "x: a\nb: c" would be one field to ours and two to h11.
    "bare LF between fields": Difference(
        RESPONSE + b"x: a\ncontent-length: 0\r\n\r\n", "refused", "read"),
    "bare LF head": Difference(b"HTTP/1.1 200 OK\ncontent-length: 0\n\n", "refused",
                               "read"),
    # Field syntax that cannot move a line end: ours does not check the name's characters
    # (a token, RFC 9110 5.1) or whitespace controls inside a value or reason; h11 does.
    "name not a token": Difference(RESPONSE + b"x(y): 1\r\ncontent-length: 0\r\n\r\n",
                                   "read", "refused"),
    "vertical tab in a value": Difference(
        RESPONSE + b"x: a\x0bb\r\ncontent-length: 0\r\n\r\n", "read", "refused"),
    "form feed in the reason": Difference(b"HTTP/1.1 200 O\x0cK\r\ncontent-length: 0\r\n\r\n",
                                          "read", "refused"),
    # Versions: ours reads HTTP/1.0 and HTTP/1.1 only (R1); h11 takes any 1-digit.1-digit.
    "HTTP/1.2": Difference(b"HTTP/1.2 200 OK\r\ncontent-length: 0\r\n\r\n", "refused",
                           "read"),
    "HTTP/2.0": Difference(b"HTTP/2.0 200 OK\r\ncontent-length: 0\r\n\r\n", "refused",
                           "read"),
    # A list of identical lengths in one field: h11 takes it (RFC 9110 8.6, a MAY); ours
    # takes only repeated fields (R2), never a list.
    "length list": Difference(b"HTTP/1.1 200 OK\r\ncontent-length: 1, 1\r\n\r\nx", "refused",
                              "read"),
    # Our limits: a Content-Length of at most 18 digits and a chunk size of at most 16 hex
    # digits (the largest that fit an int64); h11 allows 20 of each.
    "19-digit length": Difference(b"HTTP/1.1 200 OK\r\ncontent-length: " + b"0" * 19 +
                                  b"\r\n\r\n", "refused", "read"),
    "17-digit chunk size": Difference(CHUNKED + b"0" * 16 + b"1\r\nx\r\n0\r\n\r\n",
                                      "refused", "read"),
    # ... and a chunk size line of at most MAX_LINE bytes; h11 bounds it by its buffer.
    "long chunk extension": Difference(CHUNKED + b"1;x=" + b"y" * MAX_LINE +
                                       b"\r\nx\r\n0\r\n\r\n", "refused", "read"),
    # ... and a head of at most MAX_HEAD bytes, however it arrives; h11 (given the same
    # bound) refuses only a head still incomplete past it, so it takes one arriving
    # whole in one read (ours: R1).
    "head over MAX_HEAD in one read": Difference(
        RESPONSE + b"x: " + b"y" * MAX_HEAD + b"\r\ncontent-length: 0\r\n\r\n", "refused",
        "read"),
    # Whitespace in a chunk size line: ours strips it around the size, so it takes the
    # BWS RFC 9112 7.1.1 allows before ";" (h11 does not) and also leading whitespace
    # (which the RFC does not allow; harmless: it cannot move a line end).
    "space before an extension": Difference(CHUNKED + b"1 ;a=b\r\nx\r\n0\r\n\r\n", "read",
                                            "refused"),
    "space before the size": Difference(CHUNKED + b" 1\r\nx\r\n0\r\n\r\n", "read",
                                        "refused"),
    # Transfer-Encoding: ours ignores empty list elements (RFC 9110 5.6.1) and reads an
    # empty field as no coding; h11 wants exactly "chunked".
    "empty element before chunked": Difference(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: , chunked\r\n\r\n0\r\n\r\n", "read",
        "refused"),
    "empty Transfer-Encoding": Difference(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding:\r\ncontent-length: 0\r\n\r\n", "read",
        "refused"),
    # Transfer-Encoding in an HTTP/1.0 response is faulty framing (RFC 9112 6.1): ours
    # refuses it, h11 reads it chunked.
    "chunked in HTTP/1.0": Difference(
        b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n", "refused", "read"),
    # Framing fields on a response that has no body (204, 304, 1xx, or to HEAD): ours
    # does not read them (R2), h11 validates them anyway.
    "bad length on a 204": Difference(b"HTTP/1.1 204 No Content\r\ncontent-length: x\r\n\r\n",
                                      "read", "refused"),
    "gzip on a HEAD answer": Difference(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", "read", "refused", "HEAD"),
    # Trailer fields: ours reads past them and never looks inside (the gateway uses
    # none) but for a bare CR, LF or NUL (R3); h11 parses and validates them.
    "trailer line without colon": Difference(CHUNKED + b"0\r\nno colon\r\n\r\n", "read",
                                             "refused"),
}


@pytest.mark.parametrize("case", DIFFERENCES.values(), ids=DIFFERENCES.keys())
def test_where_they_differ(case: Difference) -> None:
    parts = [case.stream]
    assert (_outcome(ours(parts, eof=True, method=case.method)),
            _outcome(theirs(parts, eof=True, method=case.method).reading)) == (
        case.ours, case.h11)


def test_chunked_beside_a_length_ends_the_connection_for_ours_only() -> None:
    # Both read the body chunked (RFC 9112 6.3: Transfer-Encoding overrides); the RFC
    # adds that the connection ought to be closed after such a message, which ours does
    # (R4) and h11 does not.
    stream = (b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n"
              b"5\r\nhello\r\n0\r\n\r\n")
    mine, reference = ours([stream], eof=False), theirs([stream], eof=False).reading
    assert (mine.body, mine.ended, mine.keep_alive) == (b"hello", True, False)
    assert (reference.body, reference.ended, reference.keep_alive) == (b"hello", True, True)


def test_the_readers_are_compared_on_real_readings() -> None:
    # The comparison itself must see what is there, or every agreement passes vacuously.
    stream = CHUNKED + b"5;x=1\r\nhello\r\n0\r\nx-t: 1\r\n\r\nHTTP/1.1"
    expected = Reading((b"1.1", 200, b"OK", ((b"content-type", b"text/event-stream"),)),
                       b"hello", True, False, True, b"HTTP/1.1")
    assert agree([stream], eof=False) == expected
    assert ours([stream[:-12]], eof=True).refused
