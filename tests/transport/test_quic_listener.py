"""quic:// on real sockets: nnrp-py's native client (quinn + rustls, FORCE_QUIC, no ALPN)
and aioquic's client against a GatewayServer with the scripted handler."""

from __future__ import annotations

import json
import os
import socket
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.profile import EndCause
from gateway.server import ConnectionLimits
from gateway.tools.client import ClientError
from gateway.transport import AlpnPolicy, TlsConfig
from tests.support.quic import (
    Pki,
    aioquic_client,
    make_pki,
    native_quic_options,
    nnrp_over,
    start_quic_server,
)
from tests.support.waits import until, until_steady

pytest.importorskip("aioquic")


def script(**kw: Any) -> bytes:
    return json.dumps(kw).encode()


def terminal(events: list[dict[str, Any]]) -> bool:
    return any(e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON") for e in events)


def wire(events: list[dict[str, Any]], frame_id: int = 1) -> list[dict[str, Any]]:
    return [e for e in events if e.get("frame_id") == frame_id and e["kind"] != "lifecycle"]


def envelope(**kw: Any) -> bytes:
    return script(**kw)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def native() -> Any:
    pytest.importorskip("nnrp.client.native")
    from nnrp.client.native import connect_native_client_connection

    from tests.support import native as native_peer

    return connect_native_client_connection, native_peer


# ------------------------------------------------------------------ native client


@pytest.mark.interop
async def test_native_client_streams_over_quic(nursery: trio.Nursery, pki: Pki) -> None:
    connect, peer = native()
    gateway = await start_quic_server(nursery, pki)
    options = native_quic_options(gateway.uri, pki.der)

    def scenario() -> list[dict[str, Any]]:
        with connect(options) as connection:
            session = peer.open_session(connection)
            session.submit_operation(peer.openai_submit(101, 1, script(events=20),
                                                        trace_id=0xABC))
            events = peer.poll_until(session, terminal)
            session.close()
            return events

    with trio.fail_after(30):
        events = await trio.to_thread.run_sync(scenario)
    frames = wire(events)
    assert [e["sequence"] for e in frames[:-1]] == list(range(1, 21))
    assert frames[-1]["kind"] == "RESULT_PUSH"
    assert frames[-1]["payload"]["header_trace_id"] == 0xABC
    (operation,) = gateway.seen.operations
    assert operation.notes.transport == "quic"
    assert gateway.stats.connections_total == 1


@pytest.mark.interop
async def test_native_cancel_mid_stream(nursery: trio.Nursery, pki: Pki) -> None:
    connect, peer = native()
    gateway = await start_quic_server(nursery, pki)
    options = native_quic_options(gateway.uri, pki.der)

    def scenario() -> list[dict[str, Any]]:
        with connect(options) as connection:
            session = peer.open_session(connection)
            # Three events, then none until the cancel: it always lands mid-stream.
            session.submit_operation(peer.openai_submit(0x65, 1, script(events=400,
                                                                        hold_after=3)))
            events: list[dict[str, Any]] = []
            sent = False
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(
                    e["kind"] == "RESULT_DROP_REASON" for e in events):
                events.extend(peer.poll_once(session))
                partials = [e for e in events if e["kind"] == "PARTIAL_RESULT"]
                if len(partials) >= 3 and not sent:
                    sent = True
                    connection.cancel_runtime_operation(
                        session, operation_id=0x65, control_sequence=1, reason_code=1,
                        diagnostic=b"user hit stop")
            # Then a window past the terminal: anything in it would be one frame too many.
            grace = time.monotonic() + 0.3
            while time.monotonic() < grace:
                events.extend(peer.poll_once(session))
            session.close()
            return events

    with trio.fail_after(30):
        events = await trio.to_thread.run_sync(scenario)
    (cancelled,) = gateway.seen.cancelled
    assert cancelled.operation_id == 0x65
    assert cancelled.outcome == "cancelled"
    frames = wire(events)
    partials = [e for e in frames if e["kind"] == "PARTIAL_RESULT"]
    assert len(partials) == 3
    assert frames[-1]["kind"] == "RESULT_DROP_REASON"
    assert frames[-1]["diagnostic"] == b"user hit stop"  # the client's own words


@pytest.mark.interop
async def test_native_two_sessions_on_one_quic_connection(nursery: trio.Nursery,
                                                          pki: Pki) -> None:
    connect, peer = native()
    gateway = await start_quic_server(nursery, pki)
    options = native_quic_options(gateway.uri, pki.der)

    def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        with connect(options) as connection:
            first, second = peer.open_session(connection), peer.open_session(connection)
            # Neither stream emits before both operations run: they stream at once or
            # the poll below runs out of time.
            first.submit_operation(peer.openai_submit(
                1, 1, script(events=30, delay=0.005, await_operations=2)))
            second.submit_operation(peer.openai_submit(
                2, 1, script(events=20, delay=0.005, await_operations=2)))
            a, b = [], []
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not (terminal(a) and terminal(b)):
                a.extend(peer.poll_once(first, 5))
                b.extend(peer.poll_once(second, 5))
            first.close()
            second.close()
            return a, b

    with trio.fail_after(30):
        a, b = await trio.to_thread.run_sync(scenario)
    assert [e["kind"] for e in wire(a)] == ["PARTIAL_RESULT"] * 30 + ["RESULT_PUSH"]
    assert [e["kind"] for e in wire(b)] == ["PARTIAL_RESULT"] * 20 + ["RESULT_PUSH"]
    assert {op.session_id for op in gateway.seen.operations} == {1, 2}
    assert gateway.stats.connections_total == 1  # both sessions shared one QUIC connection


@pytest.mark.interop
async def test_native_reconnects_after_server_restart(nursery: trio.Nursery,
                                                      pki: Pki) -> None:
    connect, peer = native()
    first = await start_quic_server(nursery, pki)
    port = first.address[1]
    options = native_quic_options(first.uri, pki.der)
    second: list[Any] = []

    async def restart() -> None:
        await first.server.shutdown(1.0)  # drains: CONNECTION_CLOSE reaches the client
        await first.stop()
        second.append(await start_quic_server(nursery, pki, port=port))

    def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            with connect(options) as connection:
                session = peer.open_session(connection)
                session.submit_operation(peer.openai_submit(1, 1, script(events=3)))
                out["before"] = peer.poll_until(session, terminal)
                trio.from_thread.run(restart)
                # The old connection is gone: no answer (or an error), never a hang.
                session.submit_operation(peer.openai_submit(2, 1, script(events=3)))
                out["stale"] = peer.poll_until(session, terminal, timeout=2.0)
        except Exception as exc:  # the native client raises closing a closed connection
            out["stale_error"] = type(exc).__name__
        with connect(options) as connection:  # a new connection to the new server
            session = peer.open_session(connection)
            session.submit_operation(peer.openai_submit(3, 1, script(events=3)))
            out["after"] = peer.poll_until(session, terminal)
            session.close()
        return out

    with trio.fail_after(60):
        out = await trio.to_thread.run_sync(scenario)
    assert wire(out["before"])[-1]["kind"] == "RESULT_PUSH"
    assert not terminal(out.get("stale", [])) or "stale_error" in out
    assert [e["kind"] for e in wire(out["after"])] == ["PARTIAL_RESULT"] * 3 + ["RESULT_PUSH"]
    assert [op.operation_id for op in second[0].seen.operations] == [3]


@pytest.mark.interop
async def test_native_client_with_retry_always(nursery: trio.Nursery, pki: Pki) -> None:
    """Address validation on every connection: quinn follows the Retry."""
    connect, peer = native()
    gateway = await start_quic_server(nursery, pki, retry_threshold=0)

    def scenario() -> list[dict[str, Any]]:
        with connect(native_quic_options(gateway.uri, pki.der)) as connection:
            session = peer.open_session(connection)
            session.submit_operation(peer.openai_submit(1, 1, script(events=2)))
            events = peer.poll_until(session, terminal)
            session.close()
            return events

    with trio.fail_after(30):
        events = await trio.to_thread.run_sync(scenario)
    assert wire(events)[-1]["kind"] == "RESULT_PUSH"
    assert gateway.stats.retries == 1


@pytest.mark.interop
async def test_native_client_refused_when_nnrp_alpn_is_required(nursery: trio.Nursery,
                                                                pki: Pki) -> None:
    connect, peer = native()
    gateway = await start_quic_server(nursery, pki, alpn=AlpnPolicy.NNRP)

    def scenario() -> str:
        try:
            with connect(native_quic_options(gateway.uri, pki.der)) as connection:
                peer.open_session(connection)
        except Exception as exc:
            return type(exc).__name__
        return "connected"

    with trio.fail_after(30):
        outcome = await trio.to_thread.run_sync(scenario)
    assert outcome != "connected"
    assert not gateway.seen.operations


@pytest.mark.interop
async def test_garbage_datagrams_do_not_disturb_a_live_connection(nursery: trio.Nursery,
                                                                  pki: Pki) -> None:
    connect, peer = native()
    gateway = await start_quic_server(nursery, pki)
    options = native_quic_options(gateway.uri, pki.der)
    junk = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sent = 0

    async def spray() -> None:
        nonlocal sent
        for index in range(300):
            kind = index % 3
            if kind == 0:  # random bytes of any length
                data = os.urandom(1 + index % 1400)
            elif kind == 1:  # a short header for an unknown connection ID
                data = bytes([0x40 | (index & 0x3F)]) + os.urandom(40)
            else:  # a padded Initial-looking long header whose payload never decrypts
                data = (b"\xc3\x00\x00\x00\x01\x08" + os.urandom(8) + b"\x08"
                        + os.urandom(8) + b"\x00\x44\xb0" + os.urandom(1200))
            await junk.sendto(data, gateway.address)
            sent += 1
            await trio.sleep(0.002)  # the spray's pace, beside the stream

    def scenario() -> list[dict[str, Any]]:
        with connect(options) as connection:
            session = peer.open_session(connection)
            session.submit_operation(peer.openai_submit(1, 1, script(events=100,
                                                                     delay=0.005)))
            trio.from_thread.run_sync(nursery.start_soon, spray)
            events = peer.poll_until(session, terminal, timeout=20)
            session.close()
            return events

    with junk, trio.fail_after(40):
        events = await trio.to_thread.run_sync(scenario)
        await until(lambda: sent >= 300)
    assert [e["kind"] for e in wire(events)] == ["PARTIAL_RESULT"] * 100 + ["RESULT_PUSH"]
    # Each is dropped as garbage or, once Initial-looking ones pass retry_threshold (64/s;
    # how many do depends on how fast this host sends them, and the burst test pins it),
    # answered by a stateless Retry. A few random ones may parse as something else.
    assert gateway.stats.garbage + gateway.stats.retries >= 290
    assert gateway.stats.connections_total == 1
    assert len(gateway.endpoint.routes) == 0  # every half-made connection was dropped


# ------------------------------------------------------------------ aioquic client


@pytest.mark.parametrize(("policy", "offer", "accepted", "selected"), [
    (AlpnPolicy.NONE, None, True, None),
    (AlpnPolicy.NONE, ["nnrp/1"], False, None),
    (AlpnPolicy.NNRP, None, False, None),
    (AlpnPolicy.NNRP, ["h3", "nnrp/1"], True, "nnrp/1"),
    (AlpnPolicy.ANY, None, True, None),
    (AlpnPolicy.ANY, ["nnrp/1"], True, "nnrp/1"),
    (AlpnPolicy.ANY, ["h3"], False, None),
])
async def test_alpn_policies(nursery: trio.Nursery, pki: Pki, policy: AlpnPolicy,
                             offer: list[str] | None, accepted: bool,
                             selected: str | None) -> None:
    gateway = await start_quic_server(nursery, pki, alpn=policy)
    with trio.fail_after(10):
        async with aioquic_client(gateway.address, pki.cert, alpn=offer) as client:
            await client.wait_for(lambda: client.handshake is not None
                                  or client.terminated is not None)
            if not accepted:
                assert client.handshake is None
                assert client.terminated is not None
                assert client.terminated.error_code == 0x100 + 120  # no_application_protocol
                return
            assert client.handshake is not None
            assert client.handshake.alpn_protocol == selected
            async with nnrp_over(client) as nnrp:
                session = await nnrp.open_session()
                operation = await session.submit(envelope(events=3))
                kinds = [type(event).__name__ async for event in operation.events()]
    assert kinds == ["PartialReceived"] * 3 + ["ResultReceived"]


async def test_vanished_client_ends_its_operation_within_the_idle_timeout(
        nursery: trio.Nursery, pki: Pki) -> None:
    idle = 1.0
    gateway = await start_quic_server(nursery, pki, idle_timeout=idle)
    with trio.fail_after(15):
        async with aioquic_client(gateway.address, pki.cert) as client, \
                nnrp_over(client) as nnrp:
            session = await nnrp.open_session()
            operation = await session.submit(envelope(events=10_000, delay=0.01))
            events = operation.events()
            for _ in range(3):
                await events.__anext__()
            client.vanished = True  # no CONNECTION_CLOSE, no ACK, nothing
            gone_at = trio.current_time()
            await until(lambda: gateway.seen.cancelled)
            ended_after = trio.current_time() - gone_at
    (operation_seen,) = gateway.seen.cancelled
    with trio.fail_after(10):
        await until(lambda: not gateway.server.connections)
    # The reader (receive() -> None: DISCONNECT) or the blocked writer (BrokenResourceError:
    # the connection's nursery is cancelled) notices first; either way the operation ended.
    assert operation_seen.end_cause in (None, EndCause.DISCONNECTED)
    assert idle * 0.9 <= ended_after < idle * 3 + 1.0  # the idle timeout, not minutes
    await until(lambda: not gateway.server.connections)
    assert len(gateway.endpoint.routes) == 0


async def test_extra_streams_are_refused_without_breaking_the_first(nursery: trio.Nursery,
                                                                    pki: Pki) -> None:
    gateway = await start_quic_server(nursery, pki)
    with trio.fail_after(20):
        async with aioquic_client(gateway.address, pki.cert) as client, \
                nnrp_over(client) as nnrp:
            session = await nnrp.open_session()
            operation = await session.submit(envelope(events=50, delay=0.01))
            extra = []
            for _ in range(20):  # beyond max_streams_bidi: aioquic queues them for credit
                stream_id = client.quic.get_next_available_stream_id()
                client.quic.send_stream_data(stream_id, b"not nnrp" * 100)
                extra.append(stream_id)
            client.flush()
            kinds = [type(event).__name__ async for event in operation.events()]
            await client.wait_for(lambda: all(s in client.resets for s in extra))
    assert kinds == ["PartialReceived"] * 50 + ["ResultReceived"]
    assert extra[0] == 4
    assert {client.resets[s] for s in extra} == {0x101}
    assert gateway.stats.refused_streams == 20


async def test_client_that_stops_acknowledging_stalls_only_its_connection(
        nursery: trio.Nursery, pki: Pki) -> None:
    send_buffer = 64 * 1024
    gateway = await start_quic_server(nursery, pki, send_buffer=send_buffer,
                                      limits=ConnectionLimits(handshake_timeout=5.0,
                                                              write_timeout=2.0))
    with trio.fail_after(60):
        # A long QUIC idle timeout (30 s, the server's, once negotiated): only the write
        # timeout can end the stalled connection within the bound below.
        async with aioquic_client(gateway.address, pki.cert, idle_timeout=60.0) as slow, \
                nnrp_over(slow) as slow_nnrp:
            session = await slow_nnrp.open_session()
            operation = await session.submit(envelope(events=5000, size=2000))
            events = operation.events()
            await events.__anext__()
            slow.deaf = True  # nothing it is sent is acknowledged from now on
            await until_steady(lambda: gateway.seen.operations[0].events_sent,
                               steady_for=0.3)  # the operation waits
            (connection,) = gateway.server.connections
            listener = gateway.server.quic_listeners[0]
            (quic_peer,) = listener.endpoint.peers
            sent_then = gateway.seen.operations[0].events_sent
            backlog = quic_peer.quic.unacked_bytes(0)
            # Bounded: aioquic holds at most send_buffer plus one write batch; the outbox
            # holds at most its high-water mark; the operation waits.
            assert backlog <= send_buffer + connection.limits.outbox_high_water
            assert connection.outbox.queued_bytes <= connection.limits.outbox_high_water * 2
            # Another client on the same listener is served meanwhile.
            async with aioquic_client(gateway.address, pki.cert) as other, \
                    nnrp_over(other) as other_nnrp:
                other_session = await other_nnrp.open_session()
                other_op = await other_session.submit(envelope(events=20))
                kinds = [type(event).__name__ async for event in other_op.events()]
            assert kinds == ["PartialReceived"] * 20 + ["ResultReceived"]
            assert gateway.seen.operations[0].events_sent - sent_then < 200
            # The stalled connection ends at the write timeout (2 s), its QUIC connection
            # after the close linger and closing period: bounded with room for a busy
            # host (10 s), still far short of the idle timeout's 30 s.
            stalled_at = trio.current_time()
            await until(lambda: not (gateway.server.connections
                                     or listener.endpoint.peers))
            assert trio.current_time() - stalled_at < 2.0 + 1.0 + 10.0
    assert gateway.seen.operations[1].outcome == "ok"


async def test_tls_reload_applies_to_new_handshakes(nursery: trio.Nursery, tmp_path: Path,
                                                    pki: Pki) -> None:
    gateway = await start_quic_server(nursery, pki)
    replacement = make_pki(tmp_path / "next", name="next")
    old_ca = tmp_path / "old-ca.pem"
    old_ca.write_bytes(pki.cert.read_bytes())

    async def handshake(ca: Path) -> bool:
        async with aioquic_client(gateway.address, ca, idle_timeout=2.0) as client:
            await client.wait_for(lambda: client.handshake is not None
                                  or client.terminated is not None)
            return client.handshake is not None

    with trio.fail_after(20):
        async with aioquic_client(gateway.address, old_ca) as old_client, \
                nnrp_over(old_client) as old_nnrp:
            # Replace the files the listener was configured with, then reload (SIGHUP).
            pki.cert.write_bytes(replacement.cert.read_bytes())
            pki.key.write_bytes(replacement.key.read_bytes())
            gateway.server.reload_quic_tls()
            assert await handshake(replacement.cert)
            assert not await handshake(old_ca)  # the old certificate is no longer served
            # The established connection keeps its keys and keeps working.
            session = await old_nnrp.open_session()
            operation = await session.submit(envelope(events=2))
            kinds = [type(event).__name__ async for event in operation.events()]
            assert kinds == ["PartialReceived"] * 2 + ["ResultReceived"]
            # A bad file keeps the current certificate.
            pki.key.write_bytes(b"not a key")
            gateway.server.reload_quic_tls()
            assert await handshake(replacement.cert)


async def test_refused_when_over_the_connection_limit(nursery: trio.Nursery,
                                                      pki: Pki) -> None:
    gateway = await start_quic_server(nursery, pki, max_connections=2, retry_threshold=None,
                                      handshake_timeout=1.0)
    with trio.fail_after(20):
        async with aioquic_client(gateway.address, pki.cert) as a, \
                aioquic_client(gateway.address, pki.cert) as b:
            await a.wait_for(lambda: a.handshake is not None)
            await b.wait_for(lambda: b.handshake is not None)
            async with aioquic_client(gateway.address, pki.cert, idle_timeout=1.0) as c:
                await c.wait_for(lambda: c.terminated is not None)
                assert c.handshake is None
            assert gateway.stats.refused_initials >= 1
            async with nnrp_over(a) as nnrp:  # the admitted ones are unaffected
                session = await nnrp.open_session()
                operation = await session.submit(envelope(events=2))
                kinds = [type(event).__name__ async for event in operation.events()]
    assert kinds == ["PartialReceived"] * 2 + ["ResultReceived"]


async def test_quic_needs_a_certificate(nursery: trio.Nursery) -> None:
    from gateway.server import GatewayServer
    from gateway.transport import ListenError

    async def handler(op: Any) -> None:
        pass

    server = GatewayServer(handler)
    with pytest.raises(ExceptionGroup) as caught:
        await server.serve(["quic://127.0.0.1:0"])
    assert caught.group_contains(ListenError, match="certificate")


async def test_closed_client_connection_reports_end(nursery: trio.Nursery, pki: Pki) -> None:
    gateway = await start_quic_server(nursery, pki)
    with trio.fail_after(10):
        async with aioquic_client(gateway.address, pki.cert) as client, \
                nnrp_over(client) as nnrp:
            session = await nnrp.open_session()
            operation = await session.submit(envelope(hang=True))
            await until(lambda: gateway.seen.operations)
            client.quic.close()
            client.flush()
            with pytest.raises(ClientError):
                async for _ in operation.events():
                    pass
        await until(lambda: gateway.seen.cancelled)
        await until(lambda: not gateway.server.connections)
    assert gateway.seen.cancelled[0].end_cause in (None, EndCause.DISCONNECTED)


async def test_datagrams_waiting_together_are_serviced_together(
        nursery: trio.Nursery, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_quic_listener.RECEIVE_BATCH``: the datagrams waiting in the socket when the
    listener wakes are read together, and the connection they touch is serviced (its
    events applied, its ACKs sent, its tasks woken) once, not once per datagram: a big
    submit over quic:// cost the gateway 10.6-10.9 s of CPU for 63 MiB that way, 3.2-3.5 s
    batched (docs/benchmarks.md, "Over WebSocket and QUIC"). A hundred copies of one of
    the client's datagrams, all sent before the listener runs, are a few batches (at
    most 64 datagrams each), not a hundred services."""
    from gateway.transport._quic_listener import QuicListener

    gateway = await start_quic_server(nursery, pki)
    serviced: list[object] = []
    service = QuicListener.service

    def counted(self: QuicListener, session: Any) -> None:
        serviced.append(session)
        service(self, session)

    with trio.fail_after(20):
        async with aioquic_client(gateway.address, pki.cert) as client, \
                nnrp_over(client) as nnrp:
            session = await nnrp.open_session()
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            client.quic.send_ping(7)
            (datagram, address), *_ = client.quic.datagrams_to_send(trio.current_time())
            monkeypatch.setattr(QuicListener, "service", counted)
            received = gateway.stats.datagrams_in
            for _ in range(100):  # no checkpoint: all queued before the listener runs
                client.sock.sendto(datagram, address)
            await until(lambda: gateway.stats.datagrams_in >= received + 100)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            monkeypatch.setattr(QuicListener, "service", service)
            # Two batches at least (64 at most each); a batch per 5 ms on a slow host;
            # and the woken tasks' own services: far from one per datagram.
            assert 2 <= len(serviced) <= 30
            operation = await session.submit(envelope(events=3))  # and it still serves
            events = [event async for event in operation.events()]
            assert type(events[-1]).__name__ == "ResultReceived"


# ------------------------------------------------------------------ the gateway process


async def test_gateway_serves_chat_over_quic(nursery: trio.Nursery, pki: Pki) -> None:
    """GatewayConfig (tls + quic_alpn) to a real chat answer from the replay vLLM."""
    from gateway.app import Gateway, GatewayConfig
    from gateway.tools.replay import ReplayServer
    from tests.support.stack import chat, envelope as chat_envelope, run_operation

    url = await nursery.start(ReplayServer(speed=50.0).serve)
    gateway = Gateway(GatewayConfig(listen=("quic://127.0.0.1:0",), vllm_url=url,
                                    probe_interval=0.05, tls=TlsConfig(pki.cert, pki.key),
                                    quic_alpn="any"))
    await nursery.start(gateway.run)
    await gateway.probed.wait()
    host, _, port = gateway.endpoints[0].uri.removeprefix("quic://").rpartition(":")
    with trio.fail_after(20):
        async with aioquic_client((host, int(port)), pki.cert, alpn=["nnrp/1"]) as client, \
                nnrp_over(client) as nnrp:
            assert client.handshake is not None
            assert client.handshake.alpn_protocol == "nnrp/1"
            session = await nnrp.open_session()
            outcome = await run_operation(session, chat_envelope(chat(stream=True,
                                                                      max_tokens=3)))
            gateway.reload_tls()  # SIGHUP: the same files again; the session goes on
            again = await run_operation(session, chat_envelope(chat(stream=True,
                                                                    max_tokens=3)))
    assert outcome.types == ["response.output_text.delta"] * 3
    assert outcome.final["type"] == "response.completed"
    assert again.final["type"] == "response.completed"


def test_cli_quic_alpn_option() -> None:
    from typer.testing import CliRunner

    from cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--print-config", "--quic-alpn", "nnrp/1"])
    assert result.exit_code == 0, result.output
    assert tomllib.loads(result.output)["quic_alpn"] == "nnrp/1"
    # The default is any (AlpnPolicy: the spec's nnrp/1 and nnrp-py's no-ALPN client).
    assert tomllib.loads(runner.invoke(app, ["serve", "--print-config"]).output)[
        "quic_alpn"] == "any"
    result = runner.invoke(app, ["serve", "--print-config"],
                           env={"NNRP_GATEWAY_QUIC_ALPN": "none"})
    assert tomllib.loads(result.output)["quic_alpn"] == "none"
    assert runner.invoke(app, ["serve", "--print-config", "--quic-alpn", "h3"]).exit_code == 2
