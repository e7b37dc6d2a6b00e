"""Client writes and upstream reads per event at N paced streams (strace -c on the gateway)."""
import functools, signal, subprocess, sys, time
import trio
from gateway.tools.bench._stack import Stack, open_sessions, fan_out
from gateway.tools.bench.scenarios import _indexed_gateway_stream
async def main(streams, events, interval_us, out):
    async with Stack() as stack:
        async with open_sessions(stack.endpoint, streams) as sessions:
            spy = subprocess.Popen(["strace", "-c", "-f", "-e", "trace=write,sendto,read,recvfrom,epoll_wait,epoll_ctl", "-o", out, "-p", str(stack.gateway_pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await trio.sleep(1)
            received = []
            await fan_out(streams, functools.partial(_indexed_gateway_stream, sessions, f"replay:timestamped:{events}:{interval_us}:w{time.monotonic_ns()}", received))
            r = await stack.residence()
            spy.send_signal(signal.SIGINT); spy.wait()
            print("events", len(received), "events/read", r.get("events_per_read"))
trio.run(main, int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
