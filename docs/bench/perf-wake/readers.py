"""Per-operation reader tasks vs one reader for many upstream sockets (issue 25 item 4).

N socket pairs; a feeder process writes one small message to each of its ends every
INTERVAL (N streams x 1/INTERVAL events/s, as the paced load); this process reads them:
  per-op:      N tasks, each gateway._sockio.receive_some (trio wait_readable + read)
  one-reader:  one task waits on a private epoll holding every socket (registered once,
               level-triggered), reads each ready one and hands the bytes to its
               operation's task (trio.lowlevel.reschedule): the operation stays the owner
  inline:      one task reads and does the work itself (no hand-over: the lower bound)
Reports this process's CPU per event (the kernel's clock)."""
import os, select, socket, sys, time, multiprocessing
import outcome
import trio
from gateway import _sockio

MSG = b"data: " + b"x" * 120 + b"\n\n"

def feeder(fds, rounds, interval, go):
    socks = [socket.socket(fileno=fd) for fd in fds]
    go.wait()
    start = time.perf_counter()
    for r in range(rounds):
        for s in socks:
            s.send(MSG)
        wait = start + (r + 1) * interval - time.perf_counter()
        if wait > 0:
            time.sleep(wait)

async def per_op(socks, rounds):
    count = [0]
    async def one(s):
        n = 0
        while n < rounds * len(MSG):
            data = await _sockio.receive_some(s, 65536, likely_empty=True)
            n += len(data)
            count[0] += data.count(b"\n\n")
    async with trio.open_nursery() as nursery:
        for s in socks:
            nursery.start_soon(one, s)
    return count[0]

async def one_reader(socks, rounds, inline):
    ep = select.epoll()
    waiting = {}
    pending = {}
    received = {}
    count = [0]
    for s in socks:
        ep.register(s.fileno(), select.EPOLLIN)
        received[s.fileno()] = 0
    total = rounds * len(MSG)
    left = [len(socks)]
    done = trio.Event()
    async def op(fd):
        n = 0
        while n < total:
            def abort(_):
                del waiting[fd]
                return trio.lowlevel.Abort.SUCCEEDED
            if pending.get(fd):
                data = pending.pop(fd)
                await trio.lowlevel.checkpoint()
            else:
                waiting[fd] = trio.lowlevel.current_task()
                data = await trio.lowlevel.wait_task_rescheduled(abort)
            n += len(data)
            count[0] += data.count(b"\n\n")
    async def reader():
        while left[0]:
            await trio.lowlevel.wait_readable(ep.fileno())
            for fd, _ in ep.poll(0):
                data = os.read(fd, 65536)
                if inline:
                    count[0] += data.count(b"\n\n")
                    received[fd] += len(data)
                    if received[fd] >= total:
                        ep.unregister(fd); left[0] -= 1
                    continue
                task = waiting.pop(fd, None)
                if task is None:  # its task has not parked again yet: it takes it next
                    pending[fd] = pending.get(fd, b"") + data
                else:
                    trio.lowlevel.reschedule(task, outcome.Value(data))
                received[fd] += len(data)
                if received[fd] >= total:
                    ep.unregister(fd); left[0] -= 1
    async with trio.open_nursery() as nursery:
        if not inline:
            for s in socks:
                nursery.start_soon(op, s.fileno())
            await trio.sleep(0.05)
        nursery.start_soon(reader)
    return count[0]

def run(variant, n, rounds, interval):
    pairs = [socket.socketpair() for _ in range(n)]
    mine = [a for a, _ in pairs]
    for s in mine:
        s.setblocking(False)
    go = multiprocessing.Event()
    p = multiprocessing.get_context("fork").Process(target=feeder, args=([b.fileno() for _, b in pairs], rounds, interval, go))
    p.start()
    for _, b in pairs:
        b.close()
    async def main():
        await trio.sleep(0.1)
        c0 = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
        go.set()
        if variant == "per-op":
            events = await per_op(mine, rounds)
        else:
            events = await one_reader(mine, rounds, variant == "inline")
        return events, time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID) - c0
    events, cpu = trio.run(main)
    p.join()
    return events, cpu

if __name__ == "__main__":
    n, rounds, interval = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    for rep in range(int(sys.argv[4])):
        for variant in ("per-op", "one-reader", "inline"):
            events, cpu = run(variant, n, rounds, interval)
            print(f"{variant:11s} n={n} events={events} cpu/event={cpu / events * 1e6:.2f} us", flush=True)
