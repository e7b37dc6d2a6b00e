"""NNRP over WebSocket (RFC 6455) on wsproto: one NNRP packet per binary message, for the
server (its handshake on first use) and for the client (``open_websocket_client``).

wsproto parses and builds frames; this module owns what a server must decide beside
them, in these rules (cited in code as "rule N"):

1. A message costs its payload, however the peer fragments it: its frames' bytes go into
   one buffer as they come. (trio-websocket, before this module, kept each fragment as
   its own bytes object: a client's 1-byte fragments cost the gateway about 55 bytes of
   memory each, before any NNRP authentication; docs/benchmarks.md, "A flood of 1-byte
   WebSocket fragments".)
2. A message over ``max_message`` bytes ends the connection with close code 1009
   (Message Too Big, RFC 6455 section 7.4.1) as soon as its count passes the bound; the
   bytes over it are never kept. The bound is the protocol's largest packet: a packet
   over this gateway's own limit is refused alone, by the codec (gateway.nnrp._codec).
3. Small frames never hold the loop: at most ``FRAMES_PER_STEP`` frames are taken between
   checkpoints, whatever one read holds (a read of 1-byte fragments was one 40-50 ms
   step of the loop under trio-websocket).
4. A Ping is answered with a Pong, in order with everything else the peer sent, until we
   sent our Close (nothing follows a Close: RFC 6455 section 5.5.1). A Close is answered
   with a Close and ends the stream (``receive`` returns None). A frame wsproto cannot
   parse ends the connection with the close code wsproto names (1002 protocol error,
   1007 invalid data). A cancelled ``receive`` loses no frame: rule 3's checkpoint comes
   before the next event is taken.
5. A text message is the peer's error (``TextMessageError``): NNRP packets are binary
   messages (docs/reference/nnrp-wire.md section 1).
6. The server's handshake runs on the transport's first use, inside the connection's
   handshake timeout and under its connection limit, as a TLS handshake does (h11 under
   wsproto bounds the request's head at 16 KiB). A request for another path is answered
   404; one that is not a WebSocket upgrade, 400 with wsproto's reason (426 for a
   version it does not speak; a Host that is not a name is a 400 too). No extension is
   accepted (permessage-deflate would make rule 2 bound the compressed bytes, not the
   message) and no subprotocol.
7. One writer at a time: the connection's packets and the reader's Pongs and Close share
   the stream under one lock. A write cut short (cancelled, or the stream broke) may end
   inside a frame, so nothing is framed after it: later sends fail, and ``aclose`` closes
   the socket without a Close. wsproto's state is settled before each write.
8. Closing says so first: ``aclose`` sends a Close (1000) and waits, within
   ``CLOSE_TIMEOUT``, for the peer's Close or its end of stream before closing the
   socket (RFC 6455 section 7.1.1: the server closes TCP first, after the handshake), so
   the peer reads everything sent before it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from http import HTTPStatus

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import RemoteProtocolError

from gateway.nnrp import PROTOCOL_MAX_PACKET, PeerCredentials

from ._carriers import TextMessageError, stream_credentials

#: Bytes asked for per read. A big message arrives in reads this size (a 63 MiB submit
#: is a thousand of them); rule 3 bounds what a read of tiny frames costs in one step.
READ_BYTES = 64 * 1024
#: Frames taken from one read between checkpoints (rule 3): a flood of 1-byte frames was
#: steps of 5.6-6.3 ms on this VM, against 37-52 ms under trio-websocket
#: (docs/benchmarks.md, "A flood of 1-byte WebSocket fragments").
FRAMES_PER_STEP = 256
#: How long ``aclose`` waits for the peer's Close (rule 8).
CLOSE_TIMEOUT = 1.0
#: The most of a refusal's HTTP body the client keeps (``WebSocketRefused.body``).
REFUSAL_BODY_BYTES = 1024
#: RFC 6455 section 7.4.1 close codes this module sends.
CLOSE_NORMAL = 1000
CLOSE_MESSAGE_TOO_BIG = 1009


class WebSocketRefused(OSError):
    """The server did not upgrade the client's request, or closed before answering: an
    ``OSError``, as a refused TCP connect is. ``status`` and ``body`` (its first
    ``REFUSAL_BODY_BYTES``) are the server's HTTP answer, 0 and empty when it gave none."""

    def __init__(self, message: str, status: int = 0, body: bytes = b"") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class WebSocketTransport:
    """One packet per binary WebSocket message (module rules 1-8)."""

    message_based = True
    kind = "websocket"
    #: One message per packet, framed here: no direct writes.
    send_now: Callable[[bytes], int] | None = None

    def __init__(self, stream: trio.abc.Stream, peer: str, *, path: str | None = None,
                 max_message: int = PROTOCOL_MAX_PACKET,
                 client: WSConnection | None = None) -> None:
        """A server's transport (``path``: the one it serves; the handshake runs on first
        use), or, with ``client``, a client's whose handshake is done
        (``open_websocket_client``)."""
        self.peer = peer
        self._stream = stream
        self._path = path
        self._max_message = max_message
        self._ws = client or WSConnection(ConnectionType.SERVER)
        self._opened = client is not None
        self._handshake_lock = trio.Lock()
        self._write_lock = trio.StrictFIFOLock()  # rule 7
        #: The message being assembled (rule 1), and the events of the last read not yet
        #: taken (rule 3 may stop between them).
        self._message = bytearray()
        self._events: Iterator[Event] = client.events() if client else iter(())
        #: The stream ended for reading: the peer's Close or end of stream, a protocol
        #: error, or a refused handshake.
        self._ended = False
        self._peer_closed = trio.Event()
        self._receiving = False
        #: A write did not finish (cancelled, or the stream broke): what is on the wire
        #: may end inside a frame, so nothing more is framed after it (rule 7).
        self._broken = False

    # -- reading ---------------------------------------------------------------------

    async def receive(self, awaited: int = 0) -> bytes | bytearray | None:
        """The next binary message, or None once the stream ended (rules 1-5)."""
        if not self._opened:
            await self._server_handshake()
        self._receiving = True
        try:
            return await self._next_message()
        finally:
            self._receiving = False

    async def _next_message(self) -> bytes | bytearray | None:
        frames = 0
        while not self._ended:
            while True:
                if frames == FRAMES_PER_STEP:  # rule 3
                    # Before the next event is taken: a cancel here loses none.
                    frames = 0
                    await trio.lowlevel.checkpoint()
                event = next(self._events, None)
                if event is None:
                    break
                frames += 1
                if isinstance(event, BytesMessage):
                    message = await self._take(event)
                    if message is not None:
                        return message
                elif isinstance(event, Ping):
                    # Rule 4; after our Close (aclose) a Ping is read, not answered:
                    # RFC 6455 section 5.5.1, nothing is sent after a Close.
                    # A Pong that cannot be written ends the stream, as a broken read
                    # does (receive returns None, below): it raises nothing.
                    if self._ws.state is ConnectionState.OPEN and not self._broken:
                        await self._write_quietly(self._ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    await self._closed_by_peer(event)
                    return None
                elif isinstance(event, TextMessage):  # rule 5
                    raise TextMessageError(
                        "WebSocket text message: NNRP packets are binary messages")
                # A Pong answers nothing we sent a Ping for: nothing to do.
                if self._ended:
                    return None
            await self._read()
        return None

    async def _take(self, event: BytesMessage) -> bytes | bytearray | None:
        """Rule 1 and 2: the message once whole, else None. A message of several pieces
        is handed over as its buffer, not copied (``PacketTransport.receive``)."""
        data = event.data
        if len(self._message) + len(data) > self._max_message:
            await self._close_now(CLOSE_MESSAGE_TOO_BIG,
                                  f"message over {self._max_message} bytes")
            return None
        if not event.message_finished:
            self._message += data
            return None
        if not self._message:  # the whole message in one frame, one read
            return bytes(data)
        self._message += data
        message, self._message = self._message, bytearray()
        return message

    async def _read(self) -> None:
        """One read fed to wsproto; its events are taken lazily (rule 3)."""
        if data := await self._receive_some():
            self._ws.receive_data(data)
            self._events = self._ws.events()

    async def _receive_some(self) -> bytes:
        """One read, or b"" once the stream ended or broke (which ends the transport)."""
        try:
            data = bytes(await self._stream.receive_some(READ_BYTES))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            data = b""
        if not data:
            self._end()
        return data

    async def _closed_by_peer(self, event: CloseConnection) -> None:
        if self._ws.state is ConnectionState.REMOTE_CLOSING:  # the peer's: answered
            answer = self._ws.send(event.response())
            self._end()
            await self._write_quietly(answer)
        elif self._ws.state is ConnectionState.OPEN:
            # wsproto's word for a frame it could not parse (the state stays OPEN): the
            # peer is told why (rule 4).
            await self._close_now(event.code, event.reason or "")
        else:  # it answers our Close (CLOSED now): nothing more to say
            self._end()

    async def _close_now(self, code: int, reason: str) -> None:
        """Our Close, once: the state is settled before the write, which a cancel may
        cut short (after a cut write, ``_write`` sends nothing: rule 7)."""
        close = (self._ws.send(CloseConnection(code, reason))
                 if self._ws.state is ConnectionState.OPEN else b"")
        self._end()
        if close:
            await self._write_quietly(close)

    def _end(self) -> None:
        self._ended = True
        self._message = bytearray()
        self._events = iter(())
        self._peer_closed.set()

    # -- the server's handshake (rule 6) ---------------------------------------------

    async def _server_handshake(self) -> None:
        async with self._handshake_lock:
            while not (self._opened or self._ended):
                if not (data := await self._receive_some()):
                    return
                try:
                    self._ws.receive_data(data)
                    request = next((event for event in self._ws.events()
                                    if isinstance(event, Request)), None)
                except (RemoteProtocolError, UnicodeError) as exc:
                    # wsproto decodes the Host header as IDNA: a bad one is a UnicodeError.
                    hint = getattr(exc, "event_hint", None)
                    status = hint.status_code if isinstance(hint, RejectConnection) else 400
                    await self._refuse(
                        status, "unsupported WebSocket version" if status == 426
                        else f"not a WebSocket upgrade: {exc}",
                        hint.headers if isinstance(hint, RejectConnection) else [])
                    return
                if request is None:
                    continue
                if request.target.split("?")[0] != self._path:
                    await self._refuse(404, "no NNRP endpoint at this path")
                    return
                accept = self._ws.send(AcceptConnection())
                self._opened = True  # settled before the write, which a cancel may cut
                self._take_early_frames()
                self._events = self._ws.events()
                await self._write_quietly(accept)

    def _take_early_frames(self) -> None:
        """Bytes that came after the request, before our answer: wsproto's server leaves
        them in h11 (its client takes them). RFC 6455 section 4.1 has a client wait for
        the answer first; one that did not still has its frames read, not lost."""
        handshake = getattr(self._ws.handshake, "_h11_connection", None)
        early: bytes = handshake.trailing_data[0] if handshake is not None else b""
        if early:
            self._ws.receive_data(bytes(early))

    async def _refuse(self, status: int, why: str,
                      headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        """An HTTP answer of our own, not wsproto's: its handshake state after a request
        it could not parse allows no response. ``headers``: wsproto's hint (426 with the
        versions it speaks, say)."""
        self._end()
        body = why.encode(errors="replace") + b"\n"
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        extra = b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers)
        await self._write_quietly(
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
            b"connection: close\r\n%s\r\n%s" % (status, phrase.encode(), len(body), extra,
                                                   body))

    # -- writing (rule 7) ------------------------------------------------------------

    async def send(self, packets: list[bytes]) -> None:
        if not self._opened:
            await self._server_handshake()
        if self._ws.state is not ConnectionState.OPEN:
            raise trio.BrokenResourceError("WebSocket closed")
        await self._write(b"".join(self._ws.send(BytesMessage(packet)) for packet in packets))

    async def _write(self, data: bytes) -> None:
        """Every write of the transport: the one place rule 7's cut write is decided."""
        async with self._write_lock:
            if self._broken:
                raise trio.BrokenResourceError("an earlier write did not finish")
            try:
                await self._stream.send_all(data)
            except BaseException:
                # Perhaps nothing went out (a cancel at send_all's first checkpoint), but
                # from here nobody can tell: taken as cut.
                self._broken = True
                raise

    async def _write_quietly(self, data: bytes) -> None:
        """A write the peer may no longer read (a Close, a refusal): its failure is the
        peer's, and ends nothing more than the stream already ends."""
        try:
            await self._write(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self._end()

    # -- closing (rule 8) ------------------------------------------------------------

    async def aclose(self) -> None:
        try:
            with trio.move_on_after(CLOSE_TIMEOUT) as scope:
                scope.shield = True
                if self._opened and self._ws.state is ConnectionState.OPEN:
                    # After a cut write this sends nothing and ends the stream (_write).
                    await self._write_quietly(self._ws.send(CloseConnection(CLOSE_NORMAL)))
                    if self._receiving:  # the reader sees the peer's Close and ends
                        await self._peer_closed.wait()
                    else:
                        await self._discard_until_closed()
        finally:
            await trio.aclose_forcefully(self._stream)

    async def _discard_until_closed(self) -> None:
        while not self._ended:
            with contextlib.suppress(TextMessageError):
                await self._next_message()

    def credentials(self) -> PeerCredentials:
        return stream_credentials(self._stream, self.peer)


async def open_websocket_client(stream: trio.abc.Stream, host: str, path: str, peer: str, *,
                                max_message: int = PROTOCOL_MAX_PACKET
                                ) -> WebSocketTransport:
    """The client's handshake on ``stream`` (``host``: the Host header); raises
    ``WebSocketRefused`` when the server does not upgrade. The caller bounds its time."""
    ws = WSConnection(ConnectionType.CLIENT)
    await stream.send_all(ws.send(Request(host=host, target=path)))
    status, body = 0, bytearray()
    while True:
        data = bytes(await stream.receive_some(READ_BYTES))
        try:
            ws.receive_data(data or None)
            for event in ws.events():
                if isinstance(event, AcceptConnection):
                    # Frames that came with the answer wait in wsproto for the first read.
                    return WebSocketTransport(stream, peer, max_message=max_message,
                                              client=ws)
                if isinstance(event, RejectConnection):
                    status = event.status_code
                    if not event.has_body:
                        raise _refused(peer, status, body)
                elif isinstance(event, RejectData):
                    body += event.data[:REFUSAL_BODY_BYTES - len(body)]
                    if event.body_finished:
                        raise _refused(peer, status, body)
        except (RemoteProtocolError, UnicodeError) as exc:
            raise WebSocketRefused(f"{peer}: a bad WebSocket handshake answer: {exc}",
                                   status, bytes(body)) from exc
        if not data:
            raise _refused(peer, status, body)


def _refused(peer: str, status: int, body: bytearray) -> WebSocketRefused:
    said = body.decode(errors="replace").strip()
    if not status:
        return WebSocketRefused(f"{peer}: the server closed during the WebSocket handshake")
    return WebSocketRefused(f"{peer}: the server refused the WebSocket upgrade (HTTP "
                            f"{status}{': ' + said if said else ''})", status, bytes(body))
