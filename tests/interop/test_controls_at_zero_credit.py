"""Issue 26 (item 5): "while a client holds the credit window at 0, a CANCEL or DEADLINE
takes effect about 0.3 s later than without the pause", driven the audit's way: nnrp-py's
native client against the gateway (replay vLLM behind it; tcp, unix, ws and quic) and,
as the referee, against nnrp-py's own native server, the same client sequence against both.

The finding (docs/runtime-controls.md, the BACKPRESSURE / CREDIT_UPDATE row): the delay is
the native client's. A control call on a session waits for a poll of that session running
in another thread to return (nnrp-py.md, "Calls on a session are serialized"). Unpaused, a
partial ends that poll within a token's interval; held at zero, nothing comes, so the
control leaves only when the poll's slice runs out: up to a whole slice late, on either
server. Sent from the polling thread itself (nnrp-py.md's rule), it leaves at once, and
the gateway then ends the operation as promptly as the referee does.

nnrp-py's client has no public call for CREDIT_UPDATE or BACKPRESSURE (its server session
has them): they go through the session's runtime-frame send, which its public controls
use themselves (``NativeClientConnection._send_runtime_control``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

pytest.importorskip("nnrp.client.native")

from nnrp.core.enums import MessageType
from nnrp.native import NativeInvalidStateError
from nnrp.runtime.types import PartialResultMetadata, PressureMetadata, ResultDropReasonMetadata

from gateway import nnrp
from gateway.tools.replay import ReplayServer
from tests.support.native import (
    REFEREE_START_LIMIT,
    describe,
    native_connection,
    next_event,
    open_session,
    openai_submit,
    poll_once,
    serve_native_sessions,
    start_referee,
)
from tests.support.quic import Pki, start_quic_stack
from tests.support.stack import Stack, chat, envelope
from tests.support.waits import until

pytestmark = pytest.mark.interop

#: Partials the client lets through before holding the window at 0.
GRANTED = 4
#: The client's own poll slice when it polls and sends from one thread (short: it only
#: bounds how late the client itself looks).
SHORT_POLL_MS = 20
#: A reader thread's poll slice: long against everything else here, so a control held
#: behind it shows as waiting for the slice, not for a server.
LONG_POLL_MS = 1000
#: How long nothing may arrive before the client counts the window held (what was already
#: on its way when it paused has come): the definition of "held", not a guess at speed.
QUIET_S = 0.15
#: The gateway may be this many times slower than the referee (the minimum of REPEATS
#: runs each, on a loaded host) ...
FACTOR = 10
#: ... or take up to this long: a third of the 0.3 s issue 26 reported.
GRACE_NS = 100_000_000
REPEATS = 3
HOLDS = ("credit0", "paused")
CONTROLS = ("cancel", "deadline")


def now_ms() -> int:
    return int(time.time() * 1000)


def request_id(name: str) -> str:
    # A stream that never ends by itself: only the control can end it.
    return f"replay:long_stream:{name}"


# ------------------------------------------------------------------ the client side

def pressure(session: Any, kind: MessageType, window: int, level: int) -> None:
    """A session-scoped CREDIT_UPDATE or BACKPRESSURE (scope_id 0, flags none)."""
    session._send_runtime_frame(kind, PressureMetadata(0, window, level, 0, 0, 0))


def start_held(session: Any, hold: str, name: str) -> None:
    """Submit operation 1; ``credit0``: a window of GRANTED partials granted first."""
    if hold == "credit0":
        pressure(session, MessageType.CREDIT_UPDATE, GRANTED, int(nnrp.PressureLevel.NONE))
    session.submit_operation(openai_submit(1, 1, envelope(chat(stream=True),
                                                          request_id=request_id(name))))


def send_control(connection: Any, session: Any, control: str) -> None:
    if control == "cancel":
        connection.cancel_runtime_operation(session, operation_id=1, control_sequence=1,
                                            reason_code=1, diagnostic=b"user hit stop")
    else:  # already passed when it arrives: it applies at once
        connection.update_runtime_deadline(session, operation_id=1, control_sequence=1,
                                           deadline_unix_ms=now_ms())


@attrs.frozen
class Timeline:
    """One run, in ``time.monotonic_ns()`` (the replay and the referee stamp alike)."""

    called: int  # the control call began
    returned: int  # ... and returned: its frame is on its way
    dropped: int  # the client read operation 1's RESULT_DROP_REASON
    drop_reason: int
    partials_after: int  # partials read after the call (none: the window held)


def is_partial(event: dict[str, Any]) -> bool:
    return event["kind"] == "PARTIAL_RESULT"


def is_drop(event: dict[str, Any]) -> bool:
    return event["kind"] == "RESULT_DROP_REASON"


def one_thread(uri: str, der: bytes | None, hold: str, control: str, name: str) -> Timeline:
    """Poll and send from one thread: read GRANTED partials, hold, wait until nothing
    comes for QUIET_S, then the control; poll until its drop."""
    with native_connection("tcp", uri, trusted_der=der) as connection:
        session = open_session(connection)
        start_held(session, hold, name)
        events: list[dict[str, Any]] = []
        give_up = time.monotonic() + 30
        while sum(map(is_partial, events)) < GRANTED and time.monotonic() < give_up:
            events += poll_once(session, SHORT_POLL_MS)
        if hold == "paused":
            pressure(session, MessageType.BACKPRESSURE, 0, int(nnrp.PressureLevel.PAUSED))
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < QUIET_S and time.monotonic() < give_up:
            if arrived := poll_once(session, SHORT_POLL_MS):
                events += arrived
                quiet_since = time.monotonic()
        held = len(events)
        called = time.monotonic_ns()
        send_control(connection, session, control)
        returned = time.monotonic_ns()
        dropped = 0
        while not dropped and time.monotonic() < give_up:
            for event in poll_once(session, SHORT_POLL_MS):
                events.append(event)
                if is_drop(event):
                    dropped = time.monotonic_ns()
        session.close()
    assert dropped, f"{name}: no drop"
    drop = next(e for e in events if is_drop(e))
    return Timeline(called, returned, dropped, drop["drop_reason"],
                    sum(map(is_partial, events[held:])))


@attrs.frozen
class Poll:
    began: int
    ended: int
    events: tuple[dict[str, Any], ...]


def reader_thread(uri: str, der: bytes | None, hold: str, control: str, name: str
                  ) -> tuple[Timeline, list[Poll]]:
    """A reader thread polls in LONG_POLL_MS slices while this thread sends the control,
    once the window is held and the reader's poll has waited on nothing for QUIET_S."""
    with native_connection("tcp", uri, trusted_der=der) as connection:
        session = open_session(connection)
        start_held(session, hold, name)
        polls: list[Poll] = []
        polling_since: list[int] = [0]  # the poll in progress began (0: none)
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                began = polling_since[0] = time.monotonic_ns()
                got = session.poll_events_batch(max_events=16, timeout_ms=LONG_POLL_MS)
                polling_since[0] = 0
                events = tuple(describe(event) for event in got)
                polls.append(Poll(began, time.monotonic_ns(), events))
                if any(map(is_drop, events)):
                    stop.set()

        def received() -> list[dict[str, Any]]:
            return [event for poll in list(polls) for event in poll.events]

        reader = threading.Thread(target=read)
        reader.start()
        try:
            give_up = time.monotonic() + 30
            while sum(map(is_partial, received())) < GRANTED and time.monotonic() < give_up:
                time.sleep(0.005)
            if hold == "paused":
                pressure(session, MessageType.BACKPRESSURE, 0, int(nnrp.PressureLevel.PAUSED))
            # Held: the reader's poll has been waiting, on nothing, for QUIET_S.
            while time.monotonic() < give_up and not (
                    polling_since[0]
                    and time.monotonic_ns() - polling_since[0] > QUIET_S * 1e9):
                time.sleep(0.005)
            held = len(received())
            called = time.monotonic_ns()
            send_control(connection, session, control)
            returned = time.monotonic_ns()
            reader.join(30)
        finally:
            stop.set()
            reader.join(30)
        session.close()
    events = received()
    drop = next(e for e in events if is_drop(e))
    dropped = next(poll.ended for poll in polls if drop in poll.events)
    return Timeline(called, returned, dropped, drop["drop_reason"],
                    sum(map(is_partial, events[held:]))), polls


# ------------------------------------------------------------------ the referee

def run_flow_referee(listening: Callable[[str], None], stop: threading.Event,
                     reached: dict[str, int]) -> None:
    """nnrp-py's native server with an application that streams partials 25 ms apart
    until the operation is ended, honouring the client's window as the gateway does (a
    CREDIT_UPDATE window counts partials from then on, BACKPRESSURE paused holds them; the
    native runtime enforces neither), and ends a cancelled or expired operation with its
    drop. ``reached``: when the application met each control (monotonic ns)."""

    async def serve_session(session: Any) -> None:
        operations: dict[int, Any] = {}
        sent: dict[int, int] = {}
        expires: dict[int, int] = {}
        window, paused, total, next_at = math.inf, False, 0, 0.0

        async def drop(operation_id: int, reason: int) -> None:
            operation = operations.pop(operation_id)
            await operation.send_result_drop(ResultDropReasonMetadata(
                operation_id, sent[operation_id] + 1, reason, 3, 0, 0), b"")

        while not stop.is_set():
            event = await next_event(session, 0.005)
            if event is not None and (operation := event.as_submit()) is not None:
                operations[operation.operation_id] = operation
                sent[operation.operation_id] = 0
            elif event is not None and (runtime := event.as_runtime()) is not None:
                kind, value = runtime.header.message_type, runtime.metadata.value
                reached.setdefault(kind.name, time.monotonic_ns())
                if kind is MessageType.CREDIT_UPDATE:
                    window = total + value.credit_window
                elif kind is MessageType.BACKPRESSURE:
                    paused = value.pressure_level == nnrp.PressureLevel.PAUSED
                elif kind is MessageType.CANCEL and value.operation_id in operations:
                    await drop(value.operation_id, int(nnrp.DropReason.PEER_CANCELLED))
                elif kind is MessageType.DEADLINE and value.operation_id in operations:
                    expires[value.operation_id] = value.deadline_unix_ms
                elif kind is MessageType.SESSION_CLOSE:
                    await asyncio.to_thread(session.close)
                    return
            for operation_id in [o for o, at in expires.items() if now_ms() >= at]:
                del expires[operation_id]
                if operation_id in operations:
                    await drop(operation_id, int(nnrp.DropReason.DEADLINE_EXPIRED))
            if paused or total >= window or time.monotonic() < next_at:
                continue
            for operation_id, operation in list(operations.items())[:1]:
                body = json.dumps({"type": "response.output_text.delta", "delta": "x"}).encode()
                sent[operation_id] += 1
                total += 1
                next_at = time.monotonic() + 0.025
                await operation.send_partial_result(PartialResultMetadata(
                    operation_id, sent[operation_id], 0, sent[operation_id], len(body), 0),
                    body)

    serve_native_sessions(serve_session, listening, stop)


async def serve_flow_referee(stop: threading.Event, reached: dict[str, int], *,
                             task_status: trio.TaskStatus[str]) -> None:
    """The referee in a thread (``start_referee``); started with its ``tcp://`` endpoint."""
    await start_referee(functools.partial(run_flow_referee, stop=stop, reached=reached),
                        stop, task_status=task_status)


@attrs.define
class Referee:
    uri: str
    reached: dict[str, int]


@pytest.fixture
async def referee() -> Any:
    stop = threading.Event()
    reached: dict[str, int] = {}
    async with trio.open_nursery() as nursery:
        with trio.fail_after(REFEREE_START_LIMIT):
            uri = await nursery.start(serve_flow_referee, stop, reached)
        try:
            yield Referee(uri, reached)
        finally:
            stop.set()


@pytest.fixture
async def quic_stack(nursery: trio.Nursery, tmp_path: Path) -> tuple[Stack, Pki]:
    # 25 ms a token, as the referee's partials: a paced stream, as vLLM's.
    return await start_quic_stack(nursery, tmp_path,
                                  replay=ReplayServer(token_interval_ms=25.0))


# ------------------------------------------------------------------ one run each side

CONTROL_KIND = {"cancel": "CANCEL", "deadline": "DEADLINE"}
DROP_REASON = {"cancel": int(nnrp.DropReason.PEER_CANCELLED),
               "deadline": int(nnrp.DropReason.DEADLINE_EXPIRED)}


async def on_gateway(stack: Stack, pki: Pki, transport: str, driver: Callable[..., Any],
                     hold: str, control: str, name: str) -> tuple[Any, int]:
    """Run ``driver`` against the gateway; with the moment the replay vLLM saw its
    request aborted (the gateway's upstream abort)."""
    with trio.fail_after(60):
        result = await trio.to_thread.run_sync(functools.partial(
            driver, stack.uri(transport), pki.der, hold, control, name))
        await until(lambda: any(d.request_id == request_id(name)
                                for d in stack.replay.disconnects))
    (disconnect,) = [d for d in stack.replay.disconnects if d.request_id == request_id(name)]
    return result, disconnect.at_ns


async def on_referee(referee: Referee, driver: Callable[..., Any], hold: str, control: str,
                     name: str) -> tuple[Any, int]:
    """Run ``driver`` against the referee; with the moment its application met the
    control."""
    for attempt in (1, 2):
        referee.reached.clear()
        try:
            with trio.fail_after(60):
                result = await trio.to_thread.run_sync(functools.partial(
                    driver, referee.uri, None, hold, control, name))
            break
        except NativeInvalidStateError:
            # nnrp-py's own pair, now and then (twice in some 500 of this file's
            # referee sessions; never against the gateway): its client refuses the
            # submit that follows the CREDIT_UPDATE on a fresh session (detail 105). A
            # flaw of the referee's, not a fact about the gateway: one more session.
            if attempt == 2:
                raise
    return result, referee.reached[CONTROL_KIND[control]]


def check_held_run(timeline: Timeline, reached: int, control: str, *, not_before: int
                   ) -> None:
    """What holds on either server: the control ends the operation with no credit
    granted (nothing more streamed), with its own drop reason, and it reaches the
    server (``reached``) not before ``not_before``."""
    assert timeline.drop_reason == DROP_REASON[control]
    assert timeline.partials_after == 0
    assert not_before <= reached


# ------------------------------------------------------------------ the tests

@pytest.mark.parametrize("transport", ["tcp", "ipc", "websocket", "quic"])
async def test_a_control_at_zero_credit_ends_the_operation_as_promptly_as_on_the_referee(
        quic_stack: tuple[Stack, Pki], referee: Referee, transport: str) -> None:
    """One thread polls and sends (nnrp-py.md's rule), the window held at 0 (a spent
    CREDIT_UPDATE window, or BACKPRESSURE paused): from the control call to the client
    reading the drop, the gateway is no slower than nnrp-py's server by more than FACTOR
    (or GRACE_NS), fastest of REPEATS runs each; the vLLM request is aborted on the way."""
    stack, pki = quic_stack
    for hold in HOLDS:
        for control in CONTROLS:
            ours, theirs = [], []
            for run in range(REPEATS):
                name = f"{transport}-{hold}-{control}-{run}"
                timeline, aborted = await on_gateway(stack, pki, transport, one_thread,
                                                     hold, control, name)
                check_held_run(timeline, aborted, control, not_before=timeline.called)
                ours.append(timeline.dropped - timeline.called)
                timeline, reached = await on_referee(referee, one_thread, hold, control, name)
                check_held_run(timeline, reached, control, not_before=timeline.called)
                theirs.append(timeline.dropped - timeline.called)
            assert min(ours) <= max(FACTOR * min(theirs), GRACE_NS), (hold, control, ours,
                                                                       theirs)


@pytest.mark.parametrize("transport", ["tcp", "quic"])
async def test_the_delay_at_zero_credit_is_the_clients_poll_on_either_server(
        quic_stack: tuple[Stack, Pki], referee: Referee, transport: str) -> None:
    """The audit's delay, reproduced and placed: a reader thread polls in LONG_POLL_MS
    slices and another thread sends the control while the window is held at 0. On the
    gateway as on nnrp-py's server, the control call returns only once the reader's poll
    in progress has run out its slice with nothing read (the client held the frame), the
    server meets the control after that, and the drop is read before any later poll runs
    out empty (the server waited for nothing: no credit, no slice)."""
    stack, pki = quic_stack
    for hold in HOLDS:
        for control in CONTROLS:
            name = f"reader-{transport}-{hold}-{control}"
            runs = [await on_gateway(stack, pki, transport, reader_thread, hold, control,
                                     name),
                    await on_referee(referee, reader_thread, hold, control, name)]
            for (timeline, polls), reached in runs:
                (in_progress,) = [p for p in polls if p.began <= timeline.called <= p.ended]
                # Held: it waited out its slice (its end read from when it began: the
                # reader's own clock reading after the poll waits for the GIL) ...
                assert not in_progress.events
                slice_over = in_progress.began + LONG_POLL_MS * 1_000_000
                # ... and the call with it: the control left only then.
                assert slice_over <= timeline.returned
                check_held_run(timeline, reached, control, not_before=slice_over)
                later = [p for p in polls if p.began >= in_progress.ended]
                assert all(p.events for p in later)  # no empty slice before the drop
                assert later[-1].ended == timeline.dropped
