"""Run from the repository: ``.venv/bin/python docs/bench/issue25-final/throughput_cpu.py``.

Issue 25, row 4: where the CPU goes while ``bench run``'s throughput scenario runs its
256 streams (200 events each from the instant replay backend): the kernel CPU clock of
the gateway, the replay backend and this process (the load generator, the project's NNRP
client decoding every event), over the same seconds, three times."""
import functools
import os
import sys
import time

import trio

sys.path.insert(0, ".")
from gateway.tools.bench._procs import process_cpu_seconds  # noqa: E402
from gateway.tools.bench._stack import Stack, fan_out, open_sessions  # noqa: E402
from gateway.tools.bench.scenarios import _indexed_gateway_stream  # noqa: E402


async def main() -> None:
    async with Stack() as stack:
        replay = stack.processes[0].pid
        for round_ in range(3):
            received: list[float] = []
            async with open_sessions(stack.endpoint, 256) as sessions:
                pids = {"gateway": stack.gateway_pid, "replay backend": replay,
                        "load generator": os.getpid()}
                before = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
                start = time.perf_counter()
                await fan_out(256, functools.partial(
                    _indexed_gateway_stream, sessions,
                    f"replay:timestamped:200:0:t{time.monotonic_ns()}", received))
                wall = time.perf_counter() - start
                used = {name: process_cpu_seconds(pid) - before[name]
                        for name, pid in pids.items()}
            print(f"round {round_ + 1}: {len(received)} events in {wall:.2f} s, "
                  f"{len(received) / wall:.0f} events/s; CPU, % of a core: " + ", ".join(
                      f"{name} {cpu / wall * 100:.0f} %" for name, cpu in used.items())
                  + f"; all {sum(used.values()) / wall * 100:.0f} % of the VM's 200 %",
                  flush=True)


trio.run(main)
