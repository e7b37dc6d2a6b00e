"""``bench run --scenario tracing``: what OpenTelemetry tracing costs the
gateway, side by side with tracing off, in one run.

Two gateways in turn, the same load against each: ``serve`` as it ships, and ``serve
--otel-traces`` with every operation sampled (``OTEL_TRACES_SAMPLER=always_on``), its spans
sent over OTLP/HTTP to a sink on loopback that answers every export at once (a collector
that keeps up; it runs in this process, so its CPU is the load generator's, not the
gateway's). The figure is the gateway's CPU per streamed event (the kernel's
per-process clock), off and on, for two shapes: short operations (spans are made once per
operation, so the cost per event is largest there) and long streams. With tracing on, each
measured window closes once the sink has every span of it (the export thread's encoding
and sending are counted), and opens once the spans before it are out. Every span must
reach the sink with none dropped, or the figure would flatter tracing. The sink's export
count and bytes are each shape's own (taken in its measured window).

That figure is a whole process's CPU on a shared machine, so what tracing adds can hide
in its noise. Beside it, an in-process figure that noise cannot swamp: µs of CPU per
operation, each thread on its own clock (``time.thread_time``), through the gateway's own
tracer and queue (``gateway.observe.measure_tracing_cost``): on the event loop, deciding
the span and building and queueing both spans; on the export thread, OTLP's encoding.
"""

from __future__ import annotations

import functools
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import trio

from gateway import nnrp
from gateway.observe import ObservationRecord, measure_tracing_cost, tracing_problem
from gateway.profile import CHAT_COMPLETIONS, Outcome

from ._procs import process_cpu_seconds
from ._stack import Progress, Stack, envelope, open_sessions
from .stats import Figure

if TYPE_CHECKING:
    from gateway.tools.client import ClientSession


class OtlpSink:
    """An OTLP/HTTP endpoint that takes every export (200, empty answer) and counts them."""

    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0
        # One handler thread per export connection: ``+=`` from two at once loses one.
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with sink.lock:
                    sink.exports += 1
                    sink.bytes += len(body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/v1/traces"

    def taken(self) -> tuple[int, int]:
        """Exports and bytes taken so far."""
        with self.lock:
            return self.exports, self.bytes

    def __enter__(self) -> OtlpSink:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


async def _operations(session: ClientSession, prefix: str, count: int, events: int,
                      interval_us: int, received: list[int]) -> None:
    """``count`` streamed operations in a row on one session, ``events`` tokens each."""
    for n in range(count):
        operation = await session.submit(envelope(
            f"replay:timestamped:{events}:{interval_us}:{prefix}-{n}"))
        async for event in operation.events():
            if isinstance(event, nnrp.PartialReceived) and b"output_text.delta" in event.body:
                received[0] += 1


async def _metric(stack: Stack, name: str) -> float:
    import httpx

    async with httpx.AsyncClient(trust_env=False) as client:
        text = (await client.get(f"{stack.admin_url}/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name))


async def _exported(stack: Stack, spans: int) -> None:
    """Until the gateway has exported ``spans`` spans (none may be dropped meanwhile)."""
    with trio.fail_after(30):
        # Another process's counter: nothing here to wait on but a poll.
        while await _metric(stack, "nnrp_gateway_trace_spans_exported_total") < spans:
            if await _metric(stack, "nnrp_gateway_trace_spans_dropped_total"):
                raise RuntimeError("tracing dropped spans: the figure would flatter it")
            await trio.sleep(0.1)


async def tracing(quick: bool, progress: Progress) -> list[Figure]:
    """9. The gateway's CPU per event with tracing off and at 100 % sampling."""
    problem = tracing_problem()
    if problem is not None:
        progress(f"tracing: skipped ({problem})")
        return []
    # (label, sessions, operations per session, events per operation, interval us)
    shapes = [("short operations (16 events)", 16, 4 if quick else 16, 16, 1000),
              ("long streams (400 events)", 16, 1, 100 if quick else 400, 1000)]
    cpu_per_event: dict[tuple[str, bool], float] = {}
    detail: dict[tuple[str, bool], str] = {}
    #: Each tracing-on shape's own exports and bytes (its measured window's), not the
    #: run's running total (which every row once showed, the same for both shapes).
    exported: dict[str, tuple[int, int]] = {}
    with OtlpSink() as sink:
        env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink.endpoint,
               "OTEL_TRACES_SAMPLER": "always_on", "OTEL_BSP_SCHEDULE_DELAY": "200"}
        for traced in (False, True):
            args = ("--metrics", *(("--otel-traces",) if traced else ()))
            async with Stack(gateway_args=args, residence=False, env=env) as stack:
                # What the sink must have taken so far (two spans an operation): with
                # tracing on, each window waits for it at both ends, so it holds the
                # export of its own spans and none of another's.
                spans = 0
                for label, sessions, count, events, interval in shapes:
                    progress(f"tracing {'on' if traced else 'off'}: {label}")
                    received = [0]
                    run = time.monotonic_ns()
                    async with open_sessions(stack.endpoint, sessions) as opened:
                        # One operation a session first, not counted: the first export
                        # loads the encoder and opens the collector's connection, once.
                        async with trio.open_nursery() as nursery:
                            for index, session in enumerate(opened):
                                nursery.start_soon(functools.partial(
                                    _operations, session, f"w{run}-{index}", 1, events,
                                    interval, [0]))
                        spans += 2 * sessions
                        if traced:
                            await _exported(stack, spans)
                        cpu = process_cpu_seconds(stack.gateway_pid)
                        sink_before = sink.taken()
                        async with trio.open_nursery() as nursery:
                            for index, session in enumerate(opened):
                                nursery.start_soon(functools.partial(
                                    _operations, session, f"t{run}-{index}", count, events,
                                    interval, received))
                        spans += 2 * sessions * count
                        if traced:
                            await _exported(stack, spans)
                        cpu = process_cpu_seconds(stack.gateway_pid) - cpu
                        sink_after = sink.taken()
                        exported[label] = (sink_after[0] - sink_before[0],
                                           sink_after[1] - sink_before[1])
                    operations = sessions * count
                    cpu_per_event[label, traced] = cpu / max(received[0], 1) * 1e6
                    detail[label, traced] = (f"{cpu:.2f} CPU s for {received[0]} events in "
                                             f"{operations} operations")
                if traced:
                    dropped = await _metric(stack, "nnrp_gateway_trace_spans_dropped_total")
                    if dropped:
                        raise RuntimeError(f"tracing dropped {dropped:.0f} spans: the "
                                           "figure would flatter it")
    figures = []
    for label, *_ in shapes:
        off, on = cpu_per_event[label, False], cpu_per_event[label, True]
        exports, sent = exported[label]
        figures.append(Figure(f"gateway CPU per event, tracing off, {label}", off, "us",
                              spread=detail[label, False]))
        figures.append(Figure(f"gateway CPU per event, tracing on (100 % sampled), {label}",
                              on, "us", baseline=off, baseline_name="tracing off",
                              spread=f"{detail[label, True]}; added {on - off:+.1f} us an "
                                     f"event; {exports} OTLP exports, {sent} bytes"))
    progress("tracing: in process, CPU per operation")
    figures.extend(in_process(2_000 if quick else 20_000))
    return figures


def operation_record(events: int = 16) -> ObservationRecord:
    """A streamed chat of ``events`` tokens that ended well, as the gateway records it:
    every attribute a traced operation usually carries, so the spans are full-size."""
    return ObservationRecord(
        outcome=Outcome.OK, transport="tcp", connection_id=7, session_id=3, operation_id=41,
        frame_id=41, model="example-model", operation=CHAT_COMPLETIONS,
        request_id="bench-req-41", stream=True, queue_delay_ms=0.2, first_event_ms=4.1,
        duration_ms=30.8, events=events, event_bytes=events * 280,
        inter_event_gap_ms_max=1.6, usage={"prompt_tokens": 9, "completion_tokens": events},
        upstream_status=200, upstream_ms=29.5, upstream_aborted=False,
        upstream_abort_ms=None, error_code=None, cancel_source=None, cancel_reason=None,
        trace_id=None, span_id=None, trace_attribute_bytes=11,
        received_unix_ns=time.time_ns(), upstream_start_ms=0.9,
        response_model="example-model", response_id="chatcmpl-bench-req-41",
        finish_reasons=("length",))


def in_process(operations: int) -> list[Figure]:
    """The in-process figure (module docstring): µs of CPU per operation, per thread."""
    trace = nnrp.TraceInfo(0x4BF92F3577B34DA6, 0x00F067AA0BA902B7, 0, 1, 11)
    cost = measure_tracing_cost(operation_record(), trace, operations=operations,
                                vllm_url="http://127.0.0.1:8001")
    said = (f"{operations} operations, {cost.spans} spans, {cost.encoded_bytes} bytes "
            "encoded; time.thread_time")
    return [Figure("tracing CPU per operation, event loop (decide + build + queue)",
                   cost.event_loop_us, "us", spread=said),
            Figure("tracing CPU per operation, export thread (OTLP encoding)",
                   cost.export_us, "us", spread=said)]
