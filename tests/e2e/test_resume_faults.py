"""Resumable sessions under the faults issue 34 found (the redesign of issue 21's resume):
a resume answer lost with its connection, detached streams holding every upstream slot,
an old connection that goes silent instead of closing, nnrp-py's unchanged resubmission
of an answer longer than the session keeps, and request bodies held past every bound.

Each test names its finding, what was wrong before, and what holds now. The whole stack
runs on loopback (tests/support/stack.py); a ``StreamCutProxy`` drops the client's
network under it (tests/support/cut.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway import nnrp
from gateway.nnrp import ResumePolicy
from gateway.tools.client import (
    ClientError,
    ClientOperation,
    ClientSession,
    NnrpClient,
    ResumeTicket,
    connect,
)
from gateway.tools.replay import ReplayServer
from tests.support.cut import StreamCutProxy
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


async def proxy_to(nursery: trio.Nursery, stack: Stack, **options: Any
                   ) -> tuple[StreamCutProxy, str]:
    """A ``StreamCutProxy`` in front of the gateway's tcp listener, and its tcp:// URI.
    The server sides its half-open cuts leave are closed when the test ends."""
    host, _, port = stack.uri("tcp").removeprefix("tcp://").rpartition(":")
    proxy = StreamCutProxy((host, int(port)), **options)
    uri = "tcp://" + await nursery.start(proxy.serve)
    nursery.start_soon(close_silent_at_the_end, proxy)
    return proxy, uri


async def close_silent_at_the_end(proxy: StreamCutProxy) -> None:
    try:
        await trio.sleep_forever()
    finally:
        proxy.close_silent()


def posts(stack: Stack) -> int:
    return len([r for r in stack.replay.requests if r.method == "POST"])


async def release_when(condition: Any, hold: Any) -> None:
    """The held generation goes on once ``condition()`` holds (a resume counted, say): the
    stream is still running when the session moves, at any host speed."""
    with trio.fail_after(30):
        await until(condition)
    hold.release()


async def lose_the_answer_to_a_resume(proxy: StreamCutProxy, via: str, ticket: ResumeTicket
                                      ) -> None:
    """Resume ``ticket``'s session on a new connection through ``proxy``, and reset that
    connection once the gateway's SESSION_OPEN_ACK has gone through the proxy, without
    reading it: the client never learns the next token, and sends nothing after it."""
    host, _, port = via.removeprefix("tcp://").rpartition(":")
    sans_io = nnrp.ClientConnection()
    stream = await trio.open_tcp_stream(host, int(port))
    try:
        await stream.send_all(sans_io.hello())
        while not any(isinstance(e, nnrp.HelloAcked)
                      for e in sans_io.receive_data(await stream.receive_some())):
            pass
        connection = proxy.connections
        await stream.send_all(sans_io.resume_session(ticket.session_id, ticket.token))
        await until(lambda: any(
            isinstance(r.packet.message, nnrp.SessionOpenAck) and not r.upstream
            and r.connection == connection for r in proxy.packets))
        proxy.cut()
    finally:
        with contextlib.suppress(OSError):
            stream.socket.close()


# ---------------------------------------------------------------------------- finding 3



async def read_to(operation: ClientOperation, sequence: int) -> int:
    """Read an operation's partial results up to ``sequence``; the last one read."""
    held = 0
    async for event in operation.events():
        assert isinstance(event, nnrp.PartialReceived)
        held = event.sequence
        if held == sequence:
            break
    return held

async def test_a_resume_whose_answer_was_lost_is_accepted_again_with_the_old_ticket(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """Finding 3 of issue 34 (a lost resume reply). A resume rotated the session's token
    as it was accepted: when the SESSION_OPEN_ACK carrying the new token was lost with
    its connection, the client still held only the old one, which the gateway had
    already spent, so its next resume was rejected and vLLM went on generating for
    nobody. Now (``_resumption`` R4) the old token opens the session until the client
    shows it holds the new one: the second resume, with the old ticket, is accepted
    (status resumed), the resubmission gets the rest of the stream exactly once, and
    vLLM saw one request and no abort."""
    stack = await start_stack(nursery, socket_dir,
                              replay=ReplayServer(speed=1.0, token_interval_ms=5.0))
    registry = registry_of(stack)
    # The generation waits after 30 chunks until the second resume: it is still running
    # while the session moves, whatever the host's speed.
    hold = stack.replay.hold(lambda request: request.method == "POST", after=30)
    nursery.start_soon(release_when, lambda: registry.stats.resumed_total == 2, hold)
    payload = envelope(chat(stream=True, max_tokens=120))
    proxy, via = await proxy_to(nursery, stack, record=True)
    with trio.fail_after(30):
        async with connect(stack.uri()) as client:
            session = await client.open_session(resume=True)
            operation = await session.submit(payload, operation_id=7, frame_id=3)
            held = await read_to(operation, 10)
            assert session.ticket is not None
            old = session.ticket
        await until(lambda: registry.detached == 1)

        # The resume whose answer is lost: a raw client sends it and reads nothing more;
        # once the gateway has answered (the proxy relayed the ACK), the path resets.
        await lose_the_answer_to_a_resume(proxy, via, old)
        (answer,) = [r.packet for r in proxy.packets
                     if isinstance(r.packet.message, nnrp.SessionOpenAck) and not r.upstream]
        assert answer.message.status == nnrp.SessionOpenStatus.RESUMED  # it was accepted
        new_token = bytes(answer.body[:answer.message.resume_token_bytes])
        assert new_token != old.token
        assert registry.stats.resumed_total == 1
        await until(lambda: registry.detached == 1)  # the reset detached it again

        # The client tries again with the only ticket it has: the old one.
        async with connect(via) as client:
            resumed = await client.resume_session(old)
            assert resumed.ticket is not None
            assert resumed.ticket.token not in (old.token, new_token)
            again = await resumed.resubmit(payload, operation_id=7, frame_id=3, after=held)
            rest = [event async for event in again.events()]
            await resumed.close()
    (accepted,) = [r.packet.message for r in proxy.packets
                   if isinstance(r.packet.message, nnrp.SessionOpenAck) and r.connection == 2
                   and not r.upstream]
    assert accepted.status == nnrp.SessionOpenStatus.RESUMED
    assert registry.stats.resumed_total == 2 and registry.stats.refused_total == 0
    sequences = [e.sequence for e in rest if isinstance(e, nnrp.PartialReceived)]
    assert sequences == list(range(held + 1, 121))  # the rest, each once
    assert isinstance(rest[-1], nnrp.ResultReceived) and rest[-1].meta.status_code == 200
    assert client.repeats == 0
    assert posts(stack) == 1
    assert stack.replay.disconnects == []


# ---------------------------------------------------------------------------- finding 5


async def test_a_detached_stream_paused_at_its_bound_gives_its_upstream_slot_to_a_live_one(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """Finding 5 of issue 34 (detached sessions starve live ones). An operation of a
    detached session kept its upstream slot while nobody read it, even paused at its
    journal's bound, reading nothing from vLLM: with the pool held by such streams, a
    live client's request waited out ``--upstream-queue-timeout`` and was refused
    backend_overload. Now (``upstream/_slots`` rules 2-3) a paused detached operation
    gives its slot to the waiting request at once: the live request completes, the
    operation that gave way ends ``resume_preempted`` with its upstream aborted, and
    ``nnrp_gateway_upstream_pool_given_way_total`` counts it. Its client, back, gets what
    was produced, then the drop (backpressure)."""
    bound = 16 << 10
    stack = await start_stack(nursery, socket_dir,
                              replay=ReplayServer(speed=50.0, token_interval_ms=1.0),
                              resume=ResumePolicy(session_bytes=bound),
                              upstream_pool_size=2, upstream_queue_timeout=30.0)
    registry = registry_of(stack)
    records = records_of(stack)
    tickets: dict[str, tuple[ResumeTicket, int]] = {}
    with trio.fail_after(20):
        for name in ("first", "second"):
            payload = envelope(chat(stream=True), request_id=f"replay:long_stream:{name}")
            async with connect(stack.uri()) as client:
                session = await client.open_session(resume=True)
                operation = await session.submit(payload, operation_id=41, frame_id=4)
                async for event in operation.events():
                    assert isinstance(event, nnrp.PartialReceived)
                    if event.sequence == 3:
                        break
                assert session.ticket is not None
                tickets[name] = (session.ticket, event.sequence)
        await until(lambda: registry.detached == 2)
        journals = [record.session.journal for record in registry.book.records.values()]
        # Each journal fills to its bound, then its operation waits: vLLM is not read.
        await until(lambda: all(journal.held >= bound for journal in journals))
        await until_steady(lambda: [journal.held for journal in journals], 0.3)
    assert stack.gateway.client.slots_in_use == 2  # the whole pool, held for nobody
    started = trio.current_time()
    with trio.fail_after(40):
        async with connect(stack.uri()) as client:
            session = await client.open_session()
            outcome = await run_operation(session, envelope(
                chat(stream=True, max_tokens=5), request_id="replay:text_stream:live"))
    waited = trio.current_time() - started
    assert outcome.status == 200, outcome.final
    # At once, not after the queue timeout (made 30 s, so that a third of it is room for
    # a busy host where 2.5 s against 5 s was not).
    assert waited < 10.0
    with trio.fail_after(5):
        await until(lambda: any(r.cancel_source == "resume_preempted" for r in records))
        await until(lambda: stack.replay.disconnects)
    (preempted,) = [r for r in records if r.cancel_source == "resume_preempted"]
    assert (preempted.outcome, preempted.upstream_aborted) == ("shed", True)
    assert [d.request_id for d in stack.replay.disconnects] == [preempted.request_id]
    (live,) = [r for r in records if r.request_id == "replay:text_stream:live"]
    assert live.outcome == "ok"
    samples = metric_samples(stack.gateway.metrics.registry)
    assert samples[("nnrp_gateway_upstream_pool_given_way_total", ())] == 1
    assert samples[("nnrp_gateway_upstream_pool_wait_timeouts_total", ())] == 0
    # The client of the session that gave way comes back: what was produced, then the drop.
    name = preempted.request_id.rsplit(":", 1)[1]
    ticket, received = tickets[name]
    with trio.fail_after(10):
        async with connect(stack.uri()) as client:
            resumed = await client.resume_session(ticket)
            again = await resumed.resubmit(
                envelope(chat(stream=True), request_id=preempted.request_id),
                operation_id=41, frame_id=4, after=received)
            events = [event async for event in again.events()]
    sequences = [e.sequence for e in events if isinstance(e, nnrp.PartialReceived)]
    assert sequences == list(range(received + 1, received + 1 + len(sequences)))
    assert len(sequences) > 10
    assert isinstance(events[-1], nnrp.DropReceived)
    assert events[-1].drop_reason == nnrp.DropReason.BACKPRESSURE


# ---------------------------------------------------------------------------- finding 9


async def test_our_client_goes_on_at_once_when_its_old_connection_is_left_half_open(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """Finding 9 of issue 34 (a silent old connection that something still acknowledges).
    Behind a balancer that keeps acknowledging a path that is gone, the gateway's side of
    the old connection stays open and silent: the session stayed attached to it, every
    resume was refused, and the client waited for the gateway's TCP timeouts (about 60
    s). Now a resume of a session still attached is answered retry_later while the holder
    is probed (``_resumption`` R8), and our client takes the session at once with
    SESSION_MIGRATE (client rule 3): the stream goes on whole within a couple of
    seconds."""
    stack = await start_stack(nursery, socket_dir,
                              replay=ReplayServer(speed=1.0, token_interval_ms=5.0))
    registry = registry_of(stack)
    stats = registry.stats
    hold = stack.replay.hold(lambda request: request.method == "POST", after=60)
    nursery.start_soon(release_when, lambda: stats.migrated_total + stats.resumed_total, hold)
    proxy, via = await proxy_to(nursery, stack)
    with trio.fail_after(30):
        async with connect(via, resume=True) as client:
            session = await client.open_session(resume=True)
            operation = await session.submit(envelope(chat(stream=True, max_tokens=150)))
            events: list[Any] = []
            async for event in operation.events():
                events.append(event)
                if len(events) == 40:
                    proxy.cut(half_open=True)
                    cut_at = trio.current_time()
            ended = trio.current_time() - cut_at
            await session.close()
    partials = [e.sequence for e in events if isinstance(e, nnrp.PartialReceived)]
    assert partials == list(range(1, 151))  # none missed, none twice
    assert isinstance(events[-1], nnrp.ResultReceived) and events[-1].meta.status_code == 200
    assert ended < 3.0  # not the 60 s of TCP's timeouts
    assert client.recoveries == 1
    assert session.migrations > 0 or stats.probe_failures_total > 0
    assert stats.probes_total >= 1  # the resume's retry_later probed the silent holder
    assert posts(stack) == 1
    assert stack.replay.disconnects == []


async def test_a_client_that_only_resumes_gets_its_session_once_the_probe_closes_the_silent_one(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """Finding 9 of issue 34, for a client that never migrates (one that only resumes,
    as nnrp-py's native client does). Before, its resumes were refused for as long as the
    gateway's side of the dead connection stayed open (TCP's timeouts, about 60 s). Now
    the first resume is answered retry_later and probes the holder: a PING, and a
    connection that sends nothing at all within ``--resume-probe-timeout`` is closed,
    which detaches the session; a resume retried just after succeeds, and the stream goes
    on where the client left it."""
    probe_timeout = 0.5
    stack = await start_stack(nursery, socket_dir,
                              replay=ReplayServer(speed=1.0, token_interval_ms=5.0),
                              resume=ResumePolicy(probe_timeout=probe_timeout))
    registry = registry_of(stack)
    stats = registry.stats
    hold = stack.replay.hold(lambda request: request.method == "POST", after=30)
    nursery.start_soon(release_when, lambda: stats.resumed_total == 1, hold)
    proxy, via = await proxy_to(nursery, stack)
    payload = envelope(chat(stream=True, max_tokens=100))
    with trio.fail_after(30):
        async with connect(via) as client:
            session = await client.open_session(resume=True)
            operation = await session.submit(payload, operation_id=5, frame_id=5)
            held = await read_to(operation, 10)
            proxy.cut(half_open=True)
            assert session.ticket is not None
            ticket = session.ticket
    assert registry.detached == 0  # the gateway has not seen the old connection die
    # Bounds with room for a busy host: the dead holder's side would stay open for as
    # long as the half-open proxy holds it (TCP's timeouts, about 60 s), far past both.
    with trio.fail_after(30):
        async with connect(stack.uri()) as client:
            asked = trio.current_time()
            resumed, refusals = await resume_until_accepted(client, ticket)
            took = trio.current_time() - asked
            again = await resumed.resubmit(payload, operation_id=5, frame_id=5, after=held)
            rest = [event async for event in again.events()]
            await resumed.close()
    assert refusals >= 1
    assert took < probe_timeout * 20  # the probe's timeout, not the connection's death
    assert (stats.probes_total, stats.probe_failures_total) == (1, 1)
    assert stats.resumed_total == 1 and stats.migrated_total == 0
    sequences = [e.sequence for e in rest if isinstance(e, nnrp.PartialReceived)]
    assert sequences == list(range(held + 1, 101))
    assert isinstance(rest[-1], nnrp.ResultReceived) and rest[-1].meta.status_code == 200
    assert posts(stack) == 1
    assert stack.replay.disconnects == []


async def resume_until_accepted(client: NnrpClient, ticket: ResumeTicket
                                ) -> tuple[ClientSession, int]:
    """A client that only resumes: again every 0.1 s while the answer is retry_later;
    the session, and how many times it was told to retry."""
    refusals = 0
    while True:
        try:
            return await client.resume_session(ticket), refusals
        except ClientError as refused:
            if not refused.retry_later:
                raise
        refusals += 1
        await trio.sleep(0.1)


# ---------------------------------------------------------------------------- finding 10


async def test_nnrp_py_resubmitting_a_long_answer_unchanged_gets_the_rest_of_it(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """Finding 10 of issue 34 (nnrp-py's identical resubmission of a long answer).
    nnrp-py's native client resubmits a resumed operation unchanged: it declares no
    position (no ``nnrp.resume_after_sequence``). The gateway took that as "from the
    first result", and once the session's byte bound had trimmed a long stream's early
    results while it was attached, it refused the resubmission 410 results_unavailable
    and aborted vLLM: every long answer was lost to a drop. Now (``_journal`` J2) a
    resubmission without a position is answered from the earliest result still held: a
    continued sequence, with no hole against what the client held (repeats, identical,
    are allowed), to the terminal 200; vLLM saw one request and no abort."""
    native = pytest.importorskip("nnrp.client.native")
    from gateway.tools.conformance import native_client_options
    from tests.support.native import describe, openai_submit

    resume = native.NativeClientSessionOptions(allow_resume=True)
    bound = 16 << 10
    total = 600
    stack = await start_stack(nursery, socket_dir,
                              replay=ReplayServer(speed=1.0, token_interval_ms=1.0),
                              resume=ResumePolicy(session_bytes=bound))
    registry = registry_of(stack)
    records = records_of(stack)
    token = trio.lowlevel.current_trio_token()
    payload = envelope(chat(stream=True, max_tokens=total), request_id="long-answer")
    # The generation waits after 400 chunks until the session is resumed: far past what
    # the bound keeps, and still running when the client comes back.
    hold = stack.replay.hold(lambda request: request.method == "POST", after=400)
    nursery.start_soon(release_when, lambda: registry.stats.resumed_total == 1, hold)
    proxy, via = await proxy_to(nursery, stack)
    options = native_client_options(via)

    def first_connection() -> tuple[Any, list[dict[str, Any]]]:
        opened = native.connect_native_client_connection(options)
        connection = opened.__enter__()
        session = asyncio.run(connection.open_session(resume))
        session.submit_operation(openai_submit(7001, 1, payload))
        events: list[dict[str, Any]] = []
        # Every result the gateway sent before the hold: the client keeps up, as a
        # client reading a stream does, so what was trimmed it holds.
        quiet, deadline = 0, time.monotonic() + 20
        while not hold.waiting or quiet < 15:
            assert time.monotonic() < deadline, "the stream never reached the hold"
            polled = [describe(e) for e in session.poll_events(timeout_ms=20)]
            events += polled
            quiet = 0 if polled else quiet + 1
        trio.from_thread.run_sync(proxy.cut, trio_token=token)
        ticket = session.recovery_ticket()
        with contextlib.suppress(Exception):  # its connection is gone: closing it fails
            opened.__exit__(None, None, None)
        return ticket, events

    with trio.fail_after(30):
        ticket, before = await trio.to_thread.run_sync(first_connection)
        assert ticket is not None
        await until(lambda: registry.detached == 1)
    (record,) = registry.book.records.values()
    kept = record.session.journal.records[7001]
    assert kept.trimmed and kept.dropped_through > 1  # the early results are gone
    held = max(e["sequence"] for e in before if e["kind"] == "PARTIAL_RESULT")
    assert held > kept.dropped_through

    def second_connection() -> list[dict[str, Any]]:
        with native.connect_native_client_connection(
                native_client_options(stack.uri())) as connection:
            session = asyncio.run(connection.resume_session(ticket, resume))
            session.submit_operation(openai_submit(7001, 1, payload))  # unchanged
            events: list[dict[str, Any]] = []
            deadline = time.monotonic() + 20
            while not any(e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON") for e in events):
                assert time.monotonic() < deadline, "no terminal after the resume"
                events += [describe(e) for e in session.poll_events(timeout_ms=20)]
            session.close()
            return events

    with trio.fail_after(30):
        after = await trio.to_thread.run_sync(second_connection)
    (terminal,) = [e for e in after if e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON")]
    assert terminal["kind"] == "RESULT_PUSH", terminal  # no drop
    assert terminal["status"] == 200, terminal["payload"]  # no 410 results_unavailable
    sequences = [e["sequence"] for e in after if e["kind"] == "PARTIAL_RESULT"]
    first = sequences[0]
    assert 1 < first <= held + 1  # from the earliest held, no hole against what it held
    assert sequences == list(range(first, total + 1))  # a continued sequence to the end
    bodies = {e["sequence"]: e["body"] for e in before if e["kind"] == "PARTIAL_RESULT"}
    for event in after:
        if event["kind"] == "PARTIAL_RESULT" and event["sequence"] in bodies:
            assert bodies[event["sequence"]] == event["body"]  # a repeat is identical
    assert posts(stack) == 1
    assert stack.replay.disconnects == []
    await until(lambda: records)
    (observed,) = records
    assert (observed.outcome, observed.resumed, observed.events) == ("ok", 1, total)
    assert observed.replayed_events is not None
    assert observed.replayed_events >= held - first + 1  # what it held, sent again


# ---------------------------------------------------------------------------- finding 2


async def test_request_bodies_are_not_kept_once_their_operations_end(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """Finding 2 of issue 34 (request bodies held outside every bound). A resumable
    session's journal kept each operation's request, whole, for as long as it kept the
    operation's record, and counted none of it against ``--resume-session-bytes``: a
    client sending large prompts on one session grew the process without a bound. Now
    (``_journal`` J3) a record holds the request only while its operation runs, then
    only its key: after 40 requests of 1 MiB each, the held bytes are within the
    session's bound, no record keeps a request body, and the process grew by far less
    than the 40 MiB it was sent."""
    count, size = 40, 1 << 20
    settings = ResumePolicy(session_bytes=1 << 20)
    stack = await start_stack(nursery, socket_dir, resume=settings)
    registry = registry_of(stack)

    def payload(index: int) -> bytes:
        body = chat(stream=True, max_tokens=2)  # the replay answers it at once
        body["messages"][0]["content"] = f"{index:04d}" + "x" * size
        return envelope(body)

    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        with trio.fail_after(40):
            async with connect(stack.uri()) as client:
                session = await client.open_session(resume=True)
                warm = await run_operation(session, payload(0))
                assert warm.status == 200
                stack.replay.requests.clear()  # the replay's own record of each body
                gc.collect()
                before = tracemalloc.get_traced_memory()[0]
                for index in range(1, count + 1):
                    outcome = await run_operation(session, payload(index))
                    assert outcome.status == 200, outcome.final
                    assert [r.method for r in stack.replay.requests] == ["POST"]
                    stack.replay.requests.clear()
                gc.collect()
                grown = tracemalloc.get_traced_memory()[0] - before
                (record,) = registry.book.records.values()
                journal = record.session.journal
                assert registry.budget.held <= settings.session_bytes
                assert journal.held <= settings.session_bytes
                kept = list(journal.records.values())
                assert len(kept) == count + 1 and all(r.ended for r in kept)
                assert all(not hasattr(r, "request") and len(r.key) < 64 for r in kept)
                await session.close()
    finally:
        if not tracing:
            tracemalloc.stop()
    assert grown < 20 << 20, f"grew {grown / (1 << 20):.1f} MiB over {count} requests"
