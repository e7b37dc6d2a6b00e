"""Proxies a test puts between a client and the gateway, to drop the client's network
under it: ``cut()`` resets every TCP (or unix) connection through the proxy, both ways
(SO_LINGER 0: an RST, as a NAT or a load balancer that forgot the flow sends), or
blackholes every QUIC flow (its datagrams are dropped from then on: the gateway finds
out when QUIC's idle timeout passes). New connections through the proxy work as before.
"""

from __future__ import annotations

import contextlib
import socket
import struct

import trio

#: SO_LINGER on, 0 seconds: close() sends an RST.
_RESET = struct.pack("ii", 1, 0)


class StreamCutProxy:
    """A loopback TCP (``target`` a (host, port)) or unix (``target`` a path) proxy."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        self.target = target
        self.uri = ""
        self._pairs: list[tuple[trio.SocketStream, trio.SocketStream]] = []
        self.connections = 0
        self.cuts = 0

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
                nursery.start_soon(self._pump, client, server, nursery.cancel_scope)
                nursery.start_soon(self._pump, server, client, nursery.cancel_scope)
        finally:
            with contextlib.suppress(ValueError):
                self._pairs.remove(pair)
            for stream in pair:
                with contextlib.suppress(OSError, trio.ClosedResourceError):
                    stream.socket.close()

    @staticmethod
    async def _pump(source: trio.SocketStream, sink: trio.SocketStream,
                    scope: trio.CancelScope) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            while data := await source.receive_some(65536):
                await sink.send_all(data)
            await sink.send_eof()
            return
        scope.cancel()

    def cut(self) -> None:
        """Reset every connection through the proxy, both ways, now."""
        self.cuts += 1
        for pair in list(self._pairs):
            for stream in pair:
                with contextlib.suppress(OSError):
                    if stream.socket.family != socket.AF_UNIX:
                        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
                    stream.socket.close()
        self._pairs.clear()


class DatagramCutProxy:
    """A loopback UDP proxy for one QUIC server: each client address gets its own socket
    toward the server. ``cut()`` blackholes the flows it has seen so far."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.uri = ""
        self._flows: dict[tuple[str, int], trio.socket.SocketType] = {}
        self._dead: set[tuple[str, int]] = set()
        self.dropped = 0

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        front = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            await front.bind(("127.0.0.1", 0))
            self.uri = f"127.0.0.1:{front.getsockname()[1]}"
            async with trio.open_nursery() as nursery:
                task_status.started(self.uri)
                while True:
                    data, client = await front.recvfrom(65536)
                    if client in self._dead:
                        self.dropped += 1
                        continue
                    back = self._flows.get(client)
                    if back is None:
                        back = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                        self._flows[client] = back
                        await back.bind(("127.0.0.1", 0))
                        nursery.start_soon(self._back, front, back, client)
                    await back.sendto(data, self.target)
        finally:
            front.close()
            for back in self._flows.values():
                back.close()

    async def _back(self, front: trio.socket.SocketType, back: trio.socket.SocketType,
                    client: tuple[str, int]) -> None:
        while True:
            data, _ = await back.recvfrom(65536)
            if client in self._dead:
                self.dropped += 1
                continue
            await front.sendto(data, client)

    def cut(self) -> None:
        self._dead.update(self._flows)

