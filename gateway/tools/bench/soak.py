"""Soak: N concurrent streams for T seconds against the replay backend.

Each of N workers loops: submit a streaming request, read it to its terminal, repeat. The
run reports errors, completed operations, the gateway's RSS and open file descriptors
over time, and RSS growth after warm-up (the first sample after warm-up vs the last;
with ``cut_every``, as below).

``sigterm_at`` sends SIGTERM to the gateway mid-run (shutdown under load): every
operation must then end with ``response.completed`` or an explicit RESULT_DROP_REASON,
and started == completed + dropped (nothing lost, nothing hung).

``cut_every`` runs each stream on a connection of its own, through a cut proxy,
with a resumable session the client resumes by itself, and resets one connection every
``cut_every`` seconds on average (a seeded Poisson process; a random stream caught
mid-operation): every operation must end whole (``_resumable``: nothing lost or
duplicated), every cut be resumed, and once the load ends (the clients leave without
closing their sessions, which detach) and every window has passed, nothing may be held
and the gateway's RSS after the second period's windows be within ``max_rss_growth`` of
its RSS after the first period's (against the idle RSS a gateway that lets everything go
still looks grown: first connections, pools, allocator arenas).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from gateway import nnrp
from gateway.tools.client import ClientError

from ._procs import process_rss
from ._resumable import DETACHED, HELD_BYTES, CutStream, CutTally, released, resume_metrics
from ._stack import Progress, Stack, envelope, open_sessions
from .stats import percentile

TOKENS_PER_OPERATION = 40
#: Every this many events of each operation, one event's delay is sampled (bounded).
DELAY_SAMPLE_EVERY = 8
MAX_DELAY_SAMPLES = 1 << 20


def warm_up_seconds(seconds: float) -> float:
    """Warm-up: a fifth of the run, at least 15 s, at most half of it. Pools, caches and
    the allocator fill first: a 30-second CI run climbed 64 -> 67 MiB in its first 15 s
    and then held, while 10 minutes at 1,000 streams stayed within 0.3 %."""
    return min(max(seconds * 0.2, 15.0), seconds * 0.5)


@attrs.define
class SoakReport:
    streams: int
    seconds: float
    started: int = 0
    completed: int = 0
    dropped: int = 0
    errors: int = 0
    #: Every error, counted by its cause (the profile's error code, a drop reason, or
    #: the client-side exception), and each distinct message once (bounded).
    error_causes: dict[str, int] = attrs.field(factory=dict)
    error_samples: list[str] = attrs.field(factory=list)
    #: Recoverable refusals (ERROR_RECOVERABLE + RETRY_AFTER first): overload said
    #: explicitly, not lost; the worker waits the retry time and goes on.
    refused: int = 0
    #: Each distinct refusal message once (bounded): why the gateway said "later".
    refusal_samples: list[str] = attrs.field(factory=list)
    samples: list[dict[str, Any]] = attrs.field(factory=list)
    sigterm_at: float | None = None
    gateway_exit: int | None = None
    #: Offered load: each stream's token interval (40 tokens per operation).
    token_interval_ms: float = 20.0
    #: Seconds each completed operation took, submit to terminal.
    durations: list[float] = attrs.field(factory=list)
    #: Sampled events' delay (ms), the backend's write -> here: lag in mid-operation,
    #: which an operation's duration hides when the backend catches up on its schedule.
    delays_ms: list[float] = attrs.field(factory=list)
    #: With ``cut_every``: the mean seconds between two cuts, the gateway's resume
    #: window, what the streams saw (``_resumable.CutTally``), the gateway's RSS before
    #: the load (MiB), and for each period the seconds from the clients' leaving until
    #: no session was detached and nothing held (None: not within the window and 30 s).
    cut_every: float | None = None
    resume_window: float | None = None
    resume: CutTally | None = None
    #: With ``cut_every``: the round trip the cut proxies add (ms; 0: bare loopback).
    cut_latency_ms: float = 0.0
    rss_idle_mib: float | None = None
    #: With ``cut_every``: the RSS after the first period's windows, the baseline of
    #: ``rss_growth`` (``_cut_soak``).
    rss_baseline_mib: float | None = None
    released_after_s: list[float | None] = attrs.field(factory=list)

    @property
    def released(self) -> bool:
        """With ``cut_every``: every period ended with nothing detached, nothing held."""
        return bool(self.released_after_s) and None not in self.released_after_s

    def event_delay(self, body: bytes, received_ns: int | None = None) -> None:
        """A timestamped token's delay (the replay writes its send time as the text).

        `received_ns` is the monotonic arrival time; the default is now.
        """
        now = time.monotonic_ns() if received_ns is None else received_ns
        try:
            sent = int(json.loads(body)["delta"])
        except (ValueError, KeyError, TypeError):
            return
        if len(self.delays_ms) < MAX_DELAY_SAMPLES:
            self.delays_ms.append((now - sent) / 1e6)

    @property
    def rss_growth(self) -> float:
        """Relative RSS growth from the first sample after warm-up to the last (with
        ``cut_every``: from the RSS after the first period's windows to the last)."""
        if self.rss_baseline_mib is not None and self.samples:
            last = float(self.samples[-1]["rss_mib"])
            return (last - self.rss_baseline_mib) / self.rss_baseline_mib
        if len(self.samples) < 3:
            return 0.0
        warm_up = warm_up_seconds(self.seconds)
        warm = [s for s in self.samples if s["t"] >= warm_up] or self.samples
        first, last = float(warm[0]["rss_mib"]), float(self.samples[-1]["rss_mib"])
        return (last - first) / first

    @property
    def accounted(self) -> bool:
        return self.started == self.completed + self.dropped + self.errors + self.refused

    def error(self, cause: str, message: str) -> None:
        self.errors += 1
        self.error_causes[cause] = self.error_causes.get(cause, 0) + 1
        if message not in self.error_samples and len(self.error_samples) < 50:
            self.error_samples.append(message)

    @property
    def offered_events_per_s(self) -> float:
        return self.streams * 1000 / self.token_interval_ms

    def stretch(self, q: float) -> float | None:
        """A completed operation's duration over its nominal one (40 token intervals),
        at quantile ``q``: near 1.0 the machine carried the offered load; well above,
        the gateway, backend and load generator together could not keep up."""
        if not self.durations:
            return None
        nominal = TOKENS_PER_OPERATION * self.token_interval_ms / 1000
        return percentile(self.durations, q) / nominal

    def as_dict(self) -> dict[str, Any]:
        document = attrs.asdict(self, filter=lambda field, _: field.name not in (
            "durations", "delays_ms", "resume"))
        if self.resume is not None:
            document["resume"] = self.resume.as_dict()
        delays = self.delays_ms
        document["event_delay_ms"] = {
            name: round(percentile(delays, q), 2)
            for name, q in (("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999))} if delays else None
        stretch = {f"p{round(q * 100)}": self.stretch(q) for q in (0.5, 0.99)}
        document.update(rss_growth=round(self.rss_growth, 4), accounted=self.accounted,
                        offered_events_per_s=round(self.offered_events_per_s),
                        duration_stretch={k: v if v is None else round(v, 3)
                                          for k, v in stretch.items()})
        return document


def _terminal(result: nnrp.ResultReceived) -> tuple[str, str]:
    """(the terminal's type or error code, a message) of a RESULT_PUSH."""
    if result.typed_body is None or not result.typed_body.frames:
        return "(no body)", ""
    try:
        document = json.loads(bytes(result.typed_body.frames[0].payload))
    except ValueError:
        return "(not JSON)", ""
    if document.get("type") == "response.error":
        error = document.get("error", {})
        return str(error.get("code")), f"response.error {error.get('code')}: " \
                                       f"{error.get('message')}"
    return str(document.get("type")), ""


def _open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


async def soak(streams: int, seconds: float, *, sigterm_at: float | None = None,
               token_interval_ms: float = 20.0, log_dir: Path | None = None,
               client_nice: int = 0, progress: Progress = lambda _: None,
               cut_every: float | None = None, resume_window: float = 5.0,
               seed: int = 21, cut_latency_ms: float = 0.0) -> SoakReport:
    """Each stream is 40 tokens ``token_interval_ms`` apart, so the offered load is
    ``streams * 1000 / token_interval_ms`` events/s: size it to the machine. With
    ``log_dir``, the gateway's and the backend's logs are kept there; ``client_nice``
    lowers this (the load generator's) priority once the processes are up. ``cut_every``:
    the streams resume after random cuts (the module's docstring), over a path of
    ``cut_latency_ms`` round trip."""
    if cut_every is not None:
        return await _cut_soak(streams, seconds, cut_every=cut_every,
                               resume_window=resume_window, seed=seed,
                               latency=cut_latency_ms / 1000,
                               token_interval_ms=token_interval_ms, log_dir=log_dir,
                               client_nice=client_nice, progress=progress)
    report = SoakReport(streams, seconds, sigterm_at=sigterm_at,
                        token_interval_ms=token_interval_ms)
    interval_us = round(token_interval_ms * 1000)
    async with Stack(gateway_args=("--max-sessions-per-connection", "1024",
                                   "--upstream-pool-size", str(max(256, streams)),
                                   "--drain-timeout", "10"),
                     log_dir=log_dir, residence=False) as stack:
        pid = stack.gateway_pid
        if client_nice:
            # The load generator yields the CPU to the gateway and the backend (started
            # above at normal priority): what is measured is the gateway, not a contest.
            os.nice(client_nice)
        start = trio.current_time()
        deadline = start + seconds
        stopping = trio.Event()

        async def worker(session: Any, index: int) -> None:
            number = 0
            while trio.current_time() < deadline and not stopping.is_set():
                number += 1
                report.started += 1
                submitted = trio.current_time()
                try:
                    operation = await session.submit(envelope(
                        f"replay:timestamped:{TOKENS_PER_OPERATION}:{interval_us}:"
                        f"soak-{index}-{number}"))
                    terminal = None
                    async for event in operation.events():
                        terminal = event
                        if (isinstance(event, nnrp.PartialReceived)
                                and event.sequence % DELAY_SAMPLE_EVERY == 0):
                            report.event_delay(event.body)
                    if isinstance(terminal, nnrp.ResultReceived):
                        kind, message = _terminal(terminal)
                        retry_ms = operation.retry_after_ms
                        if kind != "response.completed" and retry_ms is not None:
                            report.refused += 1  # said explicitly: wait, then go on
                            if (message not in report.refusal_samples
                                    and len(report.refusal_samples) < 20):
                                report.refusal_samples.append(message)
                            await trio.sleep(retry_ms / 1000)
                            continue
                        if kind != "response.completed":
                            # A response.error is a RESULT_PUSH too: it must not count as
                            # completed (an earlier version did, and hid fast failures).
                            report.error(kind, message)
                            return
                        report.completed += 1
                        report.durations.append(trio.current_time() - submitted)
                    elif isinstance(terminal, nnrp.DropReceived):
                        report.dropped += 1
                    else:
                        raise ClientError("no terminal")
                except (ClientError, trio.BrokenResourceError, OSError) as exc:
                    if stopping.is_set() and report.sigterm_at is not None:
                        # After SIGTERM the gateway may close before a new submit lands.
                        report.started -= 1
                        return
                    report.error(type(exc).__name__, f"{type(exc).__name__}: {exc}")
                    return

        async def sampler() -> None:
            while trio.current_time() < deadline and not stopping.is_set():
                with trio.move_on_after(1.0):
                    await stopping.wait()
                try:
                    rss = process_rss(pid) / 2**20
                except OSError:
                    return
                report.samples.append({"t": round(trio.current_time() - start, 2),
                                       "rss_mib": round(rss, 2), "fds": _open_fds(pid),
                                       "completed": report.completed})
                progress(f"soak: {report.completed} completed, {report.errors} errors, "
                         f"RSS {rss:.1f} MiB")

        async def terminator() -> None:
            assert sigterm_at is not None
            await trio.sleep(sigterm_at)
            stopping.set()
            os.kill(pid, signal.SIGTERM)

        # 200 sessions per connection (the gateway runs with up to 1,024 each).
        async with (open_sessions(stack.endpoint, streams,
                              connections=max(1, streams // 200)) as sessions,
                    trio.open_nursery() as nursery):
            nursery.start_soon(sampler)
            if sigterm_at is not None:
                nursery.start_soon(terminator)
            for index, session in enumerate(sessions):
                nursery.start_soon(worker, session, index)
        if sigterm_at is not None:
            code = await trio.to_thread.run_sync(stack.processes[-1].wait, 30)
            report.gateway_exit = code
        report.seconds = round(trio.current_time() - start, 2)
    return report


#: A stream is cut only mid-operation: past its first result, this many before its last.
CUT_MARGIN = 5


async def _cut_soak(streams: int, seconds: float, *, cut_every: float, resume_window: float,
                    seed: int, token_interval_ms: float, log_dir: Path | None,
                    client_nice: int, progress: Progress, latency: float = 0.0
                    ) -> SoakReport:
    """``soak`` with ``cut_every``: resumable streams, each through a cut proxy, in two
    periods of ``seconds / 2``. After each, the clients leave without closing their
    sessions (every session detaches) and every window passes. The RSS after the
    second period's windows is measured against the RSS after the first's: a gateway
    that kept what it held for detached or resumed sessions would be up by what the
    second period made it hold; one that let it go reuses that memory (Python rarely
    gives freed memory back to the OS, so RSS after the first period stays near its
    high-water mark, the first use of pools and connections included)."""
    report = SoakReport(streams, seconds, token_interval_ms=token_interval_ms,
                        cut_every=cut_every, resume_window=resume_window, resume=CutTally(),
                        cut_latency_ms=latency * 1000)
    tally = report.resume
    assert tally is not None
    interval_us = round(token_interval_ms * 1000)
    rng = random.Random(seed)
    async with Stack(gateway_args=("--upstream-pool-size", str(max(256, streams)),
                                   "--drain-timeout", "10", "--metrics",
                                   "--resume-window", str(resume_window),
                                   # Every stream is this one client (one address): the
                                   # per-client caps must let it hold them all.
                                   "--resume-max-sessions-per-client", str(max(64, streams)),
                                   "--resume-client-bytes", str(256 << 20)),
                     log_dir=log_dir, residence=False) as stack:
        pid = stack.gateway_pid
        report.rss_idle_mib = round(process_rss(pid) / 2**20, 2)
        if client_nice:
            os.nice(client_nice)
        target = ("127.0.0.1", stack.nnrp_port)
        start = trio.current_time()

        async def sample(phase: str) -> float | None:
            """The gateway's RSS (MiB) now, also kept with the phase; None if unread."""
            try:
                rss = process_rss(pid) / 2**20
                metrics = await resume_metrics(stack.admin_url)
            except OSError:
                return None
            report.samples.append({
                "t": round(trio.current_time() - start, 2), "rss_mib": round(rss, 2),
                "fds": _open_fds(pid), "completed": report.completed,
                "held_mib": round(metrics.get(HELD_BYTES, 0) / 2**20, 2),
                "detached": metrics.get(DETACHED, 0), "cuts": tally.cuts, "phase": phase})
            progress(f"soak ({phase}): {report.completed} completed, {tally.cuts} cuts, "
                     f"{report.errors} errors, RSS {rss:.1f} MiB")
            return round(rss, 2)

        async def worker(stream: CutStream, index: int, deadline: float) -> None:
            number = 0
            while trio.current_time() < deadline:
                number += 1
                report.started += 1
                submitted = trio.current_time()
                failures = len(tally.failures)
                whole = await stream.run(envelope(
                    f"replay:timestamped:{TOKENS_PER_OPERATION}:{interval_us}:"
                    f"cut-{start}-{index}-{number}"), TOKENS_PER_OPERATION,
                    sample=_delay_sampler(report))
                if whole:
                    report.completed += 1
                    report.durations.append(trio.current_time() - submitted)
                    continue
                report.error("not whole", tally.failures[failures] if len(tally.failures)
                             > failures else "not whole (a failure seen before)")
                return

        async def cutter(streams_: list[CutStream]) -> None:
            while True:
                await trio.sleep(rng.expovariate(1 / cut_every))
                candidates = [stream for stream in streams_ if stream.cuttable(CUT_MARGIN)]
                if candidates:
                    rng.choice(candidates).cut()

        async def period(number: int) -> float | None:
            """One period of load, its clients leaving, the windows passing; the RSS then."""
            deadline = trio.current_time() + seconds / 2
            async with trio.open_nursery() as proxies:
                async with contextlib.AsyncExitStack() as exits:
                    cut_streams = [CutStream(target, tally, delay=latency / 2)
                                   for _ in range(streams)]
                    for stream in cut_streams:
                        await stream.open(proxies, exits)
                    async with trio.open_nursery() as nursery:
                        async def sampler() -> None:
                            while True:
                                await trio.sleep(1.0)
                                await sample(f"load {number}")

                        nursery.start_soon(sampler)
                        nursery.start_soon(cutter, cut_streams)
                        async with trio.open_nursery() as workers:
                            for index, stream in enumerate(cut_streams):
                                workers.start_soon(worker, stream, index, deadline)
                        nursery.cancel_scope.cancel()  # the load is over: no more cuts
                    tally.count(cut_streams)
                    # Leaving without SESSION_CLOSE: every session detaches.
                proxies.cancel_scope.cancel()
            left = trio.current_time()
            await sample(f"detached {number}")
            after: float | None = None
            with trio.move_on_after(resume_window + 30):
                await released(stack.admin_url)
                after = round(trio.current_time() - left, 2)
            report.released_after_s.append(after)
            await trio.sleep(1.0)  # what the gateway gives back once the sessions are gone
            return await sample(f"after the windows {number}")

        report.rss_baseline_mib = await period(1)
        await period(2)
        report.seconds = round(trio.current_time() - start, 2)
    return report


def _delay_sampler(report: SoakReport) -> Callable[[nnrp.PartialReceived], None]:
    def sample(event: nnrp.PartialReceived) -> None:
        if event.sequence % DELAY_SAMPLE_EVERY == 0:
            report.event_delay(event.body)
    return sample
