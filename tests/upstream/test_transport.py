"""The project's own http:// client (``Http1Connection``, and ``VllmClient`` over it)
against a real loopback server that says exactly what each test needs: reuse, a server
that closes idle connections, garbage, resets, interim answers, bytes after the body, an
abort after the body's end, refused connections, expiry; and the request bytes, which
must be what httpx writes for the same request (the https:// path, and this one before
it was the project's)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from gateway.upstream import UpstreamConfig, UpstreamMalformed, UpstreamUnavailable, VllmClient
from gateway.upstream._client import Http1Requests, _static_headers
from gateway.upstream._http1 import body_length, request_bytes
from gateway.upstream._https import HttpxRequests
from gateway.upstream._transport import (
    ConnectError,
    Http1Connection,
    RemoteProtocolError,
    TransportError,
)
from tests.support.build import pure_only
from tests.support.scripted_http import Reply, ScriptedServer, reset, scripted
from tests.support.waits import until

OK = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"


@asynccontextmanager
async def serving(replies: list[Reply]) -> AsyncIterator[tuple[ScriptedServer,
                                                                 Http1Connection]]:
    async with scripted(replies) as server:
        connection = Http1Connection("127.0.0.1", server.port, keepalive_expiry=0.5)
        try:
            yield server, connection
        finally:
            await connection.aclose()


def request(body: bytes = b"{}") -> bytes:
    return request_bytes("POST", b"/v1/chat/completions", [
        (b"Host", b"vllm"), (b"Content-Length", str(len(body)).encode())], body)


async def post(connection: Http1Connection, body: bytes = b"{}") -> tuple[int, bytes]:
    response = await connection.send("POST", request(body))
    try:
        return response.status, b"".join([chunk async for chunk in response])
    finally:
        await response.aclose()


async def test_a_connection_is_reused_after_a_body_read_to_its_end() -> None:
    async with serving([OK, OK, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi"]) as (
            server, connection):
        assert await post(connection) == (200, b"hello")
        assert await post(connection, b"x" * 100_000) == (200, b"hello")
        assert await post(connection) == (200, b"hi")
        assert server.connections == 1
        assert server.requests[1].endswith(b"x" * 100_000)
        assert b"content-length: 100000" in server.requests[1].lower()


async def test_bytes_after_the_body_or_connection_close_mean_a_new_connection() -> None:
    async with serving([OK + b"junk", OK]) as (server, connection):
        assert await post(connection) == (200, b"hello")
        assert await post(connection) == (200, b"hello")
        assert server.connections == 2
    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nhi"
    async with serving([closing, OK]) as (server, connection):
        assert await post(connection) == (200, b"hi")
        assert await post(connection) == (200, b"hello")
        assert server.connections == 2


async def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    async def answer_then_close(stream: trio.SocketStream) -> None:
        await stream.send_all(OK)

    async with serving([answer_then_close, OK]) as (server, connection):
        assert await post(connection) == (200, b"hello")
        with trio.fail_after(5):  # the server has closed (on loopback its FIN is here)
            await until(lambda: server.closed == 1)
        assert await post(connection) == (200, b"hello")
        assert server.connections == 2


async def test_an_idle_connection_past_its_expiry_is_not_reused() -> None:
    async with serving([OK, OK]) as (server, connection):
        assert await post(connection) == (200, b"hello")
        await trio.sleep(0.6)  # past keepalive_expiry=0.5: vLLM may be closing it now
        assert await post(connection) == (200, b"hello")
        assert server.connections == 2


async def test_an_abort_after_the_body_ended_leaves_nothing_broken() -> None:
    # The last read held the whole end of the body, then the operation was cancelled
    # and the socket closed from another task (BodyChunks.abort): not reusable.
    async with serving([OK, OK]) as (server, connection):
        response = await connection.send("POST", request())
        assert b"".join([chunk async for chunk in response]) == b"hello"
        assert response.abort()
        await response.aclose()
        assert await post(connection) == (200, b"hello")
        assert server.connections == 2


async def test_an_abort_mid_body_fails_the_pending_read() -> None:
    async def endless(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                              b"5\r\nhello\r\n")
        await trio.sleep_forever()

    async with serving([endless, OK]) as (server, connection):
        response = await connection.send("POST", request())
        assert await response.__anext__() == b"hello"

        async def abort_once_the_read_waits() -> None:
            await trio.testing.wait_all_tasks_blocked()
            assert response.abort()

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(abort_once_the_read_waits)
                with pytest.raises(TransportError):
                    await response.__anext__()
        await response.aclose()
        assert await post(connection) == (200, b"hello")  # on a new connection
        assert server.connections == 2


async def test_interim_answers_are_skipped_within_limits() -> None:
    async with serving([b"HTTP/1.1 100 Continue\r\n\r\n" + OK]) as (_, connection):
        assert await post(connection) == (200, b"hello")
    for reply in (b"HTTP/1.1 100 Continue\r\n\r\n" * 9 + OK,
                  b"HTTP/1.1 101 Switching Protocols\r\n\r\n"):
        async with serving([reply]) as (_, connection):
            with pytest.raises(RemoteProtocolError):
                await post(connection)


@pytest.mark.parametrize("reply", [
    b"garbage\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: " + b"9" * 5000 + b"\r\n\r\n",
])
async def test_bytes_that_are_not_http_are_a_protocol_error(reply: bytes) -> None:
    async with serving([reply]) as (_, connection):
        with pytest.raises(RemoteProtocolError):
            await post(connection)


async def test_a_connection_lost_mid_body_is_a_transport_error() -> None:
    async def half(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhe")

    async def resetting(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhe")
        reset(stream)

    for reply in (half, resetting):
        async with serving([reply]) as (_, connection):
            with pytest.raises(TransportError):
                await post(connection)


async def test_refused_and_silent_servers() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(ConnectError) as refused:
        await post(Http1Connection("127.0.0.1", port))
    assert refused.value.name == "ConnectError"

    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    # A cancelled request leaves the connection usable (the socket is dropped).
    async with serving([silent, OK]) as (server, connection):
        with trio.move_on_after(0.2):
            await post(connection)
        assert await post(connection) == (200, b"hello")
        assert server.connections == 2


@pure_only("it replaces _sockio.send_now, which compiled _transport calls directly; "
           "the next test sends the same 8 MiB on every build")
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
    async with serving([OK]) as (server, connection):
        with trio.fail_after(20):
            assert await post(connection, body) == (200, b"hello")
    ((sent, size),) = taken
    assert sent < size  # the rest went through send_all
    assert server.requests[0].endswith(body)
    assert b"content-length: %d" % len(body) in server.requests[0].lower()


@pytest.mark.parametrize("big_at", [0, 1, 3])
async def test_a_request_in_pieces_arrives_whole_in_order(big_at: int) -> None:
    """A request with media goes as its pieces (``_http1.RequestBody``), never joined:
    views and bytes, small ones, and an 8 MiB one the kernel takes only in part
    wherever it stands, the rest through send_all after what was taken."""
    pieces: list[bytes | memoryview] = [b'{"a": "', memoryview(b"xyz" * 1000)[1:],
                                        b"", b'"}']
    big = bytes(range(251)) * (32 << 10)
    pieces.insert(big_at, memoryview(big)[3:])
    body = b"".join(pieces)
    data = request_bytes("POST", b"/v1/chat/completions", [
        (b"Host", b"vllm"), (b"Content-Length", b"%d" % body_length(tuple(pieces)))],
        tuple(pieces))
    assert isinstance(data, tuple) and data[1:] == tuple(pieces)  # the head, then as given
    async with serving([OK]) as (server, connection):
        with trio.fail_after(20):
            response = await connection.send("POST", data)
            await response.aclose()
    assert response.status == 200
    assert server.requests[0].endswith(b"\r\n\r\n" + body)
    assert b"content-length: %d" % len(body) in server.requests[0].lower()


# --------------------------------------------------------------------------- request bytes

@pytest.mark.parametrize("base_url", [
    "http://127.0.0.1:8000", "http://localhost:8000/", "http://[::1]:9/prefix",
    "http://vllm:80", "http://us%40er:p%3Ass@vllm:8000", "https://vllm.example"])
@pytest.mark.parametrize("api_key", [None, "sk-1"])
def test_the_request_bytes_are_what_httpx_writes_for_the_same_request(
        base_url: str, api_key: str | None) -> None:
    """httpx as the referee: the request it builds from the same URL, headers and body
    (the https:// path builds it, and the http:// path sent its bytes before it was the
    project's own), written as HTTP/1.1, is byte for byte what the http:// path writes."""
    client = VllmClient(UpstreamConfig(base_url, api_key=api_key))
    static = _static_headers(httpx.URL(base_url), client._probe_client.headers)
    trio.run(client.aclose)
    referee = HttpxRequests(base_url, static, httpx.Timeout(5))
    ours = Http1Requests(base_url, static)
    body = b'{"model":"m","messages":[{"role":"user","content":"h\xc3\xa9"}]}'
    for path in ("/v1/chat/completions", "/v1/completions"):
        for headers in ({}, {"x-request-id": "r-1", "traceparent": "00-ab-cd-01"},
                        {"priority": "-3", "x-note": "caf\u00e9"}):
            built = referee.build(path, body, headers)
            expected = request_bytes("POST", built.url.raw_path, list(built.headers.raw),
                                     built.content)
            assert ours.encode(path, body, headers) == expected, (path, headers)


# --------------------------------------------------------------------------- the client

ANSWER = (b'{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":'
          b'[{"index":0,"message":{"role":"assistant","content":"h\xc3\xa9\\u000b"}}]}')


@asynccontextmanager
async def vllm_client(replies: list[Reply]) -> AsyncIterator[tuple[ScriptedServer,
                                                                   VllmClient]]:
    """The gateway's client (its request slots are the project's own connections) before
    ``ScriptedServer``."""
    async with scripted(replies) as server:
        client = VllmClient(UpstreamConfig(server.url))
        try:
            yield server, client
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()


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
    async def promise(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (65 << 20))
        await trio.sleep_forever()  # not a byte of it: the refusal must not wait for one

    with trio.fail_after(5):
        async with vllm_client([promise]) as (_, client):
            with pytest.raises(UpstreamMalformed, match="exceeds 64 MiB"):
                await client.completion({"model": "m"}, {})


async def test_a_chunked_body_growing_past_the_bound_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.upstream import _client

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
    async def resetting(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n{\"id\"")
        reset(stream)

    with trio.fail_after(5):
        async with vllm_client([resetting]) as (_, client):
            with pytest.raises(UpstreamMalformed) as caught:
                await client.completion({"model": "m"}, {})
    assert caught.value.kind == "connection_lost"


async def test_a_header_that_would_split_the_request_is_refused_before_sending() -> None:
    async with vllm_client([OK]) as (server, client):
        with pytest.raises(UpstreamUnavailable, match="LocalProtocolError"):
            await client.completion({"model": "m"}, {"x-id": "a\x00b"})
        assert server.requests == []
