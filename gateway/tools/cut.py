"""A loopback proxy to drop a client's network under it: ``cut()`` resets every TCP (or
unix) connection through the proxy, both ways (SO_LINGER 0: an RST, as a NAT or a load
balancer that forgot the flow sends). New connections through the proxy work as before.

``StreamCutProxy(record=True)`` also decodes what it relays, so a test can compare the
frames two servers send where their client library does not show them (a refused
SESSION_OPEN_ACK's fields, say). ``delay`` holds every byte that long in each direction
(a WAN's round trip, in order, without slowing the rate). While ``refusing`` is set, a
new connection is reset ``refuse_after`` seconds after it is accepted (a path that drops
whatever tries it for a while: the client has sent its first bytes and waits).
``cut(half_open=True)`` resets only the client's side: the server's side stays open and
silent, as behind a balancer that still acknowledges a path that is gone.

The resume benchmarks (``bench run --scenario resume``, ``bench soak --cut-every``) put one
in front of each client; the end-to-end resume tests use the same one
(``tests/support/cut.py``), so both cut connections the same way.
"""

from __future__ import annotations

import contextlib
import math
import socket
import struct
from collections.abc import Callable

import attrs
import trio

from gateway import nnrp

#: SO_LINGER on, 0 seconds: close() sends an RST.
_RESET = struct.pack("ii", 1, 0)


@attrs.frozen
class Relayed:
    """One packet a recording proxy relayed."""

    connection: int  # 1 for the first connection through the proxy, and so on
    upstream: bool  # from the client (True) or to it
    packet: nnrp.Packet


class StreamCutProxy:
    """A loopback TCP (``target`` a (host, port)) or unix (``target`` a path) proxy.

    ``record``: decode the NNRP packets of every connection, both ways, into ``packets``
    (in the order each direction relayed them). A direction that stops decoding stops
    being recorded (its error in ``record_errors``) and is still relayed.
    """

    def __init__(self, target: tuple[str, int] | str, *, record: bool = False,
                 delay: float = 0.0) -> None:
        self.target = target
        self.delay = delay
        self.uri = ""
        self._pairs: list[tuple[trio.SocketStream, trio.SocketStream]] = []
        #: Server sides left open by half-open cuts (closed with the proxy).
        self._silent: list[trio.SocketStream] = []
        self._scopes: dict[int, trio.CancelScope] = {}
        #: New connections are reset, ``refuse_after`` seconds in, while set.
        self.refusing = False
        self.refuse_after = 0.0
        self.refused = 0
        self.connections = 0
        self.cuts = 0
        self.record = record
        self.packets: list[Relayed] = []
        self.record_errors: list[nnrp.RemoteProtocolError] = []

    async def serve(self, listen: str | None = None, *,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on loopback (a unix path for a unix target) and relay until cancelled."""
        if isinstance(self.target, str):
            assert listen is not None, "a unix proxy needs its own socket path"
            sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            await sock.bind(listen)
            sock.listen(64)
            listeners: list[trio.SocketListener] = [trio.SocketListener(sock)]
            self.uri = f"unix://{listen}"
        else:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            self.uri = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        task_status.started(self.uri)
        await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, client: trio.SocketStream) -> None:
        if self.refusing:
            self.refused += 1
            await trio.sleep(self.refuse_after)
            _reset(client)
            return
        if isinstance(self.target, str):
            server = await trio.open_unix_socket(self.target)
        else:
            server = await trio.open_tcp_stream(*self.target)
            for stream in (client, server):
                stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self.connections += 1
        pair = (client, server)
        self._pairs.append(pair)
        try:
            async with trio.open_nursery() as nursery:
                self._scopes[id(pair)] = nursery.cancel_scope
                nursery.start_soon(self._pump, client, server, nursery.cancel_scope,
                                   self._recorder(self.connections, upstream=True),
                                   self.delay)
                nursery.start_soon(self._pump, server, client, nursery.cancel_scope,
                                   self._recorder(self.connections, upstream=False),
                                   self.delay)
        finally:
            self._scopes.pop(id(pair), None)
            with contextlib.suppress(ValueError):
                self._pairs.remove(pair)
            for stream in pair:
                if any(stream is silent for silent in self._silent):
                    continue
                with contextlib.suppress(OSError, trio.ClosedResourceError):
                    stream.socket.close()

    def _recorder(self, connection: int, *, upstream: bool) -> Callable[[bytes], None]:
        if not self.record:
            return lambda data: None
        decoder = nnrp.Decoder()

        def feed(data: bytes) -> None:
            if decoder.error is not None:
                return
            try:
                packets = decoder.feed(data)
            except nnrp.RemoteProtocolError as error:
                self.record_errors.append(error)
                return
            self.packets += [Relayed(connection, upstream, p) for p in packets]

        return feed

    @staticmethod
    async def _pump(source: trio.SocketStream, sink: trio.SocketStream,
                    scope: trio.CancelScope, record: Callable[[bytes], None],
                    delay: float = 0.0) -> None:
        if delay > 0:
            await _delayed_pump(source, sink, scope, record, delay)
            return
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            while data := await source.receive_some(65536):
                record(data)  # before it goes on: the packet is recorded before its answer
                await sink.send_all(data)
            await sink.send_eof()
            return
        scope.cancel()

    def cut(self, *, half_open: bool = False) -> None:
        """Reset every connection through the proxy, both ways, now; ``half_open``: only
        the client's side, the server's staying open and silent (it reads nothing more
        and hears nothing), until the proxy closes."""
        self.cuts += 1
        for pair in list(self._pairs):
            client, server = pair
            if half_open:
                self._silent.append(server)
                scope = self._scopes.get(id(pair))
                if scope is not None:
                    scope.cancel()
            for stream in (client,) if half_open else pair:
                _reset(stream)
        self._pairs.clear()

    def close_silent(self) -> None:
        """Close the server sides half-open cuts left (the balancer forgets them)."""
        silent, self._silent = self._silent, []
        for stream in silent:
            with contextlib.suppress(OSError):
                stream.socket.close()


def _reset(stream: trio.SocketStream) -> None:
    """Close with an RST (a unix socket just closes)."""
    with contextlib.suppress(OSError):
        if stream.socket.family != socket.AF_UNIX:
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        stream.socket.close()


async def _delayed_pump(source: trio.SocketStream, sink: trio.SocketStream,
                        scope: trio.CancelScope, record: Callable[[bytes], None],
                        delay: float) -> None:
    """The path's latency: each read leaves ``delay`` after it arrived, in order. Either
    end breaking ends the pair (``scope``)."""
    send, receive = trio.open_memory_channel[tuple[float, bytes]](math.inf)

    async def deliver() -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            async for at, data in receive:
                await trio.sleep_until(at)
                if not data:
                    await sink.send_eof()
                    return
                await sink.send_all(data)
            return
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(deliver)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            while data := await source.receive_some(65536):
                record(data)
                send.send_nowait((trio.current_time() + delay, data))
            send.send_nowait((trio.current_time() + delay, b""))
            return
        scope.cancel()
