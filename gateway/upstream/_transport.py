"""An httpx transport for one plain-HTTP loopback connection, on trio, with ``_http1``.

Each plain-HTTP request slot (``_slots``) is one of these, holding one connection, and
``send`` is called without an httpx client around it (``_client``). httpx keeps its
API (requests, responses, errors, timeouts) and the gateway's code stays on it; below,
the bytes go straight from the socket into ``_http1`` instead of through httpcore's
pool, its trio backend and h11 (that read path, the socket read included, was about a
third of the CPU per streamed event in a profile at 256 paced streams; the parts are in
docs/benchmarks.md, "The upstream read path"). https:// URLs keep httpx's own transport
(``VllmClient`` chooses).

What it guarantees, as httpcore did for the gateway:

* Errors are httpx's: ``ConnectError`` / ``ConnectTimeout`` before a request is sent,
  ``WriteError`` / ``WriteTimeout``, ``ReadError`` / ``ReadTimeout``, and
  ``RemoteProtocolError`` for bytes that are not HTTP/1.1 or a connection closed early.
* A connection is reused only after a response read to its exact end (``_http1`` R4),
  and only if the server has not closed it meanwhile (a readable idle socket is closed
  and replaced, as httpcore does); otherwise it is closed when the response is.
* ``response.extensions["network_stream"].get_extra_info("socket")`` is the socket, for
  the synchronous abort (``BodyChunks.abort``); a read pending when it closes fails as
  ``ReadError``.
* ``response.extensions[BODY_EXTENSION]`` iterates the raw body as ``aiter_raw()`` does
  (the bytes as read, chunked framing removed), one read per step, through
  ``gateway._sockio``: the streamed-event path has nothing else between the socket and
  the SSE decoder. Unlike ``aiter_raw()`` it neither guards against a second
  iteration nor releases the connection at the body's end: the caller closes the
  response, which does (``VllmClient._response`` always does). ``read_all`` takes a
  whole body at once instead (a non-streaming answer): a fixed-length one in one read
  where it has arrived, bounded before any of it is read.
* The request's bytes and the response head also go through ``gateway._sockio`` (what
  the kernel takes at once; the rest through trio's ``send_all`` within the write
  timeout): per request, no trio socket layers and no pass of the scheduler after the
  send (docs/benchmarks.md).
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import trio

from gateway import _sockio

from ._http1 import BodyDecoder, ProtocolError, ResponseHead, parse_head, request_bytes

READ_SIZE = 64 * 1024
#: The largest single read of a whole body (``LoopbackBody.read_all``): a fixed-length body
#: up to this size is asked for in one read, so it comes in one when it has arrived.
WHOLE_READ_MAX = 4 << 20
#: The response extension holding the body's own iterator: a reader that takes its
#: chunks from it skips httpx's two generator layers per read (``aiter_raw``); closing
#: the response still closes it.
BODY_EXTENSION = "gateway.body"
#: Interim (1xx) heads accepted before the final one.
MAX_INTERIM = 8


class _NetworkStream:
    """What ``response.extensions["network_stream"]`` offers (httpcore's shape)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream

    def get_extra_info(self, name: str) -> Any:
        return self._stream.socket if name == "socket" else None


class LoopbackTransport(httpx.AsyncBaseTransport):
    """One HTTP/1.1 connection to ``http://host:port``, reused while it is sound."""

    def __init__(self, keepalive_expiry: float = math.inf) -> None:
        self._stream: trio.SocketStream | None = None
        self._busy = False
        self._closed = False
        #: An idle connection older than this is closed, not reused (the server's
        #: keep-alive timeout would close it about then; httpx leaves expiry to us).
        self._expiry = keepalive_expiry
        self._idle_since = math.inf

    async def send(self, request: httpx.Request) -> httpx.Response:
        """As ``httpx.AsyncClient.send(request, stream=True)`` would answer, for the
        request slot that is this transport (``_client``): the response, bound to its
        request, its body not yet read."""
        response = await self.handle_async_request(request)
        response.request = request
        return response

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._busy:
            raise RuntimeError("one request at a time on a LoopbackTransport")
        if self._closed:
            raise httpx.ConnectError("transport closed", request=request)
        timeouts = request.extensions.get("timeout", {})
        self._busy = True
        try:
            stream = await self._connection(request, timeouts.get("connect"))
            self._idle_since = math.inf
            body = request.content  # the gateway always sends a bytes body
            try:
                data = request_bytes(request.method, request.url.raw_path,
                                     list(request.headers.raw), body)
            except ValueError as exc:
                raise httpx.LocalProtocolError(str(exc), request=request) from exc
            await self._send_request(stream, data, request, timeouts.get("write"))
            head, rest = await self._read_head(stream, request, timeouts.get("read"))
        except BaseException:
            self._busy = False
            await self._discard()
            raise
        decoder = BodyDecoder(head)
        if rest and decoder.done:  # no body, yet bytes came with the head: not reusable
            decoder.feed(rest)
            rest = b""
        response_body = LoopbackBody(self, stream, decoder, head, rest, request,
                              timeouts.get("read"))
        return httpx.Response(
            head.status, headers=head.headers, stream=response_body,
            extensions={"http_version": b"HTTP/" + head.http_version,
                        "reason_phrase": head.reason,
                        "network_stream": _NetworkStream(stream),
                        BODY_EXTENSION: response_body})

    async def _connection(self, request: httpx.Request, limit_s: float | None
                          ) -> trio.SocketStream:
        stream = self._stream
        if stream is not None and (
                stream.socket.fileno() == -1  # closed under us (an abort)
                or trio.current_time() - self._idle_since > self._expiry
                or stream.socket.is_readable()):  # idle yet readable: the server closed it
            await self._discard()
        if self._stream is None:
            host = request.url.host
            port = request.url.port or 80
            try:
                with trio.fail_after(math.inf if limit_s is None else limit_s):
                    self._stream = await trio.open_tcp_stream(host, port)
            except trio.TooSlowError as exc:
                raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out",
                                           request=request) from exc
            except OSError as exc:
                raise httpx.ConnectError(str(exc), request=request) from exc
        return self._stream

    async def _send_request(self, stream: trio.SocketStream, data: bytes,
                            request: httpx.Request, limit_s: float | None) -> None:
        """The request's bytes: what the kernel takes at once goes without trio's send
        layers and the pass they yield (a request fits a loopback socket's buffer),
        the rest through ``send_all`` within the write timeout. Not a checkpoint by
        itself when it all fits: the head's read that follows is one."""
        try:
            sent = _sockio.send_now(stream.socket, data)
        except OSError as exc:
            raise httpx.WriteError(f"{type(exc).__name__}: {exc}", request=request) from exc
        if sent < len(data):
            await _timed(stream.send_all(data[sent:]), limit_s, httpx.WriteTimeout,
                         httpx.WriteError, request)

    async def _read_head(self, stream: trio.SocketStream, request: httpx.Request,
                         limit_s: float | None) -> tuple[ResponseHead, bytes]:
        received = bytearray()
        interim = 0
        while True:
            try:
                parsed = parse_head(received, request_method=request.method)
            except ProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc), request=request) from exc
            if parsed is not None:
                head, length = parsed
                del received[:length]
                if head.status == 101:  # never asked for: an upgrade is not HTTP any more
                    raise httpx.RemoteProtocolError("unexpected 101 Switching Protocols",
                                                    request=request)
                if 100 <= head.status < 200:  # an interim answer: the real one follows
                    interim += 1
                    if interim > MAX_INTERIM:
                        raise httpx.RemoteProtocolError("too many interim responses",
                                                        request=request)
                    continue
                return head, bytes(received)
            data = await _timed(_sockio.receive_some(stream.socket, READ_SIZE), limit_s,
                                httpx.ReadTimeout, httpx.ReadError, request)
            if not data:
                raise httpx.RemoteProtocolError("server disconnected without sending a "
                                                "response", request=request)
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


class BodyTooLarge(Exception):
    """A body longer than its reader's bound (``LoopbackBody.read_all``)."""


class LoopbackBody(httpx.AsyncByteStream):
    def __init__(self, transport: LoopbackTransport, stream: trio.SocketStream,
                 decoder: BodyDecoder, head: ResponseHead, rest: bytes,
                 request: httpx.Request, timeout: float | None) -> None:
        self._transport = transport
        self._stream = stream
        self._decoder = decoder
        self._head = head
        self._rest = rest
        self._request = request
        self._timeout = timeout
        self._released = False
        #: The last read was short, so the socket has most likely been drained: the next
        #: read waits for it first instead of failing with EAGAIN (``_sockio``).
        self._drained = True

    # A plain iterator, not an async generator: the gateway leaves streams early on
    # purpose, and a suspended generator would be left for trio to finalize.
    def __aiter__(self) -> LoopbackBody:
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
            raise httpx.RemoteProtocolError(str(exc), request=self._request) from exc
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
            raise httpx.RemoteProtocolError(str(exc), request=self._request) from exc
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)  # [] is b""

    async def _receive(self, max_bytes: int = READ_SIZE) -> bytes:
        data: bytes = await _timed(
            _sockio.receive_some(self._stream.socket, max_bytes, likely_empty=self._drained),
            self._timeout, httpx.ReadTimeout, httpx.ReadError, self._request)
        self._drained = len(data) < max_bytes
        return data

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        reusable = self._head.keep_alive and self._decoder.reusable
        stream = self._transport._release(self._stream, reusable)
        if stream is not None:
            await trio.aclose_forcefully(stream)


async def _timed(work: Any, limit_s: float | None, timed_out: type[httpx.TimeoutException],
                 failed: type[httpx.TransportError], request: httpx.Request) -> Any:
    """``await work`` within ``limit_s`` seconds (None: no limit), its failures as
    httpx's."""
    try:
        if limit_s is None:
            return await work
        with trio.fail_after(limit_s):
            return await work
    except trio.TooSlowError as exc:
        raise timed_out("timed out", request=request) from exc
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise failed(f"{type(exc).__name__}: {exc}", request=request) from exc
