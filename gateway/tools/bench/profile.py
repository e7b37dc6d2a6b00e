"""``bench profile``: where the gateway process spends its CPU under a load.

A replay backend and the gateway run as processes (``Stack``); py-spy (the ``profile``
extra) attaches to the gateway and samples its Python stacks while this process drives
one of ``LOADS``; then the stacks become a flame graph, collapsed stacks to diff and the
table of the frames with the most self time (``flame``).

Rules:

1. py-spy stops the gateway for each sample (its default): with ``--nonblocking`` it
   reads the stacks of a running process, and on this VM 3.5 % of the samples of the
   256-stream load came out torn (no root, stray frames), which draws a false graph.
   A stop costs the gateway some tens of microseconds per sample, about 1 % of its
   time at the default rate. Frames are functions, without line numbers, so two
   profiles of changed code still line up. It samples only while the gateway is busy
   (rule 2 of ``flame``).
2. It is attached once the sessions are open and stopped (SIGINT: py-spy then writes its
   file) as soon as the last stream has ended: the profile is the load, not the set-up.
3. The gateway's CPU over the same window (the kernel's clock, ``_procs``) divided by the
   events delivered is reported beside the profile, so a graph is read against the cost
   it explains. py-spy itself runs on the same machine and takes a share of its CPU.
4. py-spy needs ptrace rights over the gateway (root, CAP_SYS_PTRACE, or
   kernel.yama.ptrace_scope 0 for a child): when it cannot attach, its own words are
   the error (``ProfilerUnavailable``), not an empty graph.
5. A compiled build (``gateway.compiled``; the gateway runs this interpreter, so this
   build) is sampled with ``--native``: without it py-spy sees no frame of a mypyc or C
   module, and their time lands on the interpreted function that called them. The
   native frames are named as the extension names them (``CPyDef_<module>___<name>``).
6. A load whose requests did not all end with their answer is an error, not a profile:
   sampling stops the gateway (rule 1), and at a high rate with ``--native`` the
   256-stream load fell so far behind that every request met its first-chunk timeout,
   and the report read "0 events". (``check_complete``.)
"""

from __future__ import annotations

import functools
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

import attrs
import trio

from gateway import compiled, nnrp

from ._procs import process_cpu_seconds
from ._stack import Progress, Stack, envelope, fan_out, open_sessions
from .flame import (
    FrameShare,
    Stacks,
    area_shares,
    frame_shares,
    parse_collapsed,
    render_svg,
    to_collapsed,
)
from .scenarios import _gateway_stream

if TYPE_CHECKING:
    from gateway.tools.client import ClientSession

#: Samples a second: the gateway handles thousands of events a second, so a few hundred
#: samples a second over ten seconds give a share to within a percent or so.
DEFAULT_RATE_HZ = 250
#: What py-spy says once it has attached and samples (its first line).
SAMPLING = b"Sampling process"
#: How long py-spy may take to attach (it reads the interpreter's state from the gateway).
ATTACH_TIMEOUT_S = 30
#: How long py-spy may take to write its file after SIGINT.
WRITE_TIMEOUT_S = 30


class ProfilerUnavailable(Exception):
    """py-spy is not installed or cannot attach to the gateway (rule 4)."""


class LoadIncomplete(Exception):
    """Rule 6: requests of the load did not end with their answer under the profiler."""


def check_complete(load: Load, completed: int) -> None:
    """Rule 6: every request of ``load`` ended with its answer, or ``LoadIncomplete``."""
    asked = load.streams * load.requests
    if completed < asked:
        raise LoadIncomplete(
            f"{load.name}: {completed} of {asked} requests ended with their answer; a "
            f"profile of failing requests is not the load's (a slower sampling rate, "
            f"--rate, stops the gateway less often)")


@attrs.frozen
class Load:
    """One profiled load: ``streams`` concurrent streams, each ``requests`` requests one
    after the other of ``events`` events each, the backend writing one every
    ``interval_us`` (one event per upstream read; 0: as fast as it can, many a read).
    ``stream`` False: non-streaming requests (one answer each, ``events`` is 1)."""

    name: str
    streams: int
    events: int
    interval_us: int
    what: str
    requests: int = 1
    stream: bool = True

    def quick(self) -> Load:
        if self.requests > 1:
            return attrs.evolve(self, requests=max(20, self.requests // 10))
        return attrs.evolve(self, events=max(50, self.events // 10))

    @property
    def per_request(self) -> bool:
        """Whether the figure to read is the CPU a request (short requests), not an event."""
        return self.requests > 1


#: The loads profiled (paced as ``bench run``'s latency scenario paces them),
#: then one per row of its table the paced ones do not explain: the coalesced shape of
#: the cost scenario, and the fixed cost of a request (streamed and not) that the
#: non-streaming row and ``bench live``'s short streams pay.
LOADS = (
    Load("paced-256", 256, 300, 10_000,
         "256 streams x 100 events/s (10 ms apart), one event per upstream read"),
    Load("paced-1", 1, 10_000, 1_000, "one stream x 1,000 events/s (1 ms apart)"),
    Load("coalesced-256", 256, 200, 0,
         "256 streams x 200 events from an instant backend, many events per upstream read"),
    Load("requests-16", 16, 1, 0,
         "16 streams of streamed requests of one event each, one after the other",
         requests=100),
    Load("unary-1", 1, 1, 0, "one stream of non-streaming requests, one after the other",
         requests=1000, stream=False),
)
#: The loads by name (``bench profile --load``).
LOADS_BY_NAME = {load.name: load for load in LOADS}


@attrs.frozen
class Profile:
    """One load's profile and what it cost."""

    load: Load
    samples: int
    events: int
    cpu_seconds: float
    wall_seconds: float
    shares: list[FrameShare]
    #: Self time by the unit the innermost frame is in (``flame.area_shares``).
    areas: list[tuple[str, float]]
    #: The gateway's events per upstream read over the window (its residence probe): 1
    #: when each event had a read of its own, more when the backend fell behind and the
    #: kernel handed the gateway several at once.
    events_per_read: float | None = None
    #: Requests that ended with their answer (every event, or the non-streaming answer).
    requests: int = 0

    @property
    def cpu_per_event_us(self) -> float:
        return self.cpu_seconds / max(self.events, 1) * 1e6

    @property
    def cpu_per_request_us(self) -> float:
        return self.cpu_seconds / max(self.requests, 1) * 1e6

    def as_dict(self, top: int = 30) -> dict[str, object]:
        return {"load": attrs.asdict(self.load), "samples": self.samples,
                "events": self.events, "cpu_seconds": round(self.cpu_seconds, 3),
                "wall_seconds": round(self.wall_seconds, 3),
                "events_per_read": None if self.events_per_read is None
                else round(self.events_per_read, 2),
                "requests": self.requests,
                "cpu_per_event_us": round(self.cpu_per_event_us, 2),
                "cpu_per_request_us": round(self.cpu_per_request_us, 2),
                "self_by_area": {key: round(share, 4) for key, share in self.areas[:top]},
                "top_frames": [{"frame": s.frame, "self": round(s.self_share, 4),
                                "total": round(s.total_share, 4)}
                               for s in self.shares[:top]]}


def py_spy() -> str:
    """py-spy's executable: beside this interpreter (a venv), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return str(beside)
    found = shutil.which("py-spy")
    if found is None:
        raise ProfilerUnavailable("py-spy is not installed (pip install "
                                  "'nnrp-vllm-gateway[profile]')")
    return found


def _save(raw: Path, load: Load, out: Path) -> Stacks:
    """py-spy's file to the collapsed stacks (sorted, to diff) and the flame graph."""
    if not raw.exists():
        raise ProfilerUnavailable("py-spy wrote no profile")
    stacks = parse_collapsed(raw.read_text())
    raw.unlink()
    (out / f"{load.name}.collapsed").write_text(to_collapsed(stacks))
    (out / f"{load.name}.svg").write_text(render_svg(stacks, f"nnrp-gateway serve, {load.what}"))
    return stacks


async def _attached(spy: subprocess.Popen[bytes], said: IO[bytes]) -> None:
    """Return once py-spy says it samples; its own words if it exits first (rule 4)."""
    with trio.move_on_after(ATTACH_TIMEOUT_S):
        while spy.poll() is None:
            said.seek(0)
            if SAMPLING in said.read():
                return
            await trio.sleep(0.02)
    said.seek(0)
    words = said.read().decode(errors="replace").strip()
    raise ProfilerUnavailable(words or (f"py-spy exited {spy.returncode}" if spy.returncode
                                        is not None else "py-spy did not start sampling"))


async def _requests(sessions: list[ClientSession], load: Load, prefix: str,
                    received: list[float], done: list[int], index: int) -> None:
    """One stream of the load: its requests one after the other. A streamed request's
    events are counted in ``received``; a request is counted in ``done`` when it got
    every event (or its non-streaming answer)."""
    session = sessions[index]
    for number in range(load.requests):
        request_id = f"{prefix}-{index}-{number}"
        if load.stream:
            if await _gateway_stream(session, request_id, received) == load.events:
                done.append(1)
            continue
        # Not a replay:... id: the replay answers vLLM's recorded non-streaming body.
        operation = await session.submit(envelope(request_id, stream=False))
        async for event in operation.events():
            if isinstance(event, nnrp.ResultReceived) and event.meta.status_code == 200:
                received.append(0.0)
                done.append(1)


async def _record(stack: Stack, load: Load, out: Path, rate: int) -> Profile:
    raw = out / f"{load.name}.raw"
    received: list[float] = []
    done: list[int] = []
    run = time.monotonic_ns()
    prefix = (f"replay:timestamped:{load.events}:{load.interval_us}:p{run}" if load.stream
              else f"unary-p{run}")
    async with open_sessions(stack.endpoint, load.streams) as sessions:
        # Its messages go to a file: a pipe nobody reads while the load runs could fill.
        with tempfile.TemporaryFile() as said:
            spy = subprocess.Popen(  # noqa: ASYNC220 - started here, awaited below
                [py_spy(), "record", "--pid", str(stack.gateway_pid), "--rate", str(rate),
                 "--format", "raw", "--nolineno", "--output", str(raw),
                 *(("--native",) if compiled.build() != compiled.PURE else ())],  # rule 5
                stdout=said, stderr=subprocess.STDOUT)
            try:
                await _attached(spy, said)
                await stack.residence()  # the probe counts from here
                cpu = process_cpu_seconds(stack.gateway_pid)
                start = time.perf_counter()
                await fan_out(load.streams, functools.partial(
                    _requests, sessions, load, prefix, received, done))
                wall = time.perf_counter() - start
                cpu = process_cpu_seconds(stack.gateway_pid) - cpu
                per_read = (await stack.residence()).get("events_per_read")
            finally:  # py-spy never outlives the load, cancelled or not (its own timeout)
                if spy.poll() is None:
                    spy.send_signal(signal.SIGINT)  # py-spy writes its file and exits
                with trio.CancelScope(shield=True):
                    try:
                        await trio.to_thread.run_sync(spy.wait, WRITE_TIMEOUT_S)
                    except subprocess.TimeoutExpired:
                        spy.kill()
                        await trio.to_thread.run_sync(spy.wait)
    try:
        check_complete(load, len(done))  # rule 6
    except LoadIncomplete:
        raw.unlink(missing_ok=True)  # py-spy's file of it: no profile, nothing left
        raise
    stacks = await trio.to_thread.run_sync(_save, raw, load, out)
    return Profile(load, sum(stacks.values()), len(received), cpu, wall,
                   frame_shares(stacks), area_shares(stacks), per_read, len(done))


async def profile(out: Path, quick: bool, progress: Progress, *,
                  rate: int = DEFAULT_RATE_HZ, loads: tuple[Load, ...] = LOADS
                  ) -> list[Profile]:
    """Profile the gateway under each of ``loads``, writing ``NAME.svg`` and
    ``NAME.collapsed`` into ``out`` (made if missing)."""
    py_spy()  # before any process starts: is it there at all?
    await trio.Path(out).mkdir(parents=True, exist_ok=True)
    profiles = []
    # The residence probe is on (one check per read and per event) for events per read.
    async with Stack(gateway_args=("--max-sessions-per-connection", "1024")) as stack:
        for load in loads:
            load = load.quick() if quick else load
            progress(f"profile: {load.what}, " + (f"{load.requests} requests a stream"
                                                  if load.per_request
                                                  else f"{load.events} events a stream"))
            profiles.append(await _record(stack, load, out, rate))
    return profiles


def can_attach() -> str | None:
    """None when py-spy is here and may attach to a process of ours; else why not (a
    test's skip reason)."""
    try:
        exe = py_spy()
    except ProfilerUnavailable as exc:
        return str(exc)
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); "
                              "time.sleep(30)"], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        child.stdout.readline()  # the interpreter is up, for py-spy to find
        probe = subprocess.run([exe, "dump", "--pid", str(child.pid)], capture_output=True,
                               text=True, timeout=30, check=False)
    finally:
        child.kill()
        child.communicate()
    if probe.returncode != 0:
        return (probe.stderr or probe.stdout).strip() or "py-spy cannot attach"
    return None


__all__ = ["LOADS", "LOADS_BY_NAME", "Load", "Profile", "ProfilerUnavailable", "can_attach",
           "profile", "py_spy"]
