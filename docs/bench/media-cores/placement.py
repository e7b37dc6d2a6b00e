"""The stall of ``bench media`` with its processes placed on this machine's cores, three
ways, to see what of the streams' gap p99 is the gateway's on a two-core machine.

    python docs/bench/media-cores/placement.py > docs/bench/media-cores/placement.txt

Placements (core A = the first this process may use, core B = the last):

* shared: nothing pinned, as ``bench media`` runs;
* load-apart: the load process alone on B (as a client on another machine would be);
  the gateways, the sink and the measuring client on A; the control's other gateway on B
  beside the load it takes;
* gateway-apart: the streams' gateway alone on A; everything else (the sink, the
  measuring client, the load, the other gateway) on B.

Each: 32 streams paced 10 ms through one gateway, without and with 63 MiB submits (data
URI, media dir), and the control (the load to the other gateway), each process's CPU
(cores) per round. It uses ``gateway.tools.bench.media`` as it is; a workplace script,
not part of the product.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path
from typing import Any

import trio

from gateway.tools.bench import media

CORES = sorted(os.sched_getaffinity(0))
A, B, ALL = {CORES[0]}, {CORES[-1]}, set(CORES)
#: Where each process goes, by placement: the streams' gateway, the other gateway, the
#: load, and the rest (the sink and this process).
PLACEMENTS: dict[str, dict[str, set[int]]] = {
    "shared": {"gateway": ALL, "other": ALL, "load": ALL, "rest": ALL},
    "load-apart": {"gateway": A, "other": B, "load": B, "rest": A},
    "gateway-apart": {"gateway": A, "other": B, "load": B, "rest": B},
}
LOADS = (("data URI", "data_uri", None), ("media dir", "media_dir", None),
         ("control", "data_uri", "media_dir"))


def pin(pid: int, cores: set[int]) -> None:
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            os.sched_setaffinity(int(task.name), cores)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main() -> None:
    load_cores: list[set[int]] = [ALL]
    open_process = trio.lowlevel.open_process

    async def pinned_open_process(*args: Any, **kwargs: Any) -> Any:
        process = await open_process(*args, **kwargs)
        pin(process.pid, load_cores[0])  # one thread yet: its later ones inherit
        return process

    trio.lowlevel.open_process = pinned_open_process
    print(f"cores {CORES}; A = {sorted(A)}, B = {sorted(B)}", flush=True)
    async with media.media_stack(None) as stack:
        for placement, where in PLACEMENTS.items():
            for name, mode, load_mode in LOADS:
                other = "media_dir" if mode == "data_uri" else "data_uri"
                pin(os.getpid(), where["rest"])
                pin(stack.processes[0].pid, where["rest"])
                pin(stack.pids[mode], where["gateway"])
                pin(stack.pids[other], where["other"])
                load_cores[0] = where["load"]
                pids = {"gateway": stack.pids[mode], "other gateway": stack.pids[other],
                        "sink": stack.processes[0].pid, "client": os.getpid()}
                marks: list[tuple[str, float, dict[str, float]]] = []

                def progress(line: str, marks: Any = marks, pids: Any = pids) -> None:
                    marks.append((line, time.monotonic(),
                                  {k: cpu_seconds(p) for k, p in pids.items()}))

                result = await media.measure_stall(
                    stack, name, mode, "frames", 63, quick=False,
                    run=f"p{placement}{mode}{load_mode}".replace("-", ""),
                    progress=progress, load_mode=load_mode)
                progress("end")
                print(f"{placement:13} {name:9}: gap p99 with {result.p99('with'):5.1f} ms, "
                      f"without {result.p99('without'):5.1f} ms, ratio {result.ratio:.2f}; "
                      f"by round without {[round(v, 1) for v in result.round_p99s('without')]}"
                      f" with {[round(v, 1) for v in result.round_p99s('with')]}; "
                      f"submits {result.submits}", flush=True)
                for (line, at, cpu), (_, until, cpu_after) in itertools.pairwise(marks):
                    condition = "with" if " with " in line else "without"
                    shares = ", ".join(f"{k} {(cpu_after[k] - cpu[k]) / (until - at):.2f}"
                                       for k in cpu)
                    print(f"    {condition:7} round: cores busy: {shares}", flush=True)
        for pid in [os.getpid(), *(p.pid for p in stack.processes)]:
            pin(pid, ALL)


if __name__ == "__main__":
    trio.run(main)
