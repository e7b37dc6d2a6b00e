"""This machine's price of a wake-up: the yardstick for the gateway's CPU per event, and
for every time figure of a bench (``stats`` rule 6).

A paced event costs the gateway one wake-up of its process (epoll, trio's run loop, the
read, the write) and then its own work. What a wake-up costs depends on the machine more
than on the gateway: on this project's 2-core VM a trio process that does nothing but
echo 200 bytes pays about 270 us of CPU per wake-up when they come 10 ms apart, and
about 60 us back to back (between distant wake-ups the caches and the virtual CPU go
cold; docs/benchmarks.md). ``wake_cost`` measures that echo in the same run as the
gateway, so each CPU figure also reads as a ratio, "so many bare wake-ups an event",
which carries to another machine where a bare wake-up costs something else.

The echo is a child process of its own, trio only (no gateway code), on a socket pair;
its CPU comes from the kernel's per-process clock, as the gateway's does.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import trio

from gateway import compiled

from ._procs import process_cpu_seconds

if TYPE_CHECKING:
    from .stats import Figure

_ECHO = """
import socket, sys, trio
async def main():
    sock = trio.socket.fromfd(int(sys.argv[1]), socket.AF_UNIX, socket.SOCK_STREAM)
    while data := await sock.recv(65536):
        await sock.send(data)
trio.run(main)
"""
_MESSAGE = b"x" * 200  # about one token event
_WARM_UP = 20


async def wake_cost(gap_s: float, wakes: int) -> float:
    """CPU microseconds a bare trio echo process spends per wake-up, woken every
    ``gap_s`` seconds (0: back to back) ``wakes`` times."""
    ours, theirs = socket.socketpair()
    try:
        child = await trio.lowlevel.open_process(
            [sys.executable, "-c", _ECHO, str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()  # the child has its own copy
    try:
        with trio.socket.from_stdlib_socket(ours) as sock:
            async def round_trip() -> None:
                await sock.send(_MESSAGE)
                received = 0
                while received < len(_MESSAGE):
                    data = await sock.recv(65536)
                    if not data:
                        raise RuntimeError("the echo process ended early")
                    received += len(data)
                if gap_s:
                    await trio.sleep(gap_s)

            for _ in range(_WARM_UP):  # the child's start-up and imports are not counted
                await round_trip()
            before = process_cpu_seconds(child.pid)
            for _ in range(wakes):
                await round_trip()
            spent = process_cpu_seconds(child.pid) - before
    finally:
        child.kill()
        with trio.CancelScope(shield=True):
            await child.wait()
    return spent / wakes * 1e6


#: The yardstick's pacing: back to back, as a busy gateway runs (``yardstick``).
YARDSTICK = "back to back"


async def yardstick(quick: bool) -> float:
    """The run's bare trio wake-up (``stats`` rule 6), back to back: measured once a run,
    every time figure of the run is also read as so many of it."""
    return await wake_cost(0.0, 1000 if quick else 3000)


def measure(quick: bool) -> float:
    """``yardstick``, for a bench that measures it before its own run."""
    return trio.run(yardstick, quick)


def described(figures: Iterable[Figure]) -> dict[str, Any] | None:
    """The run's yardstick as the JSON results carry it, from the figures that carry it."""
    wake = next((figure.wake for figure in figures if figure.wake), None)
    return None if wake is None else {"us": round(wake, 3), "pacing": YARDSTICK}


def line(figures: Iterable[Figure]) -> str:
    """The lines that open a report: the build measured (pure Python or compiled,
    gateway/compiled.py) and what its "wake-ups" are read against."""
    wake = described(figures)
    if wake is None:
        return f"build: {compiled.described()}\nwake-ups: not measured in this run"
    return (f"build: {compiled.described()}\nwake-ups: each time figure over this run's "
            f"bare trio wake-up, {wake['pacing']}, {wake['us']:.1f} us of CPU on this machine")
