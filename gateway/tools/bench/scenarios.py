"""The gateway's cost, measured side by side against direct HTTP on the same backend.

The replay backend and the gateway run as real processes (``nnrp-gateway replay-server``
and ``nnrp-gateway serve``); the clients run here. The gateway's CPU time and RSS are read
from /proc. Latencies across processes use ``time.monotonic_ns()`` (one clock per host):
the backend writes its send time into each token (the ``timestamped`` scenario), the
client subtracts it on receipt. "Added" latency is the gateway path's percentile minus the
direct path's, from the same run. Each path is measured in two rounds, and an added figure
carries the run's noise (how far one path's percentile moved between its own rounds): at or
below it, the figure is "not measurable" here, never a goal met, and it is met only with a
margin to its goal above it (``stats``, the bench's verdict rule). The run measures a bare
trio wake-up once (``wake.yardstick``), for the cost scenario's figures and as every time
figure's yardstick (``stats`` rule 6).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import trio

from gateway import nnrp
from gateway.tools.client import ClientSession, connect
from gateway.upstream import SSEDecoder

from . import SCENARIO_NAMES, rows
from ._procs import process_cpu_seconds, process_rss, process_tree, tree_cpu_seconds
from ._resume_scenario import resume
from ._stack import Progress, Stack, chat_body, envelope, fan_out, open_sessions
from ._tracing import tracing
from .live_cost import carries_output, live_cost, local_port, owners
from .stats import (
    Figure,
    Noise,
    against_wake,
    percentile,
    percentile_difference,
    round_spread,
)
from .wake import YARDSTICK, wake_cost, yardstick


async def _gateway_stream(session: ClientSession, request_id: str, latencies: list[float]
                          ) -> int:
    operation = await session.submit(envelope(request_id))
    count = 0
    async for event in operation.events():
        if isinstance(event, nnrp.PartialReceived):
            now = time.monotonic_ns()
            payload = json.loads(event.body)
            if payload["type"] == "response.output_text.delta":
                latencies.append((now - int(payload["delta"])) / 1e3)
                count += 1
    return count


async def _direct_stream(client: httpx.AsyncClient, url: str, request_id: str,
                         latencies: list[float]) -> int:
    decoder = SSEDecoder()
    count = 0
    async with client.stream("POST", f"{url}/v1/chat/completions",
                             json=chat_body(request_id),
                             headers={"x-request-id": request_id}) as response:
        async for raw in response.aiter_raw():
            now = time.monotonic_ns()
            for event in decoder.feed(raw):
                if event.is_done:
                    return count
                chunk = json.loads(event.data)
                for choice in chunk["choices"]:
                    content = choice["delta"].get("content")
                    if content:
                        latencies.append((now - int(content)) / 1e3)
                        count += 1
    return count


async def _indexed_gateway_stream(sessions: list[ClientSession], prefix: str,
                                  latencies: list[float], index: int) -> int:
    return await _gateway_stream(sessions[index], f"{prefix}-{index}", latencies)


async def _counted_stream(sessions: list[ClientSession], prefix: str, latencies: list[float],
                          complete: list[int], expected: int, index: int) -> None:
    """A stream, noted in ``complete`` when all ``expected`` events arrived."""
    if await _indexed_gateway_stream(sessions, prefix, latencies, index) == expected:
        complete.append(index)


async def _indexed_direct_stream(client: httpx.AsyncClient, url: str, prefix: str,
                                 latencies: list[float], index: int) -> int:
    return await _direct_stream(client, url, f"{prefix}-{index}", latencies)


# --------------------------------------------------------------------------- scenarios


def _residence_spread(residence: dict[str, Any]) -> str:
    per_read = residence.get("events_per_read")
    return (f"residence p50/p99 {residence.get('p50_us') or 0:.0f}/"
            f"{residence.get('p99_us') or 0:.0f} us over {residence.get('events')} events, "
            f"{per_read or 0:.2f} events per HTTP body chunk read")


async def _direct_fan_out(url: str, streams: int, request_prefix: str,
                          latencies: list[float]) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=None,
                                 limits=httpx.Limits(max_connections=512)) as client:
        await fan_out(streams, functools.partial(
            _indexed_direct_stream, client, url, request_prefix, latencies))


async def _gateway_round(stack: Stack, sessions: list[ClientSession], request_prefix: str,
                         latencies: list[float]) -> float:
    """One stream a session through the gateway; the gateway's CPU seconds meanwhile."""
    before = process_cpu_seconds(stack.gateway_pid)
    await fan_out(len(sessions), functools.partial(
        _indexed_gateway_stream, sessions, request_prefix, latencies))
    return process_cpu_seconds(stack.gateway_pid) - before


async def latency(stack: Stack, quick: bool, progress: Progress) -> list[Figure]:
    """1. Streaming event latency, backend emit -> client receive, side by side: through
    the gateway, through a null relay (one more process hop, no work), and direct. The
    gateway's residence time (upstream read -> socket) and CPU per event come from the
    same run: what the gateway itself costs, apart from the host's scheduling.

    Each path runs twice, in the order gateway, relay, direct, direct, relay, gateway (a
    drift over the run falls on every path alike); a figure is the percentile over both
    rounds, and how far one path's percentile moved between its two rounds is the run's
    noise, which an added figure must clear to be measurable (``stats`` rules 1-4)."""
    figures = []
    events = 40 if quick else 200
    for streams in ((1, 32) if quick else (1, 256)):
        progress(f"latency: {streams} stream(s) x {events} events, each path twice")
        via: list[list[float]] = [[], []]
        relayed: list[list[float]] = [[], []]
        direct: list[list[float]] = [[], []]
        run = time.monotonic_ns()
        prefix = f"replay:timestamped:{events}:10000"
        async with open_sessions(stack.endpoint, streams) as sessions:
            await stack.residence()  # start the probe afresh
            cpu = await _gateway_round(stack, sessions, f"{prefix}:g{run}-0", via[0])
            await _direct_fan_out(stack.relay_url, streams, f"{prefix}:r{run}-0", relayed[0])
            await _direct_fan_out(stack.vllm_url, streams, f"{prefix}:d{run}-0", direct[0])
            await _direct_fan_out(stack.vllm_url, streams, f"{prefix}:d{run}-1", direct[1])
            await _direct_fan_out(stack.relay_url, streams, f"{prefix}:r{run}-1", relayed[1])
            cpu += await _gateway_round(stack, sessions, f"{prefix}:g{run}-1", via[1])
            residence = await stack.residence()
        every_via, every_relayed, every_direct = (
            [value for samples in rounds_ for value in samples]
            for rounds_ in (via, relayed, direct))
        for q, goal in ((0.5, 150.0 if streams == 1 else None),
                        (0.99, 1000.0 if streams == 1 else 5000.0)):
            p = int(q * 100)
            added, noise = percentile_difference(via, direct, q,
                                                 ("gateway", "direct HTTP/SSE"))
            figures.append(Figure(
                f"added event latency p{p}, {streams} stream(s)", added, "us",
                goal=goal, baseline=noise.second, baseline_name="direct HTTP/SSE",
                spread=f"gateway p50/p95/p99 {percentile(every_via, .5):.0f}/"
                       f"{percentile(every_via, .95):.0f}/{percentile(every_via, .99):.0f} "
                       f"us; direct {percentile(every_direct, .5):.0f}/"
                       f"{percentile(every_direct, .95):.0f}/"
                       f"{percentile(every_direct, .99):.0f} us; n={len(every_via)} over "
                       f"two rounds a path", noise=noise))
            hop, hop_noise = percentile_difference(relayed, direct, q,
                                                   ("null relay", "direct HTTP/SSE"))
            figures.append(Figure(
                f"added by the hop (null relay) p{p}, {streams} stream(s)", hop, "us",
                baseline=hop_noise.second, baseline_name="direct HTTP/SSE",
                spread=f"relay p50/p99 {percentile(every_relayed, .5):.0f}/"
                       f"{percentile(every_relayed, .99):.0f} us", noise=hop_noise))
            work, work_noise = percentile_difference(via, relayed, q,
                                                     ("gateway", "null relay"))
            figures.append(Figure(
                f"added by the gateway's work p{p}, {streams} stream(s)", work, "us",
                baseline=work_noise.second, baseline_name="null relay",
                spread="gateway minus null relay, same run", noise=work_noise))
            measured = residence.get(f"p{p}_us")
            if measured is not None:
                # Beside the added latency only when that is a figure to read (stats rule 2).
                figures.append(Figure(
                    f"residence in the gateway p{p}, {streams} stream(s)", measured, "us",
                    baseline=added if noise.measurable() else None,
                    baseline_name="added event latency",
                    spread=_residence_spread(residence)))
        # Judged against its goal in ``cost``, where the pacing is the same at 256 streams.
        figures.append(_cpu_figure(cpu, len(every_via), streams,
                                   "latency run, paced 10 ms", residence, judged=False))
    return figures


def _cpu_figure(cpu: float, events: int, streams: int, shape: str,
                residence: dict[str, Any], *, judged: bool = True,
                wake: tuple[float, str] | None = None) -> Figure:
    """Gateway CPU (the kernel's per-process clock) per streamed event, over the whole run
    of the streams: each request's setup and terminal and the background work (health
    checks) are in it, a few microseconds an event at 256 streams. ``wake``: a bare trio
    wake-up's CPU on this machine and how it was paced, as the baseline (``wake``)."""
    goal = 10.0 if judged and streams == 256 and shape == "paced" else None
    return Figure(f"gateway CPU per event, {streams} stream(s), {shape}",
                  cpu / max(events, 1) * 1e6, "us", goal=goal,
                  baseline=None if wake is None else wake[0],
                  baseline_name="" if wake is None else f"bare trio wake-up, {wake[1]}",
                  spread=f"{cpu:.2f} CPU s for {events} events; " + _residence_spread(residence))


async def cost(stack: Stack, quick: bool, progress: Progress, back_to_back: float
               ) -> list[Figure]:
    """2. What the gateway costs per streamed event at 1, 16 and 256 streams, in the two
    shapes vLLM sends: paced, one event per upstream read (``--stream-interval 1``), and
    coalesced, an instant backend writing 64 events at a time. CPU per event and the
    residence time, both measured on the gateway process. ``back_to_back``: the run's
    yardstick, a bare trio wake-up back to back (``wake.yardstick``)."""
    figures = []
    # The yardstick first: what a bare trio process pays per wake-up on this machine,
    # paced as one stream is and back to back, as a busy gateway runs (``wake``); the
    # back-to-back one the run has measured already.
    progress("cost: a bare trio wake-up on this machine, paced")
    scale = 3 if quick else 1
    wakes = {"paced 10 ms": await wake_cost(0.010, 300 // scale),
             "paced 1 ms": await wake_cost(0.001, 1000 // scale),
             YARDSTICK: back_to_back}
    for pacing, microseconds in wakes.items():
        figures.append(Figure(
            f"bare trio wake-up CPU on this machine, {pacing}", microseconds, "us",
            spread="an echo process of 200-byte messages, trio only; the gateway's CPU per "
                   "event is read against it (ratio: bare wake-ups an event)"))
    plans = {1: (2000, 1000), 16: (500, 4000), 256: (200, 10000)}  # events, interval us
    for streams in ((1, 16, 64) if quick else (1, 16, 256)):
        events, interval_us = plans.get(streams, (200, 10000))
        if quick:
            events = max(40, events // 5)
        for shape, interval in (("paced", interval_us), ("coalesced", 0)):
            # One paced stream sleeps between events as the 1 ms echo does; more streams,
            # or a coalesced burst, keep the process busy: the back-to-back wake-up.
            pacing = "paced 1 ms" if streams == 1 and shape == "paced" else YARDSTICK
            progress(f"cost: {streams} stream(s), {shape}")
            received: list[float] = []
            run = time.monotonic_ns()
            async with open_sessions(stack.endpoint, streams) as sessions:
                await stack.residence()
                cpu = process_cpu_seconds(stack.gateway_pid)
                await fan_out(streams, functools.partial(
                    _indexed_gateway_stream, sessions,
                    f"replay:timestamped:{events}:{interval}:c{run}", received))
                cpu = process_cpu_seconds(stack.gateway_pid) - cpu
                residence = await stack.residence()
            figures.append(_cpu_figure(cpu, len(received), streams, shape, residence,
                                       wake=(wakes[pacing], pacing)))
            for q in (0.5, 0.99):
                measured = residence.get(f"p{int(q * 100)}_us")
                if measured is not None:
                    figures.append(Figure(
                        f"residence in the gateway p{int(q * 100)}, {streams} stream(s), "
                        f"{shape}", measured, "us", spread=_residence_spread(residence)))
    return figures


async def throughput(stack: Stack, quick: bool, progress: Progress) -> list[Figure]:
    """3. Events/s through the gateway from an instant backend, at several concurrencies."""
    figures = []
    for streams in ((1, 16, 64) if quick else (1, 16, 256)):
        events = max(200, (4000 if quick else 20000) // streams)
        progress(f"throughput: {streams} stream(s) x {events} events")
        received: list[float] = []
        run = time.monotonic_ns()
        async with open_sessions(stack.endpoint, streams) as sessions:
            cpu = process_cpu_seconds(stack.gateway_pid)
            start = time.perf_counter()
            await fan_out(streams, functools.partial(
                _indexed_gateway_stream, sessions, f"replay:timestamped:{events}:0:t{run}",
                received))
            wall = time.perf_counter() - start
            cpu = process_cpu_seconds(stack.gateway_pid) - cpu
        figures.append(Figure(f"events/s through the gateway, {streams} stream(s)",
                              len(received) / wall, "events/s", goal=50_000,
                              higher_is_better=True,
                              spread=f"{len(received)} events in {wall:.2f} s; gateway CPU "
                                     f"{cpu / wall * 100:.0f}% of a core (client shares the "
                                     "machine)"))
    return figures


async def unary(stack: Stack, quick: bool, progress: Progress) -> list[Figure]:
    """4. Non-streaming requests: requests/s and added latency vs direct HTTP. Each path
    runs in two rounds of half the time (gateway, direct, direct, gateway); how far one
    path's p50 moved between its rounds is the run's noise (``stats`` rules 1-4)."""
    seconds = 2.0 if quick else 8.0
    progress(f"non-streaming: {seconds:.0f} s each path, in two rounds")
    via: list[list[float]] = [[], []]
    direct: list[list[float]] = [[], []]
    async with connect(stack.endpoint) as client, httpx.AsyncClient(trust_env=False) as http:
        session = await client.open_session()

        async def through_gateway(samples: list[float]) -> None:
            end = time.perf_counter() + seconds / 2
            while time.perf_counter() < end:
                start = time.perf_counter()
                operation = await session.submit(envelope("unary", stream=False))
                async for _ in operation.events():
                    pass
                samples.append((time.perf_counter() - start) * 1e6)

        async def straight(samples: list[float]) -> None:
            end = time.perf_counter() + seconds / 2
            while time.perf_counter() < end:
                start = time.perf_counter()
                response = await http.post(f"{stack.vllm_url}/v1/chat/completions",
                                           json=chat_body("unary", stream=False))
                response.raise_for_status()
                samples.append((time.perf_counter() - start) * 1e6)

        await through_gateway(via[0])
        await straight(direct[0])
        await straight(direct[1])
        await through_gateway(via[1])
    added, noise = percentile_difference(via, direct, .5, ("gateway", "direct HTTP"))
    every_via = [value for samples in via for value in samples]
    every_direct = [value for samples in direct for value in samples]
    return [Figure("non-streaming added latency p50", added,
                   "us", goal=300, baseline=noise.second,
                   baseline_name="direct HTTP",
                   spread=f"gateway {len(every_via) / seconds:.0f} req/s (p50 "
                          f"{percentile(every_via, .5):.0f} us, p99 "
                          f"{percentile(every_via, .99):.0f}); direct "
                          f"{len(every_direct) / seconds:.0f} req/s (p50 "
                          f"{percentile(every_direct, .5):.0f} us)", noise=noise),
            Figure("non-streaming requests/s through the gateway", len(every_via) / seconds,
                   "req/s", higher_is_better=True, baseline=len(every_direct) / seconds,
                   baseline_name="direct HTTP")]


async def cancellation(stack: Stack, quick: bool, progress: Progress) -> list[Figure]:
    """5. CANCEL sent -> upstream socket closed, as the backend saw it; late frames."""
    rounds = 20 if quick else 100
    progress(f"cancellation: {rounds} rounds")
    sent: dict[str, int] = {}
    late = 0
    async with connect(stack.endpoint) as client:
        session = await client.open_session()
        for number in range(rounds):
            request_id = f"replay:long_stream:c{time.monotonic_ns()}-{number}"
            operation = await session.submit(envelope(request_id))
            events = 0
            try:
                async for event in operation.events():
                    events += 1
                    if events == 3:
                        sent[request_id] = time.monotonic_ns()
                        await operation.cancel()
                    elif events > 3 and not isinstance(
                            event, nnrp.PartialReceived | nnrp.DropReceived):
                        late += 1
            except Exception:
                late += 1
    await trio.sleep(0.2)
    closed = {d["request_id"]: d["at_ns"] for d in (await stack.backend_log())["disconnects"]}
    delays = [(closed[rid] - at) / 1e6 for rid, at in sent.items() if rid in closed]
    missing = len(sent) - len(delays)
    return [Figure("cancel -> upstream socket closed p50", percentile(delays, .5), "ms", goal=1.0,
                   spread=f"p99 {percentile(delays, .99):.3f} ms; {len(delays)} rounds; "
                          f"{missing} without a recorded abort"),
            Figure("cancel -> upstream socket closed p99", percentile(delays, .99), "ms",
                   goal=5.0),
            Figure("frames after the cancel's terminal", late, "frames", goal=0)]


async def pause(stack: Stack, quick: bool, progress: Progress) -> list[Figure]:
    """6. A client that pauses mid-stream (BACKPRESSURE paused, then FLOW_UPDATE resume)
    for 30 s: nothing reaches
    it while paused, the gateway's memory stays flat (the pause reaches vLLM's socket as
    TCP backpressure), and resuming delivers every event in order."""
    seconds = 3.0 if quick else 30.0
    # ~45 MB of SSE: far more than the sockets in between can hold (--quick: ~14 MB).
    tokens = 60_000 if quick else 200_000
    request_id = f"replay:timestamped:{tokens}:0:pause{time.monotonic_ns()}"
    progress(f"pause: {seconds:.0f} s mid-stream")
    pid = stack.gateway_pid
    received: list[tuple[float, Any]] = []
    async with connect(stack.endpoint) as client:
        session = await client.open_session()
        operation = await session.submit(envelope(request_id))
        arrived, finished = trio.Event(), trio.Event()

        async def consume() -> None:
            async for event in operation.events():
                received.append((time.perf_counter(), event))
                if len(received) == 1000:
                    arrived.set()
            finished.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await arrived.wait()
            await session.backpressure(nnrp.PressureLevel.PAUSED)
            paused_at = time.perf_counter()
            await trio.sleep(1.0)  # what was on the wire when the pause landed
            rss_start, count_start = process_rss(pid), len(received)
            playing_start = (await stack.backend_log())["playing"].get(request_id)
            await trio.sleep(seconds - 1.0)
            rss_end, count_end = process_rss(pid), len(received)
            log = await stack.backend_log()
            playing_end = log["playing"].get(request_id)
            finished_while_paused = request_id in log["completed"]
            await session.resume()
            resumed_at = time.perf_counter()
            with trio.fail_after(600):
                await finished.wait()
    partials = [e for _, e in received if isinstance(e, nnrp.PartialReceived)]
    gaps = sum(1 for i, p in enumerate(partials, start=1) if p.sequence != i)
    deltas = sum(1 for p in partials if b"output_text.delta" in p.body)
    ended = received[-1][1]
    completed = isinstance(ended, nnrp.ResultReceived) and ended.meta.status_code == 200
    return [
        Figure(f"gateway RSS growth during a {seconds:.0f} s client pause",
               (rss_end - rss_start) / 1024, "KiB", goal=1024.0,
               spread=f"gateway RSS {rss_start / 2**20:.1f} -> {rss_end / 2**20:.1f} MiB; "
                      f"vLLM chunks written {playing_start} -> {playing_end} "
                      f"(finished while paused: {finished_while_paused})"),
        Figure("events delivered while paused (after the first second)",
               count_end - count_start, "events", goal=0,
               spread=f"{count_start} events before the pause settled"),
        Figure("events lost or out of order after resume",
               (tokens - deltas) + gaps + (0 if completed else 1), "events", goal=0,
               spread=f"{len(partials)} partials, {deltas} deltas, terminal "
                      f"{type(ended).__name__}; drained in "
                      f"{time.perf_counter() - resumed_at:.1f} s after a "
                      f"{resumed_at - paused_at:.1f} s pause"),
    ]


async def scale(stack: Stack, quick: bool, progress: Progress) -> list[Figure]:
    """7. RSS per idle session and per active stream; start-up time."""
    figures = [Figure("gateway start-up (spawn -> /readyz)", stack.startup_seconds, "s",
                      goal=1.0)]
    pid = stack.gateway_pid
    for count in ((200,) if quick else (1000, 10000)):
        progress(f"scale: {count} idle sessions")
        before = process_rss(pid)
        async with contextlib.AsyncExitStack() as exits:
            clients = [await exits.enter_async_context(connect(stack.endpoint))
                       for _ in range(max(1, count // 512))]
            for index in range(count):
                await clients[index % len(clients)].open_session()
            await trio.sleep(0.3)
            after = process_rss(pid)
        figures.append(Figure(f"RSS per idle session ({count} sessions)",
                              (after - before) / count / 1024, "KiB", goal=32,
                              spread=f"gateway RSS {before / 2**20:.1f} -> "
                                     f"{after / 2**20:.1f} MiB"))
    active = 100 if quick else 1000
    progress(f"scale: {active} active streams")
    before = process_rss(pid)
    async with open_sessions(stack.endpoint, active) as sessions, trio.open_nursery() as nursery:
        started = trio.Semaphore(0)

        async def hold(index: int) -> None:
            operation = await sessions[index].submit(envelope(
                f"replay:timestamped:100000:50000:s{index}"))
            async for _ in operation.events():
                started.release()
                break
            await trio.sleep_forever()

        for index in range(active):
            nursery.start_soon(hold, index)
        for _ in range(active):
            await started.acquire()
        await trio.sleep(0.5)
        after = process_rss(pid)
        nursery.cancel_scope.cancel()
    figures.append(Figure(f"RSS per active stream ({active} streams)",
                          (after - before) / active / 1024, "KiB", goal=64,
                          spread=f"gateway RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MiB"))
    return figures


async def live(vllm_url: str, endpoint: str | None, model: str, quick: bool,
               progress: Progress, streams: int | None = None) -> list[Figure]:
    """8. TTFT and time per output token through the gateway vs direct, on a real vLLM
    (``live_figures``);
    with ``streams``, also the gateway's CPU per event against vLLM's API server's CPU per
    chunk at that many concurrent streams (``live_cost``)."""
    rounds = 3 if quick else 30
    tokens = 32
    progress(f"live: {rounds} requests each path against {vllm_url}")

    async def measure(stream_fn: Callable[[], AsyncIterator[float]]) -> tuple[float, float]:
        start = time.perf_counter()
        times = [t async for t in stream_fn()]
        return (times[0] - start) * 1e3, ((times[-1] - times[0]) / max(1, len(times) - 1)) * 1e3

    via: list[tuple[float, float]] = []
    direct: list[tuple[float, float]] = []
    cpu_figures: list[Figure] = []
    stack: Stack | None = None
    if endpoint is None:
        stack = Stack(gateway_args=("--allow-untested-vllm",))
        stack.vllm_url = vllm_url  # point the gateway at the live vLLM, no replay
    # Greedy decoding: both paths see the same tokens, so neither is timed on a luckier
    # completion (vLLM holds back tokens that end mid UTF-8 sequence).
    body = {"model": model, "stream": True, "max_tokens": tokens, "ignore_eos": True,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Count slowly."}]}
    async with contextlib.AsyncExitStack() as exits:
        if stack is not None:
            await exits.enter_async_context(_LiveGateway(stack))
            endpoint = stack.endpoint
        assert endpoint is not None
        client = await exits.enter_async_context(connect(endpoint))
        session = await client.open_session()
        http = await exits.enter_async_context(httpx.AsyncClient(trust_env=False, timeout=None))

        async def via_gateway() -> AsyncIterator[float]:
            operation = await session.submit(json.dumps({
                "schema_version": "openai-compatible/1",
                "operation": "chat.completions.create", "body": body}).encode())
            async for event in operation.events():
                if isinstance(event, nnrp.PartialReceived):
                    yield time.perf_counter()

        async def via_http() -> AsyncIterator[float]:
            decoder = SSEDecoder()
            async with http.stream("POST", f"{vllm_url}/v1/chat/completions",
                                   json=body) as response:
                async for raw in response.aiter_raw():
                    for event in decoder.feed(raw):
                        if not event.is_done and carries_output(json.loads(event.data)):
                            yield time.perf_counter()

        for _ in range(rounds):
            via.append(await measure(via_gateway))
            direct.append(await measure(via_http))
        if streams is not None:
            # The gateway bench live started (its workers too), or the one at --endpoint.
            gateway_pids = (process_tree(stack.gateway_pid) if stack is not None else
                            owners(local_port(endpoint, "the gateway"), f"the gateway at "
                                                                       f"{endpoint}"))
            cost_body = {**body, "max_tokens": 16 if quick else 64}
            cpu_figures = await live_cost(vllm_url, endpoint, gateway_pids, cost_body,
                                          streams, 1 if quick else 3, progress)
    return [*live_figures("TTFT", [v[0] for v in via], [d[0] for d in direct]),
            *live_figures("time per output token", [v[1] for v in via],
                          [d[1] for d in direct]),
            *cpu_figures]


#: ``bench live``'s goal: through the gateway within 3 % of direct HTTP/SSE.
LIVE_GOAL = 1.03


def live_figures(what: str, via: list[float], direct: list[float]) -> list[Figure]:
    """``what`` (ms, one a round, in the rounds' order) through the gateway and direct:
    the p50 through the gateway beside direct's, and their ratio against ``LIVE_GOAL``,
    judged by the bench's verdict rule as a path over its control (``stats`` rules 3-4):
    the noise is how far either path's p50 moved between the two halves of its rounds."""
    ours, theirs = percentile(via, .5), percentile(direct, .5)
    spreads = [round_spread([times[:len(times) // 2], times[len(times) // 2:]], .5)
               for times in (via, direct)]
    floor = max(spreads) if all(map(math.isfinite, spreads)) else math.nan
    noise = Noise(ours, theirs, floor, ("through the gateway p50", "direct HTTP/SSE p50"),
                  how="the larger move of a path's p50 between the halves of its rounds",
                  combine="ratio", unit="ms")
    return [Figure(f"live {what} p50 through the gateway", ours, "ms", baseline=theirs,
                   baseline_name="direct HTTP/SSE"),
            Figure(f"live {what} p50, through the gateway over direct HTTP/SSE",
                   ours / theirs if theirs else math.inf, "x", goal=LIVE_GOAL, noise=noise,
                   spread=f"{len(via)} rounds a path")]


class _LiveGateway:
    """Only the gateway process, pointed at an existing vLLM."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    async def __aenter__(self) -> None:
        s = self.stack
        s.processes.append(subprocess.Popen(  # noqa: ASYNC220 - started, not awaited
            [s.exe, "serve", "--listen", s.endpoint, "--vllm-url", s.vllm_url,
             "--admin-listen", f"127.0.0.1:{s.admin_port}", "--log-level", "warning",
             *s.gateway_args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            await s._wait(f"{s.admin_url}/readyz")
        except BaseException:  # not ready (vLLM away, say): the gateway does not outlive us
            with trio.CancelScope(shield=True):
                await s.__aexit__()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.stack.__aexit__()


async def workers(quick: bool, progress: Progress) -> list[Figure]:
    """8. Scaling across cores (``serve --workers N``): the same paced load (100 events/s
    a stream, one event per upstream read) at 256 and 1,024 streams, through one worker
    and through two, side by side. Events/s delivered against offered, the latency tail
    (backend emit -> client receive), and the gateway's CPU summed over its processes.
    The load generator and the backend are Python processes on the same machine: on a
    2-core VM two workers compete with them for the cores, which the CPU split shows."""
    figures = []
    events = 100 if quick else 300  # 1 s or 3 s of tokens a stream, at 100 events/s
    for streams in ((64, 256) if quick else (256, 1024)):
        delivered_rate: dict[int, float] = {}
        for count in (1, 2):
            progress(f"workers: {count} worker(s), {streams} streams x 100 events/s")
            # Every stream gets an upstream connection in each configuration (the pool
            # is per worker): a stream waiting for one is not what is measured here.
            args = ("--workers", str(count), "--max-sessions-per-connection", "1024",
                    "--upstream-pool-size", str(streams))
            async with Stack(gateway_args=args, residence=False) as stack:
                received: list[float] = []
                complete: list[int] = []
                run = time.monotonic_ns()

                async with open_sessions(stack.endpoint, streams, connections=32) as sessions:
                    pids = process_tree(stack.gateway_pid)
                    cpu_before = tree_cpu_seconds(pids)
                    backend_before = process_cpu_seconds(stack.processes[0].pid)
                    client_before = time.process_time()
                    start = time.perf_counter()
                    await fan_out(streams, functools.partial(
                        _counted_stream, sessions, f"replay:timestamped:{events}:10000:w{run}",
                        received, complete, events))
                    wall = time.perf_counter() - start
                    cpu_after = tree_cpu_seconds(pids)
                    backend = process_cpu_seconds(stack.processes[0].pid) - backend_before
                    client = time.process_time() - client_before
            cpu = {pid: cpu_after.get(pid, 0.0) - cpu_before[pid] for pid in cpu_before}
            offered = streams * 100.0
            delivered_rate[count] = len(received) / wall
            split = ", ".join(f"{seconds / wall * 100:.0f}%" for seconds in cpu.values())
            label = f"{streams} streams, {count} worker(s)"
            figures.append(Figure(
                f"events/s delivered, {label}", delivered_rate[count], "events/s",
                higher_is_better=True, baseline=offered, baseline_name="offered",
                spread=f"{len(complete)}/{streams} streams complete; "
                       f"{len(received)} events in {wall:.2f} s (nominal "
                       f"{events / 100:.1f} s); gateway CPU {sum(cpu.values()) / wall * 100:.0f}"
                       f"% of a core (supervisor, workers: {split}); beside it the "
                       f"backend {backend / wall * 100:.0f}% and the load generator "
                       f"{client / wall * 100:.0f}% of {os.cpu_count()} cores"))
            for q in (0.5, 0.99):
                figures.append(Figure(
                    f"event latency p{int(q * 100)}, {label}", percentile(received, q), "us",
                    goal=5000.0 if q == 0.99 and streams == 256 else None,
                    spread=f"p50/p95/p99/max {percentile(received, .5):.0f}/"
                           f"{percentile(received, .95):.0f}/{percentile(received, .99):.0f}/"
                           f"{max(received, default=0):.0f} us"))
            figures.append(Figure(
                f"gateway CPU per event, {label}", sum(cpu.values()) / max(len(received), 1)
                * 1e6, "us", spread="summed over the supervisor and its workers"))
        figures.append(Figure(
            f"events/s scaling, 2 workers over 1, {streams} streams",
            delivered_rate[2] / max(delivered_rate[1], 1e-9), "x", higher_is_better=True,
            spread="delivered events/s with two workers over one, same load, same run"))
    return figures


SCENARIOS: dict[str, Callable[[Stack, bool, Progress], Any]] = {
    "latency": latency, "throughput": throughput, "unary": unary,
    "cancellation": cancellation, "pause": pause, "scale": scale}
#: Scenarios that also read the run's yardstick, a bare trio wake-up back to back.
YARDSTICKED: dict[str, Callable[[Stack, bool, Progress, float], Any]] = {"cost": cost}
#: Scenarios that start their own stacks (one per configuration they compare).
STAGED: dict[str, Callable[[bool, Progress], Any]] = {"workers": workers, "resume": resume,
                                                      "tracing": tracing}
assert set(SCENARIOS) | set(YARDSTICKED) | set(STAGED) == set(SCENARIO_NAMES)


async def run_scenarios(names: list[str], quick: bool, progress: Progress
                        ) -> dict[str, list[Figure]]:
    """Each scenario of ``names``, then the goal rows made from their figures; every
    figure carries the run's yardstick (``stats`` rule 6), measured once, first."""
    progress(f"a bare trio wake-up on this machine, {YARDSTICK} (the run's yardstick)")
    wake = await yardstick(quick)
    results: dict[str, list[Figure]] = {}
    for name in names:
        if name in STAGED:
            results[name] = await STAGED[name](quick, progress)
            continue
        args = ("--max-sessions-per-connection", "1024") if name == "scale" else ()
        async with Stack(gateway_args=args) as stack:
            results[name] = await (YARDSTICKED[name](stack, quick, progress, wake)
                                   if name in YARDSTICKED else
                                   SCENARIOS[name](stack, quick, progress))
    # The cost-against-goals rows, made from the figures just measured.
    goal_rows = rows.run_rows(results)
    if goal_rows:
        results[rows.SECTION] = goal_rows
    return {name: against_wake(figures, wake) for name, figures in results.items()}
