"""The log lines a client could multiply at will (gateway/server/_stats.py ``Notice``)."""

from __future__ import annotations

import structlog
import trio
import trio.testing

from gateway.server._stats import Notice


async def test_refused_resumes_are_logged_at_most_once_a_second_with_a_count(
        autojump_clock: trio.testing.MockClock) -> None:
    """Issue 34, finding 12: a client guessing tokens wrote a log line per guess (about
    5,900 a second on one connection)."""
    refusals = Notice("resume refused")
    with structlog.testing.capture_logs() as logs:
        for _ in range(1000):
            refusals.note(peer="192.0.2.9:40000")
        await trio.sleep(1.0)
        refusals.note(peer="192.0.2.9:40000")
        for _ in range(5):
            refusals.note(peer="192.0.2.9:40000")
    lines = [line for line in logs if line["event"] == "resume refused"]
    assert [line["count"] for line in lines] == [1, 1000]
