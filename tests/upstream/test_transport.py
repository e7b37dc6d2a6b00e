"""LoopbackTransport against a real loopback server that says exactly what each test
needs: reuse, a server that closes idle connections, garbage, resets, interim answers,
bytes after the body, an abort after the body's end, refused connections, expiry."""

from __future__ import annotations

import functools
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from gateway.upstream._transport import LoopbackTransport
from tests.support.waits import until

Reply = bytes | Callable[[trio.SocketStream], Any]
OK = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"


class Server:
    """Answers each request with the next reply in ``replies`` (bytes, or a coroutine
    function given the stream); counts connections and requests."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self.connections = 0
        self.closed = 0  # connections this server has closed
        self.requests: list[bytes] = []
        self.port = 0

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
        except trio.BrokenResourceError:
            pass
        finally:
            await stream.aclose()
            self.closed += 1


@asynccontextmanager
async def serving(replies: list[Reply]) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    server = Server(replies)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(
            trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
        server.port = listeners[0].socket.getsockname()[1]
        transport = LoopbackTransport(keepalive_expiry=0.5)
        async with httpx.AsyncClient(transport=transport,
                                     base_url=f"http://127.0.0.1:{server.port}") as client:
            yield server, client
        nursery.cancel_scope.cancel()


async def post(client: httpx.AsyncClient, body: bytes = b"{}") -> tuple[int, bytes]:
    async with client.stream("POST", "/v1/chat/completions", content=body) as response:
        return response.status_code, await response.aread()


async def test_a_connection_is_reused_after_a_body_read_to_its_end() -> None:
    async with serving([OK, OK, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi"]) as (
            server, client):
        assert await post(client) == (200, b"hello")
        assert await post(client, b"x" * 100_000) == (200, b"hello")
        assert await post(client) == (200, b"hi")
        assert server.connections == 1
        assert server.requests[1].endswith(b"x" * 100_000)
        assert b"content-length: 100000" in server.requests[1].lower()


async def test_bytes_after_the_body_or_connection_close_mean_a_new_connection() -> None:
    async with serving([OK + b"junk", OK]) as (server, client):
        assert await post(client) == (200, b"hello")
        assert await post(client) == (200, b"hello")
        assert server.connections == 2
    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nhi"
    async with serving([closing, OK]) as (server, client):
        assert await post(client) == (200, b"hi")
        assert await post(client) == (200, b"hello")
        assert server.connections == 2


async def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    async def answer_then_close(stream: trio.SocketStream) -> None:
        await stream.send_all(OK)

    async with serving([answer_then_close, OK]) as (server, client):
        assert await post(client) == (200, b"hello")
        with trio.fail_after(5):  # the server has closed (on loopback its FIN is here)
            await until(lambda: server.closed == 1)
        assert await post(client) == (200, b"hello")
        assert server.connections == 2


async def test_an_idle_connection_past_its_expiry_is_not_reused() -> None:
    async with serving([OK, OK]) as (server, client):
        assert await post(client) == (200, b"hello")
        await trio.sleep(0.6)  # past keepalive_expiry=0.5: vLLM may be closing it now
        assert await post(client) == (200, b"hello")
        assert server.connections == 2


async def test_an_abort_after_the_body_ended_leaves_nothing_broken() -> None:
    # The last read held the whole end of the body, then the operation was cancelled
    # and the socket closed from another task (BodyChunks.abort): not reusable.
    async with serving([OK, OK]) as (server, client):
        async with client.stream("POST", "/") as response:
            assert await response.aread() == b"hello"
            response.extensions["network_stream"].get_extra_info("socket").close()
        assert await post(client) == (200, b"hello")
        assert server.connections == 2


async def test_interim_answers_are_skipped_within_limits() -> None:
    async with serving([b"HTTP/1.1 100 Continue\r\n\r\n" + OK]) as (_, client):
        assert await post(client) == (200, b"hello")
    for reply in (b"HTTP/1.1 100 Continue\r\n\r\n" * 9 + OK,
                  b"HTTP/1.1 101 Switching Protocols\r\n\r\n"):
        async with serving([reply]) as (_, client):
            with pytest.raises(httpx.RemoteProtocolError):
                await post(client)


async def test_a_header_that_would_split_the_request_is_refused_before_sending() -> None:
    async with serving([OK]) as (server, client):
        with pytest.raises(httpx.LocalProtocolError):
            await client.post("/", content=b"{}", headers={"x-id": "a\x00b"})
        assert server.requests == []


@pytest.mark.parametrize("reply", [
    b"garbage\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: " + b"9" * 5000 + b"\r\n\r\n",
])
async def test_bytes_that_are_not_http_are_a_protocol_error(reply: bytes) -> None:
    async with serving([reply]) as (_, client):
        with pytest.raises(httpx.RemoteProtocolError):
            await post(client)


async def test_a_connection_lost_mid_body_is_an_httpx_error() -> None:
    async def half(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhe")

    async def reset(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhe")
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                 b"\x01\x00\x00\x00\x00\x00\x00\x00")

    for reply in (half, reset):
        async with serving([reply]) as (_, client):
            with pytest.raises(httpx.TransportError):
                await post(client)


async def test_refused_and_silent_servers() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    async with httpx.AsyncClient(transport=LoopbackTransport()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.post(f"http://127.0.0.1:{port}/", content=b"{}")

    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with serving([silent]) as (_, client):
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/", content=b"{}", timeout=httpx.Timeout(5, read=0.2))
        # A cancelled request leaves the transport usable (the connection is dropped).
    async with serving([silent, OK]) as (server, client):
        with trio.move_on_after(0.2):
            await post(client)
        assert await post(client) == (200, b"hello")
        assert server.connections == 2


# --------------------------------------------------------------------------- whole bodies

ANSWER = (b'{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":'
          b'[{"index":0,"message":{"role":"assistant","content":"h\xc3\xa9\\u000b"}}]}')


@asynccontextmanager
async def vllm_client(replies: list[Reply]) -> AsyncIterator[tuple[Server, Any]]:
    """The gateway's client (its request slots are LoopbackTransports) before ``Server``."""
    from gateway.upstream import UpstreamConfig, VllmClient

    server = Server(replies)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(
            trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
        server.port = listeners[0].socket.getsockname()[1]
        client = VllmClient(UpstreamConfig(f"http://127.0.0.1:{server.port}"))
        try:
            yield server, client
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()
            nursery.cancel_scope.cancel()


def in_pieces(head: bytes, body: bytes, pieces: int) -> Callable[[trio.SocketStream], Any]:
    """A reply whose head and body arrive in separate writes, the body cut in ``pieces``."""
    async def reply(stream: trio.SocketStream) -> None:
        await stream.send_all(head)
        step = -(-len(body) // pieces)
        for start in range(0, len(body), step):
            await trio.sleep(0.01)
            await stream.send_all(body[start:start + step])
        await stream.receive_some(1)  # the client closes, or reuses: either is fine here
    return reply


def chunked(body: bytes, pieces: int) -> bytes:
    step = -(-len(body) // pieces)
    return b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + step]), body[i:i + step])
                    for i in range(0, len(body), step)) + b"0\r\n\r\n"


@pytest.mark.parametrize("pieces", [1, 7])
async def test_a_whole_body_is_the_bytes_vllm_sent_however_it_arrives(pieces: int) -> None:
    length_head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(ANSWER)
    chunked_head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    with trio.fail_after(10):
        for head, body in ((length_head, ANSWER), (chunked_head, chunked(ANSWER, pieces))):
            async with vllm_client([head + body, in_pieces(head, body, pieces)]) as (
                    server, client):
                for _ in range(2):  # in one write, then in pieces after the head
                    answer = await client.completion({"model": "m"}, {})
                    assert answer.text == ANSWER
                    assert answer.body["choices"][0]["message"]["content"] == "hé\x0b"
                assert server.connections == 1  # read to its exact end: reused


async def test_a_content_length_past_the_bound_is_refused_before_any_body_byte() -> None:
    from gateway.upstream import UpstreamMalformed

    async def promise(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (65 << 20))
        await trio.sleep_forever()  # not a byte of it: the refusal must not wait for one

    with trio.fail_after(5):
        async with vllm_client([promise]) as (_, client):
            with pytest.raises(UpstreamMalformed, match="exceeds 64 MiB"):
                await client.completion({"model": "m"}, {})


async def test_a_chunked_body_growing_past_the_bound_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.upstream import UpstreamMalformed, _client

    monkeypatch.setattr(_client, "MAX_JSON_BODY", 1 << 20)
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    endless = b"%x\r\n%s\r\n" % (64 << 10, b" " * (64 << 10))

    async def flood(stream: trio.SocketStream) -> None:
        await stream.send_all(head)
        for _ in range(100):  # 6.4 MiB, never an end
            await stream.send_all(endless)

    with trio.fail_after(10):
        async with vllm_client([flood]) as (_, client):
            with pytest.raises(UpstreamMalformed, match="exceeds 1 MiB"):
                await client.completion({"model": "m"}, {})


async def test_a_connection_lost_mid_body_is_a_broken_answer() -> None:
    from gateway.upstream import UpstreamMalformed

    async def reset(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n{\"id\"")
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                 b"\x01\x00\x00\x00\x00\x00\x00\x00")

    with trio.fail_after(5):
        async with vllm_client([reset]) as (_, client):
            with pytest.raises(UpstreamMalformed) as caught:
                await client.completion({"model": "m"}, {})
    assert caught.value.kind == "connection_lost"


async def test_a_request_larger_than_the_socket_takes_at_once_is_sent_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What the kernel does not take at once goes through send_all, after what it took.
    from gateway import _sockio

    taken: list[tuple[int, int]] = []
    original = _sockio.send_now

    def noting(sock: Any, data: bytes) -> int:
        taken.append((original(sock, data), len(data)))
        return taken[-1][0]

    monkeypatch.setattr(_sockio, "send_now", noting)
    body = bytes(range(256)) * (32 << 10)  # 8 MiB: more than a loopback send buffer
    async with serving([OK]) as (server, client):
        with trio.fail_after(20):
            assert await post(client, body) == (200, b"hello")
    ((sent, size),) = taken
    assert sent < size  # the rest went through send_all
    assert server.requests[0].endswith(body)
    assert b"content-length: %d" % len(body) in server.requests[0].lower()
