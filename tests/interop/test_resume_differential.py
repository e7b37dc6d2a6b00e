"""Differential (issue 21): one resume script, with nnrp-py's native client, against
nnrp-py's native server and against the gateway, each behind a proxy that cuts it and
records the frames (tests.support.cut).

The script: open a session with ``allow_resume``, submit operation 7001 (frame 1), read
some partials; try the live ticket on a second connection while the first still
streams; cut the connection; once the server has seen it die, resume with the ticket on
a new connection, resubmit 7001 with the same ids and read to the terminal; cut again
and, once that is seen, resume with the ticket already spent (refused), then with the
current one (accepted) and close the session.

What must agree, and does: a 120,000 ms window and a 24-byte token; a resume answered
``resumed`` with the same session id, ``resume_enabled`` and a new token (tokens
rotate); the spent token refused as ``resume_rejected`` (header session 0, no token, no
``resume_enabled``); a 200 terminal; the client holding every sequence 1..n.

Where they differ, in the room the spec leaves (session-recovery.md):

* The operation. nnrp-py's server starts a resubmitted operation again: the resumed
  session is a new session to its application, which runs the work a second time and
  streams sequences from 1 again (the second run's bodies). The gateway attaches the
  resubmission to its generation and sends again what it holds, with the original
  sequences and bytes, then goes on live: vLLM sees one request.
* A refusal's ACK. nnrp-py's server fills in ``resume_window_ms`` (its window),
  ``granted_operation_credit`` and ``max_in_flight`` when it refuses a resume, and sends
  no body; the gateway, granting nothing, sends 0 in all three and a UTF-8 diagnostic
  as the body. (A resumed ACK differs in the credit granted alone: 2 against 4.)
* The live token of a session whose connection still lives. nnrp-py's server rejects it
  (its record is active); the gateway answers ``retry_later``, with the same
  ``resume_rejected`` code, so the holder of the current token knows to try again once
  the old connection is seen dead (docs/resume.md).
* The spent token. nnrp-py's server refuses it from the moment it hands out the next;
  the gateway keeps it good for ``confirm_grace`` seconds after the client shows it holds
  the new one (rule R4: an ACK lost with its connection must not strand the session), so
  here the gateway runs with a short grace and the script waits past it.

Found here, and fixed: nnrp-py's server declares a refusal's diagnostic body in
``session_extension_bytes`` (checked with its schema and policy refusals); the gateway
sent the body with 0 there, and nnrp-py's client, finding bytes it was not told of,
reported ``NativeInvalidStateError`` detail 105 instead of the refusal. Now both
refusals read in nnrp-py's client as the reference's does (the last test).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

pytest.importorskip("nnrp.server.native")

from nnrp.client.native import NativeClientSessionOptions, connect_native_client_connection
from nnrp.core.enums import MessageType
from nnrp.native import NativeRuntimeError
from nnrp.runtime.types import PartialResultMetadata
from nnrp.server.native import (
    listen_native_server,
)

from gateway import nnrp
from gateway.nnrp import ResumePolicy
from gateway.observe import ObservationRecord
from gateway.tools.conformance import native_client_options
from gateway.tools.replay import ReplayServer
from tests.support.cut import StreamCutProxy
from tests.support.native import (
    close_serving,
    native_server_options,
    openai_submit,
    poll_until,
    result_metadata,
    waiting_accept,
)
from tests.support.stack import chat, envelope, records_of, start_stack
from tests.support.waits import until

pytestmark = pytest.mark.interop

RESUME = NativeClientSessionOptions(allow_resume=True)
#: The gateway's grace for a replaced token (10 s by default), short here so that the
#: spent token is tried past it.
CONFIRM_GRACE = 0.2
OPERATION, FRAME = 7001, 1
#: Partials in the operation, and how many the client reads before its connection drops.
N, READ_BEFORE_CUT = 120, 20
#: nnrp-py's serving actor sends one partial per operation this often.
PACE = 0.005
#: Bounds a native client's wait for one phase (a guard: every wait ends on an event).
PHASE_TIMEOUT = 20.0


def terminal(events: list[dict[str, Any]]) -> bool:
    return any(e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON") for e in events)


# -- nnrp-py's native server, with a serving application --------------------------------


@attrs.define
class _Served:
    """One session the native server gave the application (a resumed one is a new one)."""

    session: Any
    #: operation id -> [operation, partials sent, partials to send, run, last send time]
    operations: dict[int, list[Any]] = attrs.Factory(dict)
    done: bool = False


@attrs.define
class NativeApplication:
    """An application on nnrp-py's native server, as one actor (nnrp-py.md): accepts
    sessions, resumed ones included, and serves each submit by streaming the N partials
    its JSON payload asks for, then a RESULT_PUSH 200. A session whose connection died is
    left alone, never closed: closing it would delete the session's record in the
    runtime, and a resume would then be refused."""

    ready: queue.Queue[str] = attrs.Factory(queue.Queue)
    stop: threading.Event = attrs.Factory(threading.Event)
    #: Sessions whose connection the runtime has seen die (their poll fails), in order.
    lost: list[int] = attrs.Factory(list)
    #: (session index, operation id, frame id, run) for every submit served.
    submits: list[tuple[int, int, int, int]] = attrs.Factory(list)

    def run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        # An explicit tcp route: "nnrp://host:0" alone binds nnrp's default port (4433).
        with listen_native_server(native_server_options()) as server:
            self.ready.put(server.bound_provider_endpoints["tcp"].uri)
            served: list[_Served] = []
            runs: dict[int, int] = {}
            accepting = waiting_accept(server)
            try:
                while not self.stop.is_set():
                    if accepting.done():
                        served.append(_Served(accepting.result()))
                        accepting = waiting_accept(server)
                    live = [(index, e) for index, e in enumerate(served) if not e.done]
                    if not live:
                        await asyncio.wait({accepting}, timeout=0.01)
                    for index, entry in live:
                        await self._step(index, entry, runs)
            finally:
                await close_serving(server, accepting)

    async def _step(self, index: int, entry: _Served, runs: dict[int, int]) -> None:
        try:
            events = entry.session.poll_events(max_events=16, timeout_ms=1)
        except NativeRuntimeError:  # the runtime dropped the session: its connection died
            entry.done = True
            self.lost.append(index)
            return
        for event in events:
            if (operation := event.as_submit()) is not None:
                typed = nnrp.parse_typed_body(bytes(operation.submit.tail.body),
                                              payload_kind_bitmap=0x10, payload_frame_count=1)
                total = json.loads(typed.frames[0].payload)["n"]
                run = runs[operation.operation_id] = runs.get(operation.operation_id, 0) + 1
                self.submits.append((index, operation.operation_id, operation.frame_id, run))
                entry.operations[operation.operation_id] = [operation, 0, total, run, 0.0]
            elif ((runtime := event.as_runtime()) is not None
                  and runtime.header.message_type is MessageType.SESSION_CLOSE):
                # A clean close: the client's close() waits for the application's.
                await asyncio.to_thread(entry.session.close)
                entry.done = True
                return
        now = time.monotonic()
        for op_id, state in list(entry.operations.items()):
            operation, sent, total, run, last = state
            if now - last < PACE:
                continue
            state[4] = now
            try:
                if sent < total:
                    body = json.dumps({"delta": f"t{sent + 1}", "run": run}).encode()
                    await operation.send_partial_result(
                        PartialResultMetadata(op_id, sent + 1, 0, sent + 1, len(body), 0), body)
                    state[1] = sent + 1
                else:
                    await operation.send_result(
                        result_metadata(), nnrp.pack_single_frame(b'{"type":"done"}'))
                    del entry.operations[op_id]
            except NativeRuntimeError:  # the connection died under the send; the poll says so next
                entry.operations.clear()
                return


# -- the client script, the same for both servers ----------------------------------------


@attrs.define
class Target:
    proxy: StreamCutProxy
    uri: str  # tcp:// through the proxy
    payload: bytes
    #: True once the server has seen its client's connection die (``cuts`` so far).
    seen_dead: Callable[[int], bool]
    #: How long a replaced token stays good once the new one is confirmed: nnrp-py spends
    #: it at once; the gateway keeps it ``confirm_grace`` seconds (a lost ACK, R4).
    spent_after: float = 0.0


@attrs.frozen
class Ticket:
    session_id: int
    token: bytes
    window_ms: int
    from_operation: int | None

    @classmethod
    def of(cls, ticket: Any) -> Ticket:
        return cls(ticket.session_id, ticket.resume_token, ticket.resume_window_ms,
                   ticket.resume_from_operation_id)


@attrs.frozen
class Refusal:
    """A refused resume as nnrp-py's client reports it."""

    exception: str
    status_code: int
    error_family: int
    protocol_error_code: int
    detail_code: int


@attrs.define
class Observed:
    """What one server did with the script."""

    opened: Ticket | None = None
    submitted: Ticket | None = None
    resumed: Ticket | None = None
    last: Ticket | None = None
    live: Refusal | None = None
    spent: Refusal | None = None
    before: list[dict[str, Any]] = attrs.Factory(list)
    after: list[dict[str, Any]] = attrs.Factory(list)
    #: Connection number -> the SESSION_OPEN_ACK on it: (header session_id, ACK, body).
    acks: dict[int, tuple[int, nnrp.SessionOpenAck, bytes]] = attrs.Factory(dict)


def _refusal(connection: Any, ticket: Any) -> Refusal | None:
    try:
        asyncio.run(connection.resume_session(ticket, RESUME))
    except NativeRuntimeError as error:
        status = error.status
        return Refusal(type(error).__name__, status.status_code, status.error_family,
                       status.protocol_error_code, status.detail_code)
    return None  # accepted: the caller's assertion says what was expected


async def run_script(target: Target) -> Observed:
    seen = Observed()
    trio_token = trio.lowlevel.current_trio_token()
    options = native_client_options(target.uri)

    def first_connection() -> Any:
        opened = connect_native_client_connection(options)
        connection = opened.__enter__()
        session = asyncio.run(connection.open_session(RESUME))
        seen.opened = Ticket.of(session.recovery_ticket())
        session.submit_operation(openai_submit(OPERATION, FRAME, target.payload))
        seen.before = poll_until(session, lambda events: sum(
            e["kind"] == "PARTIAL_RESULT" for e in events) >= READ_BEFORE_CUT, PHASE_TIMEOUT)
        ticket = session.recovery_ticket()
        seen.submitted = Ticket.of(ticket)
        # The live ticket, on another connection while this one streams on.
        with connect_native_client_connection(options) as other:
            seen.live = _refusal(other, ticket)
        trio.from_thread.run_sync(target.proxy.cut, trio_token=trio_token)
        with contextlib.suppress(Exception):  # its connection is gone: closing it fails
            opened.__exit__(None, None, None)
        return ticket

    def resumed_connection(ticket: Any) -> Any:
        opened = connect_native_client_connection(options)
        connection = opened.__enter__()
        session = asyncio.run(connection.resume_session(ticket, RESUME))
        renewed = session.recovery_ticket()
        seen.resumed = Ticket.of(renewed)
        session.submit_operation(openai_submit(OPERATION, FRAME, target.payload))
        seen.after = poll_until(session, terminal, PHASE_TIMEOUT)
        # Dropped too, without SESSION_CLOSE: the session stays resumable, with the new
        # token only, which is what the spent one is then tried against.
        trio.from_thread.run_sync(target.proxy.cut, trio_token=trio_token)
        with contextlib.suppress(Exception):
            opened.__exit__(None, None, None)
        return renewed

    def spent_then_current(spent: Any, current: Any) -> None:
        with connect_native_client_connection(options) as connection:
            seen.spent = _refusal(connection, spent)
        # The current token still opens it: the refusal was the token's, not a lost session.
        with connect_native_client_connection(options) as connection:
            session = asyncio.run(connection.resume_session(current, RESUME))
            seen.last = Ticket.of(session.recovery_ticket())
            session.close()

    with trio.fail_after(60):
        ticket = await trio.to_thread.run_sync(first_connection)
        # A resume before the server has seen the cut would meet a live session (the
        # third difference): wait for the server to say it has.
        await until(lambda: target.seen_dead(1))
        renewed = await trio.to_thread.run_sync(resumed_connection, ticket)
        await until(lambda: target.seen_dead(2))
        await trio.sleep(target.spent_after)
        await trio.to_thread.run_sync(spent_then_current, ticket, renewed)
    assert target.proxy.record_errors == []
    seen.acks = {r.connection: (r.packet.session_id, r.packet.message, r.packet.body)
                 for r in target.proxy.packets if isinstance(r.packet.message, nnrp.SessionOpenAck)}
    return seen


async def against_nnrp_py() -> tuple[Observed, NativeApplication]:
    application = NativeApplication()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, application.run)
        try:
            endpoint = await trio.to_thread.run_sync(application.ready.get, True, 30)
            host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
            proxy = StreamCutProxy((host, int(port)), record=True)
            via = await nursery.start(proxy.serve)
            # The runtime drops a session as soon as its connection dies, and the
            # application's next poll of it fails: that is the server having seen it.
            seen = await run_script(Target(
                proxy, f"tcp://{via}", json.dumps({"n": N}).encode(),
                lambda cuts: len(application.lost) == cuts))
        finally:
            application.stop.set()  # its thread ends by itself; the proxy is cancelled
            nursery.cancel_scope.cancel()
    return seen, application


@attrs.frozen
class Gateway:
    seen: Observed
    replay: ReplayServer
    records: list[ObservationRecord]


async def against_the_gateway(socket_dir: Path) -> Gateway:
    async with trio.open_nursery() as nursery:
        stack = await start_stack(nursery, socket_dir,
                                  replay=ReplayServer(speed=1.0, token_interval_ms=5.0),
                                  resume=ResumePolicy(confirm_grace=CONFIRM_GRACE))
        records = records_of(stack)
        registry = stack.gateway.server.registry
        assert registry is not None
        host, _, port = stack.uri("tcp").removeprefix("tcp://").rpartition(":")
        proxy = StreamCutProxy((host, int(port)), record=True)
        via = await nursery.start(proxy.serve)
        payload = envelope(chat(stream=True, max_tokens=N), request_id="differential-1")
        # Its one session detached again after each cut (a resume attaches it).
        seen = await run_script(Target(proxy, f"tcp://{via}", payload,
                                       lambda cuts: registry.detached == 1,
                                       spent_after=CONFIRM_GRACE * 2))
        with trio.fail_after(10):
            await until(lambda: records)
        nursery.cancel_scope.cancel()
    return Gateway(seen, stack.replay, records)


@attrs.frozen
class Runs:
    reference: Observed
    application: NativeApplication
    gateway: Gateway

    @property
    def ours(self) -> Observed:
        return self.gateway.seen


@pytest.fixture(scope="module")
def runs() -> Runs:
    """The script against both servers, once for this module's tests, which compare the
    same two runs. Its own trio.run: pytest-trio's fixtures live for one test."""

    async def both(socket_dir: Path) -> Runs:
        reference, application = await against_nnrp_py()
        return Runs(reference, application, await against_the_gateway(socket_dir))

    # Under /tmp, as the socket_dir fixture: the gateway's unix socket path must be short.
    with tempfile.TemporaryDirectory(prefix="nnrp-") as path:
        return trio.run(both, Path(path))


def partials(events: list[dict[str, Any]]) -> dict[int, bytes]:
    """sequence -> body, for one connection's events (no sequence twice on one)."""
    found = [(e["sequence"], e["body"]) for e in events if e["kind"] == "PARTIAL_RESULT"]
    assert len({sequence for sequence, _ in found}) == len(found)
    return dict(found)


def differing(reference: nnrp.SessionOpenAck, ours: nnrp.SessionOpenAck
              ) -> dict[str, tuple[int, int]]:
    """The fields of two ACKs that differ: name -> (nnrp-py's, ours)."""
    theirs, mine = attrs.asdict(reference), attrs.asdict(ours)
    return {name: (value, mine[name]) for name, value in theirs.items() if mine[name] != value}


# The connections of the script, as the proxies number them.
OPENED, LIVE, RESUMED, SPENT, LAST = 1, 2, 3, 4, 5
RESUME_REJECTED = int(nnrp.SessionError.RESUME_REJECTED)


def test_both_grant_a_120_s_window_and_a_24_byte_token_that_rotates(runs: Runs) -> None:
    for seen in (runs.reference, runs.ours):
        tickets = [seen.opened, seen.submitted, seen.resumed, seen.last]
        assert all(t is not None for t in tickets)
        opened, submitted, resumed, last = (t for t in tickets if t is not None)
        assert {t.session_id for t in (opened, submitted, resumed, last)} == {1}
        assert {t.window_ms for t in (opened, submitted, resumed, last)} == {120_000}
        assert {len(t.token) for t in (opened, submitted, resumed, last)} == {24}
        assert submitted.token == opened.token  # a submit changes nothing but the position
        assert (opened.from_operation, submitted.from_operation) == (None, OPERATION)
        assert len({submitted.token, resumed.token, last.token}) == 3  # a new one each resume
        # Each resumed ACK: the same session, status resumed, resume still enabled, the
        # new token as its body.
        for connection, ticket in ((RESUMED, resumed), (LAST, last)):
            header_session, ack, body = seen.acks[connection]
            assert (header_session, ack.session_id, ack.status) == (
                1, 1, nnrp.SessionOpenStatus.RESUMED)
            assert (ack.session_flags_ack, ack.resume_window_ms, ack.resume_token_bytes,
                    ack.session_error_code) == (1, 120_000, 24, 0)
            assert body == ticket.token
    # Field by field, the granting ACKs differ in the credit granted alone (server policy):
    # nnrp-py grants 2 each time; ours grants the session's free slots, so the resume
    # that finds the operation still running grants one fewer.
    for connection, ours in ((OPENED, 4), (RESUMED, 3), (LAST, 4)):
        assert differing(runs.reference.acks[connection][1], runs.ours.acks[connection][1]
                         ) == {"granted_operation_credit": (2, ours)}


def test_both_end_with_a_200_and_the_client_holds_every_sequence(runs: Runs) -> None:
    for seen in (runs.reference, runs.ours):
        (result,) = [e for e in seen.after if e["kind"] == "RESULT_PUSH"]
        assert result["status"] == 200
        before, after = partials(seen.before), partials(seen.after)
        assert len(before) >= READ_BEFORE_CUT
        assert sorted(before.keys() | after.keys()) == list(range(1, N + 1))


def test_nnrp_py_runs_a_resubmitted_operation_again(runs: Runs) -> None:
    """Its resumed session is new to the application: the resubmission is a new operation,
    served from the start (sequences from 1, second-run bodies)."""
    seen = runs.reference
    before, after = partials(seen.before), partials(seen.after)
    assert runs.application.submits == [(0, OPERATION, FRAME, 1), (1, OPERATION, FRAME, 2)]
    assert list(after) == list(range(1, N + 1))
    assert {json.loads(body)["run"] for body in before.values()} == {1}
    assert {json.loads(body)["run"] for body in after.values()} == {2}
    assert all(after[sequence] != body for sequence, body in before.items())


def test_the_gateway_attaches_the_resubmission_and_sends_again_what_it_holds(
        runs: Runs) -> None:
    """The resubmission joins the generation (one vLLM request): what the client may have
    missed comes again with its original sequences and bytes, then the rest."""
    before, after = partials(runs.ours.before), partials(runs.ours.after)
    assert list(after) == list(range(1, N + 1))
    assert all(after[sequence] == body for sequence, body in before.items())
    replay = runs.gateway.replay
    assert len([r for r in replay.requests if r.method == "POST"]) == 1
    assert replay.disconnects == []
    (record,) = runs.gateway.records
    assert (record.outcome, record.resumed, record.events) == ("ok", 1, N)
    assert record.replayed_events >= len(before)


def test_both_refuse_the_spent_token_as_resume_rejected(runs: Runs) -> None:
    """The same refusal in what decides it; nnrp-py's server also fills in its window and
    credit, where the gateway, granting nothing, sends 0 and says why in the body."""
    for seen in (runs.reference, runs.ours):
        header_session, ack, _ = seen.acks[SPENT]
        assert (header_session, ack.session_id, ack.status, ack.session_error_code) == (
            0, 0, nnrp.SessionOpenStatus.REJECTED, RESUME_REJECTED)
        assert (ack.resume_token_bytes, ack.session_flags_ack) == (0, 0)
    reference, ours = runs.reference.acks[SPENT], runs.ours.acks[SPENT]
    assert differing(reference[1], ours[1]) == {
        "granted_operation_credit": (2, 0), "max_in_flight": (4, 0),
        "resume_window_ms": (120_000, 0), "session_extension_bytes": (0, len(ours[2]))}
    assert (reference[2], ours[2]) == (
        b"", b"resume rejected: no session can be resumed with this token")
    # What nnrp-py's client makes of the reference's refusal: resume_rejected, in its
    # session error family.
    assert runs.reference.spent == Refusal("NativeProtocolError", 4, 1, RESUME_REJECTED, 108)


def test_a_live_token_is_rejected_by_nnrp_py_and_retry_later_at_the_gateway(
        runs: Runs) -> None:
    """While the session's first connection still streams, its token on another
    connection: nnrp-py's server rejects it (its record is active); the gateway asks the
    holder to retry, and pings the old connection (gateway/nnrp/_resumption.py R8):
    silent for the probe's time, it would be taken for dead. The same code in both."""
    reference, ours = runs.reference.acks[LIVE], runs.ours.acks[LIVE]
    assert (reference[1].status, ours[1].status) == (
        nnrp.SessionOpenStatus.REJECTED, nnrp.SessionOpenStatus.RETRY_LATER)
    assert differing(reference[1], ours[1]) == {
        "status": (1, 2), "granted_operation_credit": (2, 0), "max_in_flight": (4, 0),
        "resume_window_ms": (120_000, 0), "session_extension_bytes": (0, len(ours[2]))}
    assert reference[1].session_error_code == RESUME_REJECTED
    assert (reference[2], ours[2]) == (
        b"", b"the session is still attached to its previous connection, which is being "
        b"checked; retry shortly")
    assert runs.reference.live == Refusal("NativeProtocolError", 4, 1, RESUME_REJECTED, 108)


def test_nnrp_py_s_client_sees_the_same_refusals_from_both(runs: Runs) -> None:
    assert runs.ours.spent == runs.reference.spent
    assert runs.ours.live == runs.reference.live
