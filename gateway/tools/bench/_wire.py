"""Wire benchmarks: round trips, event throughput and idle-session memory.

The gateway server runs in this process; every load generator runs in a separate
process (multiprocessing, spawn), so client and server never share a GIL.
"""

from __future__ import annotations

import json
import multiprocessing
import time
import tracemalloc
from typing import Any

import trio

from gateway.profile import EndCause
from gateway.server import GatewayServer, Operation

from ._stats import Figure, percentile, rss_bytes

_DELTA = b'{"type":"response.output_text.delta","index":0,"delta":"tok"}'
_DONE = b'{"type":"response.completed","body":{}}'


async def bench_handler(op: Operation) -> None:
    """Trivial handler: ``{"events": N}`` partials, then a completed terminal."""
    assert op.typed_body is not None
    count = json.loads(op.typed_body.frames[0].payload).get("events", 0)
    for _ in range(count):
        await op.emit(_DELTA)
    await op.close(EndCause.COMPLETED, _DONE)


# --------------------------------------------------------------------------- load generators


def _native_round_trips(uri: str, seconds: float, in_flight: int, queue: Any) -> None:
    """nnrp-py's native client: ``in_flight`` operations kept in flight on one session
    (1 = strictly sequential), each resubmitted as soon as its terminal arrives."""
    import asyncio

    from nnrp.client.native import NativeClientSessionOptions, connect_native_client_connection
    from nnrp.core.enums import MessageType

    from gateway.tools.conformance import native_client_options, native_openai_submit

    options = native_client_options(uri)
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
            for event in session.poll_events(timeout_ms=20):
                header = getattr(event, "header", None)
                if header is not None and header.message_type is MessageType.RESULT_PUSH:
                    latencies.append(time.perf_counter() - started.pop(header.frame_id))
                    submit()
        session.close()
    queue.put(latencies)


def _our_round_trips(uri: str, seconds: float, in_flight: int, queue: Any) -> None:
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

        async with connect(uri) as client:
            session = await client.open_session()
            async with trio.open_nursery() as nursery:
                for _ in range(in_flight):
                    nursery.start_soon(worker, session)
        return latencies

    queue.put(trio.run(run))


def _event_sink(uri: str, events: int, queue: Any) -> None:
    """Raw sans-IO client: one operation of ``events`` partials; counts them as they land."""
    from gateway import nnrp

    async def run() -> tuple[int, float]:
        host, port = uri.removeprefix("tcp://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        client = nnrp.ClientConnection()
        await stream.send_all(client.hello())
        while not client.receive_data(await stream.receive_some(65536)):
            pass
        await stream.send_all(client.open_session())
        while not client.receive_data(await stream.receive_some(65536)):
            pass
        start = time.perf_counter()
        await stream.send_all(client.submit(1, 1, 1, json.dumps({"events": events}).encode()))
        seen = 0
        while True:
            done = False
            for event in client.receive_data(await stream.receive_some(1 << 20)):
                if isinstance(event, nnrp.PartialReceived):
                    seen += 1
                elif isinstance(event, nnrp.ResultReceived):
                    done = True
            if done:
                break
        elapsed = time.perf_counter() - start
        await stream.aclose()
        return seen, elapsed

    queue.put(trio.run(run))


def _idle_sessions(uri: str, connections: int, per_connection: int, queue: Any,
                   release: Any) -> None:
    from gateway.tools.client import connect

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            opened = trio.Semaphore(0)

            async def hold() -> None:
                async with connect(uri) as client:
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


async def run_wire_bench(quick: bool = False) -> list[Figure]:
    """Round trips per second, events per second, memory per idle session."""
    seconds = 2.0 if quick else 8.0
    server = GatewayServer(bench_handler)
    figures: list[Figure] = []
    async with trio.open_nursery() as nursery:
        (endpoint,) = await nursery.start(server.serve, ["tcp://127.0.0.1:0"])
        uri = endpoint.uri
        runners: list[tuple[str, Any]] = [("project client", _our_round_trips)]
        try:
            import nnrp.client.native  # noqa: F401

            runners.insert(0, ("nnrp-py native client", _native_round_trips))
        except ImportError:
            pass
        for label, runner in runners:
            for in_flight in (1, 16):
                cpu_before = time.process_time()
                latencies = await _in_subprocess(runner, uri, seconds, in_flight)
                server_cpu = (time.process_time() - cpu_before) / seconds * 100
                mode = "sequential" if in_flight == 1 else f"{in_flight} in flight"
                figures.append(Figure(
                    f"round trips/s, {label}, {mode}, trivial handler",
                    len(latencies) / seconds, "rt/s",
                    goal=3000 if in_flight > 1 else None, higher_is_better=True,
                    spread=f"p50 {percentile(latencies, 0.5) * 1e3:.2f} ms, "
                           f"p99 {percentile(latencies, 0.99) * 1e3:.2f} ms, "
                           f"gateway CPU {server_cpu:.0f}% of a core"))
        events = 50_000 if quick else 300_000
        cpu_before = time.process_time()
        seen, elapsed = await _in_subprocess(_event_sink, uri, events)
        server_cpu = (time.process_time() - cpu_before) / elapsed * 100
        figures.append(Figure("events/s to one client (one stream)", seen / elapsed, "events/s",
                              goal=50_000, higher_is_better=True,
                              spread=f"{seen} events in {elapsed:.2f} s, "
                                     f"gateway CPU {server_cpu:.0f}% of a core"))
        figures.append(await _idle_session_memory(uri, quick))
        nursery.cancel_scope.cancel()
    return figures


async def _idle_session_memory(uri: str, quick: bool) -> Figure:
    connections, per_connection = (8, 32) if quick else (16, 63)
    sessions = connections * per_connection
    context = multiprocessing.get_context("spawn")
    release = context.Event()
    queue = context.Queue()
    tracemalloc.start()
    before, before_rss = tracemalloc.get_traced_memory()[0], rss_bytes()
    process = context.Process(target=_idle_sessions,
                              args=(uri, connections, per_connection, queue, release),
                              daemon=True)
    process.start()
    try:
        await trio.to_thread.run_sync(queue.get, True, 120)
        await trio.sleep(0.5)
        after, after_rss = tracemalloc.get_traced_memory()[0], rss_bytes()
    finally:
        tracemalloc.stop()
        release.set()
        await trio.to_thread.run_sync(process.join, 10)
        if process.is_alive():
            process.kill()
    per_session = (after - before) / sessions / 1024
    return Figure(f"memory per idle session ({sessions} sessions on {connections} connections)",
                  per_session, "KiB", goal=32,
                  spread=f"Python heap (tracemalloc), connection state included; "
                         f"RSS {before_rss / 2**20:.1f} -> {after_rss / 2**20:.1f} MiB")
