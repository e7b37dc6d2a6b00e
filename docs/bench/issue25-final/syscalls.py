"""Run from the repository: ``.venv/bin/python docs/bench/issue25-final/syscalls.py``.

Issue 25, the one-stream row: the system calls the gateway makes per event against
those of the null relay (``bench relay``, a bare trio byte relay: the row's baseline),
one paced stream each (2,000 events 1 ms apart, the cost scenario's one-stream shape, or
at the pace given in microseconds),
counted by ``strace -c -f`` attached to that process only while its stream runs."""
import functools
import subprocess
import sys
import time

import trio

sys.path.insert(0, ".")
from gateway.tools.bench._stack import Stack, open_sessions  # noqa: E402
from gateway.tools.bench.scenarios import _direct_fan_out, _indexed_gateway_stream  # noqa: E402

EVENTS = 2000
#: The pace: 1 ms (the cost scenario's one stream) or, as the first argument, another
#: (10000: the latency scenario's, which issue 25's first row is measured at).
INTERVAL_US = int(sys.argv[1]) if len(sys.argv) > 1 else 1000


async def traced(pid: int, job) -> tuple[str, int]:
    out = f"/tmp/strace-{pid}.txt"
    spy = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", out],
                           stderr=subprocess.DEVNULL)
    await trio.sleep(1.0)  # attached
    count = await job()
    spy.send_signal(2)
    await trio.to_thread.run_sync(spy.wait)
    return open(out).read(), count


async def main() -> None:
    async with Stack() as stack:
        relay_pid = stack.processes[1].pid

        async def via_gateway() -> int:
            received: list[float] = []
            async with open_sessions(stack.endpoint, 1) as sessions:
                await _indexed_gateway_stream(
                    sessions, f"replay:timestamped:{EVENTS}:{INTERVAL_US}:s{time.monotonic_ns()}",
                    received, 0)
            return len(received)

        async def via_relay() -> int:
            latencies: list[float] = []
            await _direct_fan_out(stack.relay_url, 1,
                                  f"replay:timestamped:{EVENTS}:{INTERVAL_US}:r{time.monotonic_ns()}",
                                  latencies)
            return len(latencies)

        for name, pid, job in (("gateway", stack.gateway_pid, via_gateway),
                               ("null relay", relay_pid, via_relay)):
            text, count = await traced(pid, job)
            print(f"== {name}: {count} events {INTERVAL_US} us apart; strace -c -f -p {name}")
            calls = 0
            for line in text.splitlines():
                parts = line.split()
                if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                    calls_here = int(parts[3])
                    calls += calls_here
                    print(f"  {parts[-1]:<16} {calls_here:>7}  {calls_here / count:6.2f} an event")
            print(f"  {'all':<16} {calls:>7}  {calls / count:6.2f} an event")


trio.run(main)
