"""What a benchmark reads of another process: its exact CPU time, its children, its RSS."""

from __future__ import annotations

import contextlib
import os
import time

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: The clock id's low bits: the scheduler's runtime (linux/posix-timers.h); a process,
#: not a thread, as the per-thread bit (4) is clear.
_CPUCLOCK_SCHED = 2
_PAGE = os.sysconf("SC_PAGE_SIZE")


def process_cpu_seconds(pid: int) -> float:
    """The CPU time ``pid`` has run, exactly: the kernel's per-process CPU clock (Linux's
    CPUCLOCK_SCHED for a process id, clock_getcpuclockid(3)). /proc/PID/stat's user and
    system times are sampled at the scheduler tick (10 ms here), which charges a process
    that wakes in step with a paced load too much or too little (issue 16); they remain
    the fallback where that clock cannot be read."""
    with contextlib.suppress(OSError, OverflowError):
        return time.clock_gettime((~pid << 3) | _CPUCLOCK_SCHED)
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def process_tree(pid: int) -> list[int]:
    """``pid`` and its children (a ``--workers`` supervisor's workers)."""
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listed:
            children += [int(child) for child in listed.read().split()]
    return [pid, *children]


def tree_cpu_seconds(pids: list[int]) -> dict[int, float]:
    """CPU seconds per process (one that has gone counts nothing)."""
    seconds = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            seconds[pid] = process_cpu_seconds(pid)
    return seconds


def process_rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE
