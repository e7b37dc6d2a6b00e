"""Feeding response bytes, in given parts, through the upstream's HTTP/1.1 reader."""

from __future__ import annotations

from collections.abc import Iterable

from gateway.upstream._http1 import BodyDecoder, parse_head


def read_in_parts(parts: Iterable[bytes]) -> tuple[bytes, BodyDecoder | None]:
    """The body read so far and its decoder (None while the head is incomplete), as the
    transport reads them: the head first, the bytes after it into the decoder."""
    received = b""
    decoder = None
    body = b""
    for part in parts:
        if decoder is None:
            received += part
            parsed = parse_head(received)
            if parsed is None:
                continue
            head, length = parsed
            decoder = BodyDecoder(head)
            part = received[length:]
        body += decoder.feed(part)
    return body, decoder
