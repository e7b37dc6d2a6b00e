"""A response body's reads, as the stream reads them: the step taken on every read of
every stream, so a module of the compiled build (``gateway/compiled.py``; it ran
interpreted in ``_client``, a frame per read in the profiles against the real vLLM).

``ResponseBody`` is what both request paths answer (``_transport.Http1Response`` for
http://, ``_https.HttpxResponse`` for https://); ``BodyChunks`` reads one as the stream
does (a reset mid-body is ``UpstreamMalformed``), and counts each read that delivered
bytes in the client's ``BodyPulse`` (the health check's sign of life).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import trio

from ._errors import UpstreamMalformed
from ._transport import TransportError

#: How long a finished stream waits for the rest of its body (vLLM sends the chunked
#: terminator right after [DONE]); past it, the connection is closed, not pooled.
TRAILER_WAIT = 0.25


class ResponseBody(Protocol):
    """A response whose head has been read (``_transport.Http1Response``,
    ``_https.HttpxResponse``): its status, then its raw body (chunked framing removed),
    read as it comes or whole. Failures are ``TransportError``s; ``aclose`` always."""

    status: int

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def __anext__(self) -> bytes: ...

    async def read_all(self, max_bytes: int) -> bytes:
        """The whole body; ``BodyTooLarge`` past ``max_bytes``."""
        ...

    def abort(self) -> bool:
        """Close the socket now, from any task; False when there is none (a mock)."""
        ...

    async def aclose(self) -> None: ...


class BodyPulse:
    """Reads of response bodies that delivered bytes (shared by every stream of a
    client): a count, not a time (stamping trio's clock on every read was 5 % of the
    gateway's CPU at 32 streams)."""

    def __init__(self) -> None:
        self.reads = 0


class BodyChunks:
    """The response body's raw chunks; a reset mid-body becomes UpstreamMalformed.

    A plain iterator, not an async generator: leaving it early must not leave a
    suspended generator for trio to finalize (the pipeline leaves early on purpose).
    """

    def __init__(self, response: ResponseBody, pulse: BodyPulse) -> None:
        self._response = response
        self._pulse = pulse

    def abort(self) -> bool:
        """Close the response's socket now, synchronously, from any task: vLLM sees the
        disconnect (and aborts the request) without waiting for the reading task to be
        scheduled, which at 256 busy streams can take many milliseconds. The reading
        task's pending read then fails, and closing the response later is harmless.
        False when there is no socket to close (a mock transport)."""
        return self._response.abort()

    async def read_trailer(self, *, max_bytes: int = 4096) -> bool:
        """After ``data: [DONE]``: read the little that is left (the chunked-encoding
        terminator) so the connection goes back to the pool. Breaking off at [DONE]
        instead left every response unfinished, so its socket was closed and each
        request paid a new connect; 1,000 streams reconnecting together then met connect
        timeouts (1,000-stream soak). More than ``max_bytes`` or a slower end and the
        connection is closed as before. True when the body ended cleanly."""
        received = 0
        with trio.move_on_after(TRAILER_WAIT):
            try:
                async for chunk in self._response:
                    received += len(chunk)
                    if received > max_bytes:
                        return False
            except TransportError:
                return False
            return True
        return False

    def __aiter__(self) -> BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._response.__anext__()
            self._pulse.reads += 1
            return chunk
        except TransportError as exc:
            # A reset mid-body: the stream is broken, not merely unavailable.
            raise UpstreamMalformed(
                f"vLLM connection broke mid-response: {exc.name}",
                kind="connection_lost") from exc
