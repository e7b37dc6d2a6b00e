"""Wire benchmarks: round trips, event throughput and idle-session memory, over TCP and,
beside it in the same run, over WebSocket and QUIC.

The gateway server runs in this process; every load generator runs in a separate
process (multiprocessing, spawn), so client and server never share a GIL. The QUIC
listener gets a throwaway self-signed certificate, which the clients trust (``Trust``).
Each WebSocket and QUIC figure carries the TCP one as its baseline: on the same machine and run, the
ratio is what can be compared across machines, not the figure.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import multiprocessing
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import trio

from gateway.profile import EndCause
from gateway.server import GatewayServer, Operation
from gateway.tools.client import Trust
from gateway.transport import QuicSettings, TlsConfig

from .stats import Figure, percentile, rss_bytes

_DELTA = b'{"type":"response.output_text.delta","index":0,"delta":"tok"}'
_DONE = b'{"type":"response.completed","body":{}}'


async def bench_handler(op: Operation) -> None:
    """Trivial handler: ``{"events": N}`` partials, then a completed terminal."""
    assert op.typed_body is not None
    count = json.loads(bytes(op.typed_body.frames[0].payload)).get("events", 0)
    for _ in range(count):
        await op.emit(_DELTA)
    await op.close(EndCause.COMPLETED, _DONE)


# --------------------------------------------------------------------------- load generators


def _native_round_trips(uri: str, trust: Trust, seconds: float, in_flight: int,
                        queue: Any) -> None:
    """nnrp-py's native client: ``in_flight`` operations kept in flight on one session
    (1 = strictly sequential), each resubmitted as soon as its terminal arrives."""
    import asyncio

    from nnrp.client.native import NativeClientSessionOptions, connect_native_client_connection
    from nnrp.core.enums import MessageType

    from gateway.tools.conformance import native_client_options, native_openai_submit

    options = native_client_options(uri, trusted_der=trust.certificate_der())
    payload = json.dumps({"events": 0}).encode()
    latencies: list[float] = []
    with connect_native_client_connection(options) as connection:
        session = asyncio.run(connection.open_session(NativeClientSessionOptions(
            max_in_flight_operations=64)))
        started: dict[int, float] = {}
        number = 0

        def submit() -> None:
            nonlocal number
            number += 1
            started[number] = time.perf_counter()
            session.submit_operation(native_openai_submit(number, number, payload))

        end = time.perf_counter() + seconds
        for _ in range(in_flight):
            submit()
        while time.perf_counter() < end:
            # Bounded: an unbounded poll returns only once nothing is pending
            # (conformance's NATIVE_POLL_BATCH says why).
            for event in session.poll_events(max_events=256, timeout_ms=20):
                header = getattr(event, "header", None)
                if header is not None and header.message_type is MessageType.RESULT_PUSH:
                    latencies.append(time.perf_counter() - started.pop(header.frame_id))
                    submit()
        session.close()
    queue.put(latencies)


def _our_round_trips(uri: str, trust: Trust, seconds: float, in_flight: int,
                     queue: Any) -> None:
    from gateway.tools.client import connect

    async def run() -> list[float]:
        latencies: list[float] = []
        payload = json.dumps({"events": 0}).encode()
        end = time.perf_counter() + seconds

        async def worker(session: Any) -> None:
            while time.perf_counter() < end:
                start = time.perf_counter()
                operation = await session.submit(payload)
                async for _ in operation.events():
                    pass
                latencies.append(time.perf_counter() - start)

        async with connect(uri, quic=trust.quic()) as client:
            session = await client.open_session()
            async with trio.open_nursery() as nursery:
                for _ in range(in_flight):
                    nursery.start_soon(worker, session)
        return latencies

    queue.put(trio.run(run))


def _event_sink(uri: str, trust: Trust, events: int, queue: Any) -> None:
    """Raw sans-IO client on the bare transport (no client library in the way): one
    operation of ``events`` partials; counts them as they land."""
    from gateway import nnrp
    from gateway.transport import connect

    async def run() -> tuple[int, float]:
        async with trio.open_nursery() as nursery:  # a QUIC connection's driver task
            transport = await connect(uri, nursery, quic=trust.quic())
            client = nnrp.ClientConnection()

            async def answer() -> list[nnrp.ClientEvent]:
                data = await transport.receive()
                if data is None:
                    raise ConnectionError(f"{uri} closed the connection")
                return client.receive_data(data)

            await transport.send([client.hello()])
            while not await answer():
                pass
            await transport.send([client.open_session()])
            while not await answer():
                pass
            start = time.perf_counter()
            await transport.send([client.submit(1, 1, 1,
                                                json.dumps({"events": events}).encode())])
            seen = 0
            done = False
            while not done:
                for event in await answer():
                    if isinstance(event, nnrp.PartialReceived):
                        seen += 1
                    elif isinstance(event, nnrp.ResultReceived):
                        done = True
            elapsed = time.perf_counter() - start
            await transport.aclose()
            nursery.cancel_scope.cancel()
        return seen, elapsed

    queue.put(trio.run(run))


#: Connects in progress at once while idle connections are opened: the figure is memory,
#: not how fast a burst of handshakes is served.
_CONNECTING_AT_ONCE = 16


def _idle_sessions(uri: str, trust: Trust, connections: int, per_connection: int,
                   queue: Any, release: Any) -> None:
    from gateway.tools.client import connect

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            opened = trio.Semaphore(0)
            connecting = trio.Semaphore(_CONNECTING_AT_ONCE)

            async def hold() -> None:
                async with contextlib.AsyncExitStack() as stack:
                    async with connecting:
                        client = await stack.enter_async_context(
                            connect(uri, quic=trust.quic()))
                        for _ in range(per_connection):
                            await client.open_session()
                    opened.release()
                    await trio.to_thread.run_sync(release.wait)

            for _ in range(connections):
                nursery.start_soon(hold)
            for _ in range(connections):
                await opened.acquire()
            queue.put("ready")

    trio.run(run)


# --------------------------------------------------------------------------- scenarios


#: How long a load generator may run before the benchmark gives up on it.
_GENERATOR_LIMIT = 120.0


async def _in_subprocess(target: Any, *args: Any) -> Any:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=target, args=(*args, queue), daemon=True)
    process.start()
    try:
        return await trio.to_thread.run_sync(queue.get, True, _GENERATOR_LIMIT)
    finally:
        await trio.to_thread.run_sync(process.join, 10)
        if process.is_alive():
            process.kill()


def _throwaway_certificate(folder: Path) -> TlsConfig:
    """A self-signed ECDSA certificate for 127.0.0.1, valid for a day: the QUIC listener's,
    and the one thing its clients trust."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from .._selfsigned import self_signed

    certificate, key = self_signed(
        "bench.localhost", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        datetime.timedelta(days=1))
    cert, key_file = folder / "cert.pem", folder / "key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return TlsConfig(cert, key_file)


#: The transports measured (their schemes), in order; the first is every later one's
#: baseline.
TRANSPORTS = ("tcp", "ws", "quic")


def _against(figure: Figure, baseline: Figure | None) -> Figure:
    """``figure`` with ``baseline`` (the same measurement over TCP) beside it."""
    if baseline is None:
        return figure
    return Figure(figure.name, figure.value, figure.unit, goal=figure.goal,
                  higher_is_better=figure.higher_is_better, baseline=baseline.value,
                  baseline_name="tcp", spread=figure.spread)


async def run_wire_bench(quick: bool = False) -> list[Figure]:
    """Round trips per second, events per second, memory per idle session (TCP) and per
    idle connection: each over every transport in ``TRANSPORTS``."""
    seconds = 2.0 if quick else 8.0
    with tempfile.TemporaryDirectory(prefix="nnrp-bench-") as folder:
        tls = _throwaway_certificate(Path(folder))
        trust = Trust(tls.cert_file)
        server = GatewayServer(bench_handler, quic=QuicSettings(tls))
        figures: list[Figure] = []
        async with trio.open_nursery() as nursery:
            endpoints = await nursery.start(server.serve,
                                            [f"{t}://127.0.0.1:0" for t in TRANSPORTS])
            uris = {endpoint.spec.scheme: endpoint.uri for endpoint in endpoints}
            runners: list[tuple[str, Any]] = [("project client", _our_round_trips)]
            try:
                import nnrp.client.native  # noqa: F401

                runners.insert(0, ("nnrp-py native client", _native_round_trips))
            except ImportError:
                pass
            for label, runner in runners:
                for in_flight in (1, 16):
                    baseline = None
                    for transport in TRANSPORTS:
                        figure = await _round_trips(runner, label, uris[transport], trust,
                                                    seconds, in_flight)
                        figures.append(_against(figure, baseline))
                        baseline = baseline or figure
            events = 50_000 if quick else 300_000
            baseline = None
            for transport in TRANSPORTS:
                figure = await _events_to_one_client(uris[transport], trust, events)
                figures.append(_against(figure, baseline))
                baseline = baseline or figure
            figures.append(await _idle_session_memory(uris["tcp"], trust, quick))
            baseline = None
            for transport in TRANSPORTS:
                figure = await _idle_connection_memory(uris[transport], trust, quick)
                figures.append(_against(figure, baseline))
                baseline = baseline or figure
            nursery.cancel_scope.cancel()
    return figures


def _over(uri: str) -> str:
    """How a figure's name says its transport: TCP's names are those of earlier runs."""
    scheme = uri.partition("://")[0]
    return "" if scheme == "tcp" else f", over {scheme.upper()}"


async def _round_trips(runner: Any, label: str, uri: str, trust: Trust, seconds: float,
                       in_flight: int) -> Figure:
    cpu_before = time.process_time()
    latencies = await _in_subprocess(runner, uri, trust, seconds, in_flight)
    server_cpu = (time.process_time() - cpu_before) / seconds * 100
    mode = "sequential" if in_flight == 1 else f"{in_flight} in flight"
    return Figure(f"round trips/s, {label}, {mode}, trivial handler{_over(uri)}",
                  len(latencies) / seconds, "rt/s",
                  goal=3000 if in_flight > 1 else None, higher_is_better=True,
                  spread=f"p50 {percentile(latencies, 0.5) * 1e3:.2f} ms, "
                         f"p99 {percentile(latencies, 0.99) * 1e3:.2f} ms, "
                         f"gateway CPU {server_cpu:.0f}% of a core")


async def _events_to_one_client(uri: str, trust: Trust, events: int) -> Figure:
    cpu_before = time.process_time()
    seen, elapsed = await _in_subprocess(_event_sink, uri, trust, events)
    server_cpu = (time.process_time() - cpu_before) / elapsed * 100
    return Figure(f"events/s to one client (one stream){_over(uri)}", seen / elapsed,
                  "events/s", goal=50_000, higher_is_better=True,
                  spread=f"{seen} events in {elapsed:.2f} s, "
                         f"gateway CPU {server_cpu:.0f}% of a core")


async def _idle_session_memory(uri: str, trust: Trust, quick: bool) -> Figure:
    connections, per_connection = (8, 32) if quick else (16, 63)
    sessions = connections * per_connection
    per_session, rss = await _idle_heap(uri, trust, connections, per_connection)
    return Figure(f"memory per idle session ({sessions} sessions on {connections} connections)",
                  per_session / 1024, "KiB", goal=32,
                  spread=f"Python heap (tracemalloc), connection state included; {rss}")


async def _idle_connection_memory(uri: str, trust: Trust, quick: bool) -> Figure:
    """What one more idle client costs: a connection with one open session (for QUIC,
    aioquic's connection state: keys, loss recovery, stream buffers, routes)."""
    connections = 32 if quick else 128
    per_connection, rss = await _idle_heap(uri, trust, connections, 1)
    return Figure(f"memory per idle connection with one session ({connections} connections)"
                  f"{_over(uri)}", per_connection / 1024, "KiB",
                  spread=f"Python heap (tracemalloc); {rss}")


async def _idle_heap(uri: str, trust: Trust, connections: int, per_connection: int
                     ) -> tuple[float, str]:
    """Bytes of this process's Python heap per open session while a client process holds
    ``connections`` x ``per_connection`` idle sessions; and the RSS before and after."""
    context = multiprocessing.get_context("spawn")
    release = context.Event()
    queue = context.Queue()
    tracemalloc.start()
    before, before_rss = tracemalloc.get_traced_memory()[0], rss_bytes()
    process = context.Process(target=_idle_sessions,
                              args=(uri, trust, connections, per_connection, queue, release),
                              daemon=True)
    process.start()
    try:
        await trio.to_thread.run_sync(queue.get, True, _GENERATOR_LIMIT)
        await trio.sleep(0.5)  # the client saw every session open; let the heap settle
        after, after_rss = tracemalloc.get_traced_memory()[0], rss_bytes()
    finally:
        tracemalloc.stop()
        release.set()
        await trio.to_thread.run_sync(process.join, 10)
        if process.is_alive():
            process.kill()
    return ((after - before) / (connections * per_connection),
            f"RSS {before_rss / 2**20:.1f} -> {after_rss / 2**20:.1f} MiB")
