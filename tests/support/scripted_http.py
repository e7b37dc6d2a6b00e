"""A loopback HTTP/1.1 server that says exactly what a test needs, for the upstream's own
http:// path (``gateway.upstream._transport``) and the client over it: each request is
answered with the next reply of a script (bytes, or a coroutine function given the
stream), and the server counts connections, requests and the connections it closed.

``sse_reply`` builds a streamed answer as vLLM writes one (chunked, one HTTP chunk per
step) from (delay, bytes | RESET) steps, the same steps a respx body plays on https://.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

Reply = bytes | Callable[[trio.SocketStream], Any]
#: A step that resets the connection (RST: SO_LINGER 0, then close) instead of writing.
RESET = ConnectionResetError("reset by peer")
Step = tuple[float, bytes | Exception]


class ScriptedServer:
    """Answers each request with the next reply in ``replies``; counts connections and
    requests."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self.connections = 0
        self.closed = 0  # connections this server has closed
        self.requests: list[bytes] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        buffer = b""
        try:
            while self.replies:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                self.requests.append(head + b"\r\n\r\n" + buffer[:length])
                buffer = buffer[length:]
                reply = self.replies.pop(0)
                if isinstance(reply, bytes):
                    await stream.send_all(reply)
                else:
                    await reply(stream)
                    return
            await stream.receive_some(1)  # hold the connection until the client closes
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()
            self.closed += 1


@asynccontextmanager
async def scripted(replies: list[Reply]) -> AsyncIterator[ScriptedServer]:
    """The server, listening on a loopback port, until the block ends. What the block
    raises comes out as itself, not in the server's nursery's exception group."""
    server = ScriptedServer(replies)
    try:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(
                trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
            server.port = listeners[0].socket.getsockname()[1]
            try:
                yield server
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            only = group.exceptions[0]
            raise only from only.__cause__
        raise


def reset(stream: trio.SocketStream) -> None:
    """Make the stream's close a reset (RST), not an orderly end (FIN)."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                             b"\x01\x00\x00\x00\x00\x00\x00\x00")


def sse_reply(*steps: Step, head: bytes = b"HTTP/1.1 200 OK\r\n"
              b"content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
              ) -> Callable[[trio.SocketStream], Any]:
    """A chunked answer: the head, then each step's bytes as one HTTP chunk after its
    delay; the terminating chunk after the last, unless a step resets the connection."""
    async def reply(stream: trio.SocketStream) -> None:
        await stream.send_all(head)
        for delay, step in steps:
            await trio.sleep(delay)  # the scripted body's pace
            if isinstance(step, Exception):
                reset(stream)
                return
            await stream.send_all(b"%x\r\n%s\r\n" % (len(step), step))
        await stream.send_all(b"0\r\n\r\n")
        await stream.receive_some(1)  # the client closes, or reuses: either is fine here
    return reply


def fixed_reply(status: int, body: bytes, content_type: bytes = b"application/json"
                ) -> bytes:
    """A whole answer with a Content-Length."""
    return (b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
            % (status, content_type, len(body), body))
