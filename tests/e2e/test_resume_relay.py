"""The relay between workers at its edges (gateway/server/_relay.py rules 3 and 4): a
worker that cannot be reached, and a client that breaks its carrier's rules once its
connection is relayed. Two gateways play two workers of a pod, as in test_resume.py."""

from __future__ import annotations

import contextlib
from pathlib import Path

import attrs
import pytest
import structlog
import trio
import trio_websocket

from gateway import nnrp
from gateway.app import Gateway, GatewayConfig
from gateway.nnrp import ResumePolicy
from gateway.tools.client import ClientError, ResumeTicket, connect
from gateway.tools.replay import ReplayServer
from gateway.transport import parse_endpoint
from tests.support.stack import chat, envelope, run_operation
from tests.support.waits import until


async def workers(nursery: trio.Nursery, socket_dir: Path, indexes: tuple[int, ...]
                  ) -> list[Gateway]:
    """Gateways as the workers ``indexes`` of a pod of two: a worker not started is one
    that has gone (its relay socket answers nothing)."""
    url = await nursery.start(ReplayServer(speed=1.0, token_interval_ms=5.0).serve)
    relays = (str(socket_dir / "w0.relay"), str(socket_dir / "w1.relay"))
    started = []
    for index in indexes:
        gateway = Gateway(GatewayConfig(
            listen=("tcp://127.0.0.1:0", "ws://127.0.0.1:0/nnrp"), vllm_url=url,
            probe_interval=0.05, resume=ResumePolicy(worker=index, relays=relays)))
        await nursery.start(gateway.run)
        started.append(gateway)
    return started


def uri(gateway: Gateway, scheme: str) -> str:
    return next(e.uri for e in gateway.endpoints if e.uri.startswith(f"{scheme}://"))


async def test_a_resume_for_a_worker_that_is_gone_is_rejected_plainly(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """Worker 0 restarted: the sessions it issued tokens for are gone. A resume of one,
    arriving at worker 1, is rejected as any token that opens nothing (not retry-later,
    not a silent close), and worker 1 goes on serving."""
    (survivor,) = await workers(nursery, socket_dir, (1,))
    with trio.fail_after(10):
        async with connect(uri(survivor, "tcp")) as client:
            with pytest.raises(ClientError) as refused:
                await client.resume_session(ResumeTicket(1, b"\x00" * 24, 120_000))
        assert not refused.value.retry_later
        assert "the gateway process that held the session is gone" in str(refused.value)
        async with connect(uri(survivor, "tcp")) as client:
            session = await client.open_session()
            assert (await run_operation(session, envelope(chat(max_tokens=2)))).status == 200


async def test_a_migration_to_a_worker_that_is_gone_is_refused_and_stays(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    (survivor,) = await workers(nursery, socket_dir, (1,))
    with trio.fail_after(10):
        async with connect(uri(survivor, "tcp")) as first, \
                connect(uri(survivor, "ws")) as second:
            session = await first.open_session(resume=True)
            assert session.ticket is not None and session.ticket.token[0] == 1
            # A token worker 0 issued: worker 1 hands the connection to it, or would.
            session.ticket = attrs.evolve(session.ticket,
                                          token=b"\x00" + session.ticket.token[1:])
            ack = await second.migrate_session(session, old_transport_id=nnrp.TransportId.TCP,
                                               new_transport_id=nnrp.TransportId.WEBSOCKET)
            assert ack.accept_code == nnrp.MigrateAccept.REFUSED
            assert session.client is first
            assert (await run_operation(session, envelope(chat(max_tokens=2)))).status == 200


async def test_a_text_message_on_a_relayed_websocket_ends_that_connection_alone(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """NNRP over WebSocket is binary messages: a text message on a connection worker 1
    relays to worker 0 ends the relay, as it ends any connection, without a crash; both
    workers go on serving."""
    holder, relayer = await workers(nursery, socket_dir, (0, 1))
    registry = holder.server.registry
    assert registry is not None
    with trio.fail_after(10):
        async with connect(uri(holder, "tcp")) as client:
            session = await client.open_session(resume=True)
            assert session.ticket is not None
            ticket = session.ticket
        await until(lambda: registry.detached == 1)
        sans_io = nnrp.ClientConnection()
        endpoint = parse_endpoint(uri(relayer, "ws"))
        with structlog.testing.capture_logs() as logs:
            # The stream is the test's to close: trio-websocket does not close one the
            # server broke under it (gateway/transport/_client.py).
            stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
            async with stream, trio.open_nursery() as websocket_nursery:
                ws = await trio_websocket.wrap_client_stream(
                    websocket_nursery, stream, f"{endpoint.host}:{endpoint.port}",
                    endpoint.path)
                await ws.send_message(sans_io.hello())
                assert sans_io.receive_data(bytes(await ws.get_message()))
                await ws.send_message(sans_io.resume_session(ticket.session_id, ticket.token))
                await until(lambda: registry.stats.resumed_total == 1)
                await ws.send_message("not a packet")
                with contextlib.suppress(trio_websocket.ConnectionClosed):
                    while True:
                        await ws.get_message()
                await ws.aclose()
            await until(lambda: registry.detached == 1)  # the holder saw its end
        assert relayer.server.registry is not None
        assert relayer.server.registry.stats.relayed_total == 1
        assert not [entry for entry in logs if entry["log_level"] in ("error", "critical")]
        for gateway in (holder, relayer):
            async with connect(uri(gateway, "ws")) as client:
                session = await client.open_session()
                assert (await run_operation(session, envelope(chat(max_tokens=2)))).status == 200
