"""A session's operations (gateway/server/_session.py): its drain, its opaque id, and the
real port's fast-emit test (``_Port.ready``) around a sans-IO ServerConnection."""

from __future__ import annotations

import math

import trio
import trio.testing

from gateway import nnrp
from gateway.nnrp import DropReason
from gateway.profile import EndCause
from gateway.server import Operation, ServerStats, Session
from gateway.server._outbox import Outbox
from tests.support.ports import RecordingPort, operation


def protocol_session() -> nnrp.ServerSession:
    return nnrp.ServerSession(1, nnrp.ServerConfig(), max_in_flight=8)


async def test_a_session_drain_lets_work_finish_then_ends_the_rest(
        autojump_clock: trio.testing.MockClock) -> None:
    # Virtual time: the quick operation's 0.05 s always fits in the 0.2 s grace.
    ended: list[Operation] = []
    stats = ServerStats()

    async def handler(op: Operation) -> None:
        if op.operation_id == 1:
            await trio.sleep(0.05)  # quick work, well inside the grace (virtual time)
            await op.close(EndCause.COMPLETED, b"quick")
        else:
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        session = Session(protocol_session(), nursery, handler, ended.append, stats)
        ports = [RecordingPort(), RecordingPort()]
        for number, port in enumerate(ports, 1):
            session.start(operation(port, number))
        assert stats.inflight == 0  # not started until the nursery runs them
        await trio.testing.wait_all_tasks_blocked()
        assert stats.inflight == 2
        with trio.fail_after(2):
            await session.drain(grace=0.2)
    assert [op.operation_id for op in ended] == [1, 2]
    assert ports[0].sent == [("result", 200, b"quick")]
    assert ports[1].sent == [("drop", DropReason.TRANSPORT_CLOSED, b"transport_closed")]
    assert session.operations == {}
    assert stats.inflight == 0


async def test_an_idle_session_drains_at_once() -> None:
    async with trio.open_nursery() as nursery:
        async def nothing(op: Operation) -> None:
            await trio.lowlevel.checkpoint()

        session = Session(protocol_session(), nursery, nothing, None, ServerStats())
        with trio.fail_after(1):
            await session.drain(grace=math.inf)


async def test_a_session_gives_its_operations_one_opaque_id_of_its_own() -> None:
    # Session ids are numbered from 1 in every gateway: both of these are session 1. The
    # uid is what tells them apart (X-Session-ID upstream), the same for every operation.
    async with trio.open_nursery() as nursery:
        async def nothing(op: Operation) -> None:
            await op.close(EndCause.COMPLETED, b"")

        first, second = (Session(protocol_session(), nursery, nothing, None, ServerStats())
                         for _ in range(2))
        assert first.session_id == second.session_id == 1
        started = [operation(RecordingPort(), number) for number in (1, 2, 3)]
        for op in started[:2]:
            assert op.session_uid is None
            first.start(op)
        second.start(started[2])
        with trio.fail_after(1):
            await first.drain()
            await second.drain()
    assert len(first.uid) == 16 and int(first.uid, 16) >= 0
    assert [op.session_uid for op in started] == [first.uid, first.uid, second.uid]
    assert first.uid != second.uid



class _Link:
    """What a session needs of its connection, around a real ServerConnection."""

    def __init__(self, protocol: nnrp.ServerConnection, outbox: Outbox) -> None:
        self.protocol = protocol
        self.outbox = outbox
        self.flow_changed = trio.Event()
        self.operations = 1

    def count_operations(self, change: int) -> None:
        pass


async def test_the_real_port_is_ready_only_when_no_wait_would_block() -> None:
    """``_Port.ready`` (issue 25's fast emit) says yes only attached and live, with room in
    the outbox, no flow window and no SUPERSEDE waiting: each state that makes ``room`` or
    ``credit`` wait, or the supersede rule apply, makes it say no."""
    from tests.support.controls import connected, submit
    from tests.support.wire import pk

    async def port_in(state: str) -> bool:
        protocol = connected(max_in_flight=8)
        protocol.receive_data(submit(1, 1) + submit(2, 2))
        outbox = Outbox(high_water=100, low_water=10)
        async with trio.open_nursery() as nursery:
            server_session = protocol.session(1)
            assert server_session is not None
            session = Session(server_session, nursery, _never, None, ServerStats())
            session.attach(_Link(protocol, outbox))
            port = session.port(1)
            if state == "detached":
                session.detach()
            elif state == "held":  # awaiting its resubmission after a resume
                server_session.awaiting[1] = 1
                server_session.operations[1].quiet = True
            elif state == "muted":
                server_session.mute(1)
            elif state == "outbox closed":
                outbox.close()
            elif state == "over high water":
                outbox.put(b"x" * 200)
            elif state.startswith("back under high water"):
                outbox.put(b"x" * 60)
                outbox.put(b"y" * 60)  # 120 queued: over the high-water mark (100)
                batch = await outbox.take()
                outbox.put(b"z" * 30)
                outbox.written(batch)  # 30 queued: under 100, over the low-water mark (10)
                if state.endswith("then under low water"):
                    outbox.written(await outbox.take())
            elif state == "credit window":
                protocol.receive_data(pk(nnrp.CreditUpdate(scope_id=1, credit_window=5),
                                         session_id=1))
            elif state == "paused":
                protocol.receive_data(pk(nnrp.Backpressure(scope_id=1, level=3),
                                         session_id=1))
            elif state == "supersede waits":
                protocol.receive_data(pk(nnrp.Supersede(old_operation_id=1,
                                                        new_operation_id=3), session_id=1))
            elif state == "another operation superseded":
                protocol.receive_data(pk(nnrp.Supersede(old_operation_id=2,
                                                        new_operation_id=3), session_id=1))
            ready = port.ready()
            nursery.cancel_scope.cancel()
        return ready

    assert await port_in("attached")
    assert await port_in("another operation superseded")
    assert await port_in("back under high water, then under low water")
    for state in ("detached", "held", "muted", "outbox closed", "over high water",
                  "back under high water, not yet under low water", "credit window",
                  "paused", "supersede waits"):
        assert not await port_in(state), state


async def _never(op: Operation) -> None:
    raise AssertionError("no operation runs here")
