"""HTTP/1.1 for one loopback client connection, sans-IO: request bytes out, a response
head and body bytes in (RFC 9112). No trio, no httpx; ``_transport`` does the I/O.

Why not h11 here: on the streaming path vLLM sends one chunk per token. In a profile at
256 paced streams the read path below httpx's API (httpcore's stream and pool layers,
h11's ``next_event``, the socket read) held about a third of the gateway's samples, h11
about half of that; h11's parser alone, timed apart, takes about five times as long as
this module per read, and it hands over one chunk per call, so a stream that fell
behind caught up one token per pass (docs/benchmarks.md, "The upstream read path").
This module does only what a client reading vLLM needs, strictly:

Rules (each cited as R<n> where it is applied):

* R1 The head ends at the first CRLFCRLF, within ``MAX_HEAD`` bytes; the status line is
  ``HTTP/1.x NNN reason`` (NNN from 100); a header line without a colon, or with
  whitespace before it, is an error (RFC 9112 §5.1: no whitespace between name and
  colon). Only CRLF ends a line: a bare CR or LF, or a NUL, anywhere in the head is an
  error (RFC 9110 §5.5: reject or replace), never part of a value, since a reader that
  takes a bare LF as a line end (h11 does, RFC 9112 §2.2) would see other fields, and
  so other framing, in the same bytes.
* R2 Framing (RFC 9112 §6.3): no body for 1xx, 204 and 304; ``Transfer-Encoding`` whose
  last coding is ``chunked`` is chunked; any other transfer coding is refused (the
  gateway asks for identity); else ``Content-Length`` (one value, digits only; repeated
  identical values are one) is a fixed body; else the body runs to the connection's end.
* R3 Chunked body: a size line (hex digits, optional ``;`` extensions, CRLF, at most
  ``MAX_LINE`` bytes), the data, CRLF; a zero size ends the data, then trailer lines (at
  most ``MAX_HEAD`` bytes in all) up to an empty line. Extensions and trailer fields are
  not read, but as in R1 a bare LF in a size line, or a bare CR or LF or a NUL in a
  trailer line, is an error: another reader would end the line there. Anything else is
  an error.
* R4 The connection may carry another request only if the response is HTTP/1.1, has no
  ``Connection: close`` (nor both ``Content-Length`` and chunked), its body is delimited
  (chunked or fixed) and ended exactly: not a byte more arrived than the message held.

Errors are ``ProtocolError`` (the transport maps them to httpx's RemoteProtocolError).
"""

from __future__ import annotations

import attrs

MAX_HEAD = 64 * 1024
MAX_LINE = 4096
_HEX = frozenset(b"0123456789abcdefABCDEF")


class ProtocolError(Exception):
    """The server's bytes are not HTTP/1.1 as R1-R3 read it."""


#: A request's body: one buffer, or pieces sent one after another and never joined (a
#: request with media: its JSON between the placeholders, each base64 slice, each cut
#: literal; ``gateway.pipeline._media`` D3).
RequestBody = bytes | tuple[bytes | memoryview, ...]


def body_length(body: RequestBody) -> int:
    return len(body) if isinstance(body, bytes) else sum(len(piece) for piece in body)


def request_bytes(method: str, target: bytes, headers: list[tuple[bytes, bytes]],
                  body: RequestBody) -> RequestBody:
    """The request: head and body in one buffer, or for a body in pieces, the head
    followed by the pieces (headers as the caller built them)."""
    lines = [method.encode("ascii"), b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        if any(c in field for field in (name, value) for c in (b"\r", b"\n", b"\0")):
            raise ValueError("header with a line break or NUL")
        lines += [name, b": ", value, b"\r\n"]
    lines.append(b"\r\n")
    if isinstance(body, bytes):
        return b"".join(lines) + body
    return (b"".join(lines), *body)


@attrs.frozen
class ResponseHead:
    http_version: bytes  # b"1.1" or b"1.0"
    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]  # names lowercased, in order
    #: "chunked", "length", "close" or "none" (R2).
    framing: str
    length: int = 0
    keep_alive: bool = True


def parse_head(data: bytes | bytearray, *, request_method: str = "POST"
               ) -> tuple[ResponseHead, int] | None:
    """The head at the start of ``data`` and its length, or None until it is complete."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) > MAX_HEAD:
            raise ProtocolError("response head too large")
        return None
    if end > MAX_HEAD:
        raise ProtocolError("response head too large")
    head = bytes(data[:end])
    lines = head.split(b"\r\n")
    if (head.count(b"\n") != len(lines) - 1 or head.count(b"\r") != len(lines) - 1
            or b"\0" in head):  # R1: CRLF is the only line end
        raise ProtocolError("bare CR, LF or NUL in the response head")
    status_line = lines[0].split(b" ", 2)  # R1
    if (len(status_line) < 2 or status_line[0] not in (b"HTTP/1.1", b"HTTP/1.0")
            or len(status_line[1]) != 3 or not status_line[1].isdigit()):
        raise ProtocolError(f"bad status line {lines[0][:80]!r}")
    version = status_line[0][5:]
    status = int(status_line[1])
    if status < 100:
        raise ProtocolError(f"bad status code {status}")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or b" " in name:
            raise ProtocolError(f"bad header line {line[:80]!r}")
        headers.append((name.lower(), value.strip(b" \t")))
    return _framed(version, status, status_line[2] if len(status_line) > 2 else b"",
                   headers, request_method), end + 4


def _framed(version: bytes, status: int, reason: bytes, headers: list[tuple[bytes, bytes]],
            request_method: str) -> ResponseHead:
    """R2 and R4."""
    tokens = {token.strip().lower() for n, v in headers if n == b"connection"
              for token in v.split(b",")}
    keep_alive = version == b"1.1" and b"close" not in tokens
    codings = [c.strip().lower() for n, v in headers if n == b"transfer-encoding"
               for c in v.split(b",") if c.strip()]  # empty list elements are ignored
    if codings and version == b"1.0":  # RFC 9112 6.1: faulty framing
        raise ProtocolError("Transfer-Encoding in an HTTP/1.0 response")
    lengths = {v for n, v in headers if n == b"content-length"}
    if codings and lengths:  # RFC 9112 6.3: chunked wins, and the connection ends after
        keep_alive = False
    if status < 200 or status in (204, 304) or request_method == "HEAD":
        return ResponseHead(version, status, reason, headers, "none", 0, keep_alive)
    if codings:
        if codings != [b"chunked"]:
            raise ProtocolError(f"unsupported transfer coding {b','.join(codings)!r}")
        return ResponseHead(version, status, reason, headers, "chunked", 0, keep_alive)
    if lengths:
        if len(lengths) != 1 or not next(iter(lengths)).isdigit() or len(
                next(iter(lengths))) > 18:
            raise ProtocolError(f"bad Content-Length {sorted(lengths)!r}")
        return ResponseHead(version, status, reason, headers, "length",
                            int(next(iter(lengths))), keep_alive)
    return ResponseHead(version, status, reason, headers, "close", 0, False)


class BodyDecoder:
    """A response body's bytes, whatever its framing (R2, R3): ``feed`` the connection's
    bytes, get the body's; ``done`` once it ended; ``extra`` counts bytes past its end."""

    def __init__(self, head: ResponseHead) -> None:
        self.framing = head.framing
        self.done = head.framing == "none" or (head.framing == "length" and not head.length)
        self.extra = 0
        self._left = head.length  # length: bytes to come; chunked: of the current chunk
        self._buffer = bytearray()
        self._state = "size"  # chunked: size, data, data_end, trailer
        self._trailer = 0  # trailer bytes so far (bounded like a head)

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.extra += len(data)
            return b""
        if self.framing == "close":
            return data
        if self.framing == "length":
            if len(data) < self._left:
                self._left -= len(data)
                return data
            body, self.extra = data[:self._left], len(data) - self._left
            self._left, self.done = 0, True
            return body
        return self._feed_chunked(data)

    def end_of_stream(self) -> None:
        """The server closed the connection: fine only where the body runs to the end."""
        if self.framing == "close":
            self.done = True
        elif not self.done:
            raise ProtocolError("peer closed connection without sending complete message "
                                "body")

    @property
    def remaining(self) -> int | None:
        """A fixed-length body's bytes still to come; None for any other framing."""
        return self._left if self.framing == "length" else None

    @property
    def reusable(self) -> bool:
        """R4, as far as the body goes."""
        return self.done and self.extra == 0 and self.framing != "close"

    def _feed_chunked(self, data: bytes) -> bytes:
        """R3. The common case, whole chunks in one read (vLLM writes one chunk per SSE
        event), takes the lean loop here: each chunk's data copied once, nothing else
        made. It reads only the canonical shape (a size line of hex digits alone, the
        data, CRLF) from a read's first byte; at anything else (an extension, a chunk cut
        by the read, the last chunk, an error) it hands the rest, at that byte, to the
        general loop (``_feed_chunked_strictly``), which reads every shape R3 allows."""
        if self._buffer or self._state != "size":
            return self._feed_chunked_strictly(data, [])
        pieces: list[bytes] = []
        position, end = 0, len(data)
        while position < end:
            # A size line of 16 hex digits at most: its CRLF within 18 bytes.
            line_end = data.find(b"\r\n", position, position + 18)
            if line_end <= position:
                break
            size_field = data[position:line_end]
            if not _HEX.issuperset(size_field):
                break
            size = int(size_field, 16)
            data_end = line_end + 2 + size
            if not size or data_end + 2 > end or data[data_end:data_end + 2] != b"\r\n":
                break
            pieces.append(data[line_end + 2:data_end])
            position = data_end + 2
        if position == end:
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return self._feed_chunked_strictly(data, pieces, position)

    def _feed_chunked_strictly(self, data: bytes, pieces: list[bytes],
                               position: int = 0) -> bytes:
        """R3, every shape: ``data`` after what this decoder holds, from ``position``
        (where the lean loop stopped: it holds nothing then); ``pieces``, the body's
        bytes the lean loop took from the same read before it."""
        buffer = bytes(self._buffer) + data if self._buffer else data
        end = len(buffer)
        while position < end:
            state = self._state
            if state == "data":
                take = min(self._left, end - position)
                pieces.append(buffer[position:position + take])
                position += take
                self._left -= take
                if not self._left:
                    self._state = "data_end"
                continue
            if state == "data_end":
                if end - position < 2:
                    break
                if buffer[position:position + 2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF")
                position += 2
                self._state = "size"
                continue
            line_end = buffer.find(b"\r\n", position, position + MAX_LINE + 2)
            if line_end < 0:
                if end - position > MAX_LINE:
                    raise ProtocolError("chunk line too long")
                break
            line = buffer[position:line_end]
            position = line_end + 2
            if state == "size":
                size, semicolon, _extensions = line.partition(b";")
                size = size.strip(b" \t")
                # Without extensions the hex check refuses a bare LF already (R3).
                if (not size or len(size) > 16 or not _HEX.issuperset(size)
                        or (semicolon and b"\n" in line)):
                    raise ProtocolError(f"bad chunk size line {line[:40]!r}")
                self._left = int(size, 16)
                self._state = "data" if self._left else "trailer"
            elif len(line) + self._trailer > MAX_HEAD:  # state == "trailer"
                raise ProtocolError("trailer section too large")
            elif line:
                if b"\r" in line or b"\n" in line or b"\0" in line:  # R3
                    raise ProtocolError(f"bad trailer line {line[:40]!r}")
                self._trailer += len(line) + 2
            else:  # the trailer section's end: the message's end
                self.done = True
                self.extra = end - position
                position = end
        if position < end and not self.done:
            self._buffer = bytearray(buffer[position:])
        elif self._buffer:
            self._buffer = bytearray()
        return b"".join(pieces)
