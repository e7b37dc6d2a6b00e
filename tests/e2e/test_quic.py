"""The whole gateway (replay vLLM behind it) over quic:// with nnrp-py's native client
(quinn + rustls, FORCE_QUIC, no ALPN): what works on TCP works on QUIC. Transcripts,
cancel, drain, the transport label of logs and metrics, and which carrier the native
client's default policy picks when the gateway offers both TCP and QUIC.

IPv6: a quic:// listener on ::1 serves the project's client; nnrp-py's native client
cannot reach it (its limitation, pinned by a strict xfail that names it).

The runtime controls over QUIC (DEADLINE, EXPIRE_AT, SUPERSEDE, BUDGET_UPDATE, every
cancel form...) are tests/interop/test_runtime_controls.py, parametrized by transport.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

pytest.importorskip("nnrp.client.native")

from nnrp.client.native import (
    NativeClientOptions,
    NativeClientProviderRoute,
    connect_native_client_connection,
)
from nnrp.core.messages import TransportPolicy
from nnrp.native import NativeInternalError, NativeTransportClientSecurity

from gateway import nnrp
from gateway.pipeline import PipelineLimits
from gateway.tools.client import connect
from gateway.tools.replay import ReplayServer
from gateway.transport import QuicClientOptions, TlsConfig
from tests.support.native import native_connection, open_session, openai_submit, poll_until
from tests.support.quic import (
    Pki,
    aioquic_client,
    make_pki,
    needs_ipv6_loopback,
    start_quic_stack,
)
from tests.support.scenarios import CHAT_SCENARIOS, request_for
from tests.support.stack import (
    Stack,
    chat,
    envelope,
    metric_samples,
    records_of,
    run_operation,
    start_stack,
)
from tests.support.waits import until

pytestmark = pytest.mark.interop


def terminal(frame_id: int) -> Any:
    def done(events: list[dict[str, Any]]) -> bool:
        return any(e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON")
                   and e.get("frame_id") == frame_id for e in events)
    return done


def frames(events: list[dict[str, Any]], frame_id: int) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] != "lifecycle" and e["frame_id"] == frame_id]


@pytest.fixture
async def quic_stack(nursery: trio.Nursery, tmp_path: Path) -> tuple[Stack, Pki]:
    return await start_quic_stack(
        nursery, tmp_path, replay=ReplayServer(speed=50.0, token_interval_ms=20.0),
        pipeline=PipelineLimits(first_chunk_timeout=3.0, idle_timeout=2.0))


async def test_native_client_over_quic_sees_what_our_client_sees_over_tcp(
        quic_stack: tuple[Stack, Pki]) -> None:
    """Every recorded chat transcript (text, tool calls, reasoning, logprobs, n=2, vLLM's
    errors...) through the native client over QUIC, compared with the project's client
    over TCP."""
    stack, pki = quic_stack
    names = [n for n in CHAT_SCENARIOS if n != "engine_death_mid_stream"]
    payloads = {n: envelope(request_for(n), request_id=f"replay:{n}:quic") for n in names}
    over_tcp = {}
    async with connect(stack.uri("tcp")) as client:
        session = await client.open_session()
        for name in names:
            outcome = await run_operation(session, payloads[name])
            over_tcp[name] = (outcome.partials, outcome.status, outcome.final)

    def scenario() -> dict[str, Any]:
        results = {}
        with native_connection("quic", stack.uri("quic"), trusted_der=pki.der) as connection:
            assert connection.active_transport_name == "quic"
            session = open_session(connection)
            for number, name in enumerate(names, start=1):
                session.submit_operation(openai_submit(number, number, payloads[name]))
                events = frames(poll_until(session, terminal(number), timeout=15), number)
                partials = [json.loads(e["body"]) for e in events
                            if e["kind"] == "PARTIAL_RESULT"]
                results[name] = (partials, events[-1].get("status"), events[-1].get("payload"))
            session.close()
        return results

    records = records_of(stack)
    with trio.fail_after(120):
        over_quic = await trio.to_thread.run_sync(scenario)
    for name in names:
        assert over_quic[name] == over_tcp[name], name
    assert {r.transport for r in records} == {"quic"}
    assert len(records) == len(names)


async def test_cancel_over_quic_closes_the_upstream_socket(
        quic_stack: tuple[Stack, Pki]) -> None:
    """CANCEL mid-stream: RESULT_DROP_REASON peer_cancelled, vLLM's socket closed (the
    replay backend records the disconnect), and the operation is logged and counted with
    transport quic, beside the QUIC listener's own counters."""
    stack, pki = quic_stack

    def scenario() -> list[dict[str, Any]]:
        with native_connection("quic", stack.uri("quic"), trusted_der=pki.der) as connection:
            session = open_session(connection)
            session.submit_operation(openai_submit(1, 1, envelope(
                chat(stream=True), request_id="replay:long_stream:quic-cancel")))
            cancelled = False

            def on_event(event: dict[str, Any]) -> None:
                nonlocal cancelled
                partials = event["kind"] == "PARTIAL_RESULT"
                if partials and not cancelled and event["sequence"] >= 3:
                    connection.cancel_runtime_operation(session, operation_id=1,
                                                        control_sequence=1, reason_code=1)
                    cancelled = True

            events = poll_until(session, terminal(1), timeout=15, on_event=on_event)
            time.sleep(0.3)  # anything after the terminal would be a protocol error here
            events += poll_until(session, lambda _: False, timeout=0.1)
            session.close()
            return events

    with structlog.testing.capture_logs() as logs, trio.fail_after(30):
        events = await trio.to_thread.run_sync(scenario)
        await until(lambda: stack.replay.disconnects)
        await until(lambda: any(line["event"] == "operation" for line in logs))
    ours = frames(events, 1)
    assert ours[-1]["kind"] == "RESULT_DROP_REASON"
    assert ours[-1]["drop_reason"] == nnrp.DropReason.PEER_CANCELLED
    assert len([e for e in ours if e["kind"] == "PARTIAL_RESULT"]) >= 3
    assert stack.replay.disconnects[0].request_id == "replay:long_stream:quic-cancel"
    (line,) = [line for line in logs if line["event"] == "operation"]
    assert (line["transport"], line["outcome"]) == ("quic", "cancelled")
    assert line["upstream_aborted"] is True
    got = metric_samples(stack.gateway.metrics.registry)
    assert got[("nnrp_gateway_requests_total", (("model_name", "example-model"),
                                                ("outcome", "cancelled"),
                                                ("transport", "quic")))] == 1
    assert got[("nnrp_gateway_cancellations_total", (("kind", "cancel"),))] == 1
    assert got[("nnrp_gateway_quic_connections_total", ())] == 1
    assert got[("nnrp_gateway_quic_datagrams_total", (("direction", "in"),))] > 10
    assert got[("nnrp_gateway_quic_dropped_datagrams_total", (("reason", "garbage"),))] == 0


async def test_drain_over_quic_ends_what_outlives_it_and_closes_the_socket(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """The drain's bound over QUIC (that a slow reader loses nothing is
    tests/interop/test_drain.py, parametrized by transport): an operation still streaming
    when --drain-timeout is up is dropped and its vLLM request aborted; the client, which
    never closes, is closed (CONNECTION_CLOSE: it sees the end, it does not hang); the
    gateway is done within the drain time and the close linger; then the UDP socket is
    gone and a new handshake gets no answer."""
    stack, pki = await start_quic_stack(
        nursery, tmp_path, replay=ReplayServer(token_interval_ms=20.0), drain_timeout=1.0)
    listener = stack.gateway.server.quic_listeners[0]
    started = trio.Event()
    token = trio.lowlevel.current_trio_token()

    events: list[dict[str, Any]] = []  # what reached the client before the end

    def never_closes() -> str:
        try:
            with native_connection("quic", stack.uri("quic"), trusted_der=pki.der) as c:
                session = open_session(c)
                session.submit_operation(openai_submit(1, 1, envelope(
                    chat(stream=True, max_tokens=400), request_id="replay:text_stream:long")))

                def on_event(event: dict[str, Any]) -> None:
                    events.append(event)
                    if event["kind"] == "PARTIAL_RESULT" and not started.is_set():
                        trio.from_thread.run_sync(started.set, trio_token=token)

                # 400 tokens take 8 s: the drain ends the connection long before.
                poll_until(session, terminal(1), timeout=15, on_event=on_event)
                return "still open"
        except Exception as exc:  # the native client raises on the closed connection
            return type(exc).__name__

    result: list[str] = []

    async def client() -> None:
        result.append(await trio.to_thread.run_sync(never_closes))

    with structlog.testing.capture_logs() as logs, trio.fail_after(30):
        async with trio.open_nursery() as inner:
            inner.start_soon(client)
            await started.wait()
            began = trio.current_time()
            await stack.gateway.drain()
            drained_after = trio.current_time() - began
        await until(lambda: listener.connections_open == 0)
    assert result == ["NativeInvalidStateError"]  # the end of the connection, not a hang
    kinds = {e["kind"] for e in frames(events, 1)}
    assert "PARTIAL_RESULT" in kinds and "RESULT_PUSH" not in kinds
    assert drained_after < 1.0 + listener.settings.close_linger + 1.0
    with trio.fail_after(5):  # the backend sees the abort after us
        await until(lambda: stack.replay.disconnects)
    assert [d.request_id for d in stack.replay.disconnects] == ["replay:text_stream:long"]
    (line,) = [line for line in logs if line["event"] == "operation"]
    assert (line["transport"], line["outcome"], line["upstream_aborted"]) == (
        "quic", "shutdown", True)
    refused = listener.stats.refused_initials
    with trio.fail_after(10):
        async with aioquic_client(listener_address(stack), pki.cert, idle_timeout=1.0) as late:
            await late.wait_for(lambda: late.terminated is not None)
    assert late.handshake is None
    assert listener.stats.refused_initials == refused  # no socket read it, not even to refuse


def listener_address(stack: Stack) -> tuple[str, int]:
    host, _, port = stack.uri("quic").removeprefix("quic://").rpartition(":")
    return host, int(port)


@pytest.mark.parametrize("policy", [TransportPolicy.AUTO, TransportPolicy.PREFER_QUIC])
async def test_default_policy_with_tcp_and_quic_picks_the_faster_probe(
        quic_stack: tuple[Stack, Pki], policy: TransportPolicy) -> None:
    """nnrp-py rc4.post20, the gateway offering both: with two eligible carriers the
    native client first probes each (one connection and 3 TRANSPORT_PROBE samples per
    carrier), then ranks by probe success, then median throughput, then RTT; the static
    rank (quic 1 before tcp 2) and PREFER_QUIC only break ties. On loopback this
    gateway's TCP answers a probe several times faster than its QUIC (Python's QUIC stack
    on the server), so TCP is chosen, even with PREFER_QUIC (documented in docs/quic.md),
    when the machine is quiet."""
    stack, pki = quic_stack
    server = stack.gateway.server
    quic_listener = server.quic_listeners[0]
    security = NativeTransportClientSecurity(server_name="127.0.0.1",
                                             trusted_certificate_der=pki.der)
    options = NativeClientOptions(
        "nnrp://" + stack.uri("tcp").removeprefix("tcp://"), transport_policy=policy,
        provider_routes={
            "tcp": NativeClientProviderRoute(provider_endpoint=stack.uri("tcp")),
            "quic": NativeClientProviderRoute(provider_endpoint=stack.uri("quic"),
                                              security=security)})

    def scenario() -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        with connect_native_client_connection(options) as connection:
            probes = {c.transport_name: c.probe
                      for c in connection.transport_selection.candidates
                      if c.probe is not None}
            session = open_session(connection)
            session.submit_operation(openai_submit(1, 1, envelope(chat(stream=True,
                                                                       max_tokens=3))))
            events = poll_until(session, terminal(1))
            session.close()
            return connection.active_transport_name, probes, events

    records = records_of(stack)
    with trio.fail_after(30):
        chosen, probes, events = await trio.to_thread.run_sync(scenario)
    assert frames(events, 1)[-1]["status"] == 200
    assert set(probes) == {"tcp", "quic"}  # both carriers were probed...
    assert all(p.success_count >= 1 for p in probes.values())  # 3 on a quiet machine
    fastest = max(probes, key=lambda name: (probes[name].success_count,
                                            probes[name].median_throughput_bytes_per_sec,
                                            -probes[name].median_rtt_us))
    # ...and the better probe won. Which one that is depends on the machine's moment (on
    # a quiet loopback TCP, by a wide margin; a CPU hog beside it once gave QUIC the
    # better probe), so the test asserts the rule, not the winner (issue 28).
    assert chosen == fastest, probes
    assert [r.transport for r in records] == [chosen]
    # Each probe is a connection of its own: one on each listener, then the session's.
    assert quic_listener.stats.connections_total == 1 + (chosen == "quic")
    assert server.stats.connections_total == 3


async def test_chat_command_over_quic_trusts_the_ca_file(
        quic_stack: tuple[Stack, Pki]) -> None:
    """`nnrp-gateway chat --endpoint quic://... --ca-file cert.pem`: the terminal client
    (the project's aioquic client) trusts the listener's self-signed certificate; without
    the file the system's store refuses it, a one-line error."""
    from typer.testing import CliRunner

    from cli.main import app

    stack, pki = quic_stack
    chat_args = ["chat", "Hello there", "--endpoint", stack.uri("quic"), "--max-tokens", "4"]
    with trio.fail_after(30):
        trusted = await trio.to_thread.run_sync(
            CliRunner().invoke, app, [*chat_args, "--ca-file", str(pki.cert)])
        untrusted = await trio.to_thread.run_sync(CliRunner().invoke, app, chat_args)
    assert trusted.exit_code == 0, trusted.output
    assert "The quick brown fox" in trusted.output
    assert untrusted.exit_code == 1
    assert "Traceback" not in untrusted.output
    # Issue 37: the same hint as tcps:// and wss:// give (it was "no NNRP session (QUIC
    # handshake with ... failed: self-signed certificate)").
    assert untrusted.stderr.splitlines() == [
        f"error: the server's certificate is not trusted; give --ca-file (self-signed "
        f"certificate), {stack.uri('quic')}"]


async def test_the_capability_document_lists_every_listener_quic_included(
        quic_stack: tuple[Stack, Pki]) -> None:
    """The document a client reads over any transport (here over QUIC) names where the
    gateway listens; the certificate of quic:// is in the target manifest."""
    stack, pki = quic_stack

    def scenario() -> dict[str, Any]:
        with native_connection("quic", stack.uri("quic"), trusted_der=pki.der) as connection:
            session = open_session(connection)
            session.submit_operation(openai_submit(1, 1, json.dumps({
                "schema_version": "openai-compatible/1",
                "operation": "gateway.capabilities"}).encode()))
            events = frames(poll_until(session, terminal(1), timeout=15), 1)
            session.close()
        payload = events[-1]["payload"]
        return dict(payload if isinstance(payload, dict) else json.loads(payload))

    with trio.fail_after(30):
        document = await trio.to_thread.run_sync(scenario)
    listeners = document["body"]["nnrp"]["listeners"]
    # The default ALPN policy (AlpnPolicy: the spec's nnrp/1 or none at all).
    assert {"transport": "quic", "uri": stack.uri("quic"), "alpn": "any"} in listeners
    assert {"transport": "tcp", "uri": stack.uri("tcp")} in listeners
    assert {listener["transport"] for listener in listeners} == {"tcp", "ipc", "websocket",
                                                                 "quic"}


@pytest.fixture
async def ipv6_quic_stack(nursery: trio.Nursery, tmp_path: Path) -> tuple[Stack, Pki]:
    """The whole stack with its quic:// listener on ::1 (the certificate names ::1)."""
    pki = make_pki(tmp_path / "pki")
    stack = await start_stack(nursery, tmp_path, extra_listen=("quic://[::1]:0",),
                              tls=TlsConfig(pki.cert, pki.key))
    return stack, pki


@needs_ipv6_loopback
async def test_quic_on_ipv6_loopback_serves_our_client(
        ipv6_quic_stack: tuple[Stack, Pki]) -> None:
    """Issue 26: the quic:// listener binds ::1 and serves the project's own client over
    IPv6: a streamed request and a cancel, each seen by the gateway as a QUIC operation
    from ::1."""
    stack, pki = ipv6_quic_stack
    uri = stack.uri("quic")
    assert uri.startswith("quic://[::1]:")
    (listener,) = stack.gateway.server.quic_listeners
    records = records_of(stack)
    with trio.fail_after(30):
        async with connect(uri, quic=QuicClientOptions(ca_file=pki.cert)) as client:
            session = await client.open_session()
            outcome = await run_operation(session, envelope(
                chat(stream=True, max_tokens=5), request_id="replay:text_stream:ipv6"))
            held = await session.submit(envelope(chat(stream=True), request_id=(
                "replay:long_stream:ipv6")))
            async for event in held.events():
                if isinstance(event, nnrp.PartialReceived):
                    await held.cancel()
            await stack.replay.wait_until(lambda: any(
                d.request_id == "replay:long_stream:ipv6" for d in stack.replay.disconnects))
    assert outcome.status == 200 and outcome.partials
    assert isinstance(held.terminal, nnrp.DropReceived)
    assert held.terminal.drop_reason == nnrp.DropReason.PEER_CANCELLED
    assert listener.stats.datagrams_in > 0
    assert [r.transport for r in records] == ["quic", "quic"]


@needs_ipv6_loopback
@pytest.mark.xfail(strict=True, raises=pytest.RaisesGroup(  # pytest-trio's nursery wraps it
    pytest.RaisesExc(NativeInternalError, match="detail_code=106"), flatten_subgroups=True),
    reason=(
    "nnrp-py 1.0.0rc4.post20: its native QUIC client binds its UDP socket to 0.0.0.0:0 "
    "(IPv4 only, seen with strace) whatever the server's address, so quinn refuses an "
    "IPv6 server before sending a datagram ('invalid remote address'; detail_code 106). "
    "The gateway's listener is not at fault: it serves our client over ::1 (above)."))
async def test_native_client_over_quic_on_ipv6_loopback(
        ipv6_quic_stack: tuple[Stack, Pki]) -> None:
    stack, pki = ipv6_quic_stack
    (listener,) = stack.gateway.server.quic_listeners

    def scenario() -> list[dict[str, Any]]:
        with native_connection("quic", stack.uri("quic"), trusted_der=pki.der) as connection:
            session = open_session(connection)
            session.submit_operation(openai_submit(1, 1, envelope(chat(max_tokens=3))))
            events = frames(poll_until(session, terminal(1), timeout=15), 1)
            session.close()
        return events

    try:
        with trio.fail_after(30):
            events = await trio.to_thread.run_sync(scenario)
    except NativeInternalError:
        assert listener.stats.datagrams_in == 0  # it never reached the listener
        raise
    assert events[-1]["kind"] == "RESULT_PUSH" and events[-1]["status"] == 200
