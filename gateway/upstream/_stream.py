"""One streamed completion as checked chunks: SSE framing, ``[DONE]``, per-read clocks.

    async with client.chunks(body, headers, first_chunk=120, idle=60) as stream:
        async for batch in stream:          # the chunks of one upstream read
            for chunk in batch: ...         # each a checked chat.completion.chunk dict
    # here vLLM said [DONE] and the connection went back to its slot

Time: the first-chunk clock runs from the request until the first body bytes, the idle
clock from one read to the next, and each is a cancel scope around *the read only*. Time
the consumer spends elsewhere (waiting for a slow NNRP reader, say) never counts as vLLM
being idle, so nothing has to stop or restart a clock around backpressure.

End of stream: ``data: [DONE]`` ends the iteration. A body that ends before it, or a
reset mid-body, is ``UpstreamMalformed``; an SSE or chunk rule broken is too. Leaving the
``chunks`` context before ``[DONE]`` (a cancel, an error) closes the socket, which is
how vLLM learns to abort the request (vllm-http.md section 3).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

import trio

from ._chunks import parse_chunk
from ._errors import UpstreamMalformed, UpstreamTimeout
from ._sse import SSEDecoder, SSEError

Chunk = dict[str, Any]


class ByteChunks(Protocol):
    """The response body's raw reads (``_client.BodyChunks``)."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def __anext__(self) -> bytes: ...


class ChunkStream:
    """Checked ``chat.completion.chunk`` dicts, one list per upstream read."""

    def __init__(self, body: ByteChunks, *, first_chunk_deadline: float,
                 first_chunk_timeout: float, idle_timeout: float, max_event: int) -> None:
        self._body = body
        self._deadline = first_chunk_deadline
        self._first_chunk_timeout = first_chunk_timeout
        self._idle_timeout = idle_timeout
        self._decoder = SSEDecoder(max_event=max_event)
        #: When (trio clock) the first body bytes arrived; None until then.
        self.first_byte_at: float | None = None
        #: vLLM said ``data: [DONE]``: the answer is complete.
        self.done = False

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> list[Chunk]:
        while not self.done:
            raw = await self._read()
            try:
                events = self._decoder.feed(raw)
            except SSEError as exc:
                raise UpstreamMalformed(str(exc)) from exc
            batch: list[Chunk] = []
            for event in events:
                if event.is_done:
                    self.done = True
                    break
                batch.append(parse_chunk(event.data))
            if batch:
                return batch
        raise StopAsyncIteration

    async def _read(self) -> bytes:
        first = self.first_byte_at is None
        deadline = self._deadline if first else trio.current_time() + self._idle_timeout
        with trio.move_on_at(deadline):
            try:
                raw = await self._body.__anext__()
            except StopAsyncIteration:
                raise UpstreamMalformed("vLLM's stream ended before data: [DONE]") from None
            if first:
                self.first_byte_at = trio.current_time()
            return raw
        if first:
            raise UpstreamTimeout("first_chunk", self._first_chunk_timeout)
        raise UpstreamTimeout("idle", self._idle_timeout)
