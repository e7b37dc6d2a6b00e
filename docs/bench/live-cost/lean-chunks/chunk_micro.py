"""The chunked decoder per read, alone in one process: one and three chunks of a vLLM
SSE event (chunk_micro.txt). Run with each build's Python, from outside the checkout
for an installed compiled build."""

from __future__ import annotations

import functools
import timeit

from gateway.upstream import _http1

EVENT = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,'
         b'"model":"m","choices":[{"index":0,"delta":{"content":" word"},'
         b'"logprobs":null,"finish_reason":null}]}\n\n')
ONE = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
CALLS = 200_000

if __name__ == "__main__":
    print(_http1.__file__.rsplit("/", 1)[-1])
    head, _ = _http1.parse_head(  # type: ignore[misc]
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    decoder = _http1.BodyDecoder(head)
    for name, data in (("one chunk", ONE), ("three chunks", ONE * 3)):
        best = min(timeit.repeat(functools.partial(decoder.feed, data), number=CALLS,
                                 repeat=5))
        print(f"{name}: {best / CALLS * 1e9:.0f} ns a read")
