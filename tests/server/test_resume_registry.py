"""The resumable sessions' I/O side alone (gateway/server/_resume.py): what it logs."""

from __future__ import annotations

import structlog
import trio
import trio.testing

from gateway.server._resume import RefusalLog


async def test_refused_resumes_are_logged_at_most_once_a_second_with_a_count(
        autojump_clock: trio.testing.MockClock) -> None:
    """Issue 34, finding 12: a client guessing tokens wrote a log line per guess (about
    5,900 a second on one connection)."""
    refusals = RefusalLog()
    with structlog.testing.capture_logs() as logs:
        for _ in range(1000):
            refusals.refused(peer="192.0.2.9:40000")
        await trio.sleep(1.0)
        refusals.refused(peer="192.0.2.9:40000")
        for _ in range(5):
            refusals.refused(peer="192.0.2.9:40000")
    lines = [line for line in logs if line["event"] == "resume refused"]
    assert [line["refusals"] for line in lines] == [1, 1000]
