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


async def test_an_operation_follows_its_session_off_a_connection_that_no_longer_reads() -> None:
    """A review of issue 34: after SESSION_MIGRATE away from a half-open connection, an
    operation waiting for room kept waiting on the old connection's full buffer (up to
    the write timeout). It looks again where its session is now."""
    from gateway import nnrp
    from gateway.nnrp._server_operation import ServerOperation
    from gateway.server._outbox import Outbox
    from gateway.server._session import Session
    from gateway.server._stats import ServerStats

    class Link:
        def __init__(self, outbox: Outbox) -> None:
            self.outbox = outbox
            self.protocol = nnrp.ServerConnection()
            self.flow_changed = trio.Event()
            self.operations = 0

        def count_operations(self, change: int) -> None:
            self.operations += change

    async def never(operation: object) -> None:
        raise AssertionError("no operation runs here")

    protocol = nnrp.ServerSession(1, nnrp.ServerConfig(), max_in_flight=4)
    protocol.operations[7] = ServerOperation(7, 1)
    async with trio.open_nursery() as nursery:
        session = Session(protocol, nursery, never, None, ServerStats())
        stuck = Outbox(high_water=10)  # a peer that reads nothing: it never drains
        stuck.put(b"x" * 100)
        old = Link(stuck)
        protocol.connection = old.protocol
        session.attach(old)
        got_room = trio.Event()

        async def produce() -> None:
            await session.port(7).room()
            got_room.set()

        nursery.start_soon(produce)
        # The producer is parked on the old connection's full outbox before the session
        # moves: the state itself, not a 0.1 s sleep taken to be long enough.
        await trio.testing.wait_all_tasks_blocked()
        assert not got_room.is_set()
        session.detach()  # SESSION_MIGRATE: take_session, then the new connection's attach
        new = Link(Outbox())
        protocol.connection = new.protocol
        session.attach(new)
        with trio.fail_after(2):
            await got_room.wait()
