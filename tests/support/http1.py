"""Feeding response bytes, in given parts, through the upstream's HTTP/1.1 reader."""

from __future__ import annotations

from collections.abc import Iterable

from gateway.upstream._http1 import BodyDecoder, ProtocolError, ResponseHead, parse_head


def read_response(parts: Iterable[bytes], *, request_method: str = "POST"
                  ) -> tuple[ResponseHead | None, bytes, BodyDecoder | None]:
    """The final head, the body read so far and its decoder (None, b"", None while the
    head is incomplete), as ``Http1Connection`` reads them: interim (1xx) heads are
    passed over, a 101 is refused, the bytes after the final head go to the decoder."""
    received = b""
    head = decoder = None
    body = b""
    for part in parts:
        if decoder is not None:
            body += decoder.feed(part)
            continue
        received += part
        while (parsed := parse_head(received, request_method=request_method)) is not None:
            head, length = parsed
            received = received[length:]
            if head.status == 101:
                raise ProtocolError("unexpected 101 Switching Protocols")
            if head.status >= 200:
                decoder = BodyDecoder(head)
                body += decoder.feed(received) if received else b""
                break
            head = None  # an interim answer: the real one follows
    return head, body, decoder


def read_in_parts(parts: Iterable[bytes]) -> tuple[bytes, BodyDecoder | None]:
    """The body read so far and its decoder (None while the head is incomplete)."""
    _head, body, decoder = read_response(parts)
    return body, decoder
