"""Gateway CPU per request: many short streams (fixed cost) and unary, sequential and 16 in flight."""
import functools, sys, time, subprocess, signal
import trio
from gateway.tools.bench._stack import Stack, open_sessions, fan_out, envelope
from gateway.tools.bench._procs import process_cpu_seconds
from gateway.tools.bench.scenarios import _indexed_gateway_stream
from gateway.tools.client import connect

async def streams(stack, events, concurrent, requests, tag):
    received = []
    async with open_sessions(stack.endpoint, concurrent) as sessions:
        cpu = process_cpu_seconds(stack.gateway_pid)
        t = time.perf_counter()
        async def worker(i):
            for r in range(requests // concurrent):
                await _indexed_gateway_stream(sessions, f"replay:timestamped:{events}:0:{tag}{r}", received, i)
        await fan_out(concurrent, worker)
        cpu = process_cpu_seconds(stack.gateway_pid) - cpu
        wall = time.perf_counter() - t
    print(f"{tag}: {events} events x {requests} req, {concurrent} conc: CPU/request {cpu/requests*1e6:.0f} us, per event {cpu/max(len(received),1)*1e6:.1f} us, wall/request {wall/requests*1e6:.0f} us", flush=True)

async def main():
    spy = (sys.argv[1] if len(sys.argv) > 1 else None) or None
    async with Stack(gateway_args=("--max-sessions-per-connection", "1024")) as stack:
        p = None
        if spy:
            p = subprocess.Popen(["/work/main/.venv/bin/py-spy", "record", "--pid", str(stack.gateway_pid), "--rate", "250", "--format", "raw", "--nolineno", "--output", spy], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await trio.sleep(2)
        mode = sys.argv[2] if len(sys.argv) > 2 else "all"
        for rnd in range(2):
            if mode in ("all", "s1"): await streams(stack, 1, 1, 300, f"s1-{rnd}-")
            if mode in ("all", "s16"): await streams(stack, 1, 16, 1600, f"s16-{rnd}-")
            if mode in ("all", "e56"): await streams(stack, 56, 16, 800, f"e56-{rnd}-")
        if p:
            p.send_signal(signal.SIGINT); p.wait()

trio.run(main)
