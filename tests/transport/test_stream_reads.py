"""A stream transport's reads (gateway/transport/_carriers.py): the usual size, and the
big reads a big packet's arrival asks for (``awaited``, ``nnrp.Decoder.awaited``)."""

from __future__ import annotations

import socket

import trio

from gateway import nnrp
from gateway.transport._carriers import BIG_READ, READ_SIZE, StreamTransport


async def _transport_with_buffered(size: int) -> tuple[StreamTransport, socket.socket]:
    ours, theirs = socket.socketpair()
    for sock in (ours, theirs):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    theirs.sendall(bytes(size))  # all of it buffered on our side before any read
    return StreamTransport(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), "ipc",
                           "test"), theirs


async def test_a_read_takes_what_a_big_packet_awaits_up_to_big_read() -> None:
    transport, theirs = await _transport_with_buffered(3 * READ_SIZE)
    with theirs:
        assert await transport.receive() == bytes(READ_SIZE)  # the usual read
        assert await transport.receive(awaited=10 << 20) == bytes(2 * READ_SIZE)
        await transport.aclose()
    transport, theirs = await _transport_with_buffered(BIG_READ + READ_SIZE)
    with theirs:
        assert await transport.receive(awaited=10 << 20) == bytes(BIG_READ)
        await transport.aclose()


def test_the_decoder_says_what_the_big_packet_it_fills_awaits() -> None:
    body = bytes(nnrp.VIEW_MIN_BODY)
    packet = nnrp.encode(nnrp.Packet(nnrp.FrameSubmit(
        operation_id=1, payload_kind_bitmap=0x10, payload_frame_count=1),
        session_id=3, frame_id=1, body=body))
    decoder = nnrp.Decoder()
    assert decoder.awaited == 0
    decoder.feed(packet[:1000])
    assert decoder.awaited == len(packet) - 1000
    assert len(decoder.feed(packet[1000:])) == 1 and decoder.awaited == 0
    decoder.feed(packet[:10])  # not even a header: no packet to fill yet
    assert decoder.awaited == 0
