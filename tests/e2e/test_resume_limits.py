"""Resumable sessions at their edges (issue 21): the window passing, tokens that open
nothing, another identity's token, a resume during a drain, the byte bound of a detached
session, the cap on resumable sessions, and a resubmission that is not the request it
resubmits. The project's client, step by step (``resume_session``, ``resubmit``)."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway import nnrp
from gateway.nnrp import ResumePolicy, ServerConfig
from gateway.server import TokenAuthenticator
from gateway.tools.client import ClientError, ClientSession, ResumeTicket, connect
from gateway.tools.replay import ReplayServer
from tests.support.cut import StreamCutProxy
from tests.support.servers import start_server
from tests.support.stack import (
    Stack,
    chat,
    envelope,
    metric_samples,
    records_of,
    registry_of,
    run_operation,
    start_stack,
)
from tests.support.waits import until, until_steady


async def detach(stack: Stack, payload: bytes, *, events: int = 3, auth: bytes = b""
                 ) -> tuple[ResumeTicket, int]:
    """Open a resumable session, stream ``events`` results of ``payload``, then drop the
    connection without SESSION_CLOSE; the ticket, and the last sequence received."""
    registry = registry_of(stack)
    detached = registry.detached
    async with connect(stack.uri()) as client:
        session = await client.open_session(resume=True, auth=auth)
        operation = await session.submit(payload, operation_id=41, frame_id=4)
        received = 0
        async for event in operation.events():
            assert isinstance(event, nnrp.PartialReceived)
            received = event.sequence
            if received == events:
                break
        assert session.ticket is not None
        ticket = session.ticket
    await until(lambda: registry.detached == detached + 1)
    return ticket, received


async def test_a_window_that_passes_ends_the_operations_and_aborts_vllm(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, resume=ResumePolicy(window=0.5))
    records = records_of(stack)
    ticket, _ = await detach(stack, envelope(chat(stream=True),
                                             request_id="replay:long_stream:expires"))
    with trio.fail_after(5):
        await until(lambda: stack.replay.disconnects)  # vLLM aborted the generation
        await until(lambda: records)
    (record,) = records
    assert (record.outcome, record.cancel_source) == ("cancelled", "resume_expired")
    assert record.upstream_aborted
    assert registry_of(stack).sessions == 0
    with trio.fail_after(5):
        await until(lambda: registry_of(stack).budget.held == 0)  # the journal is gone
    samples = metric_samples(stack.gateway.metrics.registry)
    assert samples[("nnrp_gateway_resume_expired_total", ())] == 1
    assert samples[("nnrp_gateway_resume_held_bytes", ())] == 0
    with trio.fail_after(5):
        async with connect(stack.uri()) as client:
            with pytest.raises(ClientError) as refused:
                await client.resume_session(ticket)
    assert not refused.value.retry_later


#: How long a spent token stays good once its client has the next (short for the test).
GRACE = 0.2


async def test_a_token_is_good_once_and_an_unknown_one_gets_the_same_answer(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, resume=ResumePolicy(confirm_grace=GRACE))
    ticket, _ = await detach(stack, envelope(chat(stream=True),
                                             request_id="replay:long_stream:once"))
    with trio.fail_after(10):
        async with connect(stack.uri()) as client:
            session = await client.resume_session(ticket)
            await check_tokens(client, session, ticket)
    assert registry_of(stack).stats.refused_total == 2


async def check_tokens(client: Any, session: ClientSession, ticket: ResumeTicket) -> None:
    """The spent token and an unknown one: refused alike; the live one: retry later.
    Asked on another connection than the one holding session 1 (there, any resume of id 1
    is refused before a token is looked at). A token is spent ``confirm_grace`` after the
    client has shown it holds the next one, by a packet on the resumed connection
    (gateway/nnrp/_resumption.py R4); until then it still opens the session (here:
    attached, so retry later)."""
    assert session.ticket is not None and session.ticket.token != ticket.token
    async with connect(client.transport.peer) as other:
        with pytest.raises(ClientError) as unconfirmed:
            await other.resume_session(ticket)
        assert unconfirmed.value.retry_later  # not spent yet: the ACK may have been lost
        await session.trace_context(trace_id=1, span_id=1)  # a packet: confirms
        await client.ping()
        await trio.sleep(GRACE)
        answers = []
        for token in (ticket.token, b"\x00" * 24):  # spent, and never issued
            with pytest.raises(ClientError) as refused:
                await other.resume_session(ResumeTicket(ticket.session_id, token,
                                                        ticket.window_ms))
            answers.append(str(refused.value))
            assert not refused.value.retry_later
        assert answers[0] == answers[1]  # nothing says whether a session exists
        # Its live token, while it is attached to a connection the server has not seen
        # die: retry later; only the holder of that token learns it.
        with pytest.raises(ClientError) as attached:
            await other.resume_session(session.ticket)
        assert attached.value.retry_later


async def test_a_token_opens_nothing_for_another_identity(nursery: trio.Nursery,
                                                          socket_dir: Path) -> None:
    authenticate = TokenAuthenticator([b"alice-key", b"bob-key"])
    stack = await start_stack(nursery, socket_dir,
                              server=ServerConfig(authenticate=authenticate))
    ticket, _ = await detach(stack, envelope(chat(stream=True),
                                             request_id="replay:long_stream:who"),
                             auth=b"alice-key")
    with trio.fail_after(10):
        async with connect(stack.uri()) as client:
            with pytest.raises(ClientError) as refused:
                await client.resume_session(ticket, auth=b"bob-key")
            assert "resume rejected" in str(refused.value)
            session = await client.resume_session(ticket, auth=b"alice-key")
            assert session.ticket is not None


async def test_during_the_drain_a_client_resumes_and_collects_what_finished_meanwhile(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """Finding 8 of issue 34: SIGTERM closed the listeners at once, so a detached session
    could not be resumed during the drain ("connection refused"), and an answer that
    finished meanwhile was never delivered. Now the gateway keeps taking connections
    while a session waits detached: a new session is retry_later, a resume is answered,
    and the answer comes whole; then the listeners close."""
    stack = await start_stack(nursery, socket_dir, drain_timeout=10.0, drain_close_grace=0.2)
    payload = envelope(chat(stream=True), request_id="replay:text_stream:drain")
    ticket, received = await detach(stack, payload)
    records = records_of(stack)
    with trio.fail_after(10):
        await until(lambda: records)  # it finished while its client was away
    assert records[0].outcome == "ok"
    events: list[Any] = []

    async def collect() -> None:
        async with connect(stack.uri()) as client:
            with pytest.raises(ClientError) as refused:
                await client.open_session()
            assert refused.value.retry_later  # no new sessions
            session = await client.resume_session(ticket)
            operation = await session.resubmit(payload, operation_id=41, frame_id=4,
                                               after=received)
            events.extend([event async for event in operation.events()])

    with trio.fail_after(15):
        # As the app does on SIGTERM (serve_until_signalled): drain, then cancel whatever
        # is left. The client's connection was taken during the drain: the drain waits
        # for it (a review found it cut before the replay went out).
        async with trio.open_nursery() as app:
            app.start_soon(collect)
            await stack.gateway.drain()
            app.cancel_scope.cancel()
    assert isinstance(events[-1], nnrp.ResultReceived)
    assert [e.sequence for e in events[:-1]] == list(range(received + 1, received + len(events)))
    assert not stack.gateway.server.accepting
    assert registry_of(stack).sessions == 0


async def test_a_connection_that_drops_during_the_drain_can_still_be_resumed(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """A review of issue 34: with nothing detached at SIGTERM, accepting stopped at once,
    and a client whose connection dropped during the drain got "connection refused".
    While a resumable session lives the gateway takes resumes; a session the gateway
    closes itself at the end of its connection's drain ends (nothing waits for it)."""
    stack = await start_stack(nursery, socket_dir, drain_timeout=10.0, drain_close_grace=0.2,
                              replay=ReplayServer(speed=1.0, token_interval_ms=10.0))
    host, _, port = stack.uri().removeprefix("tcp://").rpartition(":")
    proxy = StreamCutProxy((host, int(port)))
    via = "tcp://" + await nursery.start(proxy.serve)
    with trio.fail_after(20):
        async with connect(via, resume=True) as client, trio.open_nursery() as app:
            session = await client.open_session(resume=True)
            operation = await session.submit(envelope(chat(stream=True, max_tokens=200)))
            sequences = []
            draining = trio.Event()

            async def drain() -> None:
                draining.set()
                await stack.gateway.drain()
                app.cancel_scope.cancel()

            async for event in operation.events():
                if isinstance(event, nnrp.PartialReceived):
                    sequences.append(event.sequence)
                    if event.sequence == 20:
                        app.start_soon(drain)
                        await draining.wait()
                        await until(lambda: registry_of(stack).draining)
                        proxy.cut()  # the client's network drops during the drain
                else:
                    terminal = event
            await session.close()
    assert sequences == list(range(1, 201)) and isinstance(terminal, nnrp.ResultReceived)
    assert client.recoveries == 1
    assert not stack.gateway.server.accepting and registry_of(stack).sessions == 0


async def test_a_session_still_detached_when_the_drain_ends_ends_and_vllm_aborts(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, drain_timeout=1.0, drain_close_grace=0.2)
    records = records_of(stack)
    await detach(stack, envelope(chat(stream=True), request_id="replay:long_stream:drain"))
    with trio.fail_after(10):
        await stack.gateway.drain()
    await until(lambda: records)
    (record,) = records
    assert (record.outcome, record.upstream_aborted) == ("shutdown", True)
    with trio.fail_after(5):  # the backend sees the abort after the log
        await until(lambda: stack.replay.disconnects)
    assert [d.request_id for d in stack.replay.disconnects] == ["replay:long_stream:drain"]
    assert not stack.gateway.server.accepting


async def test_a_detached_session_at_its_byte_bound_stops_reading_vllm_and_loses_nothing(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    bound = 16 << 10
    stack = await start_stack(nursery, socket_dir,
                              replay=ReplayServer(speed=50.0, token_interval_ms=1.0),
                              resume=ResumePolicy(session_bytes=bound))
    request_id = "replay:long_stream:bound"
    payload = envelope(chat(stream=True), request_id=request_id)
    ticket, received = await detach(stack, payload)
    registry = registry_of(stack)
    # The journal fills to its bound, then the operation waits: vLLM's socket is no
    # longer read (the replay's count stops), and nothing is dropped.
    with trio.fail_after(10):
        await until(lambda: registry.budget.held >= bound)
        progress = stack.replay.playing[request_id]
        await until_steady(lambda: progress.sent, 0.5)  # the writes stopped
    assert registry.budget.held < bound + (8 << 10)  # one upstream read past it at most
    with trio.fail_after(10):
        async with connect(stack.uri()) as client:
            session = await client.resume_session(ticket)
            operation = await session.resubmit(payload, operation_id=41, frame_id=4,
                                               after=received)
            sequences = []
            async for event in operation.events():
                sequences.append(event.sequence)
                if len(sequences) == 2000:
                    await operation.cancel()
                    break
    assert sequences == list(range(received + 1, received + 2001))


async def test_room_another_session_makes_in_the_shared_bound_wakes_a_detached_one(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    bound = 16 << 10
    stack = await start_stack(nursery, socket_dir,
                              replay=ReplayServer(speed=50.0, token_interval_ms=1.0),
                              resume=ResumePolicy(total_bytes=bound))
    registry = registry_of(stack)
    first = envelope(chat(stream=True), request_id="replay:long_stream:first")
    second = envelope(chat(stream=True), request_id="replay:long_stream:second")
    first_ticket, _ = await detach(stack, first)
    with trio.fail_after(10):
        await until(lambda: registry.budget.held >= bound)  # the first fills the bound
    before = set(map(id, registry.book.records.values()))
    await detach(stack, second)
    (record,) = [r for r in registry.book.records.values() if id(r) not in before]
    journal = record.session.journal
    with trio.fail_after(10):
        await until_steady(lambda: journal.held, 0.5)  # the second waits for room
    stalled_at = journal.held
    # The first session's client comes back and closes it: its bytes are freed, and the
    # second, still detached, reads vLLM again until the bound is reached once more.
    # (Counted where the gateway keeps them: the backend's own count of what it wrote
    # may not move, the sockets' buffers holding more than the bound.)
    async with connect(stack.uri()) as client:
        session = await client.resume_session(first_ticket)
        await session.close()
    with trio.fail_after(10):
        await until(lambda: registry.sessions == 1)
        await until(lambda: journal.held > stalled_at)
        await until(lambda: registry.budget.held >= bound)
    assert registry.detached == 1


async def test_a_recovery_that_meets_a_server_that_never_answers_ends_with_the_window(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """Our client's recovery: the address now leads to something that takes the
    connection and never answers (a half-dead pod behind the same name). Each attempt
    ends with the window, and the operation gets an error, not a wait without end."""
    stack = await start_stack(nursery, socket_dir, resume=ResumePolicy(window=1.0))
    host, _, port = stack.uri().removeprefix("tcp://").rpartition(":")
    proxy = StreamCutProxy((host, int(port)))
    via = "tcp://" + await nursery.start(proxy.serve)
    silent: list[trio.SocketStream] = []

    async def never_answer(stream: trio.SocketStream) -> None:
        silent.append(stream)
        await trio.sleep_forever()

    (black_hole,) = await nursery.start(
        functools.partial(trio.serve_tcp, never_answer, 0, host="127.0.0.1"))
    with trio.fail_after(10):
        async with connect(via, resume=True) as client:
            session = await client.open_session(resume=True)
            operation = await session.submit(envelope(chat(stream=True)))
            async for event in operation.events():
                if isinstance(event, nnrp.PartialReceived) and event.sequence == 3:
                    proxy.target = black_hole.socket.getsockname()[:2]
                    proxy.cut()
                    break
            with pytest.raises(ClientError, match=r"not resumed .* window of 1 s passed"):
                async for _ in operation.events():
                    pass
            assert client.recoveries == 0 and client.recovery_attempts >= 1
            assert silent  # it did reach the silent server


async def test_a_recovery_that_meets_a_busy_server_tries_again_and_resumes(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """SERVER_BUSY to a recovering client (a pod at its connection limit, or another
    behind the same name): it says to try again, so the client does, and resumes once
    the gateway that holds its session answers."""
    stack = await start_stack(nursery, socket_dir)
    (socket_dir / "busy").mkdir()
    busy = await start_server(nursery, socket_dir / "busy", max_connections=0)
    gateway = stack.uri().removeprefix("tcp://").rpartition(":")
    proxy = StreamCutProxy((gateway[0], int(gateway[2])))
    via = "tcp://" + await nursery.start(proxy.serve)
    payload = envelope(chat(stream=True, max_tokens=200))
    with trio.fail_after(20):
        async with connect(via, resume=True) as client:
            session = await client.open_session(resume=True)
            operation = await session.submit(payload)
            sequences = []
            async for event in operation.events():
                if isinstance(event, nnrp.PartialReceived):
                    sequences.append(event.sequence)
                if sequences == [1, 2, 3]:
                    host, _, port = busy.uri().removeprefix("tcp://").rpartition(":")
                    proxy.target = (host, int(port))
                    proxy.cut()
                    await until(lambda: busy.server.stats.connections_refused >= 2)
                    proxy.target = (gateway[0], int(gateway[2]))
    assert sequences == list(range(1, 201))
    assert client.recoveries == 1 and client.recovery_attempts >= 3


async def test_past_the_cap_sessions_open_without_resume(nursery: trio.Nursery,
                                                         socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, resume=ResumePolicy(max_sessions=1))
    async with connect(stack.uri()) as client:
        first = await client.open_session(resume=True)
        second = await client.open_session(resume=True)
        assert first.ticket is not None
        assert second.ticket is None  # resume_enabled clear: the client sees it
        await first.close()
        third = await client.open_session(resume=True)  # the cap counts live ones only
        assert third.ticket is not None


async def test_a_resubmission_that_is_another_request_is_refused_and_the_original_ends(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir)
    request_id = "replay:long_stream:other"
    ticket, _ = await detach(stack, envelope(chat(stream=True), request_id=request_id))
    with trio.fail_after(10):
        async with connect(stack.uri()) as client:
            session = await client.resume_session(ticket)
            other = envelope(chat(stream=True, max_tokens=3), request_id=request_id)
            operation = await session.resubmit(other, operation_id=41, frame_id=4)
            (terminal,) = [event async for event in operation.events()]
        await until(lambda: stack.replay.disconnects)
    assert isinstance(terminal, nnrp.ResultReceived)
    assert terminal.meta.status_code == 409
    assert terminal.typed_body is not None
    error = json.loads(terminal.typed_body.frames[0].payload)["error"]
    assert error["code"] == "resubmission_differs"
    assert [r.method for r in stack.replay.requests].count("POST") == 1


async def test_a_deadline_runs_on_while_detached_and_its_drop_is_replayed(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """A DEADLINE keeps running while the session waits for its client: the operation
    ends at it (vLLM aborted), and the resumed client gets everything held, the drop
    last."""
    stack = await start_stack(nursery, socket_dir)
    records = records_of(stack)
    request_id = "replay:long_stream:deadline"
    payload = envelope(chat(stream=True), request_id=request_id)
    async with connect(stack.uri()) as client:
        session = await client.open_session(resume=True)
        operation = await session.submit(payload, operation_id=41, frame_id=4)
        await client.send(client.sans_io.deadline(
            session.session_id, 41, int(time.time() * 1000) + 300, frame_id=4))
        async for _ in operation.events():
            break
        assert session.ticket is not None
        ticket = session.ticket
    with trio.fail_after(5):
        await until(lambda: records)
    (record,) = records
    assert (record.outcome, record.cancel_source) == ("deadline", "deadline_expired")
    with trio.fail_after(5):  # the backend sees the abort after the log
        await until(lambda: stack.replay.disconnects)
    assert [d.request_id for d in stack.replay.disconnects] == [request_id]
    with trio.fail_after(10):
        async with connect(stack.uri()) as client:
            resumed = await client.resume_session(ticket)
            again = await resumed.resubmit(payload, operation_id=41, frame_id=4)
            events = [event async for event in again.events()]
    assert isinstance(events[-1], nnrp.DropReceived)
    assert events[-1].drop_reason == nnrp.DropReason.DEADLINE_EXPIRED
    partials = [e.sequence for e in events if isinstance(e, nnrp.PartialReceived)]
    assert partials == list(range(1, len(partials) + 1)) and len(partials) >= 1


async def test_an_operation_not_resubmitted_in_the_window_ends_without_a_frame(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """After a resume the client has the window to resubmit what it wants back; what it
    does not resubmit ends when the window passes (vLLM aborted), and not one frame of it
    reaches the client, which never asked for it again: a frame of an operation the
    client does not know is a protocol error to it. The session goes on."""
    stack = await start_stack(nursery, socket_dir, resume=ResumePolicy(window=0.5))
    records = records_of(stack)
    ticket, _ = await detach(stack, envelope(chat(stream=True),
                                             request_id="replay:long_stream:forgotten"))
    with trio.fail_after(10):
        async with connect(stack.uri()) as client:
            session = await client.resume_session(ticket)
            await until(lambda: records)
            (record,) = records
            assert (record.outcome, record.cancel_source) == ("cancelled", "resume_expired")
            await until(lambda: stack.replay.disconnects)
            # Frames come in order: a stray one of operation 41 would be read before this
            # operation's result, and fail the client.
            outcome = await run_operation(session, envelope(chat(max_tokens=2)))
            assert outcome.status == 200
            assert client.failure is None


async def test_a_resumed_session_closed_before_its_resubmissions_sends_none_of_them(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """SESSION_CLOSE (drain) on a resumed session whose operation was never resubmitted:
    the operation is abandoned there and then, nothing of it goes out, the close is
    acknowledged at once."""
    stack = await start_stack(nursery, socket_dir)
    records = records_of(stack)
    ticket, _ = await detach(stack, envelope(chat(stream=True),
                                             request_id="replay:long_stream:closed"))
    with trio.fail_after(10):
        async with connect(stack.uri()) as client:
            session = await client.resume_session(ticket)
            await session.close()
            assert client.failure is None
        await until(lambda: records)
    (record,) = records
    assert record.cancel_source == "resume_abandoned"
    with trio.fail_after(5):
        await until(lambda: stack.replay.disconnects)


async def test_a_pause_ends_with_its_connection_and_the_resumed_stream_goes_on(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """Flow control belongs to a connection (nnrp-wire.md, BACKPRESSURE): an operation
    paused on the connection that dropped is not paused on the one that resumes it."""
    stack = await start_stack(nursery, socket_dir,
                              replay=ReplayServer(speed=1.0, token_interval_ms=5.0))
    registry = registry_of(stack)
    payload = envelope(chat(stream=True, max_tokens=60))
    with trio.fail_after(10):
        async with connect(stack.uri()) as client:
            session = await client.open_session(resume=True)
            operation = await session.submit(payload, operation_id=41, frame_id=4)
            async for event in operation.events():
                received = event.sequence
                break
            await session.backpressure(nnrp.PressureLevel.PAUSED)
            # The gateway reads a connection in order: once this answer is back, the
            # pause has been applied.
            await client.open_session()
            assert session.ticket is not None
            ticket = session.ticket
        await until(lambda: registry.detached == 1)
        async with connect(stack.uri()) as client:
            resumed = await client.resume_session(ticket)
            again = await resumed.resubmit(payload, operation_id=41, frame_id=4,
                                           after=received)
            events = [event async for event in again.events()]
    partials = [e.sequence for e in events if isinstance(e, nnrp.PartialReceived)]
    assert partials == list(range(received + 1, 61))
    assert isinstance(events[-1], nnrp.ResultReceived) and events[-1].meta.status_code == 200


async def test_each_resume_gives_the_operations_a_window_of_their_own(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """The window for resubmitting runs from the latest resume: the timer an earlier
    resume left must not end an operation the client resubmits within the window of a
    later one. (Found by ``bench run --scenario resume``: cuts about a window apart
    ended a stream as resume_expired moments after its second resume; its resubmission
    got 410 and the rest of the stream was lost.)"""
    window = 2.0
    stack = await start_stack(nursery, socket_dir, resume=ResumePolicy(window=window))
    registry = registry_of(stack)
    records = records_of(stack)
    payload = envelope(chat(stream=True), request_id="replay:long_stream:twice")
    ticket, held = await detach(stack, payload)
    with trio.fail_after(20):
        async with connect(stack.uri()) as client:  # resume 1, resubmitted at once
            session = await client.resume_session(ticket)
            first = trio.current_time()
            operation = await session.resubmit(payload, operation_id=41, frame_id=4,
                                               after=held)
            async for event in operation.events():
                assert isinstance(event, nnrp.PartialReceived)
                held = event.sequence
                break
            assert session.ticket is not None
            ticket = session.ticket
        await until(lambda: registry.detached == 1)
        await trio.sleep_until(first + window / 2)
        async with connect(stack.uri()) as client:  # resume 2, halfway through the first's
            session = await client.resume_session(ticket)
            # Resubmitted after the first resume's window, within the second's.
            await trio.sleep_until(first + window * 1.25)
            operation = await session.resubmit(payload, operation_id=41, frame_id=4,
                                               after=held)
            async for event in operation.events():
                assert isinstance(event, nnrp.PartialReceived), event
                assert event.sequence == held + 1  # it goes on where it was
                break
            await operation.cancel()
            async for _ in operation.events():
                pass
    await until(lambda: records)
    (record,) = records
    assert (record.outcome, record.cancel_source) == ("cancelled", "cancel")  # not expired
