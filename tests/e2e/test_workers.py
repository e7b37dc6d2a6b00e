"""``serve --workers 2`` as real processes: every worker serves every listener, a killed
worker is restarted while the other keeps streaming, SIGTERM drains them all, /metrics
and /readyz answer for the pod, and no worker outlives its supervisor.

Which worker gets a connection is the kernel's choice (a SO_REUSEPORT hash for inet
listeners, the first to accept for the shared unix socket). The tests find out rather
than guess: ``connect_to`` opens connections until one is held by the wanted worker,
read from /proc (which process holds the server side of the new TCP connection); for
unix, the other worker is stopped (SIGSTOP) while connecting, so it cannot accept.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from gateway.nnrp import ResultReceived
from gateway.tools.client import ClientError, connect
from gateway.transport import QuicClientOptions
from tests.support.otlp import OtlpReceiver
from tests.support.processes import ReplayThread, free_port, served_endpoints
from tests.support.quic import make_pki
from tests.support.stack import chat, envelope, run_operation, stream_through_signal
from tests.support.waits import wait_for
from tests.support.workers import EXE, held_by, served_workers, server_sockets

if TYPE_CHECKING:
    from gateway.tools.replay import RecordedRequest




@contextmanager
def stopped(*pids: int) -> Iterator[None]:
    """The processes are stopped (cannot accept) inside the block."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def worker_children(pid: int) -> list[int]:
    """The worker processes among ``pid``'s children: importing trio runs
    ``ldconfig -p`` (ctypes.util.find_library), a child too, before any worker."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listed:
            found += [int(child) for child in listed.read().split()]
    workers = []
    for child in found:
        try:
            with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                if b"gateway.workers" in cmdline.read():
                    workers.append(child)
        except FileNotFoundError:
            pass  # gone already
    return workers


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is not serving.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


async def stream_once(uri: str, *, tokens: int = 8, **connect_options: Any) -> Any:
    async with connect(uri, **connect_options) as client:
        session = await client.open_session()
        return await run_operation(session, envelope(chat(stream=True, max_tokens=tokens)))


async def connect_to(stack: contextlib.AsyncExitStack, uri: str, pid: int,
                     pids: list[int]) -> Any:
    """A client connected to worker ``pid`` (see the module's doc)."""
    if uri.startswith("unix://"):
        with stopped(*(other for other in pids if other != pid)):
            return await stack.enter_async_context(connect(uri))
    port = int(uri.split("://")[1].split("/")[0].rsplit(":", 1)[1])
    for _ in range(64):  # each try is a coin toss between two workers
        before = held_by(pid, server_sockets(port))
        attempt = contextlib.AsyncExitStack()
        client = await attempt.enter_async_context(connect(uri))
        if held_by(pid, server_sockets(port)) - before:
            stack.push_async_exit(attempt)
            return client
        await attempt.aclose()
    raise AssertionError(f"no connection to {uri} reached worker {pid}")


#: Chunks a held stream sends first (its role chunk and seven tokens): past the five
#: events after which the tests act.
HELD_AFTER = 8


def is_chat(request: RecordedRequest) -> bool:
    return request.path == "/v1/chat/completions"


@pytest.fixture
def replay() -> Iterator[ReplayThread]:
    with ReplayThread(token_interval_ms=20.0) as thread:
        yield thread


def test_every_worker_serves_every_listener_and_metrics_are_the_pods(
        tmp_path: Path, replay: ReplayThread) -> None:
    sock = tmp_path / "nnrp.sock"
    with served_workers(tmp_path, replay.url, "tcp://127.0.0.1:0", f"unix://{sock}",
                        "ws://127.0.0.1:0/nnrp") as served:
        assert len(served.pids) == 2

        async def one_stream_per_worker_and_listener() -> None:
            for pid in served.pids:
                for uri in served.uris.values():
                    async with contextlib.AsyncExitStack() as stack:
                        client = await connect_to(stack, uri, pid, served.pids)
                        session = await client.open_session()
                        outcome = await run_operation(session, envelope(chat(
                            stream=True, max_tokens=8)))
                        assert outcome.status == 200 and len(outcome.partials) == 8

        trio.run(one_stream_per_worker_and_listener)
        # Each record is logged after its terminal is on the wire: wait for the last.
        wait_for(lambda: len(served.operations()) == 6, what="six operation records")
        by_worker = sorted((r["worker"], r["transport"]) for r in served.operations())
        assert by_worker == [(0, "ipc"), (0, "tcp"), (0, "websocket"),
                             (1, "ipc"), (1, "tcp"), (1, "websocket")]
        metrics = served.metrics()
        # Summed across the workers, as one process would count them (connect_to may
        # have opened more connections than it kept; each ran one operation or none).
        assert metrics["nnrp_gateway_connections_total"] >= 6
        for transport in ("tcp", "ipc", "websocket"):
            assert metrics['nnrp_gateway_requests_total{model_name="example-model",'
                           f'outcome="ok",transport="{transport}"}}'] == 2
        assert metrics["nnrp_gateway_upstream_ready"] == 1  # not 2: every worker sees it
        assert metrics['nnrp_gateway_build_info{version="0.1.0"}'] == 1
        assert metrics["nnrp_gateway_workers_running"] == 2
        capabilities = httpx.get(f"{served.admin}/capabilities").json()
        assert [listener["uri"] for listener in capabilities["nnrp"]["listeners"]] == list(
            served.uris.values())
    assert not sock.exists()  # the supervisor's socket file, removed on exit


def test_a_killed_worker_is_restarted_while_the_other_streams_on(
        tmp_path: Path, replay: ReplayThread) -> None:
    with served_workers(tmp_path, replay.url, "tcp://127.0.0.1:0") as served:
        survivor, victim = served.pids
        uri = served.uris["tcp"]
        # The survivor's stream is held mid-way (after HELD_AFTER chunks) until the victim
        # is back: it is in flight through the whole crash and restart.
        hold = replay.call(replay.server.hold, is_chat, after=HELD_AFTER)

        def restarted() -> bool:
            return (served.metrics().get("nnrp_gateway_workers_running") == 2
                    and len(served.worker_pids()) == 2
                    and victim not in served.worker_pids())

        async def stream_through_a_crash() -> Any:
            events: list[Any] = []

            async def stream(client: Any) -> None:
                events.extend(await stream_through_signal(client, victim, signal.SIGKILL))

            async with contextlib.AsyncExitStack() as stack:
                client = await connect_to(stack, uri, survivor, served.pids)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stream, client)
                    await trio.to_thread.run_sync(functools.partial(
                        wait_for, restarted, what="the restart"))
                    assert not events  # still streaming
                    await trio.to_thread.run_sync(replay.call, hold.release)
            return events

        requests = "nnrp_gateway_requests_total"
        before = sum(v for k, v in served.metrics().items() if k.startswith(requests))
        events = trio.run(stream_through_a_crash)
        assert isinstance(events[-1], ResultReceived) and len(events) == 61
        metrics = served.metrics()
        assert metrics["nnrp_gateway_worker_restarts_total"] == 1
        # What the killed worker had counted is still counted (no false counter reset).
        assert sum(v for k, v in metrics.items() if k.startswith(requests)) >= before + 1
        replacement = served.worker_pids()[1]

        async def stream_on_the_replacement() -> Any:
            async with contextlib.AsyncExitStack() as stack:
                client = await connect_to(stack, uri, replacement, served.worker_pids())
                session = await client.open_session()
                return await run_operation(session, envelope(chat(stream=True,
                                                                  max_tokens=8)))

        operations_before = len(served.operations())
        assert trio.run(stream_on_the_replacement).status == 200
        # The record is logged after the terminal is on the wire: wait for it.
        wait_for(lambda: len(served.operations()) > operations_before, what="its record")
        assert served.operations()[-1]["worker"] == 1
        assert replacement != victim
        restart = [r for r in served.records() if r.get("event") == "worker exited; "
                   "restarting it"]
        assert restart[0]["status"] == -signal.SIGKILL


def test_sigterm_drains_every_worker(tmp_path: Path, replay: ReplayThread) -> None:
    with served_workers(tmp_path, replay.url, "tcp://127.0.0.1:0") as served:
        uri = served.uris["tcp"]
        results: list[list[Any]] = []
        # Both streams are held mid-way until both workers are draining: each worker has
        # its stream in flight when its drain begins.
        hold = replay.call(replay.server.hold, is_chat, after=HELD_AFTER)

        def draining() -> list[dict[str, Any]]:
            return [r for r in served.records() if r.get("event") == "draining"]

        async def two_streams_through_sigterm() -> None:
            async def one(pid: int, started: trio.Event) -> None:
                async with contextlib.AsyncExitStack() as stack:
                    client = await connect_to(stack, uri, pid, served.pids)
                    session = await client.open_session()
                    operation = await session.submit(envelope(chat(stream=True,
                                                                   max_tokens=60)))
                    events = []
                    async for event in operation.events():
                        events.append(event)
                        if len(events) == 5:
                            started.set()
                    results.append(events)

            async with trio.open_nursery() as nursery:
                started = [trio.Event(), trio.Event()]
                for pid, event in zip(served.pids, started, strict=True):
                    nursery.start_soon(one, pid, event)
                    await event.wait()
                served.process.send_signal(signal.SIGTERM)
                await trio.to_thread.run_sync(functools.partial(
                    wait_for, lambda: len(draining()) == 2, what="both workers draining"))
                await trio.to_thread.run_sync(replay.call, hold.release)

        trio.run(two_streams_through_sigterm)
        assert sorted((r["worker"], r["inflight"]) for r in draining()) == [(0, 1), (1, 1)]
        assert [isinstance(events[-1], ResultReceived) for events in results] == [True, True]
        assert [len(events) for events in results] == [61, 61]
        assert served.process.wait(timeout=30) == 0
        assert sorted(r["worker"] for r in served.operations()) == [0, 1]
        assert not any(alive(pid) for pid in served.pids)
        with pytest.raises(OSError, match="connect"):
            trio.run(stream_once, uri)  # nobody listens any more


def test_a_second_signal_during_the_drain_stops_every_worker_at_once(
        tmp_path: Path, replay: ReplayThread) -> None:
    # Issue 22: the supervisor passes the second signal on; nobody waits for the drain
    # (--drain-timeout 10 s here, and the stream is held until the gateway is gone).
    with served_workers(tmp_path, replay.url, "tcp://127.0.0.1:0") as served:
        uri = served.uris["tcp"]
        hold = replay.call(replay.server.hold, is_chat, after=HELD_AFTER)

        def draining() -> list[dict[str, Any]]:
            return [r for r in served.records() if r.get("event") == "draining"]

        async def stream_through_two_signals() -> None:
            async def one(started: trio.Event) -> None:
                with contextlib.suppress(ClientError):  # it dies with its worker
                    async with connect(uri) as client:
                        session = await client.open_session()
                        operation = await session.submit(envelope(chat(stream=True,
                                                                       max_tokens=60)))
                        async for _ in operation.events():
                            started.set()

            async with trio.open_nursery() as nursery:
                started = trio.Event()
                nursery.start_soon(one, started)
                await started.wait()
                served.process.send_signal(signal.SIGTERM)
                await trio.to_thread.run_sync(functools.partial(
                    wait_for, lambda: len(draining()) == 2, what="both workers draining"))
                served.process.send_signal(signal.SIGINT)
                status = await trio.to_thread.run_sync(
                    functools.partial(served.process.wait, 8))
                assert status == 1
                await trio.to_thread.run_sync(replay.call, hold.release)

        trio.run(stream_through_two_signals)
        assert not any(alive(pid) for pid in served.pids)
        assert "error: stopped by a second signal during the drain" in served.log.read_text()


def test_quic_datagrams_stay_with_the_worker_holding_their_connection(
        tmp_path: Path, replay: ReplayThread) -> None:
    pki = make_pki(tmp_path / "pki")
    with served_workers(tmp_path, replay.url, "quic://127.0.0.1:0",
                        extra=("--tls-cert", str(pki.cert), "--tls-key",
                               str(pki.key))) as served:
        uri = served.uris["quic"]
        options = QuicClientOptions(ca_file=pki.cert)

        async def eight_at_once() -> list[Any]:
            outcomes: list[Any] = []

            async def one() -> None:
                outcomes.append(await stream_once(uri, tokens=20, quic=options))

            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(one)
            return outcomes

        # Each connection's datagrams hash to one worker's socket (its 4-tuple): were
        # they spread, the worker without the connection's state would drop them.
        outcomes = trio.run(eight_at_once)
        assert [(o.status, len(o.partials)) for o in outcomes] == [(200, 20)] * 8
        metrics = served.metrics()
        assert metrics["nnrp_gateway_quic_connections_total"] == 8
        assert metrics['nnrp_gateway_quic_dropped_datagrams_total{reason="garbage"}'] == 0


def test_an_unsupported_vllm_stops_the_gateway_with_its_status(tmp_path: Path) -> None:
    with ReplayThread(version="0.21.0") as old:
        log = tmp_path / "gateway.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [EXE, "serve", "--workers", "2", "--vllm-url", old.url, "--listen",
                 f"tcp://127.0.0.1:{free_port()}"], stdout=sink, stderr=subprocess.STDOUT)
        try:
            assert process.wait(timeout=30) == 3  # EXIT_FATAL, as one process exits
        finally:
            if process.poll() is None:
                process.kill()
        assert "cannot serve this configuration" in log.read_text()


def test_no_worker_outlives_a_killed_supervisor(tmp_path: Path,
                                                replay: ReplayThread) -> None:
    with served_workers(tmp_path, replay.url, "tcp://127.0.0.1:0") as served:
        served.process.kill()  # SIGKILL: no drain, no goodbye
        served.process.wait()
        wait_for(lambda: not any(alive(pid) for pid in served.pids), timeout=15,
                 what="orphaned workers to exit")
        assert any(r.get("event") == "the supervisor is gone; draining"
                   for r in served.records())


def test_sigterm_while_a_worker_waits_to_restart_stops_everything(
        tmp_path: Path, replay: ReplayThread) -> None:
    with served_workers(tmp_path, replay.url, "tcp://127.0.0.1:0") as served:
        os.kill(served.pids[1], signal.SIGKILL)
        served.process.send_signal(signal.SIGTERM)  # within the 0.5 s restart backoff
        assert served.process.wait(timeout=15) == 0
        # Nothing started after the stop is left behind, and nothing was restarted.
        assert not any(alive(pid) for pid in served.worker_pids())
        assert served.worker_pids() == served.pids
        assert len([r for r in served.records() if r.get("event") == "worker serving"]) == 2
        assert served.records()[-1]["event"] == "drained"


def test_sighup_while_workers_start_is_not_fatal(tmp_path: Path,
                                                 replay: ReplayThread) -> None:
    pki = make_pki(tmp_path / "pki")
    log = tmp_path / "gateway.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [EXE, "serve", "--workers", "2", "--vllm-url", replay.url, "--listen",
             "tcp://127.0.0.1:0", "--listen", "tcps://127.0.0.1:0", "--tls-cert",
             str(pki.cert), "--tls-key", str(pki.key)], stdout=sink, stderr=subprocess.STDOUT)
    try:
        # The supervisor handles signals once it binds; its workers are then importing.
        wait_for(lambda: process.poll() is not None or bool(worker_children(process.pid)),
                 what="workers spawned")
        process.send_signal(signal.SIGHUP)
        wait_for(lambda: any(uri.startswith("tcp://")
                             for uri in served_endpoints(log.read_text()))
                 or process.poll() is not None, what="the announcement")
        assert process.poll() is None, log.read_text()
        uri = next(uri for uri in served_endpoints(log.read_text())
                   if uri.startswith("tcp://"))
        # A worker serves once it listens, and says "not ready" (503, with a retry time)
        # until its own probe of vLLM has succeeded: retried as a client would, it
        # streams.
        answers = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            answer = trio.run(stream_once, uri)
            answers.append(answer.status)
            if answer.status == 200:
                break
            assert answer.status == 503, answer
            assert "not ready" in answer.final["error"]["message"], answer.final
            time.sleep(0.1)
        assert answers[-1] == 200, answers
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0


def test_nnrp_pys_native_client_streams_through_both_workers(
        tmp_path: Path, replay: ReplayThread) -> None:
    """The protocol's own client, on tcp and unix: each connection's stream completes
    and its session stays usable for a second operation, whichever worker holds it."""
    pytest.importorskip("nnrp.client.native")
    from tests.support.native import native_connection, open_session, openai_submit, poll_until

    sock = tmp_path / "nnrp.sock"
    with served_workers(tmp_path, replay.url, "tcp://127.0.0.1:0",
                        f"unix://{sock}") as served:
        for transport, uri in (("tcp", served.uris["tcp"]), ("ipc", served.uris["unix"])):
            for _ in range(4):  # connections spread by the kernel; each must work
                with native_connection(transport, uri) as connection:
                    session = open_session(connection)
                    for frame in (1, 2):
                        session.submit_operation(openai_submit(frame, frame, envelope(
                            chat(stream=True, max_tokens=6))))
                        events = poll_until(session, lambda e, f=frame: any(
                            x["kind"] == "RESULT_PUSH" and x.get("frame_id") == f
                            for x in e))
                        frames = [e for e in events if e.get("frame_id") == frame]
                        assert [e["kind"] for e in frames] == (
                            ["PARTIAL_RESULT"] * 6 + ["RESULT_PUSH"])
                    session.close()
        wait_for(lambda: len(served.operations()) == 16, what="16 operation records")


def test_a_resume_the_kernel_gives_to_the_other_worker_is_relayed_to_the_holder(
        tmp_path: Path, replay: ReplayThread) -> None:
    """A session opened on worker 0; its client's connection drops; the new connection
    lands on worker 1 (found, as in every test here, not guessed), which relays it whole
    to worker 0: the stream goes on with nothing lost and nothing twice."""
    with served_workers(tmp_path, replay.url, "tcp://127.0.0.1:0") as served:
        holder, other = served.pids
        uri = served.uris["tcp"]
        payload = envelope(chat(stream=True, max_tokens=60))

        async def scenario() -> tuple[list[Any], list[Any]]:
            async with contextlib.AsyncExitStack() as stack:
                client = await connect_to(stack, uri, holder, served.pids)
                session = await client.open_session(resume=True)
                assert session.ticket is not None and session.ticket.token[0] == 0
                operation = await session.submit(payload, operation_id=3, frame_id=3)
                held = []
                async for event in operation.events():
                    held.append(event)
                    if len(held) == 5:
                        break
            # The connection went without SESSION_CLOSE: the session waits on worker 0.
            await trio.to_thread.run_sync(lambda: wait_for(
                lambda: served.metrics().get(
                    'nnrp_gateway_resume_sessions{state="detached"}') == 1,
                what="the detached session"))
            async with contextlib.AsyncExitStack() as stack:
                client = await connect_to(stack, uri, other, served.pids)
                resumed = await client.resume_session(session.ticket)
                again = await resumed.resubmit(payload, operation_id=3, frame_id=3,
                                               after=held[-1].sequence)
                rest = [event async for event in again.events()]
                await resumed.close()
            return held, rest

        held, rest = trio.run(scenario)
        sequences = [event.sequence for event in held + rest
                     if not isinstance(event, ResultReceived)]
        assert sequences == list(range(1, 61))
        assert isinstance(rest[-1], ResultReceived) and rest[-1].meta.status_code == 200
        metrics = served.metrics()
        assert metrics["nnrp_gateway_resume_relayed_total"] == 1
        assert metrics["nnrp_gateway_resume_resumed_total"] == 1
        assert len([r for r in replay.server.requests if r.method == "POST"]) == 1


def test_every_worker_exports_its_own_spans_and_the_pod_counts_them(
        tmp_path: Path, replay: ReplayThread, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 24: each worker process has its own tracer and export thread (the supervisor
    # none); the OTEL_* environment reaches them through the supervisor.
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        with served_workers(tmp_path, replay.url, "tcp://127.0.0.1:0",
                            extra=("--otel-traces",)) as served:

            async def one_stream_per_worker() -> None:
                for pid in served.pids:
                    async with contextlib.AsyncExitStack() as stack:
                        client = await connect_to(stack, served.uris["tcp"], pid, served.pids)
                        session = await client.open_session()
                        outcome = await run_operation(session, envelope(chat(
                            stream=True, max_tokens=4)))
                        assert outcome.status == 200

            trio.run(one_stream_per_worker)
            wait_for(lambda: len(served.operations()) == 2, what="two operation records")
            wait_for(lambda: len([s for s in receiver.taken()
                                  if s.attributes.get("nnrp.operation.id")]) == 2,
                     what="two operation spans")
            spans = {s.span_id: s for s in receiver.taken() if s.attributes.get("nnrp.operation.id")}
            # Each worker's log line names the span that worker exported.
            assert sorted(spans) == sorted(line["span_id"] for line in served.operations())
            assert sorted(line["worker"] for line in served.operations()) == [0, 1]
            wait_for(lambda: served.metrics().get("nnrp_gateway_trace_spans_exported_total")
                     == 4, what="four spans counted across the workers")
            metrics = served.metrics()
            assert metrics['nnrp_gateway_trace_spans_dropped_total{reason="queue_full"}'] == 0
