"""Every runtime-control API of nnrp-py's native client, against the whole gateway (replay
vLLM behind it; over TCP and over QUIC) and, as the outside referee, against nnrp-py's
native server.

For each API the client streams a request, calls the API after two partials, and then
checks three things: the control had its effect (docs/runtime-controls.md, "Cases"), no
frame the client cannot accept came back (the native client raises on those), and the
session is still usable (a second request completes and SESSION_CLOSE is acknowledged).

The control always lands while the stream runs, however fast the replay: the replay
holds the stream after the two partials the client acts on. A control that ends the
operation meets a stream that never ends by itself (``long_stream``), held for good, so
nothing of it is on the wire behind the control (nnrp-py's native client refuses a
partial of an operation it has frame-cancelled); for one that lets it finish, the hold
is released once the gateway shows the control applied (``Case.applied``), and the
stream runs to its end.

The native server replies to no control by itself (its application decides); the small
application below reacts to cancels and supersedes the way the reference adapter does.
Where the spec leaves room (which drop reason a supersede or a cancel ends with), the
gateway must end the operation the way that server does.
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
from nnrp.runtime.types import PartialResultMetadata, ResultDropReasonMetadata

from gateway import nnrp
from gateway.pipeline import PipelineLimits
from gateway.tools.replay import ReplayServer
from tests.support.native import (
    REFEREE_START_LIMIT,
    native_connection,
    next_event,
    open_session,
    openai_submit,
    poll_once,
    poll_until,
    result_metadata,
    serve_native_sessions,
    start_referee,
)
from tests.support.quic import Pki, start_quic_stack
from tests.support.stack import (
    Stack,
    chat,
    envelope,
    live_operations,
    records_of,
    start_stack,
)
from tests.support.waits import until

pytestmark = pytest.mark.interop

TOKENS = 40  # the streamed request, when it runs to its end
Control = Callable[[Any, Any], None]  # (connection, session) -> None
#: Evidence that a control was applied: (the stack, the client's events so far) -> bool.
Applied = Callable[[Stack, list[dict[str, Any]]], bool]
#: Partials operation 1 streams before the client calls the API; its stream is held
#: there (after its role chunk and these tokens), so the budget of 5 is not spent yet.
PARTIALS_BEFORE_CONTROL = 2


def now_ms() -> int:
    return int(time.time() * 1000)


def request(tokens: int, name: str, scenario: str = "text_stream") -> bytes:
    return envelope(chat(stream=True, max_tokens=tokens),
                    request_id=f"replay:{scenario}:{name}")


def is_first(recorded: Any) -> bool:
    """The replay's record of operation 1's request (``drive``)."""
    return str(recorded.headers.get("x-request-id", "")).endswith(":first")


def is_first_long(recorded: Any) -> bool:
    """Operation 1's request in a case whose control ends it."""
    return is_first(recorded) and recorded.scenario == "long_stream"


def received(kind: str) -> Applied:
    return lambda _stack, events: any(e["kind"] == kind for e in events)


def budget_applied(stack: Stack, _events: list[dict[str, Any]]) -> bool:
    return any(op.token_budget == 5 for op in live_operations(stack.gateway))


def priority_refused(stack: Stack, _events: list[dict[str, Any]]) -> bool:
    return any(op.notes.priority_updates for op in live_operations(stack.gateway))


def hint_ignored(stack: Stack, _events: list[dict[str, Any]]) -> bool:
    return stack.gateway.server.stats.ignored_frames > 0


# ------------------------------------------------------------------ the APIs, one each

def cancel(connection: Any, session: Any) -> None:
    connection.cancel_runtime_operation(session, operation_id=1, control_sequence=1,
                                        reason_code=1, diagnostic=b"user hit stop")


def abort(connection: Any, session: Any) -> None:
    connection.abort_runtime_operation(session, operation_id=1, control_sequence=1,
                                       reason_code=1, flags=0x02)


def cancel_frame(connection: Any, session: Any) -> None:
    connection.cancel_frame(session, frame_id=1)


def live_priority(connection: Any, session: Any) -> None:
    connection.update_runtime_priority(session, operation_id=1, control_sequence=1,
                                       priority_class=3, priority_delta=1)


def deadline(connection: Any, session: Any) -> None:
    connection.update_runtime_deadline(session, operation_id=1, control_sequence=1,
                                       deadline_unix_ms=now_ms() + 50)


def expire_at(connection: Any, session: Any) -> None:
    connection.expire_runtime_operation_at(session, operation_id=1, control_sequence=1,
                                           expire_at_unix_ms=now_ms() + 50, flags=0x03)


def supersede(connection: Any, session: Any) -> None:
    connection.supersede_runtime_operation(session, old_operation_id=1, new_operation_id=2,
                                           control_sequence=1, diagnostic=b"newer_request")
    session.submit_operation(openai_submit(2, 2, request(3, "replacement")))


def live_budget(connection: Any, session: Any) -> None:
    connection.update_runtime_budget(session, operation_id=1, token_budget=5,
                                     flags=int(nnrp.BudgetFlag.REPLACE))


def route_hint(connection: Any, session: Any) -> None:
    connection.send_runtime_route_hint(session, operation_id=1, route_id=7,
                                       flags=int(nnrp.HintFlag.BEST_EFFORT))


def execution_hint(connection: Any, session: Any) -> None:
    connection.send_runtime_execution_hint(session, operation_id=1, route_id=7,
                                           executor_class=2,
                                           flags=int(nnrp.HintFlag.MUST_HONOR))


#: Two tokens the gateway implements and one it does not (it routes nowhere).
OFFER = ("control.cancel_abort", "control.route_execution_hint", "control.trace_context")


def negotiate(connection: Any, session: Any) -> None:
    connection.negotiate_runtime_capabilities(
        session, profile_id=0, capability_count=len(OFFER), body=nnrp.pack_tokens(OFFER),
        flags=int(nnrp.CapabilityFlag.DOWNGRADE_ALLOWED))


def degrade(connection: Any, session: Any) -> None:
    tokens = ("control.cancel_abort",)
    connection.degrade_runtime_profile(session, profile_id=0, capability_count=len(tokens),
                                       body=nnrp.pack_tokens(tokens))


@attrs.frozen
class Case:
    control: Control
    #: How operation 1 ends: ("push", status) or ("drop", reason).
    ends: tuple[str, int]
    #: Frames the gateway answers the control with, before the terminal.
    replies: tuple[str, ...] = ()
    #: The end cause in the gateway's record of operation 1.
    cause: str = "completed"
    upstream_aborted: bool = False
    #: The replay scenario of operation 1: ``long_stream`` when the control ends it (its
    #: hold is then never released).
    scenario: str = "text_stream"
    #: For a stream that ends by itself: what shows the control applied, which releases
    #: the hold (the control must land while the operation runs).
    applied: Applied | None = None


CASES = {
    "cancel": Case(cancel, ("drop", 3), cause="peer_cancelled", upstream_aborted=True,
                   scenario="long_stream"),
    "abort": Case(abort, ("drop", 3), cause="peer_cancelled", upstream_aborted=True,
                  scenario="long_stream"),
    "cancel_frame": Case(cancel_frame, ("drop", 3), cause="peer_cancelled",
                         upstream_aborted=True, scenario="long_stream"),
    "live_priority": Case(live_priority, ("push", 200), replies=("ERROR_RECOVERABLE",),
                          applied=priority_refused),
    "deadline": Case(deadline, ("drop", 1), cause="deadline_expired", upstream_aborted=True,
                     scenario="long_stream"),
    "expire_at": Case(expire_at, ("drop", 2), cause="expired_at", upstream_aborted=True,
                      scenario="long_stream"),
    "supersede": Case(supersede, ("drop", 2), cause="superseded", upstream_aborted=True,
                      scenario="long_stream"),
    "live_budget": Case(live_budget, ("drop", 6), cause="budget_exceeded",
                        upstream_aborted=True, applied=budget_applied),
    "route_hint": Case(route_hint, ("push", 200), applied=hint_ignored),
    "execution_hint": Case(execution_hint, ("push", 200), replies=("ERROR_RECOVERABLE",),
                           applied=received("ERROR_RECOVERABLE")),
    "negotiate": Case(negotiate, ("push", 200), replies=("DEGRADE_PROFILE",),
                      applied=received("DEGRADE_PROFILE")),
    # Session-scoped, answered with nothing: operation 1 ends alike whenever it lands.
    "degrade": Case(degrade, ("push", 200)),
}

#: The controls after which the referee's application ends the operation itself.
REFEREE_ENDS = {"cancel", "abort", "cancel_frame", "supersede", "deadline", "expire_at"}


# ------------------------------------------------------------------ the client side

def drive(uri: str, control: Control, trusted_der: bytes | None = None, *,
          scenario: str = "text_stream", events: list[dict[str, Any]] | None = None
          ) -> dict[str, list[dict[str, Any]]]:
    """Stream operation 1 (replay ``scenario``), call ``control`` after two partials, poll
    past its terminal (nothing may follow it), then prove the session usable and close
    it. ``events``: filled as they arrive (another thread may watch them)."""
    with native_connection("tcp", uri, trusted_der=trusted_der) as connection:
        session = open_session(connection)
        session.submit_operation(openai_submit(1, 1, request(TOKENS, "first", scenario)))
        events = [] if events is None else events
        called = ended = None
        deadline_at = time.monotonic() + 20
        while time.monotonic() < deadline_at:
            for event in poll_once(session):
                events.append(event)
                partials = [e for e in events if e["kind"] == "PARTIAL_RESULT"
                            and e["frame_id"] == 1]
                if called is None and len(partials) >= PARTIALS_BEFORE_CONTROL:
                    control(connection, session)
                    called = time.monotonic()
                if ended is None and event.get("frame_id") == 1 and event["kind"] in (
                        "RESULT_PUSH", "RESULT_DROP_REASON"):
                    ended = time.monotonic()
            # A window after the terminal: a frame in it would be one too many.
            if ended is not None and time.monotonic() - ended > 0.3:
                break
        # Whatever the control did, the session still serves requests.
        session.submit_operation(openai_submit(9, 9, request(3, "after")))
        after: list[dict[str, Any]] = []
        while time.monotonic() < deadline_at and not any(
                e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON") and e.get("frame_id") == 9
                for e in after):
            after += poll_once(session)
        session.close()
    return {"events": [e for e in events if e["kind"] != "lifecycle"],
            "after": [e for e in after if e["kind"] != "lifecycle"]}


def ending(events: list[dict[str, Any]], frame_id: int) -> tuple[str, int]:
    (end,) = [e for e in events if e["frame_id"] == frame_id
              and e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON")]
    if end["kind"] == "RESULT_PUSH":
        return ("push", end["status"])
    return ("drop", end["drop_reason"])


def assert_usable(result: dict[str, list[dict[str, Any]]]) -> None:
    assert ending(result["after"], 9) == ("push", 200)


# ------------------------------------------------------------------ the gateway

@pytest.fixture
async def quic_stack(nursery: trio.Nursery, tmp_path: Path) -> tuple[Stack, Pki]:
    # 25 ms a token: a paced stream, as vLLM's (when and where controls land is held).
    return await start_quic_stack(nursery, tmp_path,
                                  replay=ReplayServer(token_interval_ms=25.0),
                                  pipeline=PipelineLimits(priority_scheduling=False))


@pytest.fixture
def stack(quic_stack: tuple[Stack, Pki]) -> Stack:
    return quic_stack[0]


@pytest.mark.parametrize("transport", ["tcp", "quic"])
@pytest.mark.parametrize("name", list(CASES))
async def test_each_client_api_against_the_gateway(quic_stack: tuple[Stack, Pki], name: str,
                                                   transport: str) -> None:
    """Each API over TCP and over QUIC (FORCE_QUIC: quinn + rustls): the same effects."""
    stack, pki = quic_stack
    case = CASES[name]
    records = records_of(stack)
    seen: list[dict[str, Any]] = []
    if case.applied is not None or case.scenario == "long_stream":
        hold = stack.replay.hold(is_first, after=1 + PARTIALS_BEFORE_CONTROL)
    async with trio.open_nursery() as nursery:
        if case.applied is not None:
            applied = case.applied

            async def release_once_applied() -> None:
                with trio.fail_after(30):
                    await until(lambda: applied(stack, seen))
                hold.release()

            nursery.start_soon(release_once_applied)
        with trio.fail_after(40):
            result = await trio.to_thread.run_sync(functools.partial(
                drive, stack.uri(transport), case.control, pki.der, scenario=case.scenario,
                events=seen))
    events = result["events"]
    assert ending(events, 1) == case.ends
    first = [e for e in events if e["frame_id"] == 1]
    assert first[-1]["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON")  # nothing after it
    replies = [e["kind"] for e in events if e["kind"] not in (
        "PARTIAL_RESULT", "RESULT_PUSH", "RESULT_DROP_REASON", "TRACE_CONTEXT")
        and e["frame_id"] in (0, 1)]
    assert tuple(replies) == case.replies
    assert_usable(result)

    (record,) = [r for r in records if r.operation_id == 1]
    assert record.end_cause == case.cause
    assert record.transport == transport
    first_request = next(r for r in stack.replay.requests
                         if r.headers.get("x-request-id", "").endswith(":first"))
    aborted = any(d.request_id == first_request.headers["x-request-id"]
                  for d in stack.replay.disconnects)
    assert aborted is case.upstream_aborted
    if name == "supersede":
        assert ending(events, 2) == ("push", 200)  # the replacement ran to its end
    if name == "live_budget":
        text = [json.loads(e["body"]) for e in first if e["kind"] == "PARTIAL_RESULT"]
        deltas = [p for p in text if p["type"] == "response.output_text.delta"]
        assert len(deltas) <= 5
        assert record.tokens_used == 5
    if name == "negotiate":
        # Downgrade allowed: the answer is the subset we implement (route hints are not).
        (reply,) = [e for e in events if e["kind"] == "DEGRADE_PROFILE"]
        assert nnrp.parse_tokens(reply["body"], 2) == ("control.cancel_abort",
                                                       "control.trace_context")


async def test_session_budget_caps_the_next_request(stack: Stack) -> None:
    """BUDGET_UPDATE for operation 0 is the session's budget: a request submitted after it
    is sent to vLLM with its max_tokens capped, so vLLM stops in time (no abort)."""

    def scenario() -> list[dict[str, Any]]:
        with native_connection("tcp", stack.uri()) as connection:
            session = open_session(connection)
            connection.update_runtime_budget(session, operation_id=0, token_budget=4,
                                             flags=int(nnrp.BudgetFlag.REPLACE))
            session.submit_operation(openai_submit(1, 1, request(TOKENS, "capped")))
            events = poll_until(session, lambda events: any(
                e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON") for e in events),
                timeout=15)
            session.close()
            return events

    with trio.fail_after(30):
        events = await trio.to_thread.run_sync(scenario)
    assert ending(events, 1) == ("push", 200)
    (sent,) = [r for r in stack.replay.requests if r.method == "POST"]
    assert json.loads(sent.body)["max_tokens"] == 4
    assert not stack.replay.disconnects


@pytest.mark.parametrize("family", ["0.26", "0.32", "0.33"])
async def test_submit_priority_reaches_vllm(nursery: trio.Nursery, tmp_path: Path,
                                            family: str) -> None:
    """With vLLM's priority scheduling on, the session's priority class becomes each
    request's priority (class * 10 + delta; lower runs first in vLLM): the body's
    ``priority`` up to 0.26, the ``X-Vllm-Priority`` header from 0.32 (which reads it
    first), the client's body untouched."""
    stack = await start_stack(nursery, tmp_path, replay=ReplayServer(family=family),
                              pipeline=PipelineLimits(priority_scheduling=True))

    def scenario() -> list[dict[str, Any]]:
        from nnrp.client.native import NativeClientSessionOptions, NativeSessionPriorityClass

        options = NativeClientSessionOptions(
            priority_class=NativeSessionPriorityClass.BACKGROUND)
        submit = openai_submit(1, 1, request(3, "priority"))
        with native_connection("tcp", stack.uri()) as connection:
            session = asyncio.run(connection.open_session(options))
            session.submit_operation(submit)
            events = poll_until(session, lambda events: any(
                e["kind"] == "RESULT_PUSH" for e in events), timeout=15)
            session.close()
            return events

    with trio.fail_after(30):
        events = await trio.to_thread.run_sync(scenario)
    assert ending(events, 1) == ("push", 200)
    (sent,) = [r for r in stack.replay.requests if r.method == "POST"]
    if family == "0.26":
        assert json.loads(sent.body)["priority"] == 10  # background: one step after default
        assert "x-vllm-priority" not in sent.headers
    else:
        assert sent.headers["x-vllm-priority"] == "10"
        assert "priority" not in json.loads(sent.body)


# ------------------------------------------------------------------ the referee

@attrs.define
class _Running:
    operation: Any
    frame_id: int
    total: float  # partials to send (math.inf: until the operation is ended)
    held: bool = False  # no partial after PARTIALS_BEFORE_CONTROL
    sent: int = 0
    next_at: float = 0.0
    #: A DEADLINE or EXPIRE_AT: (unix ms, the drop reason when it passes).
    expires: tuple[int, int] | None = None


def run_referee(listening: Callable[[str], None], stop: threading.Event, log: list[str],
                options: Any = None) -> None:
    """nnrp-py's native server (``options``, by default ``native_server_options()``),
    calling ``listening(endpoint)`` once it is bound and listening; one session at a
    time, with an application that streams
    ``max_tokens`` partials 25 ms apart (for a ``replay:long_stream:`` request, two and
    then nothing until a control ends it, as the replay vLLM behind the gateway is held)
    and ends cancelled, superseded or expired
    operations with RESULT_DROP_REASON the way the reference adapter does (the native
    runtime itself enforces none of these)."""

    async def serve_session(session: Any) -> None:
        active: dict[int, _Running] = {}

        async def drop(operation_id: int, reason: int, diagnostic: bytes) -> None:
            running = active.pop(operation_id, None)
            if running is not None:
                await running.operation.send_result_drop(ResultDropReasonMetadata(
                    operation_id, running.sent + 1, reason, 3, 0, len(diagnostic)),
                    diagnostic)

        while not stop.is_set():
            event = await next_event(session, 0.005)
            if event is not None and (operation := event.as_submit()) is not None:
                typed = nnrp.parse_typed_body(bytes(operation.submit.tail.body),
                                              payload_kind_bitmap=0x10, payload_frame_count=1)
                document = json.loads(typed.frames[0].payload)
                endless = document.get("request_id", "").startswith("replay:long_stream:")
                active[operation.operation_id] = _Running(
                    operation, operation.submit.header.frame_id,
                    math.inf if endless else document["body"]["max_tokens"], held=endless)
            elif event is not None and (runtime := event.as_runtime()) is not None:
                kind = runtime.header.message_type
                log.append(kind.name)
                value = runtime.metadata.value
                if kind in (MessageType.CANCEL, MessageType.ABORT):
                    await drop(value.operation_id, 3, b"peer_cancelled")
                elif kind is MessageType.FRAME_CANCEL:
                    by_frame = {r.frame_id: op for op, r in active.items()}
                    if runtime.header.frame_id in by_frame:
                        await drop(by_frame[runtime.header.frame_id], 3, b"peer_cancelled")
                elif kind is MessageType.SUPERSEDE:
                    await drop(value.old_operation_id, 2, bytes(runtime.tail.diagnostic))
                elif kind in (MessageType.DEADLINE, MessageType.EXPIRE_AT):
                    running = active.get(value.operation_id)
                    if running is not None:
                        reason = 1 if kind is MessageType.DEADLINE else 2
                        running.expires = (value.deadline_unix_ms, reason)
                elif kind is MessageType.SESSION_CLOSE:
                    await asyncio.to_thread(session.close)
                    return
            now = time.monotonic()
            for op_id, running in list(active.items()):
                if running.expires is not None and now_ms() >= running.expires[0]:
                    await drop(op_id, running.expires[1], b"")
                    continue
                if now < running.next_at or (
                        running.held and running.sent >= PARTIALS_BEFORE_CONTROL):
                    continue
                if running.sent < running.total:
                    body = json.dumps({"type": "response.output_text.delta",
                                       "delta": "x"}).encode()
                    running.sent += 1
                    running.next_at = now + 0.025
                    await running.operation.send_partial_result(PartialResultMetadata(
                        op_id, running.sent, 0, running.sent, len(body), 0), body)
                else:
                    await running.operation.send_result(
                        result_metadata(),
                        nnrp.pack_single_frame(b'{"type":"response.completed"}'))
                    del active[op_id]

    serve_native_sessions(serve_session, listening, stop, options)


async def serve_referee(stop: threading.Event, log: list[str], options: Any = None, *,
                        task_status: trio.TaskStatus[str]) -> None:
    """The referee in a thread (``start_referee``); started with its ``tcp://`` endpoint."""
    await start_referee(functools.partial(run_referee, stop=stop, log=log, options=options),
                        stop, task_status=task_status)


@pytest.fixture
async def referee() -> Any:
    stop = threading.Event()
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(REFEREE_START_LIMIT):
            uri = await nursery.start(serve_referee, stop, log)
        try:
            yield uri, log
        finally:
            stop.set()


async def test_a_referee_that_cannot_listen_says_why_at_once() -> None:
    """The referee's start waits for its listener or its failure, not for a time: a port
    already taken fails the start with nnrp-py's own listen error, not a timeout."""
    from nnrp.core.messages import TransportPolicy
    from nnrp.native import NativeRuntimeError
    from nnrp.server.native import NativeServerBootstrapOptions, NativeServerProviderRoute

    with trio.socket.socket() as taken:
        await taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        options = NativeServerBootstrapOptions(
            f"nnrp://127.0.0.1:{port}",
            provider_routes={"tcp": NativeServerProviderRoute(f"tcp://127.0.0.1:{port}")},
            transport_policy=TransportPolicy.FORCE_TCP)
        # (The old fixture waited 30 s on a queue here and raised queue.Empty.)
        with pytest.RaisesGroup(NativeRuntimeError, allow_unwrapped=True,
                                flatten_subgroups=True):
            async with trio.open_nursery() as nursery:
                with trio.fail_after(REFEREE_START_LIMIT):
                    await nursery.start(serve_referee, threading.Event(), [], options)


async def test_each_client_api_against_the_referee(referee: Any, nursery: trio.Nursery,
                                                   tmp_path: Path) -> None:
    """Every API is accepted by nnrp-py's own server as the control it names, and its
    session stays usable; where both servers end the operation, they end it alike."""
    uri, log = referee
    stack = await start_stack(nursery, tmp_path, replay=ReplayServer(token_interval_ms=25.0))
    # As in the gateway's own test: a stream a control ends is held for good after the
    # partials the client acts on (the referee's application holds it alike).
    stack.replay.hold(is_first_long, after=1 + PARTIALS_BEFORE_CONTROL)
    expected_kind = {
        "cancel": "CANCEL", "abort": "ABORT", "cancel_frame": "FRAME_CANCEL",
        "live_priority": "PRIORITY_UPDATE", "deadline": "DEADLINE", "expire_at": "EXPIRE_AT",
        "supersede": "SUPERSEDE", "live_budget": "BUDGET_UPDATE", "route_hint": "ROUTE_HINT",
        "execution_hint": "EXECUTION_HINT", "negotiate": "CAPABILITY_NEGOTIATION",
        "degrade": "DEGRADE_PROFILE"}
    for name, case in CASES.items():
        log.clear()
        with trio.fail_after(40):
            theirs = await trio.to_thread.run_sync(functools.partial(
                drive, uri, case.control, scenario=case.scenario))
            ours = await trio.to_thread.run_sync(functools.partial(
                drive, stack.uri(), case.control, scenario=case.scenario))
        assert expected_kind[name] in log, (name, log)
        assert_usable(theirs)
        assert_usable(ours)
        if name in REFEREE_ENDS:
            assert ending(ours["events"], 1) == ending(theirs["events"], 1), name


async def test_over_the_limit_is_recoverable_and_says_when(stack: Stack) -> None:
    """A submit over the session's in-flight limit ends with ERROR_RECOVERABLE and
    RETRY_AFTER before its terminal 503; the session keeps serving."""
    from nnrp.client.native import NativeClientSessionOptions

    # Operation 1 is in flight when operation 2 arrives: its stream is held until
    # operation 2's refusal is in.
    hold = stack.replay.hold(is_first, after=1)
    events: list[dict[str, Any]] = []

    def refused() -> bool:
        return any(e.get("frame_id") == 2 and e["kind"] == "RESULT_PUSH" for e in events)

    def scenario() -> dict[str, Any]:
        with native_connection("tcp", stack.uri()) as connection:
            session = asyncio.run(connection.open_session(
                NativeClientSessionOptions(max_in_flight_operations=1)))
            session.submit_operation(openai_submit(1, 1, request(TOKENS, "first")))
            session.submit_operation(openai_submit(2, 2, request(3, "over")))
            end = time.monotonic() + 15
            while time.monotonic() < end and sum(
                    e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON") for e in events) < 2:
                events.extend(poll_once(session))
            session.submit_operation(openai_submit(3, 3, request(3, "later")))
            while time.monotonic() < end and not any(
                    e.get("frame_id") == 3 and e["kind"] == "RESULT_PUSH" for e in events):
                events.extend(poll_once(session))
            session.close()
            return {"events": [e for e in events if e["kind"] != "lifecycle"]}

    async def release_once_refused() -> None:
        with trio.fail_after(30):
            await until(refused)
        hold.release()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(release_once_refused)
        with trio.fail_after(30):
            result = await trio.to_thread.run_sync(scenario)
    over = [e for e in result["events"] if e["frame_id"] == 2]
    assert [e["kind"] for e in over] == ["ERROR_RECOVERABLE", "RETRY_AFTER", "RESULT_PUSH"]
    assert over[-1]["status"] == 503
    assert over[-1]["payload"]["error"]["code"] == "adapter_operation_limit"
    assert ending(result["events"], 1) == ("push", 200)
    assert ending(result["events"], 3) == ("push", 200)
