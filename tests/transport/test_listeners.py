"""Listening sockets (gateway/transport/_listeners.py): which accept failures end a listener
for good, and the shared listener groups of a pod's workers (one socket each in one
SO_REUSEPORT group, released and renewed; QUIC's kept; a unix socket shared)."""

from __future__ import annotations

import errno
import socket

import pytest
import trio

from gateway.transport import ListenError, accept_failure_is_terminal, bind_shared


@pytest.mark.parametrize(("error", "terminal"), [
    (OSError(errno.EMFILE, "Too many open files"), False),
    (OSError(errno.ENFILE, "File table overflow"), False),
    (OSError(errno.ENOBUFS, "No buffer space available"), False),
    (OSError(errno.ENOMEM, "Cannot allocate memory"), False),
    (OSError(errno.EINVAL, "Invalid argument"), True),  # a shut-down listening socket
    (OSError(errno.EBADF, "Bad file descriptor"), True),
    (OSError(errno.ENOTSOCK, "Socket operation on non-socket"), True),
    (trio.ClosedResourceError(), True),
])
def test_which_accept_failures_are_terminal(error: BaseException, terminal: bool) -> None:
    assert accept_failure_is_terminal(error) is terminal


async def test_a_port_in_use_is_an_error_with_workers_too() -> None:
    group = await bind_shared("tcp://127.0.0.1:0", 2)
    port = group.per_worker[0][0].getsockname()[1]
    try:
        # Each of these would join the group silently with SO_REUSEPORT alone.
        for clash in (f"tcp://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/nnrp"):
            with pytest.raises(ListenError, match="in use") as raised:
                await bind_shared(clash, 2)
            assert str(raised.value).startswith(f"cannot listen on {clash}: ")
            assert isinstance(raised.value.__cause__, OSError)
            assert raised.value.__cause__.errno == errno.EADDRINUSE
    finally:
        group.close()
    # Closed, the port is free again (TIME_WAIT or not).
    again = await bind_shared(f"tcp://127.0.0.1:{port}", 2)
    again.close()


async def test_each_worker_has_its_own_socket_in_one_group_and_a_released_one_renews(
        ) -> None:
    group = await bind_shared("tcp://127.0.0.1:0", 3)
    try:
        ports = {sockets[0].getsockname()[1] for sockets in group.per_worker}
        assert len(ports) == 1 and len({id(s[0]) for s in group.per_worker}) == 3
        old = group.per_worker[1][0]
        group.release(1)
        assert old.fileno() == -1
        group.renew(1)
        assert group.per_worker[1][0].getsockname()[1] in ports
        # The renewed socket is in the group: a client connects and it can accept.
        with socket.create_connection(("127.0.0.1", ports.pop()), timeout=2):
            pass
    finally:
        group.close()
    quic = await bind_shared("quic://127.0.0.1:0", 2)
    try:
        kept = quic.per_worker[0][0]
        quic.release(0)  # QUIC sockets stay: the hash must not move established flows
        assert kept.fileno() != -1
        buffer = kept.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        assert buffer > 256 * 1024  # the listener's own receive buffer, as one process
    finally:
        quic.close()
    unix_group = await bind_shared("unix:///tmp/nnrp-test-shared.sock", 2)
    try:
        assert unix_group.per_worker[0] is unix_group.per_worker[1]
    finally:
        unix_group.close()
