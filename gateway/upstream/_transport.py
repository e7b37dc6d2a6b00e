"""The project's own HTTP/1.1 client for an http:// vLLM: one connection, on trio, with
``_http1`` reading the bytes. No httpx below ``_client`` on this path (why: ``_client``'s
rules); https:// goes through httpx (``_https``).

    connection = Http1Connection(host, port, connect_timeout=2.0, write_timeout=30.0)
    response = await connection.send("POST", request_bytes(...))   # head read, body not
    async for raw in response: ...      # or: await response.read_all(max_bytes)
    await response.aclose()             # always: it decides the connection's reuse

Each plain-HTTP request slot (``_slots``) is one ``Http1Connection``. What it guarantees:

* Failures are ``TransportError``s, named as httpx names the same failure (the names
  reach vLLM's error messages and logs, so they read the same for both schemes):
  ``ConnectError`` / ``ConnectTimeout`` before a request is sent, ``WriteError`` /
  ``WriteTimeout``, ``ReadError``, ``RemoteProtocolError`` for bytes that are not
  HTTP/1.1 or a connection closed early, ``LocalProtocolError`` for a request header
  that would split the request. There is no read timeout: the stream's clocks time the
  reads (``_stream``), the caller's scopes the rest.
* A connection is reused only after a response read to its exact end (``_http1`` R4),
  and only if the server has not closed it meanwhile (an idle socket that is readable is
  closed and replaced) and it has not been idle past ``keepalive_expiry``; otherwise it
  is closed when the response is.
* ``Http1Response.abort()`` closes the socket synchronously, from any task (a cancel's
  abort, ``_reads.BodyChunks.abort``); a read pending then fails as ``ReadError``.
* The body iterates as the bytes are read (chunked framing removed), one read of the
  socket per step, through ``gateway._sockio``: the streamed-event path has nothing else
  between the socket and the SSE decoder, and a read returns everything the socket holds
  (a stream that fell behind catches up in one pass). ``read_all`` takes a whole body
  instead (a non-streaming answer): a fixed-length one in one read where it has arrived,
  refused past its bound before a byte of it is read.
* The request's bytes and the response head also go through ``gateway._sockio`` (what
  the kernel takes at once; the rest through trio's ``send_all`` within the write
  timeout): per request, no trio socket layers and no pass of the scheduler after the
  send (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import trio

from gateway import _sockio

from ._http1 import BodyDecoder, ProtocolError, RequestBody, ResponseHead, parse_head

READ_SIZE = 64 * 1024
#: The largest single read of a whole body (``Http1Response.read_all``): a fixed-length
#: body up to this size is asked for in one read, so it comes in one when it has arrived.
WHOLE_READ_MAX = 4 << 20
#: Interim (1xx) heads accepted before the final one.
MAX_INTERIM = 8


class TransportError(Exception):
    """The connection failed. ``name`` is httpx's name for the same failure (the class's
    own name here; ``_https`` gives the name of the httpx error it stands for)."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name or type(self).__name__


class ConnectError(TransportError):
    """No connection: refused, unreachable, or it failed while opening."""


class ConnectTimeout(TransportError):
    """The server did not accept the connection within the connect timeout."""


class WriteError(TransportError):
    pass


class WriteTimeout(TransportError):
    pass


class ReadError(TransportError):
    pass


class RemoteProtocolError(TransportError):
    """The server's bytes are not HTTP/1.1 (``_http1``), or it closed early."""


class LocalProtocolError(TransportError):
    """The request itself cannot be sent (a header with a line break or NUL)."""


class BodyTooLarge(Exception):
    """A body longer than its reader's bound (``read_all``)."""


class Http1Connection:
    """One HTTP/1.1 connection to ``host:port``, one request at a time, reused while it is
    sound."""

    def __init__(self, host: str, port: int, *, connect_timeout: float | None = None,
                 write_timeout: float | None = None,
                 keepalive_expiry: float = math.inf) -> None:
        self.host = host
        self.port = port
        self._connect_timeout = math.inf if connect_timeout is None else connect_timeout
        self._write_timeout = write_timeout
        #: An idle connection older than this is closed, not reused (the server's
        #: keep-alive timeout would close it about then).
        self._expiry = keepalive_expiry
        self._stream: trio.SocketStream | None = None
        self._busy = False
        self._closed = False
        self._idle_since = math.inf

    async def send(self, method: str, data: RequestBody) -> Http1Response:
        """Send a request (its whole bytes: ``_http1.request_bytes``) and read the head of
        its final response; the body is not read yet."""
        if self._busy:
            raise RuntimeError("one request at a time on an Http1Connection")
        if self._closed:
            raise ConnectError("connection closed")
        self._busy = True
        try:
            stream = await self._connection()
            self._idle_since = math.inf
            await self._send_request(stream, data)
            head, rest = await self._read_head(stream, method)
        except BaseException:
            self._busy = False
            await self._discard()
            raise
        decoder = BodyDecoder(head)
        if rest and decoder.done:  # no body, yet bytes came with the head: not reusable
            decoder.feed(rest)
            rest = b""
        return Http1Response(self, stream, decoder, head, rest)

    async def _connection(self) -> trio.SocketStream:
        stream = self._stream
        if stream is not None and (
                stream.socket.fileno() == -1  # closed under us (an abort)
                or trio.current_time() - self._idle_since > self._expiry
                or stream.socket.is_readable()):  # idle yet readable: the server closed it
            await self._discard()
        if self._stream is None:
            try:
                with trio.fail_after(self._connect_timeout):
                    self._stream = await trio.open_tcp_stream(self.host, self.port)
            except trio.TooSlowError as slow:
                raise ConnectTimeout(f"connect to {self.host}:{self.port} timed out") from slow
            except OSError as exc:
                raise ConnectError(str(exc)) from exc
        return self._stream

    async def _send_request(self, stream: trio.SocketStream, data: RequestBody) -> None:
        """The request's bytes (one buffer, or pieces in order): what the kernel takes
        at once goes without trio's send layers and the pass they yield (a request
        fits a loopback socket's buffer), the rest through ``send_all`` within the
        write timeout. Not a checkpoint by itself when it all fits: the head's read that
        follows is one. A big request (media) is never joined or copied to be sent:
        each piece goes as it is, and what the kernel did not take of one as a view."""
        pieces = (data,) if isinstance(data, bytes) else data
        for index, piece in enumerate(pieces):
            try:
                sent = _sockio.send_now(stream.socket, piece)
            except OSError as exc:
                raise WriteError(f"{type(exc).__name__}: {exc}") from exc
            if sent < len(piece):
                rest = (memoryview(piece)[sent:], *pieces[index + 1:])
                await _timed(_send_each(stream, rest), self._write_timeout, WriteTimeout,
                             WriteError)
                return

    async def _read_head(self, stream: trio.SocketStream, method: str
                         ) -> tuple[ResponseHead, bytes]:
        received = bytearray()
        interim = 0
        while True:
            try:
                parsed = parse_head(received, request_method=method)
            except ProtocolError as exc:
                raise RemoteProtocolError(str(exc)) from exc
            if parsed is not None:
                head, length = parsed
                del received[:length]
                if head.status == 101:  # never asked for: an upgrade is not HTTP any more
                    raise RemoteProtocolError("unexpected 101 Switching Protocols")
                if 100 <= head.status < 200:  # an interim answer: the real one follows
                    interim += 1
                    if interim > MAX_INTERIM:
                        raise RemoteProtocolError("too many interim responses")
                    continue
                return head, bytes(received)
            data = await _timed(_sockio.receive_some(stream.socket, READ_SIZE), None,
                                ReadError, ReadError)
            if not data:
                raise RemoteProtocolError("server disconnected without sending a response")
            received += data

    def _release(self, stream: trio.SocketStream, reusable: bool) -> trio.SocketStream | None:
        """The response is done with the connection: keep it or hand it back to close."""
        self._busy = False
        if (reusable and not self._closed and self._stream is stream
                and stream.socket.fileno() != -1):  # an abort may have closed it after
            self._idle_since = trio.current_time()   # the body's end
            return None
        if self._stream is stream:
            self._stream = None
        return stream

    async def _discard(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await trio.aclose_forcefully(stream)

    async def aclose(self) -> None:
        self._closed = True
        if not self._busy:
            await self._discard()


class Http1Response:
    """A response whose head has been read: ``status``, ``head``, and its body, read by
    iterating (the bytes as they come) or by ``read_all``. ``aclose`` always, once."""

    def __init__(self, connection: Http1Connection, stream: trio.SocketStream,
                 decoder: BodyDecoder, head: ResponseHead, rest: bytes) -> None:
        self.status = head.status
        self.head = head
        self._connection = connection
        self._stream = stream
        self._decoder = decoder
        self._rest = rest
        self._released = False
        #: The last read was short, so the socket has most likely been drained: the next
        #: read waits for it first instead of failing with EAGAIN (``_sockio``).
        self._drained = True

    # A plain iterator, not an async generator: the gateway leaves streams early on
    # purpose, and a suspended generator would be left for trio to finalize.
    def __aiter__(self) -> Http1Response:
        return self

    async def __anext__(self) -> bytes:
        decoder = self._decoder
        try:
            if self._rest:
                data, self._rest = self._rest, b""
                body = decoder.feed(data)
                if body:
                    return body
            while not decoder.done:
                data = await self._receive()
                if not data:
                    decoder.end_of_stream()
                    break
                body = decoder.feed(data)
                if body:
                    return body
        except ProtocolError as exc:
            raise RemoteProtocolError(str(exc)) from exc
        raise StopAsyncIteration

    async def read_all(self, max_bytes: int) -> bytes:
        """The whole body, for a reader that wants nothing before its end (a
        non-streaming answer): a fixed-length body is asked for whole, so one that has
        arrived comes in one read, and no step is taken per piece. More than
        ``max_bytes`` raises ``BodyTooLarge``: a Content-Length over it before any body
        byte is read."""
        decoder = self._decoder
        length = decoder.remaining
        if length is not None and length > max_bytes:
            raise BodyTooLarge(f"Content-Length {length} exceeds {max_bytes}")
        pieces: list[bytes] = []
        size = 0
        try:
            if self._rest:
                data, self._rest = self._rest, b""
                body = decoder.feed(data)
                pieces.append(body)
                size = len(body)
            while not decoder.done:
                left = decoder.remaining
                data = await self._receive(READ_SIZE if left is None
                                           else min(max(left, 1), WHOLE_READ_MAX))
                if not data:
                    decoder.end_of_stream()
                    break
                body = decoder.feed(data)
                pieces.append(body)
                size += len(body)
                if size > max_bytes:
                    raise BodyTooLarge(f"body exceeds {max_bytes} bytes")
        except ProtocolError as exc:
            raise RemoteProtocolError(str(exc)) from exc
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)  # [] is b""

    async def _receive(self, max_bytes: int = READ_SIZE) -> bytes:
        # Awaited here, not through ``_timed``: a body read has no limit of its own
        # (the stream's clocks time it), and a wrapper coroutine on every read of every
        # stream costs a frame (docs/benchmarks.md, the live profile).
        try:
            data = await _sockio.receive_some(self._stream.socket, max_bytes,
                                              likely_empty=self._drained)
        except _READ_FAILURES as exc:
            raise ReadError(f"{type(exc).__name__}: {exc}") from exc
        self._drained = len(data) < max_bytes
        return data

    def abort(self) -> bool:
        """Close the socket now, synchronously, from any task: the server sees the
        disconnect at once; the reading task's pending read then fails, and ``aclose``
        later is harmless. True: there was a socket to close."""
        with contextlib.suppress(OSError):  # it runs in another connection's task
            self._stream.socket.close()
        return True

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        reusable = self.head.keep_alive and self._decoder.reusable
        stream = self._connection._release(self._stream, reusable)
        if stream is not None:
            await trio.aclose_forcefully(stream)


async def _send_each(stream: trio.SocketStream, pieces: tuple[bytes | memoryview, ...]
                     ) -> None:
    for piece in pieces:
        await stream.send_all(piece)


#: What a socket's failure is raised as, by trio or the OS (a ``TransportError`` each).
_READ_FAILURES = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


async def _timed(work: Any, limit_s: float | None, timed_out: type[TransportError],
                 failed: type[TransportError]) -> Any:
    """``await work`` within ``limit_s`` seconds (None: no limit), its failures as
    ``failed`` (and running out of time as ``timed_out``)."""
    try:
        if limit_s is None:
            return await work
        with trio.fail_after(limit_s):
            return await work
    except trio.TooSlowError as slow:
        raise timed_out("timed out") from slow
    except _READ_FAILURES as exc:
        raise failed(f"{type(exc).__name__}: {exc}") from exc
