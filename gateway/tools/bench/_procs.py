"""What a benchmark reads of another process: its exact CPU time, its children, its RSS,
and which process owns a listening TCP socket (vLLM's API server, a gateway started
elsewhere): the parsing is pure (``stat_cpu_ticks``, ``listening_inodes``,
``socket_inode``), the rest reads /proc; and when a server it started is ready."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import httpx
import trio

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: The clock id's low bits: the scheduler's runtime (linux/posix-timers.h); a process,
#: not a thread, as the per-thread bit (4) is clear.
_CPUCLOCK_SCHED = 2
_PAGE = os.sysconf("SC_PAGE_SIZE")


def process_cpu_seconds(pid: int) -> float:
    """The CPU time ``pid`` has run, exactly: the kernel's per-process CPU clock (Linux's
    CPUCLOCK_SCHED for a process id, clock_getcpuclockid(3)). /proc/PID/stat's user and
    system times are sampled at the scheduler tick (10 ms here), which charges a process
    that wakes in step with a paced load too much or too little; they remain
    the fallback where that clock cannot be read."""
    with contextlib.suppress(OSError, OverflowError):
        return time.clock_gettime((~pid << 3) | _CPUCLOCK_SCHED)
    with open(f"/proc/{pid}/stat") as stat:
        return stat_cpu_ticks(stat.read()) / _CLOCK_TICKS


def stat_cpu_ticks(stat: str) -> int:
    """utime + stime, in clock ticks, from the text of /proc/PID/stat (proc(5): fields 14
    and 15). The command name (field 2) is in parentheses and may hold spaces and ")", so
    the fields are counted from the last ")"."""
    fields = stat.rsplit(")", 1)[1].split()
    # After the name: state is field 3, so utime (14) and stime (15) are the 12th and 13th.
    return int(fields[11]) + int(fields[12])


#: /proc/net/tcp's state column for a listening socket (include/net/tcp_states.h).
_TCP_LISTEN = "0A"


def listening_inodes(table: str, port: int) -> set[int]:
    """The inodes of the sockets listening on ``port`` (any address), from the text of
    /proc/net/tcp or /proc/net/tcp6: a header line, then per socket ``sl local_address
    rem_address st ... uid timeout inode``, addresses as HEXIP:HEXPORT."""
    inodes = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local_port = int(fields[1].rsplit(":", 1)[1], 16)
        if local_port == port and fields[3] == _TCP_LISTEN:
            inodes.add(int(fields[9]))
    return inodes


def socket_inode(link: str) -> int | None:
    """The inode of a socket from a /proc/PID/fd link's target (``socket:[12345]``)."""
    if link.startswith("socket:[") and link.endswith("]"):
        return int(link[len("socket:["):-1])
    return None


def listening_socket_owners(port: int) -> list[int]:
    """The processes holding a socket that listens on TCP ``port`` of this machine, in
    pid order: vLLM's API server for vLLM's port (its engine core is another process and
    holds no such socket), every worker for a ``--workers`` gateway's shared listener.
    Empty when nobody here listens there (a server on another host, say)."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as listed:
            inodes |= listening_inodes(listed.read(), port)
    if not inodes:
        return []
    owners = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    if socket_inode(os.readlink(f"/proc/{entry}/fd/{fd}")) in inodes:
                        owners.append(int(entry))
                        break
    return sorted(owners)


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


async def until_http_ready(url: str, process: subprocess.Popen[bytes], name: str) -> None:
    """Until ``url`` answers 200 (a started server's readiness), within a minute; an
    error naming ``name`` if its process exits first."""
    async with httpx.AsyncClient(trust_env=False) as client:
        with trio.fail_after(60):
            while process.poll() is None:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url, timeout=1)).status_code == 200:
                        return
                await trio.sleep(0.05)
    raise RuntimeError(f"the {name} exited ({process.returncode}) before it was ready")
