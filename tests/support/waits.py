"""Waiting for a state, never for the machine's speed (issue 28).

A test that sleeps "long enough" for something to happen passes on a quiet machine and
fails on a loaded one (or passes without testing anything). These wait for the condition
itself: ``until`` in a trio test, ``wait_for`` in a thread or beside a process. Both poll,
for conditions whose owner (a server's counters, a replay's record, a process's log)
offers nothing to wait on; where an event exists, wait on it instead.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import trio

#: Between two looks at a polled condition: short against any timeout, long against a
#: scheduler tick, so a poll costs the loaded host little.
POLL_INTERVAL = 0.01


async def until(condition: Callable[[], object]) -> None:
    """Return once ``condition()`` is true. The caller bounds it (``trio.fail_after``),
    as every wait in trio is bounded."""
    while not condition():  # noqa: ASYNC110 - no event exists for these conditions
        await trio.sleep(POLL_INTERVAL)


async def until_async(condition: Callable[[], Awaitable[object]]) -> None:
    """``until`` for a condition that takes a request to read (an admin endpoint's
    status): awaited again, after a pause, until it is true."""
    while not await condition():  # noqa: ASYNC110 - a request, no event, tells us
        await trio.sleep(POLL_INTERVAL * 5)


async def until_steady(value: Callable[[], object], steady_for: float) -> None:
    """Return once ``value()`` has not changed for ``steady_for`` seconds: a count that
    has stopped moving (a writer blocked by backpressure, a stalled stream). The window
    is the definition of "stopped"; how long it takes to stop is not waited for by a
    guess. The caller bounds it (``trio.fail_after``)."""
    last, since = value(), trio.current_time()
    while trio.current_time() - since < steady_for:
        await trio.sleep(POLL_INTERVAL)
        now = value()
        if now != last:
            last, since = now, trio.current_time()


def wait_for(condition: Callable[[], object], timeout: float = 20.0, what: str = "") -> None:
    """``until`` for code outside trio (a thread, a test driving processes): raises
    AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(POLL_INTERVAL * 5)
