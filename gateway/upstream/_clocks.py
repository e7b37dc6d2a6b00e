"""``ChunkStream.clocks``, apart: an ``asynccontextmanager`` is an async generator, which
mypyc cannot compile, and ``_stream`` is compiled in the compiled build
(gateway/compiled.py rule 1). This module stays interpreted; it runs once per stream, and
reads and writes the stream's deadlines as ``_stream``'s docstring tells (one watchdog
task per stream; a read only stamps its deadline).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import trio

from ._errors import UpstreamTimeout


class Clocked(Protocol):
    """The deadlines a ``ChunkStream`` keeps for its clocks (trio's clock, seconds)."""

    _first_chunk_timeout: float
    _idle_timeout: float
    _first_chunk_deadline: float
    _read_deadline: float  # the pending read's; inf while nothing is being read
    _carried_deadline: float | None  # after a read of keep-alive comments only
    _clocked: bool
    first_byte_at: float | None


@asynccontextmanager
async def stream_clocks(stream: Clocked) -> AsyncIterator[None]:
    """``ChunkStream.clocks``: the first-chunk and idle clocks around the consumer's
    iteration; a read pending at its deadline ends the block with ``UpstreamTimeout``."""
    expired = False

    async def watchdog(scope: trio.CancelScope) -> None:
        nonlocal expired
        while True:
            now = trio.current_time()
            pending = stream._read_deadline
            if pending <= now:
                # The read may have been woken with vLLM's bytes in this same pass of
                # the scheduler without having run yet (a deadline scope around the
                # read would not fire then either): let it run first. Every task made
                # runnable before now runs before this one runs again.
                await trio.lowlevel.cancel_shielded_checkpoint()
                if stream._read_deadline == pending:  # the same read, still pending
                    expired = True
                    scope.cancel()
                    return
                continue
            # Never sleep past a deadline: the pending read's, the first read's (it
            # may begin any time), or now + idle, before which no read begun from
            # now on can end.
            wake = min(now + stream._idle_timeout, stream._read_deadline)
            if stream.first_byte_at is None and stream._first_chunk_deadline > now:
                wake = min(wake, stream._first_chunk_deadline)
            if stream._carried_deadline is not None and stream._carried_deadline > now:
                wake = min(wake, stream._carried_deadline)
            await trio.sleep_until(wake)

    stream._clocked = True
    leaf: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watchdog, nursery.cancel_scope)
            try:
                yield
            except Exception as error:
                # The consumer's error (an upstream error, a bug) stays out of the
                # nursery: there it would cancel the watchdog, whose Cancelled (context:
                # the error; traceback: trio's frames, holding the nursery's pending
                # errors) made a cycle with it, which held the error's traceback (the
                # handler's frames: the operation, its request body, a 64 MiB image)
                # until the cyclic collector ran. Raised below, once the watchdog is
                # done. A Cancelled goes through the nursery, as trio wants it.
                leaf = error
            nursery.cancel_scope.cancel()  # done: the watchdog too
    except BaseExceptionGroup as group:
        # The watchdog raises nothing but an outer scope's Cancelled, so the group
        # holds what the consumer raised (an outer cancel, a KeyboardInterrupt) and
        # perhaps that Cancelled: the caller sees the consumer's exception unwrapped,
        # or the consumer's error caught above. A Cancelled left out beside it is not
        # lost: cancellation is level-triggered and the next checkpoint in the
        # cancelled scope delivers it again.
        if leaf is None:
            leaf = _the_one_error(group)
            if leaf is None:
                raise
        elif group.split(trio.Cancelled)[1] is not None:
            # Not only the watchdog's Cancelled (a bug of its own): never dropped, and
            # raised beside the consumer's error, as the nursery would have.
            mine, leaf = leaf, None
            try:
                raise BaseExceptionGroup("the stream's clocks failed beside its reader",
                                         [mine, *group.exceptions])
            finally:
                del mine
    if leaf is not None:
        # Raised here, not in the except clause, and not kept by this frame: raised
        # there, the leaf's context was the group holding it, and this frame (in its
        # traceback) held both: a cycle that kept the operation and its request body
        # (a 64 MiB image) until the cyclic collector ran.
        try:
            raise leaf  # its own cause and context kept, the group left out
        finally:
            del leaf
    if expired:
        if stream.first_byte_at is None:
            raise UpstreamTimeout("first_chunk", stream._first_chunk_timeout)
        raise UpstreamTimeout("idle", stream._idle_timeout)


def _the_one_error(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The group's one error besides Cancelled (or its one Cancelled); None if more."""
    _, others = group.split(trio.Cancelled)
    leaves = group.exceptions if others is None else others.exceptions
    return leaves[0] if len(leaves) == 1 else None
