"""The WebSocket carrier (gateway/transport/_websocket.py), rule by rule: a hostile or
clumsy client's raw frames over a real socket pair, whole, byte by byte and with trailing
bytes; the client side against trio-websocket's server (an independent implementation)
and against our own server."""

from __future__ import annotations

import base64
import functools
import os
import socket
import struct
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, ParamSpec

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings, strategies as st

from gateway.transport import (
    TextMessageError,
    WebSocketRefused,
    WebSocketTransport,
    _websocket as websocket,
)
from gateway.transport._websocket import open_websocket_client

P = ParamSpec("P")
PATH = "/nnrp"
KEY = base64.b64encode(b"sixteen byte key").decode()
BINARY, CONTINUATION, TEXT, CLOSE, PING, PONG = 0x2, 0x0, 0x1, 0x8, 0x9, 0xA


def upgrade(path: str = PATH, *extra: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: gateway", "Upgrade: websocket",
             "Connection: Upgrade", f"Sec-WebSocket-Key: {KEY}",
             "Sec-WebSocket-Version: 13", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True, mask: bool = True,
          declared: int | None = None) -> bytes:
    """One client frame, masked as RFC 6455 section 5.3 requires (``mask=False`` breaks
    it); ``declared`` lies about the payload's length."""
    length = len(payload) if declared is None else declared
    head = bytearray([(0x80 if fin else 0) | opcode])
    bit = 0x80 if mask else 0
    if length < 126:
        head.append(bit | length)
    elif length < 1 << 16:
        head += bytes([bit | 126]) + struct.pack("!H", length)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", length)
    if not mask:
        return bytes(head) + payload
    key = os.urandom(4)
    return bytes(head) + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def fragments(message: bytes, sizes: list[int]) -> bytes:
    """``message`` as a binary frame then continuations, cut at ``sizes`` (the rest
    goes in the last)."""
    pieces, at = [], 0
    for size in sizes:
        pieces.append(message[at:at + size])
        at += size
    pieces.append(message[at:])
    return b"".join(frame(BINARY if index == 0 else CONTINUATION, piece,
                          fin=index == len(pieces) - 1)
                    for index, piece in enumerate(pieces))


def server_frames(data: bytes) -> Iterator[tuple[int, bytes]]:
    """The server's frames (unmasked, each whole) as (opcode, payload)."""
    at = 0
    while at < len(data):
        opcode, length = data[at] & 0x0F, data[at + 1] & 0x7F
        at += 2
        if length == 126:
            (length,) = struct.unpack_from("!H", data, at)
            at += 2
        elif length == 127:
            (length,) = struct.unpack_from("!Q", data, at)
            at += 8
        yield opcode, data[at:at + length]
        at += length


def close_code(payload: bytes) -> int:
    return int(struct.unpack("!H", payload[:2])[0])


class Peer:
    """The client's end of a real socket pair: raw bytes out, the server's bytes in."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.received = bytearray()

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def read_head(self) -> bytes:
        """The server's HTTP answer head (its body, if any, stays in ``received``)."""
        while b"\r\n\r\n" not in self.received:
            data = await self.stream.receive_some(65536)
            assert data, "the server closed before answering"
            self.received += data
        head, _, rest = bytes(self.received).partition(b"\r\n\r\n")
        self.received = bytearray(rest)
        return head

    async def read_to_end(self) -> bytes:
        while data := await self.stream.receive_some(65536):
            self.received += data
        return bytes(self.received)

    async def read_to_end_after(self, server: WebSocketTransport, *,
                                answer: bool = False) -> bytes:
        """What the server sent, once it closed (``answer``: our Close goes first)."""
        if answer:
            await self.send(frame(CLOSE, struct.pack("!H", 1000)))
        await server.aclose()
        return await self.read_to_end()


#: What a test may take before it fails rather than hangs (a broken carrier waits forever
#: for bytes that never come): many times what any test here takes.
HANG_GUARD = 30.0


def hang_guarded(test: Callable[P, Awaitable[None]]) -> Callable[P, Awaitable[None]]:
    @functools.wraps(test)
    async def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        with trio.fail_after(HANG_GUARD):
            await test(*args, **kwargs)

    return guarded


#: Every socket a test made, closed after it (``closes_its_sockets``).
SOCKETS: list[socket.socket] = []


@pytest.fixture(autouse=True)
def closes_its_sockets() -> Iterator[None]:
    yield
    while SOCKETS:
        SOCKETS.pop().close()


def socketpair() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = socket.socketpair()
    SOCKETS.extend((a, b))
    return (trio.SocketStream(trio.socket.from_stdlib_socket(a)),
            trio.SocketStream(trio.socket.from_stdlib_socket(b)))


async def pair(**options: Any) -> tuple[WebSocketTransport, Peer]:
    a, b = socketpair()
    return WebSocketTransport(a, "peer", path=PATH, **options), Peer(b)


async def opened(**options: Any) -> tuple[WebSocketTransport, Peer]:
    """A pair whose handshake is done (the server's first receive runs it)."""
    server, peer = await pair(**options)
    await peer.send(upgrade())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server._server_handshake)
        assert (await peer.read_head()).startswith(b"HTTP/1.1 101 ")
    return server, peer


# -- rule 1 and the handshake's trailing bytes -------------------------------------------


@hang_guarded
async def test_fragments_with_pings_between_are_one_packet_and_each_ping_is_answered() -> None:
    server, peer = await pair()
    message = os.urandom(5000)
    # The first fragments ride with the upgrade request, in one write.
    await peer.send(upgrade() + frame(BINARY, message[:10], fin=False) + frame(PING, b"one")
                    + frame(CONTINUATION, message[10:2000], fin=False) + frame(PING, b"two")
                    + frame(CONTINUATION, message[2000:], fin=True)
                    + frame(BINARY, b"second"))
    assert await server.receive() == message
    assert await server.receive() == b"second"
    assert (await peer.read_head()).startswith(b"HTTP/1.1 101 Switching Protocols")
    frames = list(server_frames(await peer.read_to_end_after(server, answer=True)))
    assert frames[:2] == [(PONG, b"one"), (PONG, b"two")]
    assert frames[2][0] == CLOSE and close_code(frames[2][1]) == websocket.CLOSE_NORMAL


class ScriptedStream(trio.abc.Stream):
    """The client's bytes, handed to the carrier in the given cuts (a unit alone: the
    carrier's reads, not a socket's, decide where reads end)."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads
        self.sent = bytearray()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        return self.reads.pop(0) if self.reads else b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        self.sent += data

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def received_all(wire: bytes, cuts: list[int]
                       ) -> tuple[list[bytes | bytearray], bytes]:
    """Every message the server takes from ``wire`` read in pieces cut at ``cuts``, and
    what it sent."""
    reads, at = [], 0
    for cut in sorted(set(cuts)):
        reads.append(wire[at:cut])
        at = cut
    reads.append(wire[at:])
    stream = ScriptedStream([read for read in reads if read])
    server = WebSocketTransport(stream, "peer", path=PATH)
    messages = []
    while (message := await server.receive()) is not None:
        messages.append(message)
    return messages, bytes(stream.sent)


@hang_guarded
async def test_byte_by_byte_the_same_messages() -> None:
    """Every byte its own read, up to and through the header of a frame with an 8-byte
    length (its 64 KiB of payload then in one read)."""
    messages = [os.urandom(300), b"", os.urandom(70000)]
    small = (upgrade() + fragments(messages[0], [1, 1, 100]) + frame(PING, b"p")
             + frame(BINARY, messages[1]))
    wire = small + fragments(messages[2], [65536])
    whole, _ = await received_all(wire, [])
    one_by_one, sent = await received_all(wire, list(range(1, len(small) + 16)))
    assert whole == one_by_one == messages
    assert (PONG, b"p") in list(server_frames(sent.partition(b"\r\n\r\n")[2]))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.binary(max_size=3000),
                          st.lists(st.integers(0, 3000), max_size=6),
                          st.booleans()), min_size=1, max_size=6),
       st.lists(st.integers(1, 40000), max_size=30))
def test_any_fragmenting_and_any_reads_give_the_messages_sent(
        sent: list[tuple[bytes, list[int], bool]], cuts: list[int]) -> None:
    wire = upgrade() + b"".join(
        fragments(message, sizes) + (frame(PING, b"x") if ping else b"")
        for message, sizes, ping in sent)
    messages, out = trio.run(received_all, wire, [cut % len(wire) for cut in cuts])
    assert messages == [message for message, _, _ in sent]
    pongs = [f for f in server_frames(out.partition(b"\r\n\r\n")[2]) if f[0] == PONG]
    assert len(pongs) == sum(ping for _, _, ping in sent)


@hang_guarded
async def test_a_message_of_tiny_fragments_costs_its_payload_not_its_frame_count() -> None:
    """Rule 1: 20,000 one-byte fragments. Kept one object each (trio-websocket's way),
    they were about 55 bytes of memory apiece, 1.1 MB here; in one buffer they are the
    payload, 20 KB, beside a read's bytes."""
    count = 20_000
    wire = frame(BINARY, b"a", fin=False) + b"".join(
        frame(CONTINUATION, b"b", fin=False) for _ in range(count - 2)) + frame(
        CONTINUATION, b"c")
    stream = ScriptedStream([upgrade()] + [wire[at:at + websocket.READ_BYTES]
                                           for at in range(0, len(wire),
                                                           websocket.READ_BYTES)])
    server = WebSocketTransport(stream, "peer", path=PATH)
    tracemalloc.start()
    try:
        message = await server.receive()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message == b"a" + b"b" * (count - 2) + b"c"
    assert peak < 512 * 1024, f"{peak} bytes at the peak for a {count}-byte message"


class StepsOf(trio.abc.Instrument):
    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


@hang_guarded
async def test_a_read_of_tiny_frames_is_taken_in_steps_that_let_others_run() -> None:
    """Rule 3: one read of 9,000 one-byte frames (63 KB) is not one step of the loop."""
    count = 9000
    wire = frame(BINARY, b"a", fin=False) + b"".join(
        frame(CONTINUATION, b"b", fin=False) for _ in range(count - 2)) + frame(
        CONTINUATION, b"c")
    assert len(wire) <= websocket.READ_BYTES
    server = WebSocketTransport(ScriptedStream([upgrade(), wire]), "peer", path=PATH)
    await server._server_handshake()
    instrument = StepsOf()
    instrument.task = trio.lowlevel.current_task()
    trio.lowlevel.add_instrument(instrument)
    try:
        message = await server.receive()
    finally:
        trio.lowlevel.remove_instrument(instrument)
    assert message is not None and len(message) == count
    assert instrument.steps >= count // websocket.FRAMES_PER_STEP


# -- rule 2 ---------------------------------------------------------------------------


@hang_guarded
async def test_a_message_over_the_bound_is_closed_1009_when_its_count_passes_it() -> None:
    """The frame says a mebibyte; the server ends it at its 1,001st byte, not waiting
    for the rest, whether the bytes come in one frame or in fragments."""
    # One frame of which only 1,001 bytes are sent; then the same bytes in two fragments.
    for wire in (frame(BINARY, b"x" * 1001, declared=1 << 20),
                 fragments(b"x" * 1001, [600])):
        server, peer = await opened(max_message=1000)
        await peer.send(wire)
        assert await server.receive() is None  # without rule 2 it waits for the rest
        (opcode, payload), *_ = server_frames(await peer.read_to_end_after(server))
        assert opcode == CLOSE and close_code(payload) == websocket.CLOSE_MESSAGE_TOO_BIG


@hang_guarded
async def test_a_message_at_the_bound_is_taken() -> None:
    server, peer = await opened(max_message=1000)
    await peer.send(fragments(b"y" * 1000, [999]))
    assert await server.receive() == b"y" * 1000


# -- rules 4 and 5 --------------------------------------------------------------------


@hang_guarded
async def test_a_close_is_answered_and_ends_the_stream() -> None:
    server, peer = await opened()
    await peer.send(frame(BINARY, b"last") + frame(CLOSE, struct.pack("!H", 1001)))
    assert await server.receive() == b"last"
    assert await server.receive() is None
    assert await server.receive() is None  # and stays ended
    ((opcode, payload),) = server_frames(await peer.read_to_end_after(server))
    assert opcode == CLOSE and close_code(payload) == 1001
    with pytest.raises(trio.BrokenResourceError):
        await server.send([b"too late"])


@pytest.mark.parametrize(("bad", "code"), [
    (frame(BINARY, b"unmasked", mask=False), 1002),
    (frame(0x3, b"reserved opcode"), 1002),
    (frame(CONTINUATION, b"continues nothing"), 1002),
    (frame(PING, b"p" * 126), 1002),  # a control frame over 125 bytes
])
@hang_guarded
async def test_a_frame_wsproto_cannot_parse_ends_the_connection_with_its_code(
        bad: bytes, code: int) -> None:
    server, peer = await opened()
    await peer.send(bad)
    assert await server.receive() is None
    (opcode, payload), *_ = server_frames(await peer.read_to_end_after(server))
    assert opcode == CLOSE and close_code(payload) == code


@hang_guarded
async def test_a_text_message_is_an_error() -> None:
    server, peer = await opened()
    await peer.send(frame(TEXT, b"not a packet"))
    with pytest.raises(TextMessageError):
        await server.receive()


@hang_guarded
async def test_the_peer_ending_its_stream_ends_the_receive() -> None:
    server, peer = await opened()
    await peer.send(frame(BINARY, b"half", fin=False))
    await peer.stream.send_eof()
    assert await server.receive() is None


# -- rule 6 ---------------------------------------------------------------------------


@pytest.mark.parametrize(("request_bytes", "status", "said"), [
    (upgrade("/elsewhere"), b"404", b"no NNRP endpoint at this path"),
    (b"GET /nnrp HTTP/1.1\r\nHost: gateway\r\n\r\n", b"400", b"not a WebSocket upgrade"),
    (b"NOT HTTP AT ALL\r\n\r\n", b"400", b"not a WebSocket upgrade"),
])
@hang_guarded
async def test_a_request_that_is_not_ours_gets_an_http_answer_and_nothing_more(
        request_bytes: bytes, status: bytes, said: bytes) -> None:
    server, peer = await pair()
    await peer.send(request_bytes)
    assert await server.receive() is None
    with pytest.raises(trio.BrokenResourceError):
        await server.send([b"never framed"])
    head = await peer.read_to_end_after(server)
    assert head.split(b" ")[1] == status and said in head


@hang_guarded
async def test_a_query_string_is_the_same_path_and_no_extension_is_accepted() -> None:
    server, peer = await pair()
    await peer.send(upgrade(PATH + "?token=1",
                            "Sec-WebSocket-Extensions: permessage-deflate"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server._server_handshake)
        head = await peer.read_head()
    assert head.startswith(b"HTTP/1.1 101 ")
    assert b"sec-websocket-extensions" not in head.lower()


@hang_guarded
async def test_a_refusal_before_any_read_runs_the_handshake_first() -> None:
    """The server's refusal path sends before it receives (gateway/server/_server.py
    ``_refuse``): the handshake runs, then the packet."""
    server, peer = await pair()
    await peer.send(upgrade())
    await server.send([b"busy"])
    assert (await peer.read_head()).startswith(b"HTTP/1.1 101 ")
    (opcode, payload), *_ = server_frames(await peer.read_to_end_after(server, answer=True))
    assert (opcode, payload) == (BINARY, b"busy")


# -- rule 8 ---------------------------------------------------------------------------


@hang_guarded
async def test_aclose_waits_for_the_peers_close_while_a_reader_waits_too() -> None:
    """The connection's reader is inside ``receive`` when the connection closes: the
    peer's answering Close reaches that reader, which ends, and ``aclose`` with it."""
    server, peer = await opened()
    async with trio.open_nursery() as nursery:
        ended = trio.Event()

        async def reader() -> None:
            assert await server.receive() is None
            ended.set()

        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        closing = trio.Event()

        async def close() -> None:
            await server.aclose()
            closing.set()

        nursery.start_soon(close)
        data = await peer.stream.receive_some(100)
        assert next(iter(server_frames(data)))[0] == CLOSE
        assert not closing.is_set()  # it waits for our answer
        await peer.send(frame(CLOSE, struct.pack("!H", 1000)))
        await ended.wait()
        await closing.wait()
    assert await peer.stream.receive_some(100) == b""


@hang_guarded
async def test_aclose_gives_up_on_a_silent_peer() -> None:
    """A peer that never answers our Close: the socket closes anyway, after the
    bound (a hang guard ten times it)."""
    server, peer = await opened()
    with trio.fail_after(websocket.CLOSE_TIMEOUT * 10):  # tighter than the hang guard
        await server.aclose()
    assert next(iter(server_frames(await peer.read_to_end())))[0] == CLOSE


# -- the client side ------------------------------------------------------------------


@hang_guarded
async def test_our_client_against_trio_websockets_server(nursery: trio.Nursery) -> None:
    import trio_websocket

    big = os.urandom(3 << 20)  # over trio-websocket's default 1 MiB: set it higher

    async def echo(request: trio_websocket.WebSocketRequest) -> None:
        if request.path != PATH:
            await request.reject(404, body=b"not here")
            return
        ws = await request.accept()
        while True:
            try:
                message = await ws.get_message()
            except trio_websocket.ConnectionClosed:
                return
            await ws.send_message(message)

    server = await nursery.start(lambda task_status: trio_websocket.serve_websocket(
        echo, "127.0.0.1", 0, None, max_message_size=8 << 20, task_status=task_status))
    port = server.port
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    client = await open_websocket_client(stream, f"127.0.0.1:{port}", PATH, "echo")
    await client.send([b"one", big, b""])
    assert [await client.receive() for _ in range(3)] == [b"one", big, b""]
    await client.aclose()

    stream = await trio.open_tcp_stream("127.0.0.1", port)
    with pytest.raises(WebSocketRefused) as refused:
        await open_websocket_client(stream, f"127.0.0.1:{port}", "/elsewhere", "echo")
    assert refused.value.status == 404 and refused.value.body == b"not here"
    assert "HTTP 404: not here" in str(refused.value)
    await stream.aclose()


@hang_guarded
async def test_our_client_and_our_server_carry_big_messages_both_ways() -> None:
    a, b = socketpair()
    server = WebSocketTransport(a, "client", path=PATH)
    big = os.urandom(5 << 20)
    async with trio.open_nursery() as nursery:
        async def serve() -> None:
            while (message := await server.receive()) is not None:
                await server.send([bytes(message[::-1])])

        nursery.start_soon(serve)
        client = await open_websocket_client(b, "gateway", PATH, "server")
        await client.send([big, b"ab"])
        assert await client.receive() == big[::-1]
        assert await client.receive() == b"ba"
        await client.aclose()  # the server's reader sees the Close and answers it


# -- what a fresh-eyes review found ------------------------------------------------------


@hang_guarded
async def test_a_ping_after_our_close_is_read_not_answered_and_aclose_still_closes() -> None:
    """RFC 6455 section 5.5.1: nothing is sent after a Close. wsproto refuses a Pong then
    (LocalProtocolError), which once escaped ``aclose``, left the socket open and ended
    the whole server's connection nursery."""
    server, peer = await opened()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.aclose)
        data = await peer.stream.receive_some(100)
        assert next(iter(server_frames(data)))[0] == CLOSE
        await peer.send(frame(PING, b"late") * 3 + frame(CLOSE, struct.pack("!H", 1000)))
    assert list(server_frames(await peer.read_to_end())) == []  # no Pong, then the end


@hang_guarded
async def test_a_host_header_that_is_not_a_name_is_a_400_not_a_crash() -> None:
    """wsproto decodes Host as IDNA: a bad one raised UnicodeError out of the handshake."""
    for host in (b"\xff", b"xn--zz!"):
        server, peer = await pair()
        await peer.send(upgrade().replace(b"Host: gateway", b"Host: " + host))
        assert await server.receive() is None
        assert (await peer.read_to_end_after(server)).startswith(b"HTTP/1.1 400 ")


@hang_guarded
async def test_a_version_wsproto_does_not_speak_is_answered_426_with_the_one_it_does() -> None:
    server, peer = await pair()
    await peer.send(upgrade().replace(b"Sec-WebSocket-Version: 13", b"Sec-WebSocket-Version: 8"))
    assert await server.receive() is None
    answer = await peer.read_to_end_after(server)
    assert answer.startswith(b"HTTP/1.1 426 Upgrade Required")
    assert b"Sec-WebSocket-Version: 13" in answer
    assert b"unsupported WebSocket version" in answer


@hang_guarded
async def test_a_receive_cancelled_between_frames_loses_none_of_them() -> None:
    """A cancel at rule 3's checkpoint (256 frames in) then a receive again: the message
    is whole. The checkpoint once came after an event was taken, and that one was lost."""
    message = os.urandom(300)
    wire = upgrade() + frame(BINARY, b"first") + fragments(message, [1] * 299)
    server = WebSocketTransport(ScriptedStream([wire]), "peer", path=PATH)
    assert await server.receive() == b"first"  # the rest waits in wsproto, parsed lazily
    with trio.CancelScope() as scope:
        scope.cancel()
        await server.receive()
    assert scope.cancelled_caught  # cancelled at the checkpoint, after 256 frames
    assert await server.receive() == message


@hang_guarded
async def test_a_write_cut_short_frames_nothing_after_it() -> None:
    """A send cancelled inside its write may leave half a frame on the wire: no later
    frame (not even aclose's Close) follows it."""
    server, peer = await opened()
    big = os.urandom(8 << 20)  # more than the socket pair buffers: the write blocks
    with trio.move_on_after(0.2):
        await server.send([big])
    with pytest.raises(trio.BrokenResourceError):
        await server.send([b"after"])
    async with trio.open_nursery() as nursery:  # read while it closes: room for a Close
        nursery.start_soon(peer.read_to_end)
        await server.aclose()
    wire = bytes(peer.received)
    # The binary frame's head (an 8-byte length), then part of its payload: nothing
    # framed after the cut, not even a Close.
    assert wire[:2] == b"\x82\x7f" and len(wire) < 10 + len(big)
    assert big.startswith(wire[10:])


class WritesFail(ScriptedStream):
    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        raise trio.BrokenResourceError("the peer reset")


@hang_guarded
async def test_a_pong_that_cannot_be_written_ends_the_stream_quietly() -> None:
    """As a broken read does: receive returns None, raising nothing (the connection
    logged an unexpected BrokenResourceError as a crash)."""
    server = WebSocketTransport(WritesFail([frame(PING, b"p") + frame(BINARY, b"never")]),
                                "peer", client=_opened_client_side())
    assert await server.receive() is None
    with pytest.raises(trio.BrokenResourceError):
        await server.send([b"after"])


def _opened_client_side() -> Any:
    """A wsproto connection past its handshake, the server's side of it."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Request

    client, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="gateway", target=PATH)))
    next(event for event in server.events() if isinstance(event, Request))
    client.receive_data(server.send(AcceptConnection()))
    return server


@hang_guarded
async def test_the_clients_host_header_brackets_an_ipv6_address() -> None:
    """RFC 7230 section 5.4: ``[::1]:port``; strict proxies refuse ``::1:port``."""
    from gateway.transport import connect

    try:
        listener = (await trio.open_tcp_listeners(0, host="::1"))[0]
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = listener.socket.getsockname()[1]
    heads: list[bytes] = []

    async def answer_nothing(stream: trio.SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += await stream.receive_some(4096)
        heads.append(head)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, answer_nothing, [listener])
        with pytest.raises(WebSocketRefused):
            await connect(f"ws://[::1]:{port}/nnrp", nursery)
        nursery.cancel_scope.cancel()
    assert f"host: [::1]:{port}\r\n".encode() in heads[0].lower()


class WritesHang(ScriptedStream):
    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.sleep_forever()


@hang_guarded
async def test_a_handshake_whose_answer_is_cut_still_reads_the_frames_after_it() -> None:
    """The accept's write cancelled: the handshake is over all the same (wsproto says
    so), so the client's frames are read as frames, not as a second request that never
    comes, and nothing is framed after the cut."""
    server = WebSocketTransport(WritesHang([upgrade() + frame(BINARY, b"first")]), "peer",
                                path=PATH)
    with trio.move_on_after(0.1):
        await server.receive()
    assert await server.receive() == b"first"
    with pytest.raises(trio.BrokenResourceError):
        await server.send([b"after"])


class WritesRaise(ScriptedStream):
    closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        raise RuntimeError("a stream's own bug")

    async def aclose(self) -> None:
        self.closed = True  # first: aclose_forcefully calls it already cancelled
        await trio.lowlevel.checkpoint()


@hang_guarded
async def test_aclose_closes_the_socket_whatever_its_close_frame_raised() -> None:
    stream = WritesRaise([])
    server = WebSocketTransport(stream, "peer", client=_opened_client_side())
    with pytest.raises(RuntimeError):
        await server.aclose()
    assert stream.closed
