"""Proxies a test puts between a client and the gateway, to drop the client's network
under it: ``StreamCutProxy`` (``gateway.tools.cut``: the resume benchmarks use it too)
resets every TCP (or unix) connection through it, and can record what it relays;
``DatagramCutProxy`` blackholes every QUIC flow (its datagrams are dropped from then on:
the gateway finds out when QUIC's idle timeout passes). New connections through either
proxy work as before.
"""

from __future__ import annotations

import socket

import trio

from gateway.tools.cut import Relayed, StreamCutProxy

__all__ = ["DatagramCutProxy", "Relayed", "StreamCutProxy"]


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

