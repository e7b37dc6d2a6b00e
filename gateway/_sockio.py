"""Socket reads and writes for the per-event paths, without trio's per-call layers.

A streamed token costs the gateway one read of vLLM's socket and one write to the
client's. Through ``trio.SocketStream`` each of those passes a conflict
detector, a method wrapper, a nonblocking helper and its context manager, and a
successful write yields to the scheduler once more; on this project's measurements a
lone event's path is mostly such layers (docs/benchmarks.md, "Fewer passes per event").
These two functions keep trio's guarantees with the least in between:

* ``receive_some`` is a checkpoint, as every trio read is: it either parks in
  ``wait_readable`` or, when it reads without waiting, checks for a cancel before and
  yields after (a cancel then never loses bytes already read, as in trio). A caller
  that knows the socket is probably empty (its last read was short: vLLM sends one
  event per write, and they are read as they come) says ``likely_empty`` and skips the
  read that would only fail with EAGAIN.
* ``send_now`` never waits and is not a checkpoint: it hands the kernel what fits and
  says how much that was, for a caller that owns ordering (the connection's outbox,
  which queues the rest for its writer task).

Both use the socket's descriptor as trio's socket holds it; once trio has closed the
socket its descriptor reads -1, so a late call fails with ``OSError`` (EBADF), never
on a descriptor since reused.
"""

from __future__ import annotations

import errno
import os

import trio


async def receive_some(sock: trio.socket.SocketType, max_bytes: int, *,
                       likely_empty: bool = False) -> bytes:
    """Up to ``max_bytes`` from ``sock`` (b"" at end of stream), waiting as needed.

    Raises ``OSError`` for a broken or closed socket and ``trio.ClosedResourceError``
    when it is closed while this waits.
    """
    if not likely_empty:
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            data = os.read(sock.fileno(), max_bytes)
        except BlockingIOError:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return data
    while True:
        if sock.fileno() == -1:  # closed (an abort): trio would not wait on it
            raise OSError(errno.EBADF, "socket is closed")
        await trio.lowlevel.wait_readable(sock)
        try:
            return os.read(sock.fileno(), max_bytes)
        except BlockingIOError:  # a spurious wake-up: wait again
            continue


def send_now(sock: trio.socket.SocketType, data: bytes | memoryview) -> int:
    """Write what the kernel takes of ``data`` now; 0 when its buffer is full.

    Raises ``OSError`` for a broken or closed socket.
    """
    try:
        return os.write(sock.fileno(), data)
    except BlockingIOError:
        return 0
