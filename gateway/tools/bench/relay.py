"""A null relay: a plain TCP byte relay in the gateway's place, on the same runtime (trio).

``bench run`` puts it between the direct HTTP/SSE client and the backend, so a latency
figure splits in two: what any extra process hop costs on this host (relay minus direct)
and what the gateway's own work costs (gateway minus relay). It does nothing a proxy
could skip: one task per direction, ``receive_some`` then ``send_all``, no parsing.
"""

from __future__ import annotations

import socket

import trio

READ_SIZE = 65536


async def _pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    try:
        while data := await source.receive_some(READ_SIZE):
            await sink.send_all(data)
        await sink.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _relay_one(client: trio.SocketStream, target: tuple[str, int]) -> None:
    async with client:
        try:
            upstream = await trio.open_tcp_stream(*target)
        except OSError:
            return
        async with upstream:
            for stream in (client, upstream):
                stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pump, client, upstream)
                await _pump(upstream, client)
                nursery.cancel_scope.cancel()  # the backend is done: so is the request


async def serve_relay(listen: tuple[str, int], target: tuple[str, int], *,
                      task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Relay every connection made to ``listen`` to ``target`` until cancelled."""
    listeners = await trio.open_tcp_listeners(listen[1], host=listen[0])
    task_status.started(listeners[0].socket.getsockname()[1])

    async def handle(client: trio.SocketStream) -> None:
        await _relay_one(client, target)

    await trio.serve_listeners(handle, listeners)
