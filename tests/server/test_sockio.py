"""gateway._sockio on real socket pairs: the per-event read and write paths keep trio's
guarantees (a checkpoint per read, nothing lost to a cancel, closed sockets fail)."""

from __future__ import annotations

import errno
import socket

import pytest
import trio
import trio.testing

from gateway import _sockio


def pair() -> tuple[trio.socket.SocketType, trio.socket.SocketType]:
    a, b = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return a, b


@pytest.mark.parametrize("likely_empty", [False, True])
async def test_a_read_takes_what_is_there_or_waits_for_it(likely_empty: bool) -> None:
    a, b = pair()
    with a, b:
        await b.send(b"ready")
        assert await _sockio.receive_some(a, 100, likely_empty=likely_empty) == b"ready"
        got: list[bytes] = []
        async with trio.open_nursery() as nursery:
            async def read() -> None:
                got.append(await _sockio.receive_some(a, 3, likely_empty=likely_empty))

            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            await b.send(b"later")
        assert got == [b"lat"]
        assert await _sockio.receive_some(a, 100) == b"er"
        b.close()
        assert await _sockio.receive_some(a, 100, likely_empty=likely_empty) == b""


async def test_every_read_is_a_checkpoint_even_with_data_ready() -> None:
    a, b = pair()
    with a, b:
        await b.send(b"x" * 10)
        with trio.CancelScope() as scope:
            scope.cancel()
            await _sockio.receive_some(a, 4)
        assert scope.cancelled_caught
        # The cancel came before the read: nothing was taken from the socket.
        assert await _sockio.receive_some(a, 100) == b"x" * 10
        await b.send(b"y")
        with trio.testing.assert_checkpoints():
            assert await _sockio.receive_some(a, 100) == b"y"


async def test_a_cancelled_wait_loses_nothing() -> None:
    a, b = pair()
    with a, b:
        with trio.move_on_after(0.05) as scope:
            await _sockio.receive_some(a, 100, likely_empty=True)
        assert scope.cancelled_caught
        await b.send(b"kept")
        assert await _sockio.receive_some(a, 100) == b"kept"


async def test_a_closed_socket_fails_as_an_os_error_or_a_closed_resource() -> None:
    a, b = pair()
    with b:
        a.close()
        with pytest.raises(OSError, match=r"closed|Bad file descriptor") as closed:
            await _sockio.receive_some(a, 100, likely_empty=True)
        assert closed.value.errno == errno.EBADF
        with pytest.raises(OSError, match="Bad file descriptor"):
            await _sockio.receive_some(a, 100)
        with pytest.raises(OSError, match="Bad file descriptor"):
            _sockio.send_now(a, b"x")
    c, d = pair()
    with c, d:
        async with trio.open_nursery() as nursery:
            async def close_soon() -> None:
                await trio.testing.wait_all_tasks_blocked()
                c.close()  # an abort from another task while the read waits

            nursery.start_soon(close_soon)
            with pytest.raises(trio.ClosedResourceError):
                await _sockio.receive_some(c, 100, likely_empty=True)


async def test_a_write_never_waits_and_says_what_the_kernel_took() -> None:
    a, b = pair()
    with a, b:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        chunk = b"z" * 65536
        sent = [_sockio.send_now(a, chunk) for _ in range(64)]
        assert sent[0] > 0
        assert sent[-1] == 0  # full: nothing taken, no wait
        received = bytearray()
        while len(received) < sum(sent):
            received += await b.recv(1 << 20)
        assert bytes(received) == b"z" * sum(sent)
        b.close()
        with pytest.raises(OSError, match=r"pipe|reset") as broken:
            _sockio.send_now(a, b"after")
        assert broken.value.errno in (errno.EPIPE, errno.ECONNRESET)
