"""One operation against a recording port (gateway/server/_operation.py): its terminal, its
drops, a cancel's abort of the upstream, deadlines, priority, the token budget, progress
stages and the SUPERSEDE rule. No wire: the port records what would be sent."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from gateway import nnrp
from gateway.nnrp import DropReason, LocalProtocolError, Stage
from gateway.profile import EndCause, Outcome
from gateway.server import CancelInfo, Operation
from tests.support.ports import RecordingPort, operation


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
    assert (op.priority_class, op.priority_delta, op.priority_requested) == (0, 0, False)
    assert op.request_priority(1, 0)
    assert op.request_priority(2, -3)
    assert (op.priority_class, op.priority_delta, op.priority_requested) == (2, -3, True)
    op.dispatched_at = 1.0
    assert not op.request_priority(0, 0)
    assert (op.priority_class, op.priority_delta) == (2, -3)
    assert op.notes.priority_updates == 3  # each counted, for the record


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
