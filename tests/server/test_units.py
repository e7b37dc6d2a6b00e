"""The server's pieces alone: the outbox, an operation against a recording port, a session's
drain, and endpoint URIs. (The whole server over real sockets is test_server.py.)"""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio
import trio.testing

from gateway import nnrp
from gateway.nnrp import DropReason, LocalProtocolError, Stage
from gateway.profile import EndCause, Outcome
from gateway.server import CancelInfo, Operation, ServerStats, Session
from gateway.server._outbox import Outbox
from gateway.transport import ListenError, parse_endpoint
from tests.support.ports import RecordingPort

# --------------------------------------------------------------------------- outbox


async def test_outbox_hands_everything_queued_to_one_take() -> None:
    outbox = Outbox(high_water=100)
    for packet in (b"a", b"bb", b"ccc"):
        outbox.put(packet)
    assert outbox.queued_bytes == 6
    assert await outbox.take() == [b"a", b"bb", b"ccc"]


async def _has_room(outbox: Outbox) -> bool:
    with trio.move_on_after(0.05):
        await outbox.wait_for_room()
        return True
    return False


async def test_outbox_blocks_producers_over_high_water_until_under_low_water() -> None:
    # Hysteresis: closed past high water, open again only at or under low water.
    outbox = Outbox(high_water=10, low_water=4)
    outbox.put(b"x" * 11)
    assert not await _has_room(outbox)
    first = await outbox.take()
    outbox.put(b"y" * 6)  # produced while the writer writes
    outbox.written(first)
    assert outbox.queued_bytes == 6
    assert not await _has_room(outbox)  # under high water, but not yet under low water
    outbox.written(await outbox.take())
    assert await _has_room(outbox)


async def test_outbox_flush_and_close() -> None:
    outbox = Outbox()
    await outbox.wait_flushed()  # nothing queued: flushed at once
    outbox.put(b"z")
    with trio.move_on_after(0.05) as scope:
        await outbox.wait_flushed()
    assert scope.cancelled_caught
    outbox.written(await outbox.take())
    await outbox.wait_flushed()
    outbox.close()
    outbox.put(b"ignored")
    assert await outbox.take() == []  # closed and empty: the writer stops


class FakeSocket:
    """A direct-write target: takes up to ``room`` bytes per call, or fails."""

    def __init__(self, room: int = 1 << 30) -> None:
        self.room = room
        self.writes: list[bytes] = []
        self.error: OSError | None = None
        self.attempts = 0

    def send_now(self, data: bytes) -> int:
        self.attempts += 1
        if self.error is not None:
            raise self.error
        taken = data[:self.room]
        if taken:
            self.writes.append(taken)
        return len(taken)


def counting_outbox(sock: FakeSocket, **kw: Any) -> tuple[Outbox, list[tuple[int, int]]]:
    counted: list[tuple[int, int]] = []
    outbox = Outbox(send_now=sock.send_now,
                    on_written=lambda nbytes, packets: counted.append((nbytes, packets)), **kw)
    return outbox, counted


async def _takes_at_once(outbox: Outbox) -> list[bytes] | None:
    with trio.move_on_after(0.05):
        return await outbox.take()
    return None


async def test_a_flush_writes_everything_queued_in_one_direct_write() -> None:
    sock = FakeSocket()
    outbox, counted = counting_outbox(sock)
    outbox.put(b"progress")  # a plain put: queued for the writer, not written
    assert sock.writes == []
    outbox.put(b"a", defer=True)
    outbox.put(b"bb", defer=True)
    outbox.flush()
    assert sock.writes == [b"progressabb"]  # in call order, one write
    assert counted == [(11, 3)]
    assert outbox.queued_bytes == 0
    await outbox.wait_flushed()
    assert await _takes_at_once(outbox) is None  # the writer has nothing left to do


async def test_a_partial_direct_write_leaves_the_rest_to_the_writer() -> None:
    sock = FakeSocket(room=3)
    outbox, counted = counting_outbox(sock)
    outbox.put(b"abcd", defer=True)
    outbox.put(b"ef", defer=True)
    outbox.flush()
    assert sock.writes == [b"abc"]
    assert counted == [(3, 0)]  # bytes now, packets when their ends are written
    assert outbox.queued_bytes == 3
    batch = await _takes_at_once(outbox)
    assert batch == [b"def"]
    outbox.put(b"g", defer=True)
    outbox.flush()  # the writer holds a batch: nothing may overtake it
    assert sock.writes == [b"abc"]
    outbox.written(batch)
    assert counted == [(3, 0), (3, 2)]
    assert await _takes_at_once(outbox) == [b"g"]


async def test_a_full_socket_or_a_failed_write_wakes_the_writer() -> None:
    sock = FakeSocket(room=0)
    outbox, counted = counting_outbox(sock)
    outbox.put(b"abc", defer=True)
    outbox.flush()
    outbox.put(b"d", defer=True)
    outbox.flush()  # the socket was full: no retry until the writer has written
    assert sock.attempts == 1
    assert await _takes_at_once(outbox) == [b"abc", b"d"]  # the writer waits for room
    outbox.written([b"abc", b"d"])
    assert counted == [(4, 2)]
    sock.room, sock.error = 10, BrokenPipeError()
    outbox.put(b"xyz", defer=True)
    outbox.flush()
    assert sock.attempts == 2  # direct again once the backlog was written
    assert await _takes_at_once(outbox) == [b"xyz"]  # its write meets the error and ends


async def test_a_partial_direct_write_under_low_water_lets_producers_on() -> None:
    sock = FakeSocket(room=8)
    outbox, _ = counting_outbox(sock, high_water=6, low_water=3)
    outbox.put(b"0123456789", defer=True)  # over high water: producers would wait
    outbox.flush()  # the kernel takes 8: two bytes left, under low water
    assert await _has_room(outbox)


async def test_deferred_packets_wait_for_a_flush_or_the_next_wake() -> None:
    sock = FakeSocket()
    outbox, _ = counting_outbox(sock, high_water=4, low_water=2)
    taken: list[list[bytes]] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            async def writer() -> None:
                taken.append(await outbox.take())

            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            outbox.put(b"ab", defer=True)
            await trio.testing.wait_all_tasks_blocked()
            assert taken == []  # deferred: the writer is not woken
            outbox.put(b"cde", defer=True)  # over high water: a waiting producer wakes it
            nursery.start_soon(outbox.wait_for_room)
            await trio.testing.wait_all_tasks_blocked()
            assert taken == [[b"ab", b"cde"]] and sock.writes == []
            outbox.written(taken[0])  # under low water: the producer goes on
    outbox.put(b"x", defer=True)
    outbox.flush()
    assert sock.writes == [b"x"]  # nothing held by the writer: a flush writes directly
    outbox.put(b"g", defer=True)
    outbox.flush(direct=False)  # the connection has several operations: the writer writes
    assert sock.writes == [b"x"]
    plain = Outbox()  # no direct path (WebSocket, TLS, QUIC): a flush wakes the writer
    plain.put(b"ws", defer=True)
    plain.flush()
    assert await _takes_at_once(plain) == [b"ws"]
    outbox.close()
    outbox.put(b"late", defer=True)
    outbox.flush()
    assert sock.writes == [b"x"]  # closed: nothing more is written


# --------------------------------------------------------------------------- operation


def operation(port: RecordingPort, operation_id: int = 1, **kw: Any) -> Operation:
    return Operation(port, connection_id=1, transport="tcp", session_id=1,
                     operation_id=operation_id, frame_id=operation_id, typed_body=None,
                     body_error=None, header_trace_id=0, trace=None,
                     deadline_unix_ms=kw.pop("deadline_unix_ms", None),
                     deadline_drop_reason=kw.pop("deadline_drop_reason", 0))


@pytest.mark.parametrize("fast", [False, True])
async def test_a_handler_that_completes_sends_one_result(fast: bool) -> None:
    port = RecordingPort(fast=fast)
    op = operation(port)

    async def handler(op: Operation) -> None:
        await op.emit(b"e1")
        await op.close(EndCause.COMPLETED, b"done")

    await op.run(handler)
    assert port.sent == [("partial", b"e1"), ("result", 200, b"done")]
    assert (op.end_cause, op.outcome, op.events_sent) == (EndCause.COMPLETED, Outcome.OK, 1)
    assert port.waits == (1 if fast else 2)  # a ready port: the emit does not wait


async def test_a_ready_port_never_lets_an_event_past_a_cancel_or_a_supersede() -> None:
    """Issue 25's fast emit (``OperationPort.ready``) skips the waits, not the rules: an
    event emitted after the reader applied a cancel (the operation's own guard), or once
    the port knows of a SUPERSEDE (the port's say), is never sent, and the operation ends
    as it would have through the waits."""
    for how in ("cancel", "supersede"):
        port = RecordingPort(fast=True)
        op = operation(port)

        async def handler(op: Operation, how: str = how, port: RecordingPort = port
                          ) -> None:
            await op.emit(b"e1")
            await op.emit(b"e2")
            if how == "cancel":
                op.cancel(EndCause.PEER_CANCELLED)  # as the reader applies it
            else:
                port.superseded = True  # the port knows first (the hold is over)
            await op.emit(b"never")

        await op.run(handler)
        assert port.waits == 1, how  # only the emit after the cancel or supersede waited
        drop = ((DropReason.PEER_CANCELLED, b"peer_cancelled") if how == "cancel"
                else (DropReason.SUPERSEDED, b"superseded"))
        assert port.sent == [("partial", b"e1"), ("partial", b"e2"), ("drop", *drop)], how
        assert op.events_sent == 2, how


async def test_an_error_cause_gets_the_status_the_table_gives() -> None:
    port = RecordingPort()
    op = operation(port)

    async def handler(op: Operation) -> None:
        await op.close(EndCause.REQUEST_TIMEOUT, b"late")

    await op.run(handler)
    # request_timeout is recoverable: the client is told when to try again.
    assert port.sent == [("result", 504, b"late", 1000)]
    assert op.outcome is Outcome.DEADLINE


async def test_a_cancelled_operation_sends_only_its_drop() -> None:
    port = RecordingPort(blocked=trio.Event())
    op = operation(port)

    async def handler(op: Operation) -> None:
        await op.emit(b"never")  # blocked on room, then cancelled

    async with trio.open_nursery() as nursery:
        nursery.start_soon(op.run, handler)
        await trio.testing.wait_all_tasks_blocked()
        op.cancel(EndCause.PEER_CANCELLED)
    assert port.sent == [("drop", DropReason.PEER_CANCELLED, b"peer_cancelled")]
    assert op.outcome is Outcome.CANCELLED


async def test_a_cancel_aborts_the_upstream_at_once_and_only_while_it_streams() -> None:
    """The abort runs inside ``cancel`` itself (the reader's task), before the operation's
    own task has run again; outside the block a cancel calls nothing."""
    port = RecordingPort(blocked=trio.Event())
    op = operation(port)
    aborted: list[str] = []

    async def handler(op: Operation) -> None:
        with op.aborts_upstream(lambda: aborted.append("streaming")):
            await op.emit(b"never")  # blocked on room, then cancelled

    async with trio.open_nursery() as nursery:
        nursery.start_soon(op.run, handler)
        await trio.testing.wait_all_tasks_blocked()
        op.cancel(EndCause.PEER_CANCELLED)
        assert aborted == ["streaming"]  # already: the handler has not run yet
        op.cancel(EndCause.PEER_CANCELLED)  # a second cancel aborts nothing more
    assert aborted == ["streaming"]
    assert port.sent == [("drop", DropReason.PEER_CANCELLED, b"peer_cancelled")]

    after = operation(RecordingPort(), operation_id=2)

    async def finished_streaming(op: Operation) -> None:
        with op.aborts_upstream(lambda: aborted.append("late")):
            pass
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(after.run, finished_streaming)
        await trio.testing.wait_all_tasks_blocked()
        after.cancel(EndCause.PEER_CANCELLED)
    assert aborted == ["streaming"]


async def test_a_handler_that_returns_without_a_terminal_is_ended_by_the_operation() -> None:
    port = RecordingPort()
    op = operation(port)

    async def handler(op: Operation) -> None:
        await op.emit(b"e1")

    await op.run(handler)
    assert port.sent[-1] == ("drop", DropReason.TRANSPORT_CLOSED, b"transport_closed")
    assert (op.end_cause, op.outcome) == (EndCause.NO_TERMINAL, Outcome.INTERNAL_ERROR)


async def test_an_expired_deadline_drops_with_its_own_reason(autojump_clock: Any) -> None:
    import time

    # EXPIRE_AT's drop carries no diagnostic (the priority-deadline wire case).
    for reason, cause, diagnostic in (
            (DropReason.DEADLINE_EXPIRED, EndCause.DEADLINE_EXPIRED, b"deadline_expired"),
            (DropReason.SUPERSEDED, EndCause.EXPIRED_AT, b"")):
        port = RecordingPort()
        op = operation(port, deadline_unix_ms=int(time.time() * 1000) + 1000,
                       deadline_drop_reason=int(reason))

        async def handler(op: Operation) -> None:
            await trio.sleep_forever()

        await op.run(handler)
        assert port.sent == [("drop", reason, diagnostic)]
        assert op.end_cause is cause


async def test_a_disconnected_operation_sends_nothing() -> None:
    port = RecordingPort()
    op = operation(port)

    async def handler(op: Operation) -> None:
        op.cancel(EndCause.DISCONNECTED)
        await trio.sleep_forever()

    await op.run(handler)
    assert port.sent == []
    assert op.is_terminal


async def test_close_refuses_a_cause_that_is_not_a_handlers_terminal() -> None:
    op = operation(RecordingPort())
    with pytest.raises(LocalProtocolError):
        await op.close(EndCause.PEER_CANCELLED, b"")


async def test_priority_is_taken_before_dispatch_only() -> None:
    op = operation(RecordingPort())
    assert op.vllm_priority == -10  # interactive: one step ahead of vLLM's default
    assert op.request_priority(1, 0)
    assert op.vllm_priority is None  # balanced, what stock clients open: vLLM's default
    assert op.request_priority(2, -3)
    assert op.vllm_priority == 7 and op.priority_requested
    op.dispatched_at = 1.0
    assert not op.request_priority(0, 0)
    assert op.priority_updates == 3 and op.vllm_priority == 7


async def test_a_token_budget_caps_what_streams_and_can_end_it_live() -> None:
    port = RecordingPort()
    op = operation(port)
    op.update_budget(5, increment=False)
    assert op.spend_tokens(3) and op.spend_tokens(2)
    assert not op.spend_tokens(1)  # the sixth token would pass the budget
    assert op.end_cause is EndCause.BUDGET_EXCEEDED and op.cancel_scope.cancel_called
    lowered = operation(RecordingPort())
    lowered.spend_tokens(4)
    lowered.update_budget(2, increment=False)  # lowered below what was already used
    assert lowered.end_cause is EndCause.BUDGET_EXCEEDED
    raised = operation(RecordingPort())
    raised.update_budget(2, increment=False)
    raised.update_budget(3, increment=True)
    assert raised.token_budget == 5


async def test_progress_stages_flow_when_negotiated_or_asked() -> None:
    negotiated = RecordingPort(tokens=frozenset({"control.progress_partial"}))
    op = operation(negotiated)

    async def handler(op: Operation) -> None:
        op.stage(Stage.EXECUTING)
        await op.emit(b"e")
        await op.emit(b"f")
        await op.close(EndCause.COMPLETED, b"done")

    await op.run(handler)
    assert negotiated.progress == [Stage.QUEUED, Stage.INPUT_RECEIVED, Stage.ADMITTED,
                                   Stage.EXECUTING, Stage.PRODUCING_PARTIAL, Stage.COMPLETED]
    asked = RecordingPort()
    late = operation(asked)
    late.stage(Stage.ADMITTED)
    assert asked.progress == []  # recorded, not sent
    late.enable_progress()
    assert asked.progress == [Stage.QUEUED, Stage.INPUT_RECEIVED, Stage.ADMITTED]


async def test_no_progress_after_a_peer_cancel() -> None:
    port = RecordingPort(tokens=frozenset({"control.progress_partial"}), blocked=trio.Event())
    op = operation(port)

    async def handler(op: Operation) -> None:
        await op.emit(b"never")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(op.run, handler)
        await trio.testing.wait_all_tasks_blocked()
        op.cancel(EndCause.PEER_CANCELLED)
    assert Stage.DROPPED not in port.progress  # the client holds it as ended already
    assert [stage for stage, _ in op.stages][-1] is Stage.DROPPED


# --------------------------------------------------------------------------- session


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


# --------------------------------------------------------------------------- endpoints


@pytest.mark.parametrize(("uri", "expected"), [
    ("tcp://127.0.0.1:7700", ("tcp", "127.0.0.1", 7700, "/", "tcp", False)),
    ("tcps://[::1]:0", ("tcps", "::1", 0, "/", "tcp", True)),
    ("unix:///run/nnrp.sock", ("unix", "", 0, "/run/nnrp.sock", "ipc", False)),
    ("unix://run/nnrp.sock", ("unix", "", 0, "/run/nnrp.sock", "ipc", False)),
    ("ws://0.0.0.0:7701/nnrp", ("ws", "0.0.0.0", 7701, "/nnrp", "websocket", False)),
    ("WSS://h:1", ("wss", "h", 1, "/", "websocket", True)),
])
def test_endpoints_parse(uri: str, expected: tuple[Any, ...]) -> None:
    endpoint = parse_endpoint(uri)
    assert (endpoint.scheme, endpoint.host, endpoint.port, endpoint.path, endpoint.transport,
            endpoint.tls) == expected


@pytest.mark.parametrize(("uri", "problem"), [
    ("http://h:1", "scheme must be"),
    ("tcp://h", "needs host and port"),
    ("tcp://h:99999", "out of range"),
    ("unix://", "needs a path"),
])
def test_bad_endpoints_say_why(uri: str, problem: str) -> None:
    with pytest.raises(ListenError, match=problem):
        parse_endpoint(uri)


async def test_a_superseded_operation_can_only_end_superseded() -> None:
    """While a SUPERSEDE waits for its replacement (the port says so), nothing of the
    operation may reach the client but the superseded drop: not a partial once the hold
    is over, not its own terminal, not a deadline's drop reason."""
    for how in ("emit", "close", "deadline"):
        port = RecordingPort(superseded=True)
        op = operation(port, deadline_unix_ms=1 if how == "deadline" else None)

        async def handler(op: Operation, how: str = how) -> None:
            if how == "emit":
                await op.emit(b"{}")
            elif how == "close":
                await op.close(EndCause.COMPLETED, b"{}")
            else:
                await trio.sleep_forever()

        await op.run(handler)
        assert op.end_cause is EndCause.SUPERSEDED, how
        assert port.sent == [("drop", nnrp.DropReason.SUPERSEDED, b"superseded")], how
        assert nnrp.Stage.DROPPED not in port.progress


@pytest.mark.parametrize("then", ["replacement", "hold_over"])
async def test_a_held_supersede_stops_the_work_at_once_and_drops_only_when_the_rule_says(
        then: str, autojump_clock: trio.testing.MockClock) -> None:
    """Issue 26: the hold begins (``supersede``): the handler is cancelled and the
    upstream closed at once, but the drop waits for the replacement (its cancel carries
    the client's words) or for the hold to be over."""
    port = RecordingPort()
    op = operation(port)
    aborted: list[bool] = []
    stopped = trio.Event()

    async def streaming(op: Operation) -> None:
        with op.aborts_upstream(lambda: aborted.append(True)):
            try:
                await trio.sleep_forever()
            finally:
                stopped.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(op.run, streaming)
        await trio.testing.wait_all_tasks_blocked()
        held_at = trio.current_time()
        port.superseded, port.hold_left = True, 5.0  # the protocol's state
        op.supersede()
        assert aborted == [True]  # synchronously, as a cancel does
        await stopped.wait()
        assert port.sent == [] and not op.is_terminal  # it waits for what the rule needs
        if then == "replacement":
            op.cancel(EndCause.SUPERSEDED, CancelInfo(nnrp.CancelSource.SUPERSEDE, 2,
                                                      b"newer", 0.0))
    waited = trio.current_time() - held_at
    if then == "replacement":
        assert waited < 5.0
        assert port.sent == [("drop", nnrp.DropReason.SUPERSEDED, b"newer")]
    else:
        assert waited >= 5.0
        assert port.sent == [("drop", nnrp.DropReason.SUPERSEDED, b"superseded")]
    assert op.end_cause is EndCause.SUPERSEDED


async def _forever(_: Operation) -> None:
    await trio.sleep_forever()


async def test_a_controls_own_words_become_the_drops_diagnostic() -> None:
    port = RecordingPort()
    op = operation(port)
    op.cancel(EndCause.PEER_CANCELLED, CancelInfo(nnrp.CancelSource.CANCEL, 1, b"user hit stop",
                                                  0.0))
    await op.run(_forever)
    assert port.sent == [("drop", nnrp.DropReason.PEER_CANCELLED, b"user hit stop")]
    expired = RecordingPort()
    op = operation(expired, deadline_unix_ms=1, deadline_drop_reason=int(
        nnrp.DropReason.SUPERSEDED))
    await op.run(_forever)
    assert expired.sent == [("drop", nnrp.DropReason.SUPERSEDED, b"")]  # EXPIRE_AT: none


# --------------------------------------------------------------------------- the real port


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
