"""The listener set as one (gateway/server/_server.py, "The listener set"): bound all or
none, closed together when one listener fails for good, the failure in readiness and in
the process's exit. Real sockets; the failures are real ones (a taken address, a
listening socket shut down under the server)."""

from __future__ import annotations

import errno
import functools
import json
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from gateway import nnrp
from gateway.app import Gateway, GatewayConfig, serve_until_signalled
from gateway.server import GatewayServer
from gateway.tools.client import connect
from gateway.tools.conformance import break_listener, refuses
from gateway.tools.replay import ReplayServer
from gateway.transport import ListenerFailed, ListenError
from tests.support.waits import until

if TYPE_CHECKING:
    from tests.support.servers import RunningServer


def script(**kw: Any) -> bytes:
    return json.dumps(kw).encode()


async def test_a_failed_bind_closes_the_listeners_bound_before_it(socket_dir: Path) -> None:
    """Rule 1: unix then tcp, the tcp port taken: serve raises the bind's ListenError,
    and the unix listener it had bound is closed and its file removed."""
    async def handler(op: Any) -> None:
        raise AssertionError("nothing is served")

    server = GatewayServer(handler)
    path = socket_dir / "first.sock"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = f"tcp://127.0.0.1:{holder.getsockname()[1]}"
        with trio.fail_after(10), pytest.RaisesGroup(
                pytest.RaisesExc(ListenError, match=f"cannot listen on {busy}: address "
                                                    "already in use"), flatten_subgroups=True):
            async with trio.open_nursery() as nursery:
                await nursery.start(server.serve, [f"unix://{path}", busy])
    assert [e.uri for e in server.endpoints] == [f"unix://{path}"]  # it had bound
    assert not path.exists()
    assert await refuses(f"unix://{path}")
    assert not server.accepting and server.listener_failure is None


async def test_a_terminal_listener_failure_closes_the_whole_set(running: RunningServer
                                                                ) -> None:
    """Rule 2: the tcp listener's socket is shut down under it; the unix and ws listeners
    close too, at once, while the session already open on unix is served on."""
    server = running.server
    tcp, unix, ws = (running.uri(kind) for kind in ("tcp", "ipc", "websocket"))
    with trio.fail_after(15):
        async with connect(unix) as client:
            session = await client.open_session()
            assert break_listener(int(tcp.rsplit(":", 1)[1])) == 1
            await server.listener_set_failed.wait()
            failure = server.listener_failure
            assert isinstance(failure, ListenerFailed)
            assert (failure.uri, failure.transport) == (tcp, "tcp")
            assert "the whole listener set is closed" in str(failure)
            assert not server.accepting
            for uri in (tcp, unix, ws):
                assert await refuses(uri), uri
            operation = await session.submit(script(events=3))
            events = [event async for event in operation.events()]
            assert isinstance(events[-1], nnrp.ResultReceived)
            await session.close()


async def test_the_gateway_is_not_ready_then_drains_and_exits_with_the_failure(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """The process's side: readiness names the failure, the open session's operation
    finishes (the drain, as on SIGTERM), and serve_until_signalled raises the failure
    (the CLI's exit status 1 and one line)."""
    replay = ReplayServer(speed=50.0)
    url = await nursery.start(replay.serve)
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0", f"unix://{socket_dir}/g.sock"),
                                    vllm_url=url, probe_interval=0.05, drain_timeout=10))
    started: list[Any] = []
    outcome: list[BaseException] = []

    async def announce(endpoints: list[Any]) -> None:
        started.extend(endpoints)

    async def run() -> None:
        try:
            await serve_until_signalled(gateway, announce)
        except ListenerFailed as exc:
            outcome.append(exc)

    done = trio.Event()

    async def run_then_mark() -> None:
        try:
            await run()
        finally:
            done.set()

    nursery.start_soon(run_then_mark)
    with trio.fail_after(20):
        await until(lambda: started and gateway.info is not None)  # announced, probed
        assert gateway.readiness() == []
        tcp, unix = (e.uri for e in started)
        async with connect(unix) as client:
            session = await client.open_session()
            operation = await session.submit(json.dumps({
                "schema_version": "openai-compatible/1",
                "operation": "chat.completions.create",
                "body": {"model": "example-model", "stream": True,
                         "messages": [{"role": "user", "content": "hi"}]}}).encode())
            break_listener(int(tcp.rsplit(":", 1)[1]))
            await gateway.server.listener_set_failed.wait()
            assert gateway.readiness()[0] == str(gateway.server.listener_failure)
            events = [event async for event in operation.events()]
            assert isinstance(events[-1], nnrp.ResultReceived)
            assert events[-1].meta.status_code == 200
        await done.wait()
    (failure,) = outcome
    assert failure.uri == tcp


async def test_a_websocket_listener_failure_closes_the_set_too(running: RunningServer) -> None:
    """trio-websocket's accept loop raises what is not a shortage: the same rule."""
    server = running.server
    ws = running.uri("websocket")
    port = int(ws.rsplit(":", 1)[1].split("/")[0])
    with trio.fail_after(10):
        assert break_listener(port) == 1
        await server.listener_set_failed.wait()
    assert server.listener_failure is not None
    assert server.listener_failure.uri == ws
    for kind in ("tcp", "ipc", "websocket"):
        assert await refuses(running.uri(kind))


async def test_a_quic_socket_that_fails_closes_the_set(nursery: trio.Nursery,
                                                       tmp_path: Path) -> None:
    """A QUIC listener's socket failing for good (its read raising what no datagram
    causes: EBADF; injected, as no real socket can be made to fail so while trio waits on
    it) ends its listener, and the server closes the whole set as for a stream listener.
    An ICMP error reported on the socket (ECONNREFUSED) does not."""
    from gateway.transport import QuicSettings, TlsConfig
    from tests.support.quic import make_pki

    pki = make_pki(tmp_path / "pki")

    async def handler(op: Any) -> None:
        raise AssertionError("nothing is served")

    server = GatewayServer(handler, quic=QuicSettings(TlsConfig(pki.cert, pki.key)))
    endpoints = await nursery.start(server.serve, ["tcp://127.0.0.1:0", "quic://127.0.0.1:0"])
    tcp, quic = (e.uri for e in endpoints)
    (listener,) = server.quic_listeners
    receive = listener._receive
    failures = [OSError(errno.ECONNREFUSED, "Connection refused"),
                OSError(errno.EBADF, "Bad file descriptor")]

    def failing() -> Any:
        if failures:
            raise failures.pop(0)
        return receive()

    listener._receive = failing  # type: ignore[method-assign]
    with socket.socket(type=socket.SOCK_DGRAM) as peer:  # wakes the pending receive
        peer.sendto(b"x", ("127.0.0.1", int(quic.rsplit(":", 1)[1])))
    with trio.fail_after(10):
        await server.listener_set_failed.wait()
    failure = server.listener_failure
    assert failure is not None and (failure.uri, failure.transport) == (quic, "quic")
    assert "Bad file descriptor" in str(failure)
    assert failures == []  # the ICMP error was passed over, the EBADF was not
    assert await refuses(tcp)


async def test_a_quic_listener_stops_accepting_when_a_tcp_listener_fails(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """Rule 2 for QUIC: its socket stays open while it serves sessions (they go on), but
    a new handshake is refused once the set failed. ``refuses`` probes QUIC with a real
    handshake: it sees the listener accept first (a TCP connect to the UDP port would
    have been refused whatever the listener did)."""
    from gateway.transport import QuicClientOptions, QuicSettings, TlsConfig
    from tests.support.quic import make_pki
    from tests.support.servers import Seen, scripted_handler

    pki = make_pki(tmp_path / "pki")
    server = GatewayServer(functools.partial(scripted_handler, seen=Seen()),
                           quic=QuicSettings(TlsConfig(pki.cert, pki.key)))
    endpoints = await nursery.start(server.serve, ["tcp://127.0.0.1:0", "quic://127.0.0.1:0"])
    tcp, quic = (e.uri for e in endpoints)
    (listener,) = server.quic_listeners
    with trio.fail_after(20):
        assert not await refuses(quic)
        async with connect(quic, quic=QuicClientOptions(ca_file=pki.cert)) as client:
            session = await client.open_session()
            assert break_listener(int(tcp.rsplit(":", 1)[1])) == 1
            await server.listener_set_failed.wait()
            refused_before = listener.endpoint.stats.refused_initials
            assert await refuses(quic)
            assert listener.endpoint.stats.refused_initials > refused_before  # it was asked
            assert await refuses(tcp)
            operation = await session.submit(script(events=2))  # the session goes on
            events = [event async for event in operation.events()]
            assert isinstance(events[-1], nnrp.ResultReceived)
            await session.close()
