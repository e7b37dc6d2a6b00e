"""Run from the repository, with a real vLLM at VLLM_URL and a gateway serving it at
ENDPOINT (its pid GATEWAY_PID): ``.venv/bin/python docs/bench/issue25-final/live_wakes.py
ENDPOINT GATEWAY_PID STREAMS...``.

Issue 25, row 7: how many times the gateway process is woken per event against a real
vLLM. N concurrent streams (64 greedy tokens each, ignore_eos, three requests a stream);
the gateway's main thread's voluntary context switches (each a sleep in epoll_wait that
ended) and its CPU clock, read from /proc before and after, per event delivered."""
import json
import sys
import time

import trio

sys.path.insert(0, ".")
from gateway import nnrp  # noqa: E402
from gateway.tools.bench._stack import fan_out, open_sessions  # noqa: E402

BODY = {"model": "tiny", "stream": True, "max_tokens": 64, "ignore_eos": True,
        "temperature": 0, "messages": [{"role": "user", "content": "Count slowly."}]}
ENVELOPE = json.dumps({"schema_version": "openai-compatible/1",
                       "operation": "chat.completions.create", "body": BODY}).encode()


def read(pid: int) -> tuple[int, float]:
    switches = 0
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("voluntary_ctxt_switches:"):
            switches = int(line.split()[1])
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / 100  # utime + stime, clock ticks
    return switches, cpu


async def main() -> None:
    endpoint, pid = sys.argv[1], int(sys.argv[2])
    for streams in map(int, sys.argv[3:]):
        events: list[int] = []
        async with open_sessions(endpoint, streams) as sessions:
            async def stream(index: int) -> None:
                for _ in range(3):
                    operation = await sessions[index].submit(ENVELOPE)
                    async for event in operation.events():
                        if isinstance(event, nnrp.PartialReceived):
                            events.append(1)
            await fan_out(streams, stream)  # warm-up round
            events.clear()
            before, start = read(pid), time.perf_counter()
            await fan_out(streams, stream)
            after, wall = read(pid), time.perf_counter() - start
        wakes, cpu = after[0] - before[0], after[1] - before[1]
        print(f"{streams} streams: {len(events)} events in {wall:.1f} s; gateway woken "
              f"{wakes} times ({wakes / len(events):.2f} an event); CPU "
              f"{cpu / len(events) * 1e6:.0f} us an event (10 ms ticks)", flush=True)


trio.run(main)
