"""Resumable sessions end to end (issue 21), on every transport the gateway serves.

nnrp-py's native client opens a session with resume, streams from the replay vLLM
through a proxy the test controls, loses its connection mid-stream (the proxy resets
TCP, or blackholes QUIC's datagrams), resumes with its ticket on a new connection,
resubmits the operation with the same ids, and gets every result: the sequences across
both connections cover 1..n without a gap (repeats identical), the terminal is a 200,
and vLLM saw one request and no disconnect. The project's own client does the same by
itself, declaring what it holds, so nothing arrives twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

pytest.importorskip("nnrp.client.native")

from nnrp.client.native import (
    NativeClientOptions,
    NativeClientProviderRoute,
    NativeClientSessionOptions,
    connect_native_client_connection,
)
from nnrp.core.messages import TransportPolicy
from nnrp.native import NativeTransportClientSecurity

from gateway import nnrp
from gateway.app import Gateway, GatewayConfig
from gateway.nnrp import ResumePolicy
from gateway.tools.client import connect
from gateway.tools.conformance import native_client_options
from gateway.tools.replay import ReplayServer
from gateway.transport import QuicClientOptions, TlsConfig
from tests.support.cut import DatagramCutProxy, StreamCutProxy
from tests.support.media import PNG, image_part, with_parts
from tests.support.native import describe, openai_submit
from tests.support.otlp import OtlpReceiver
from tests.support.quic import Pki, make_pki
from tests.support.stack import Stack, chat, envelope, records_of, run_operation, start_stack
from tests.support.waits import until

pytestmark = pytest.mark.interop

RESUME = NativeClientSessionOptions(allow_resume=True)
TRANSPORTS = ["tcp", "unix", "ws", "tcps", "wss", "quic"]
#: A QUIC client silent this long is gone: how soon a blackholed flow detaches.
QUIC_IDLE = 1.0


@attrs.define
class Route:
    """The gateway, and a proxy in front of one of its listeners."""

    stack: Stack
    transport: str
    direct: str  # the listener's URI
    via: str  # the same scheme, through the proxy
    cut: Callable[[], None]
    pki: Pki

    @property
    def registry(self) -> Any:
        registry = self.stack.gateway.server.registry
        assert registry is not None
        return registry

    def native(self, uri: str) -> Any:
        """nnrp-py's native client options for ``uri`` (this route's scheme)."""
        scheme, _, rest = uri.partition("://")
        security = NativeTransportClientSecurity(server_name="127.0.0.1",
                                                 trusted_certificate_der=self.pki.der)
        if scheme == "tcps":
            return NativeClientOptions(f"nnrps://{rest}", provider_routes={
                "tcp": NativeClientProviderRoute(provider_endpoint=f"tcp://{rest}",
                                                 security=security)},
                transport_policy=TransportPolicy.FORCE_TCP)
        if scheme == "wss":
            return NativeClientOptions("nnrps://gateway.local", provider_routes={
                "websocket": NativeClientProviderRoute(provider_endpoint=uri,
                                                       security=security)},
                transport_policy=TransportPolicy.FORCE_WEBSOCKET)
        return native_client_options(uri, trusted_der=self.pki.der)

    def ours(self) -> dict[str, Any]:
        """Our client's trust for this route."""
        import ssl
        return {"ssl_context": ssl.create_default_context(cafile=str(self.pki.cert)),
                "quic": QuicClientOptions(ca_file=self.pki.cert, idle_timeout=QUIC_IDLE)}


LISTEN = {"tcp": "tcp://127.0.0.1:0", "tcps": "tcps://127.0.0.1:0", "ws": "ws://127.0.0.1:0/nnrp",
          "wss": "wss://127.0.0.1:0/nnrp", "quic": "quic://127.0.0.1:0"}


async def route(nursery: trio.Nursery, socket_dir: Path, transport: str,
                **config: Any) -> Route:
    pki = make_pki(socket_dir / "pki")
    extra = (LISTEN[transport],) if transport in ("tcps", "wss", "quic") else ()
    stack = await start_stack(
        nursery, socket_dir, replay=config.pop("replay", None)
        or ReplayServer(speed=1.0, token_interval_ms=5.0), extra_listen=extra,
        tls=TlsConfig(pki.cert, pki.key), quic_idle_timeout=QUIC_IDLE, **config)
    scheme = "unix" if transport == "unix" else transport
    direct = next(e.uri for e in stack.gateway.endpoints if e.uri.startswith(f"{scheme}://"))
    if transport == "quic":
        host, _, port = direct.removeprefix("quic://").rpartition(":")
        datagrams = DatagramCutProxy((host, int(port)))
        via = "quic://" + await nursery.start(datagrams.serve)
        return Route(stack, transport, direct, via, datagrams.cut, pki)
    if transport == "unix":
        stream = StreamCutProxy(direct.removeprefix("unix://"))
        via = await nursery.start(stream.serve, str(socket_dir / "proxy.sock"))
        return Route(stack, transport, direct, via, stream.cut, pki)
    address, _, path = direct.partition("://")[2].partition("/")
    host, _, port = address.rpartition(":")
    stream = StreamCutProxy((host, int(port)))
    proxied = await nursery.start(stream.serve)
    via = f"{scheme}://{proxied}" + (f"/{path}" if path else "")
    return Route(stack, transport, direct, via, stream.cut, pki)


def partials_of(events: list[dict[str, Any]]) -> dict[int, bytes]:
    """sequence -> body; a repeat must be identical."""
    seen: dict[int, bytes] = {}
    for event in events:
        if event["kind"] == "PARTIAL_RESULT":
            previous = seen.setdefault(event["sequence"], event["body"])
            assert previous == event["body"], f"sequence {event['sequence']} changed"
    return seen


def stream_until_cut(path: Route, trio_token: Any,
                     submits: dict[int, Callable[[Any], None]], partials: int = 20
                     ) -> tuple[Any, list[dict[str, Any]]]:
    """The first connection, in a worker thread: nnrp-py's native client opens a
    resumable session through ``path``'s proxy, runs ``submits`` (operation id -> how
    it is submitted) in order, reads until every one of those operations has
    ``partials`` partial results, and the proxy cuts the connection. Returns the
    session's recovery ticket and the events read before the cut."""
    opened = connect_native_client_connection(path.native(path.via))
    connection = opened.__enter__()
    session = asyncio.run(connection.open_session(RESUME))
    for submit in submits.values():
        submit(session)
    events: list[dict[str, Any]] = []
    while min(sum(e["kind"] == "PARTIAL_RESULT" and e["operation_id"] == operation_id
                  for e in events) for operation_id in submits) < partials:
        events += [describe(e) for e in session.poll_events(timeout_ms=20)]
    trio.from_thread.run_sync(path.cut, trio_token=trio_token)
    ticket = session.recovery_ticket()
    with contextlib.suppress(Exception):  # its connection is gone: closing it fails
        opened.__exit__(None, None, None)
    return ticket, events


async def release_when_resumed(registry: Any, hold: Any, counter: str = "resumed_total"
                               ) -> None:
    """The held generation goes on once ``registry`` has counted the resume (or the
    migration): the stream is still running when the session moves, at any host speed."""
    with trio.fail_after(30):
        await until(lambda: getattr(registry.stats, counter) == 1)
    hold.release()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_native_client_resumes_a_stream_after_its_connection_drops(
        nursery: trio.Nursery, socket_dir: Path, transport: str) -> None:
    path = await route(nursery, socket_dir, transport)
    records = records_of(path.stack)
    token = trio.lowlevel.current_trio_token()
    payload = envelope(chat(stream=True, max_tokens=200), request_id="resume-1")
    # The generation waits after 29 tokens until the session is resumed: it is still
    # running then, whatever the host's speed (the client reads 20 before the cut).
    hold = path.stack.replay.hold(lambda request: request.method == "POST", after=30)
    nursery.start_soon(release_when_resumed, path.registry, hold)

    with trio.fail_after(30):
        ticket, before = await trio.to_thread.run_sync(stream_until_cut, path, token, {
            7001: lambda session: session.submit_operation(openai_submit(7001, 1, payload))})
        assert ticket is not None and ticket.resume_window_ms == 120_000
        await until(lambda: path.registry.detached == 1)

    def second_connection() -> list[dict[str, Any]]:
        with connect_native_client_connection(path.native(path.direct)) as connection:
            session = asyncio.run(connection.resume_session(ticket, RESUME))
            session.submit_operation(openai_submit(7001, 1, payload))
            events: list[dict[str, Any]] = []
            while not any(e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON") for e in events):
                events += [describe(e) for e in session.poll_events(timeout_ms=20)]
            session.close()
            return events

    with trio.fail_after(30):
        after = await trio.to_thread.run_sync(second_connection)
    seen = partials_of(before + after)
    assert sorted(seen) == list(range(1, 201))
    terminal = [e for e in after if e["kind"] == "RESULT_PUSH"]
    assert terminal[-1]["status"] == 200
    text = "".join(json.loads(body)["delta"] for body in seen.values()
                   if json.loads(body)["type"] == "response.output_text.delta")
    assert text == terminal[-1]["payload"]["body"]["choices"][0]["message"]["content"]
    assert len([r for r in path.stack.replay.requests if r.method == "POST"]) == 1
    assert path.stack.replay.disconnects == []
    await until(lambda: records)
    (record,) = records
    assert (record.outcome, record.resumed, record.events) == ("ok", 1, 200)
    assert record.replayed_events  # nnrp-py declares nothing: it got what we held again


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_our_client_resumes_by_itself_and_the_stream_goes_on(
        nursery: trio.Nursery, socket_dir: Path, transport: str) -> None:
    path = await route(nursery, socket_dir, transport)
    records = records_of(path.stack)
    hold = path.stack.replay.hold(lambda request: request.method == "POST", after=60)
    nursery.start_soon(release_when_resumed, path.registry, hold)
    with trio.fail_after(30):
        async with connect(path.via, resume=True, **path.ours()) as client:
            session = await client.open_session(resume=True)
            assert session.ticket is not None and session.ticket.window_ms == 120_000
            operation = await session.submit(envelope(chat(stream=True, max_tokens=150)))
            events = []
            async for event in operation.events():
                events.append(event)
                if len(events) == 40:
                    path.cut()
            await session.close()
    partials = [e for e in events if isinstance(e, nnrp.PartialReceived)]
    assert [e.sequence for e in partials] == list(range(1, 151))  # none missed, none twice
    assert isinstance(events[-1], nnrp.ResultReceived)
    assert events[-1].meta.status_code == 200
    assert (client.recoveries, session.resumes) == (1, 1)
    # It declared what it held: nothing came twice on the wire either (the bench's
    # resume latency counts from the first result after what was declared).
    assert client.repeats == 0
    assert operation.resubmitted_after is not None and 40 <= operation.resubmitted_after < 150
    assert len([r for r in path.stack.replay.requests if r.method == "POST"]) == 1
    assert path.stack.replay.disconnects == []
    await until(lambda: records)
    (record,) = records
    assert (record.outcome, record.resumed, record.events) == ("ok", 1, 150)


async def test_a_session_migrates_to_another_transport_mid_stream(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """SESSION_MIGRATE on a new ws connection moves a session streaming on tcp: the ACK's
    cursor is past every frame used, what the gateway holds of the stream is sent again
    there (the client drops the repeats), and the stream ends there; vLLM never knew."""
    stack = await start_stack(nursery, socket_dir,
                              replay=ReplayServer(speed=1.0, token_interval_ms=5.0))
    registry = stack.gateway.server.registry
    assert registry is not None
    hold = stack.replay.hold(lambda request: request.method == "POST", after=30)
    nursery.start_soon(release_when_resumed, registry, hold, "migrated_total")
    with trio.fail_after(30):
        async with connect(stack.uri("tcp")) as first, connect(stack.uri("websocket")) as second:
            session = await first.open_session(resume=True)
            operation = await session.submit(envelope(chat(stream=True, max_tokens=120)),
                                              operation_id=9, frame_id=3)
            events: list[Any] = []
            async for event in operation.events():
                events.append(event)
                if len(events) == 20:
                    ack = await second.migrate_session(
                        session, old_transport_id=nnrp.TransportId.TCP,
                        new_transport_id=nnrp.TransportId.WEBSOCKET)
                    assert (ack.accept_code, ack.resume_from_frame_id) == (0, 4)
            assert session.client is second and session.session_id in second.sessions
            await session.close()
    partials = [e.sequence for e in events if isinstance(e, nnrp.PartialReceived)]
    assert partials == list(range(1, 121))
    assert isinstance(events[-1], nnrp.ResultReceived) and events[-1].meta.status_code == 200
    assert registry.stats.migrated_total == 1 and registry.stats.replayed_events_total >= 20
    assert len([r for r in stack.replay.requests if r.method == "POST"]) == 1
    assert stack.replay.disconnects == []


async def test_a_migration_with_a_wrong_token_moves_nothing(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir)
    with trio.fail_after(10):
        async with connect(stack.uri("tcp")) as first, connect(stack.uri("websocket")) as second:
            session = await first.open_session(resume=True)
            assert session.ticket is not None
            session.ticket = attrs.evolve(session.ticket, token=b"\x01" * 24)
            ack = await second.migrate_session(session, old_transport_id=nnrp.TransportId.TCP,
                                               new_transport_id=nnrp.TransportId.WEBSOCKET)
            assert ack.accept_code == nnrp.MigrateAccept.REFUSED
            assert session.client is first
            outcome = await run_operation(session, envelope(chat(max_tokens=2)))
            assert outcome.status == 200  # it works where it was


@pytest.mark.parametrize("transport", ["tcp", "ws"])
async def test_a_resume_the_kernel_gives_to_another_worker_is_relayed_to_the_holder(
        nursery: trio.Nursery, socket_dir: Path, transport: str) -> None:
    """Two gateways as two workers of a pod (each its own listeners, tokens naming the
    worker that issued them, a relay socket each): a session opened on worker 0 is
    resumed on a connection worker 1 accepted, which hands the connection to worker 0
    whole; the stream goes on, vLLM saw one request. (tests/e2e/test_workers.py runs the
    same through a real --workers 2 gateway, wherever the kernel puts it.)"""
    replay = ReplayServer(speed=1.0, token_interval_ms=5.0)
    url = await nursery.start(replay.serve)
    relays = (str(socket_dir / "w0.relay"), str(socket_dir / "w1.relay"))
    workers = []
    for index in (0, 1):
        gateway = Gateway(GatewayConfig(
            listen=("tcp://127.0.0.1:0", "ws://127.0.0.1:0/nnrp"), vllm_url=url,
            probe_interval=0.05, resume=ResumePolicy(worker=index, relays=relays)))
        await nursery.start(gateway.run)
        workers.append(gateway)
    holder = workers[0].server.registry
    assert holder is not None
    hold = replay.hold(lambda request: request.method == "POST", after=20)
    nursery.start_soon(release_when_resumed, holder, hold)
    scheme = "tcp" if transport == "tcp" else "ws"
    first, second = (next(e.uri for e in gw.endpoints if e.uri.startswith(f"{scheme}://"))
                     for gw in workers)
    payload = envelope(chat(stream=True, max_tokens=100))
    with trio.fail_after(30):
        async with connect(first) as client:
            session = await client.open_session(resume=True)
            assert session.ticket is not None and session.ticket.token[0] == 0
            operation = await session.submit(payload, operation_id=5, frame_id=5)
            held = []
            async for event in operation.events():
                held.append(event)
                if len(held) == 10:
                    break
        await until(lambda: holder.detached == 1)
        async with connect(second) as client:
            resumed = await client.resume_session(session.ticket)
            assert resumed.ticket is not None and resumed.ticket.token[0] == 0
            again = await resumed.resubmit(payload, operation_id=5, frame_id=5,
                                           after=held[-1].sequence)
            rest = [event async for event in again.events()]
    sequences = [e.sequence for e in held + rest if isinstance(e, nnrp.PartialReceived)]
    assert sequences == list(range(1, 101))
    assert isinstance(rest[-1], nnrp.ResultReceived) and rest[-1].meta.status_code == 200
    relayer = workers[1].server.registry
    assert relayer is not None and relayer.stats.relayed_total == 1
    assert holder.stats.resumed_total == 1
    assert len([r for r in replay.requests if r.method == "POST"]) == 1


async def test_a_resubmitted_big_image_is_replayed_and_one_byte_changed_is_another_request(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """Issue 36 item 4: two operations, each with a 6 MiB image as a media frame, whose
    keys are computed off the event loop (``_server_session`` rule 5c) when each submit
    is read, and when each resubmission is. After the cut, nnrp-py's native client
    resubmits the first with the same image, declaring the results it holds
    (``nnrp.resume_after_sequence``: before, a submit with media frames was keyed by its
    joined bytes, so this was another request): the rest is replayed and it goes on to
    its 200; the second with one byte of its image changed: 409 resubmission_differs,
    and vLLM's request for it is aborted."""
    from nnrp.core.enums import PayloadKind

    path = await route(nursery, socket_dir, "tcp")
    token = trio.lowlevel.current_trio_token()
    image = PNG + os.urandom(6 << 20)
    changed = bytearray(image)
    changed[len(image) // 2] ^= 0xFF
    body = with_parts(chat(stream=True, max_tokens=200), image_part("nnrp:frame/1"))

    def submit(session: Any, operation_id: int, frame_id: int, data: bytes,
               held: int | None = None) -> None:
        payload = envelope(body, request_id=f"resume-media-{operation_id}", nnrp_policy=None
                           if held is None else {"resume_after_sequence": held})
        session.submit_operation(openai_submit(operation_id, frame_id, payload,
                                               media=[(PayloadKind.OPAQUE_BYTES, data)]))

    hold = path.stack.replay.hold(lambda request: request.method == "POST", after=30)
    nursery.start_soon(release_when_resumed, path.registry, hold)

    with trio.fail_after(60):
        ticket, before = await trio.to_thread.run_sync(stream_until_cut, path, token, {
            7001: lambda session: submit(session, 7001, 1, image),
            7002: lambda session: submit(session, 7002, 2, image)})
        await until(lambda: path.registry.detached == 1)
    held = max(e["sequence"] for e in before
               if e["kind"] == "PARTIAL_RESULT" and e["operation_id"] == 7001)

    def second_connection() -> list[dict[str, Any]]:
        with connect_native_client_connection(path.native(path.direct)) as connection:
            session = asyncio.run(connection.resume_session(ticket, RESUME))
            submit(session, 7001, 1, image, held=held)
            submit(session, 7002, 2, bytes(changed))
            events: list[dict[str, Any]] = []
            while {e["frame_id"] for e in events if e["kind"] == "RESULT_PUSH"} != {1, 2}:
                events += [describe(e) for e in session.poll_events(timeout_ms=20)]
            session.close()
            return events

    with trio.fail_after(60):
        after = await trio.to_thread.run_sync(second_connection)
    (replayed,) = [e for e in after if e["kind"] == "RESULT_PUSH" and e["frame_id"] == 1]
    (refused,) = [e for e in after if e["kind"] == "RESULT_PUSH" and e["frame_id"] == 2]
    assert replayed["status"] == 200
    assert sorted(partials_of([e for e in before + after if e.get("operation_id") == 7001])
                  ) == list(range(1, 201))
    assert min(e["sequence"] for e in after if e["kind"] == "PARTIAL_RESULT") == held + 1
    assert refused["status"] == 409
    assert refused["payload"]["error"]["code"] == "resubmission_differs"
    assert len([r for r in path.stack.replay.requests if r.method == "POST"]) == 2
    await until(lambda: len(path.stack.replay.disconnects) == 1)  # 7002's, abandoned


async def test_the_chat_command_resumes_after_its_connection_drops(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """`nnrp-gateway chat` through a proxy that resets it mid-answer: the answer goes on,
    every word once, exit 0."""
    from typer.testing import CliRunner

    from cli.main import app

    path = await route(nursery, socket_dir, "tcp")
    hold = path.stack.replay.hold(lambda request: request.method == "POST", after=5)
    nursery.start_soon(release_when_resumed, path.registry, hold)

    async def cut_once_four_words_are_out() -> None:
        with trio.fail_after(30):
            await until(lambda: hold.waiting)
        path.cut()

    nursery.start_soon(cut_once_four_words_are_out)
    with trio.fail_after(60):
        result = await trio.to_thread.run_sync(
            CliRunner().invoke, app, ["chat", "Hello there", "--endpoint", path.via,
                                      "--max-tokens", "12", "--no-usage"])
    assert result.exit_code == 0, result.output
    assert "The quick brown fox jumps over the lazy dog while NNRP streams" in result.output
    assert result.output.count("The quick") == 1
    assert path.registry.stats.resumed_total == 1


async def test_a_submit_the_drop_catches_is_resubmitted_once_not_lost(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """A submit that meets the dead connection before the client's reader has seen it die
    is neither an error to the caller nor sent twice: it is in its session, so the
    recovery resubmits it, once. (Found by ``bench soak --cut-every``: the submit raised
    BrokenResourceError, though the client was about to resume by itself.)"""
    path = await route(nursery, socket_dir, "tcp")
    with trio.fail_after(30):
        async with connect(path.via, resume=True, **path.ours()) as client:
            session = await client.open_session(resume=True)
            first = await session.submit(envelope(chat(stream=True, max_tokens=5)))
            assert [event async for event in first.events()]
            path.cut()  # no checkpoint before the submit: the reader has not seen it
            operation = await session.submit(envelope(chat(stream=True, max_tokens=30)))
            events = [event async for event in operation.events()]
            await session.close()
    partials = [e.sequence for e in events if isinstance(e, nnrp.PartialReceived)]
    assert partials == list(range(1, 31))
    assert isinstance(events[-1], nnrp.ResultReceived)
    assert events[-1].meta.status_code == 200
    assert (client.recoveries, client.repeats) == (1, 0)
    assert len([r for r in path.stack.replay.requests if r.method == "POST"]) == 2


async def test_a_resume_is_an_event_of_the_operations_trace_span(
        nursery: trio.Nursery, socket_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 24: the span is built from the same record as the log line, so the resume it
    # counts is an event at the time the session was attached again.
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
        monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
        path = await route(nursery, socket_dir, "tcp", otel_traces=True)
        hold = path.stack.replay.hold(lambda request: request.method == "POST", after=30)
        nursery.start_soon(release_when_resumed, path.registry, hold)
        with trio.fail_after(30):
            async with connect(path.via, resume=True, **path.ours()) as client:
                session = await client.open_session(resume=True)
                operation = await session.submit(envelope(chat(stream=True, max_tokens=60),
                                                          request_id="otel-resume"))
                events = 0
                async for _ in operation.events():
                    events += 1
                    if events == 20:
                        path.cut()
                await session.close()

        def span() -> Any:
            return next((s for s in receiver.taken()
                         if s.attributes.get("nnrp.request_id") == "otel-resume"), None)

        with trio.fail_after(10):
            await until(span)
    exported = span()
    assert exported.attributes["nnrp.resumed"] == 1
    assert exported.attributes["nnrp.outcome"] == "ok"
    names = [name for name, _ in exported.events]
    assert names == ["nnrp.first_token", "nnrp.resume"]
    first, resumed = exported.span.events
    assert exported.span.start_time_unix_nano <= first.time_unix_nano < resumed.time_unix_nano
    assert resumed.time_unix_nano <= exported.span.end_time_unix_nano
