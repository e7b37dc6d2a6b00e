"""A fleet of gateways end to end (gateway/nnrp/_fleet.py, gateway/server/_relay.py):
three "pods" on loopback, each a gateway with its own replay vLLM and its own
``--fleet-advertise`` address. A session opened on one pod and resumed on another is
forwarded to its owner and spliced: every sequence exactly once, one terminal, one vLLM
request on the owner and none on the others. Behind Debian's HAProxy (round robin, TCP
mode, as a Kubernetes Service spreads connections) with nnrp-py's native client; and at
the edges: a made-up token, a pod out of reach, a loop attempt, a forged forward, a key
rotation mid-window, a draining owner."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
import trio

pytest.importorskip("nnrp.client.native")

from nnrp.client.native import NativeClientSessionOptions, connect_native_client_connection

from gateway import nnrp
from gateway.nnrp import ForwardOutcome
from gateway.tools.client import ClientError, ResumeTicket, connect
from gateway.tools.conformance import native_client_options
from gateway.tools.cut import StreamCutProxy
from gateway.transport import QuicClientOptions, TlsConfig
from tests.support.cut import DatagramCutProxy
from tests.support.fleet import KEY, Pod, haproxy, key_file, start_fleet
from tests.support.native import describe, openai_submit
from tests.support.processes import ReplayThread, free_port
from tests.support.quic import make_pki
from tests.support.resume import resume
from tests.support.stack import chat, envelope
from tests.support.waits import until
from tests.support.workers import served_workers

pytestmark = pytest.mark.interop

RESUME = NativeClientSessionOptions(allow_resume=True)
STREAM = envelope(chat(stream=True, max_tokens=100))


def owner_of(pods: list[Pod]) -> Pod:
    (owner,) = [pod for pod in pods if pod.registry.sessions]
    return owner


async def stream_then_drop(uri: str, pods: list[Pod], *, held_events: int = 10,
                           **trust: Any) -> tuple[ResumeTicket, list[Any]]:
    """Open a resumable session at ``uri``, stream until ``held_events`` arrived, and
    leave without closing: the session waits on its pod for its client."""
    async with connect(uri, **trust) as client:
        session = await client.open_session(resume=True)
        assert session.ticket is not None
        operation = await session.submit(STREAM, operation_id=5, frame_id=5)
        held = []
        async for event in operation.events():
            held.append(event)
            if len(held) == held_events:
                break
    owner = owner_of(pods)
    await until(lambda: owner.registry.detached == 1)
    return session.ticket, held


async def resume_at(uri: str, ticket: ResumeTicket, held: list[Any], **trust: Any
                    ) -> list[Any]:
    async with connect(uri, **trust) as client:
        resumed = await client.resume_session(ticket)
        again = await resumed.resubmit(STREAM, operation_id=5, frame_id=5,
                                       after=held[-1].sequence)
        return [event async for event in again.events()]


def whole(held: list[Any], rest: list[Any]) -> None:
    sequences = [e.sequence for e in held + rest if isinstance(e, nnrp.PartialReceived)]
    assert sequences == list(range(1, 101))  # every sequence once, in order
    terminals = [e for e in rest if isinstance(e, nnrp.ResultReceived)]
    assert len(terminals) == 1 and terminals[0].meta.status_code == 200


def native_stream_then_cut(options: Any, payload: bytes, cut: Any, token: Any
                           ) -> tuple[Any, list[dict[str, Any]]]:
    """Blocking (a worker thread): nnrp-py's native client opens a resumable session,
    streams 20 results, and its path is cut (``cut`` run in trio); its ticket and events."""
    opened = connect_native_client_connection(options)
    connection = opened.__enter__()
    session = asyncio.run(connection.open_session(RESUME))
    session.submit_operation(openai_submit(7001, 1, payload))
    events: list[dict[str, Any]] = []
    while sum(e["kind"] == "PARTIAL_RESULT" for e in events) < 20:
        events += [describe(e) for e in session.poll_events(timeout_ms=20)]
    trio.from_thread.run_sync(cut, trio_token=token)
    ticket = session.recovery_ticket()
    with contextlib.suppress(Exception):  # its connection is gone
        opened.__exit__(None, None, None)
    return ticket, events


def native_resume_to_the_end(options: Any, ticket: Any, payload: bytes
                             ) -> list[dict[str, Any]]:
    """Blocking: resume ``ticket`` on a new connection, resubmit, read to the terminal."""
    with connect_native_client_connection(options) as connection:
        session = asyncio.run(connection.resume_session(ticket, RESUME))
        session.submit_operation(openai_submit(7001, 1, payload))
        events: list[dict[str, Any]] = []
        while not any(e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON") for e in events):
            events += [describe(e) for e in session.poll_events(timeout_ms=20)]
        session.close()
        return events


def whole_native(before: list[dict[str, Any]], after: list[dict[str, Any]], count: int
                 ) -> None:
    """Every sequence 1..count once (a repeat identical), one terminal, a 200."""
    seen: dict[int, bytes] = {}
    for event in before + after:
        if event["kind"] == "PARTIAL_RESULT":
            assert seen.setdefault(event["sequence"], event["body"]) == event["body"]
    assert sorted(seen) == list(range(1, count + 1))
    terminals = [e for e in after if e["kind"] == "RESULT_PUSH"]
    assert len(terminals) == 1 and terminals[0]["status"] == 200


@pytest.mark.parametrize("scheme", ["tcp", "ws", "tcps", "wss", "quic"])
async def test_a_resume_on_another_pod_is_forwarded_to_the_owner(
        nursery: trio.Nursery, tmp_path: Path, scheme: str) -> None:
    """On every transport: the receiving pod terminates TLS, WebSocket and QUIC, and the
    pod-to-pod leg carries the client's packets (QUIC straight to the other pod, as a
    client whose address changed would reach it: HAProxy does not balance QUIC)."""
    pki = make_pki(tmp_path / "pki")
    pods = await start_fleet(nursery, tmp_path, listen=(
        "tcp://127.0.0.1:0", "ws://127.0.0.1:0/nnrp", "tcps://127.0.0.1:0",
        "wss://127.0.0.1:0/nnrp", "quic://127.0.0.1:0"), tls=TlsConfig(pki.cert, pki.key))
    trust = {"ssl_context": ssl.create_default_context(cafile=str(pki.cert)),
             "quic": QuicClientOptions(ca_file=pki.cert)}
    first, second, third = pods
    hold = second.replay.hold(lambda request: request.method == "POST", after=20)
    with trio.fail_after(30):
        ticket, held = await stream_then_drop(second.uri(scheme), pods, **trust)
        nursery.start_soon(_release_when, lambda: second.registry.stats.resumed_total, hold)
        rest = await resume_at(first.uri(scheme), ticket, held, **trust)
    whole(held, rest)
    assert (first.posts, second.posts, third.posts) == (0, 1, 0)
    assert first.forwards(ForwardOutcome.SENT) == 1
    assert second.forwards(ForwardOutcome.ACCEPTED) == 1
    assert not third.registry.stats.fleet_forwards
    assert second.replay.disconnects == []


async def _release_when(counter: Any, hold: Any) -> None:
    with trio.fail_after(30):
        await until(lambda: counter() == 1)
    hold.release()


async def test_behind_haproxy_a_native_client_resumes_on_whichever_pod_it_reaches(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """The issue's scenario: nnrp-py's native client through a cutting proxy and HAProxy
    (round robin over three pods, the Service); cut mid-stream; it resumes through
    HAProxy, which gives the new connection to another pod; that pod forwards it."""
    pods = await start_fleet(nursery, tmp_path)
    backends = [pod.uri("tcp").removeprefix("tcp://") for pod in pods]
    token = trio.lowlevel.current_trio_token()
    payload = envelope(chat(stream=True, max_tokens=200), request_id="fleet-1")
    holds = [pod.replay.hold(lambda request: request.method == "POST", after=30)
             for pod in pods]
    async with haproxy(tmp_path, backends) as service:
        host, _, port = service.rpartition(":")
        cutter = StreamCutProxy((host, int(port)))
        via = await nursery.start(cutter.serve)

        with trio.fail_after(30):
            ticket, before = await trio.to_thread.run_sync(
                native_stream_then_cut, native_client_options(f"tcp://{via}"), payload,
                cutter.cut, token)
            owner = owner_of(pods)
            await until(lambda: owner.registry.detached == 1)
        for pod, hold in zip(pods, holds, strict=True):
            if pod is owner:
                nursery.start_soon(_release_when, lambda: owner.registry.stats.resumed_total,
                                   hold)

        with trio.fail_after(30):
            after = await trio.to_thread.run_sync(
                native_resume_to_the_end, native_client_options(f"tcp://{service}"), ticket,
                payload)
    whole_native(before, after, 200)
    (forwarder,) = [pod for pod in pods if pod.forwards(ForwardOutcome.SENT)]
    assert forwarder is not owner  # HAProxy gave the resume to another pod
    assert owner.forwards(ForwardOutcome.ACCEPTED) == 1
    assert [pod.posts for pod in pods] == [1 if pod is owner else 0 for pod in pods]


async def test_a_made_up_token_leaves_the_fleet_idle(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """A forged token (and one of another fleet) is refused where it lands: no pod
    forwards anything, and the connection goes on serving."""
    pods = await start_fleet(nursery, tmp_path)
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    (other_fleet,) = await start_fleet(nursery, elsewhere, pods=1,
                                       key=key_file(elsewhere, b"z" * 64))
    async with connect(other_fleet.uri("tcp")) as client:
        foreign = (await client.open_session(resume=True)).ticket
    assert foreign is not None
    with trio.fail_after(10):
        for token in (b"\xf1" + bytes(70), foreign.token):
            async with connect(pods[0].uri("tcp")) as client:
                with pytest.raises(ClientError) as refused:
                    await client.resume_session(ResumeTicket(foreign.session_id, token,
                                                             120_000))
                assert not refused.value.retry_later
                session = await client.open_session()
                assert session is not None
    for pod in pods:
        assert not pod.registry.stats.fleet_forwards


async def test_a_pod_out_of_reach_is_retry_later_and_counted(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """A genuine token of a pod that nothing answers for any more (deleted, or cut off
    from this one): the client is told to retry, typed, and the forward is counted."""
    (pod,) = await start_fleet(nursery, tmp_path, pods=1)
    gone = nnrp.FleetIdentity(f"127.0.0.1:{free_port()}",
                              nnrp.FleetKeys([KEY], clock=time.monotonic, keep_previous=60),
                              wall_clock=time.time)
    with trio.fail_after(10):
        async with connect(pod.uri("tcp")) as client:
            with pytest.raises(ClientError) as refused:
                await client.resume_session(ResumeTicket(7, gone.seal(0, bytes(24)), 120_000))
            assert refused.value.retry_later
            assert "cannot be reached" in str(refused.value)
    assert pod.forwards(ForwardOutcome.UNREACHABLE) == 1
    async with connect(pod.uri("tcp")) as client:  # the pod goes on serving
        assert (await client.open_session()) is not None


async def test_a_forward_loop_attempt_opens_nothing_anywhere(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """A genuine forward header (the fleet's key) to pod B carrying a token that names
    pod C: B never forwards a forwarded connection (F5); C sees nothing."""
    pods = await start_fleet(nursery, tmp_path)
    first, second, third = pods
    async with connect(third.uri("tcp")) as client:
        ticket = (await client.open_session(resume=True)).ticket
    assert ticket is not None
    fleet = first.gateway.fleet
    assert fleet is not None
    host, _, port = second.advertise.rpartition(":")
    from gateway.server._relay import FIELDS
    client = nnrp.ClientConnection()
    sealed = fleet.seal_forward(second.advertise, FIELDS.pack(b"tcp", b"127.0.0.1", False, b""),
                                client.hello() + resume(ticket.token, ticket.session_id))
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(sealed.opening)
            answers = bytearray()
            while len(answers) < len(sealed.proof) or len(nnrp.split_packets(
                    bytearray(answers[len(sealed.proof):]))) < 2:
                data = await stream.receive_some(65536)
                assert data
                answers += data
    assert answers.startswith(sealed.proof)  # the owner proves it holds the key first
    packets = [nnrp.decode_packet(p)
               for p in nnrp.split_packets(answers[len(sealed.proof):])]
    assert packets[1].message.status == nnrp.SessionOpenStatus.REJECTED
    assert second.forwards(ForwardOutcome.ACCEPTED) == 1
    assert not second.forwards(ForwardOutcome.SENT)
    assert not third.registry.stats.fleet_forwards
    assert third.registry.detached == 1  # still waiting for its real client


async def test_a_forged_or_replayed_forward_header_is_refused(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    pods = await start_fleet(nursery, tmp_path, pods=2)
    first, second = pods
    fleet = first.gateway.fleet
    assert fleet is not None
    from gateway.server._relay import FIELDS
    fields = FIELDS.pack(b"tcp", b"127.0.0.1", False, b"")
    hello = nnrp.ClientConnection().hello()
    genuine = fleet.seal_forward(second.advertise, fields, hello).opening
    forged = bytearray(genuine)
    forged[-1] ^= 1
    # Genuine, but for another pod:
    elsewhere = fleet.seal_forward(first.advertise, fields, hello).opening
    host, _, port = second.advertise.rpartition(":")
    with trio.fail_after(10):
        for opening in (genuine, bytes(forged), genuine, elsewhere,
                        b"GET / HTTP/1.1\r\n\r\n" * 10):
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                await stream.send_all(opening)
                with contextlib.suppress(trio.BrokenResourceError):
                    while await stream.receive_some(65536):
                        if opening is genuine:
                            break
    assert second.forwards(ForwardOutcome.ACCEPTED) == 1
    assert second.forwards(ForwardOutcome.REJECTED) == 4


async def test_keys_rotate_in_two_steps_without_losing_a_session(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """F3's procedure with pods reloading at different times: a session opened under
    the old key, the new key added second and only two pods reloaded; then moved first
    and again only two reloaded; a resume through the pod that lags both times (it
    forwards with the old key, to an owner that seals with the new) still goes on."""
    key = key_file(tmp_path)
    pods = await start_fleet(nursery, tmp_path, key=key)
    first, second, late = pods
    hold = second.replay.hold(lambda request: request.method == "POST", after=20)
    new_key = KEY[::-1]
    with trio.fail_after(30):
        ticket, held = await stream_then_drop(second.uri("tcp"), pods)
        for keys in ((KEY, new_key), (new_key, KEY)):
            key.write_bytes(b"\n".join(keys) + b"\n")
            for pod in (first, second):
                pod.gateway.reload()  # what SIGHUP does; `late` has not yet
        nursery.start_soon(_release_when, lambda: second.registry.stats.resumed_total, hold)
        rest = await resume_at(late.uri("tcp"), ticket, held)
    whole(held, rest)
    assert second.posts == 1 and late.forwards(ForwardOutcome.SENT) == 1
    fleet = second.gateway.fleet
    assert fleet is not None and len(fleet.keys.accepted()) == 2


async def test_an_owner_that_is_busy_or_silent_is_retry_later_not_gone(
        nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner is reached but does not answer the hello: at its connection limit (it
    answers SERVER_BUSY), or a listener that accepts and says nothing (a reused pod IP).
    The session may well live: the client is told to retry, and the forward counted
    refused; a client that leaves first is counted abandoned."""
    import gateway.server._relay as relay_module

    monkeypatch.setattr(relay_module, "GREETING_TIMEOUT", 0.5)
    pods = await start_fleet(nursery, tmp_path, pods=2, max_connections=1)
    first, second = pods
    async with connect(second.uri("tcp")) as client:
        ticket = (await client.open_session(resume=True)).ticket
    assert ticket is not None
    with trio.fail_after(20):
        # The owner's one connection, taken:
        async with connect(second.uri("tcp")), connect(first.uri("tcp")) as client:
            with pytest.raises(ClientError) as refused:
                await client.resume_session(ticket)
        assert refused.value.retry_later and "busy or stopping" in str(refused.value)
        assert first.forwards(ForwardOutcome.REFUSED) == 1
        silent = await trio.open_tcp_listeners(0, host="127.0.0.1")
        heard: list[bytes] = []  # what the silent owner was sent, a chunk an item
        nursery.start_soon(_accept_and_say_nothing, silent[0], heard)
        port = silent[0].socket.getsockname()[1]
        impostor = nnrp.FleetIdentity(f"127.0.0.1:{port}", nnrp.FleetKeys(
            [KEY], clock=time.monotonic, keep_previous=60), wall_clock=time.time)
        to_silence = ResumeTicket(3, impostor.seal(0, bytes(24)), 120_000)
        async with connect(first.uri("tcp")) as client:
            with pytest.raises(ClientError) as refused:
                await client.resume_session(to_silence)
        assert refused.value.retry_later
        assert first.forwards(ForwardOutcome.REFUSED) == 2
        # The client leaves while the owner says nothing: once the owner has the forward
        # (not after a 0.1 s guess, which a busy host can take before the front has even
        # read the resume), and with the greeting wait made long, so that it cannot run
        # out first and count the forward refused.
        monkeypatch.setattr(relay_module, "GREETING_TIMEOUT", 60.0)
        front_host, _, front_port = first.uri("tcp").removeprefix("tcp://").rpartition(":")
        stream = await trio.open_tcp_stream(front_host, int(front_port))
        sans_io = nnrp.ClientConnection()
        before = len(heard)
        await stream.send_all(sans_io.hello() + resume(to_silence.token, 3))
        await until(lambda: len(heard) > before)
        await stream.aclose()
        await until(lambda: first.forwards(ForwardOutcome.ABANDONED) == 1)


async def _accept_and_say_nothing(listener: trio.SocketListener, heard: list[bytes]) -> None:
    async with listener, trio.open_nursery() as nursery:
        while True:
            stream = await listener.accept()
            nursery.start_soon(_hold_silently, stream, heard)


async def _hold_silently(stream: trio.SocketStream, heard: list[bytes]) -> None:
    async with stream:
        while data := await stream.receive_some(65536):
            heard.append(data)


async def test_a_flood_of_silent_connections_on_the_fleet_port_is_bounded(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """Connections that never send their header hold at most MAX_PENDING_FORWARDS
    places, each for HEADER_TIMEOUT; past that they are closed at once and counted; a
    forward goes through again once the flood is gone."""
    from gateway.server._server import MAX_PENDING_FORWARDS

    pods = await start_fleet(nursery, tmp_path, pods=2)
    first, second = pods
    host, _, port = second.advertise.rpartition(":")
    flood = MAX_PENDING_FORWARDS + 16
    with trio.fail_after(20):
        streams = [await trio.open_tcp_stream(host, int(port)) for _ in range(flood)]
        await until(lambda: second.forwards(ForwardOutcome.REJECTED) == 16)
        for stream in streams:
            await stream.aclose()
        await until(lambda: second.forwards(ForwardOutcome.REJECTED) == flood)
        ticket, held = await stream_then_drop(second.uri("tcp"), pods)
        rest = await resume_at(first.uri("tcp"), ticket, held)
    whole(held, rest)


async def test_a_draining_owner_still_takes_forwarded_resumes(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    pods = await start_fleet(nursery, tmp_path, drain_timeout=20.0)
    first, second, _ = pods
    hold = second.replay.hold(lambda request: request.method == "POST", after=20)
    with trio.fail_after(30):
        ticket, held = await stream_then_drop(second.uri("tcp"), pods)
        nursery.start_soon(second.gateway.drain)
        await until(lambda: second.gateway.draining)
        nursery.start_soon(_release_when, lambda: second.registry.stats.resumed_total, hold)
        rest = await resume_at(first.uri("tcp"), ticket, held)
    whole(held, rest)
    assert second.forwards(ForwardOutcome.ACCEPTED) == 1


def test_pods_of_two_workers_forward_then_relay_to_the_worker_that_holds_it(
        tmp_path: Path) -> None:
    """Two real ``serve --workers 2 --fleet-advertise`` pods: the forward from pod A
    lands on whichever worker of pod B the kernel picks, which relays it on to the
    worker holding the session when that is the other one (a forwarded connection may
    still go to a worker, never to a pod). Six sessions: the kernel's coin takes both
    paths but once in 32 runs; each must come out whole either way."""
    key = key_file(tmp_path)
    sessions = 6
    with contextlib.ExitStack() as stack:
        pods = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            replay = stack.enter_context(ReplayThread(speed=1.0, token_interval_ms=10.0))
            advertise = f"127.0.0.1:{free_port()}"
            pods.append((replay, stack.enter_context(served_workers(
                tmp_path / name, replay.url, "tcp://127.0.0.1:0",
                extra=("--fleet-advertise", advertise, "--fleet-key-file", str(key))))))
        (first_replay, first), (owner_replay, second) = pods

        async def sessions_resumed_on_the_other_pod() -> None:
            with trio.fail_after(60):
                for _ in range(sessions):
                    async with connect(second.uris["tcp"]) as client:
                        session = await client.open_session(resume=True)
                        assert session.ticket is not None
                        operation = await session.submit(STREAM, operation_id=5, frame_id=5)
                        held = []
                        async for event in operation.events():
                            held.append(event)
                            if len(held) == 10:
                                break
                    whole(held, await resume_at(first.uris["tcp"], session.ticket, held))

        trio.run(sessions_resumed_on_the_other_pod)
        assert len([r for r in owner_replay.server.requests if r.method == "POST"]) == sessions
        assert not [r for r in first_replay.server.requests if r.method == "POST"]
        assert second.metrics()[
            'nnrp_gateway_fleet_forwards_total{outcome="accepted"}'] == sessions
        assert first.metrics()['nnrp_gateway_fleet_forwards_total{outcome="sent"}'] == sessions
        assert second.metrics()["nnrp_gateway_resume_resumed_total"] == sessions


@pytest.mark.parametrize("scheme", ["ws", "quic"])
async def test_a_native_client_resumes_on_another_pod_over_websocket_and_quic(
        nursery: trio.Nursery, tmp_path: Path, scheme: str) -> None:
    """nnrp-py's native client, cut mid-stream on pod B (a TCP reset under WebSocket;
    QUIC's datagrams blackholed until its idle timeout), resumes straight at pod A, as a
    client whose address changed would land: A terminates WebSocket or QUIC and forwards
    the packets to B."""
    pki = make_pki(tmp_path / "pki")
    pods = await start_fleet(nursery, tmp_path, listen=(
        "tcp://127.0.0.1:0", "ws://127.0.0.1:0/nnrp", "quic://127.0.0.1:0"),
        tls=TlsConfig(pki.cert, pki.key), quic_idle_timeout=1.0)
    first, owner, _ = pods
    direct = owner.uri(scheme)
    address = direct.split("://", 1)[1].split("/", 1)[0]
    host, _, port = address.rpartition(":")
    cutter: StreamCutProxy | DatagramCutProxy
    if scheme == "quic":
        cutter = DatagramCutProxy((host, int(port)))
        via = "quic://" + await nursery.start(cutter.serve)
    else:
        cutter = StreamCutProxy((host, int(port)))
        via = f"ws://{await nursery.start(cutter.serve)}/nnrp"
    token = trio.lowlevel.current_trio_token()
    payload = envelope(chat(stream=True, max_tokens=200), request_id=f"fleet-{scheme}")
    hold = owner.replay.hold(lambda request: request.method == "POST", after=30)
    nursery.start_soon(_release_when, lambda: owner.registry.stats.resumed_total, hold)

    with trio.fail_after(30):
        ticket, before = await trio.to_thread.run_sync(
            native_stream_then_cut, native_client_options(via, trusted_der=pki.der), payload,
            cutter.cut, token)
        await until(lambda: owner.registry.detached == 1)
    with trio.fail_after(30):
        after = await trio.to_thread.run_sync(
            native_resume_to_the_end,
            native_client_options(first.uri(scheme), trusted_der=pki.der), ticket, payload)
    whole_native(before, after, 200)
    assert first.forwards(ForwardOutcome.SENT) == 1
    assert owner.forwards(ForwardOutcome.ACCEPTED) == 1
    assert [pod.posts for pod in pods] == [0, 1, 0]


async def test_a_stranger_at_the_owners_address_reads_nothing_and_is_not_believed(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """A pod IP reused by a stranger listening on the fleet port: the forward's opening
    seals the client's bytes (its token and credentials), and whatever the stranger
    answers (here a gateway's hello ack) reaches the client only after a proof it cannot
    make; the client is told to retry."""
    (pod,) = await start_fleet(nursery, tmp_path, pods=1)
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    heard = bytearray()

    async def stranger() -> None:
        async with listener:
            stream = await listener.accept()
            async with stream:
                heard.extend(await stream.receive_some(65536))
                sans_io = nnrp.ServerConnection()
                sans_io.receive_data(nnrp.ClientConnection().hello())
                await stream.send_all(nnrp.encode(nnrp.Packet(nnrp.ServerHelloAck())))
                await trio.sleep_forever()

    nursery.start_soon(stranger)
    gone = nnrp.FleetIdentity(f"127.0.0.1:{port}", nnrp.FleetKeys(
        [KEY], clock=time.monotonic, keep_previous=60), wall_clock=time.time)
    token = gone.seal(0, b"the-secret-part-of-token")
    with trio.fail_after(10):
        async with connect(pod.uri("tcp")) as client:
            with pytest.raises(ClientError) as refused:
                await client.resume_session(ResumeTicket(9, token, 120_000))
    assert refused.value.retry_later
    assert heard and b"the-secret-part-of-token" not in heard and token not in heard
    assert pod.forwards(ForwardOutcome.REFUSED) == 1
