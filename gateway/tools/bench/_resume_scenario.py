"""9. Resumable sessions: how long a resume takes, what a detached stream
holds, and that all of it is let go when its window passes (``bench run --scenario
resume``; the streams and their cut proxies are ``_resumable``'s)."""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from typing import TYPE_CHECKING

import attrs
import trio

from ._procs import process_rss
from ._resumable import (
    DETACHED,
    HELD_BYTES,
    CutStream,
    CutTally,
    CutTimes,
    released,
    resume_metrics,
)
from ._stack import Progress, Stack, envelope, fan_out
from .stats import Figure, percentile

if TYPE_CHECKING:
    from gateway import nnrp


async def resume(quick: bool, progress: Progress) -> list[Figure]:
    """9. Resumable sessions, on a gateway with a short ``--resume-window``
    (2 s: with 1 s, a loaded 2-core machine let a window pass before the client came
    back, and `bench run --quick` failed) and no residence probe (it keeps a sample per event, which
    the RSS figures would count).

    Resume latency: streams at 20 tokens/s, each on a connection of its own through a
    cut proxy (``_resumable``), which the client resumes by itself after each cut: the
    time from the cut to the first result of the resubmitted operation, one connection
    cut at a time and all of them at once, every operation checked whole (nothing lost,
    nothing twice, vLLM never aborted).

    Memory: rounds of streams read to their end, then their connections cut and not
    resumed: what the gateway holds for them while they are detached
    (``nnrp_gateway_resume_held_bytes``, its RSS), and its RSS once their windows have
    passed. The first round warms the gateway up (connections, upstream pool, allocator)
    and is reported apart; the RSS kept is measured over the rounds after it."""
    window = 2.0
    # Every stream is this one client (one address): the per-client cap must let it
    # hold them all.
    async with Stack(gateway_args=("--resume-window", f"{window:g}", "--metrics",
                                   "--resume-max-sessions-per-client", "256"),
                     residence=False) as stack:
        figures = await _resume_latency(stack, quick, progress)
        figures += await _detached_memory(stack, window, quick, progress)
    return figures


async def _resume_latency(stack: Stack, quick: bool, progress: Progress) -> list[Figure]:
    target = ("127.0.0.1", stack.nnrp_port)
    rng = random.Random(21)
    run = time.monotonic_ns()
    count = 8 if quick else 32
    singles, rounds = (20, 2) if quick else (200, 10)
    # 1.5 s operations at 20 tokens/s (a model's pace, and a load this 2-core machine
    # carries beside the proxies: at 100 tokens/s, 32 streams queued and the resume
    # latency was the queue's); a cut lands past the first token and at least 8 (400 ms)
    # before the last, so the resume is what the stream waits for.
    tokens, interval_us, margin = 30, 50_000, 8
    progress(f"resume: {count} streams, {singles} cuts one at a time, {rounds} of all at once")
    tally = CutTally()
    one, together = CutTimes(), CutTimes()
    delays: list[float] = []

    def delay(event: nnrp.PartialReceived) -> None:
        """The load the resumes ran under: each result's delay, backend write -> here."""
        now = time.monotonic_ns()
        written = json.loads(event.body).get("delta")
        if written is not None and len(delays) < 1_000_000:
            delays.append((now - int(written)) / 1e6)
    async with trio.open_nursery() as proxies:
        async with contextlib.AsyncExitStack() as exits:
            streams = [CutStream(target, tally) for _ in range(count)]
            for stream in streams:
                await stream.open(proxies, exits)
            done = trio.Event()

            async def loop(index: int) -> None:
                number = 0
                while not done.is_set():
                    number += 1
                    await streams[index].run(envelope(
                        f"replay:timestamped:{tokens}:{interval_us}:u{run}-{index}-{number}"),
                        tokens, sample=delay)

            async with trio.open_nursery() as nursery:
                for index in range(count):
                    nursery.start_soon(loop, index)
                for _ in range(singles):
                    stream = await _cuttable(streams, rng, margin)
                    stream.cut(one)
                    with trio.move_on_after(10):
                        await stream.resumed()
                    # The next cut at a random point of the token interval: the first
                    # result after it waits for the next token, on average half of it.
                    await trio.sleep(rng.uniform(0, interval_us / 1e6))
                for _ in range(rounds):
                    with trio.move_on_after(5):  # most of them mid-stream
                        while True:
                            if sum(s.cuttable(margin) for s in streams) >= count * 3 // 4:
                                break
                            await trio.sleep(0.005)
                    cut = [s for s in streams if s.cuttable(margin)]
                    for stream in cut:
                        stream.cut(together)
                    with trio.move_on_after(15):
                        for stream in cut:
                            await stream.resumed()
                    await trio.sleep(0.2)
                done.set()
            tally.count(streams)
            with trio.move_on_after(5):
                for stream in streams:
                    await stream.session.close()  # ended, not left detached
        proxies.cancel_scope.cancel()
    aborted = sum(1 for d in (await stack.backend_log())["disconnects"]
                  if f"u{run}-" in d["request_id"])
    figures = []
    for label, times in (("one connection cut at a time", one),
                         (f"{count} connections cut at once", together)):
        total, unpaced = times.total_ms, times.unpaced_ms
        for q in (0.5, 0.99):
            figures.append(Figure(
                f"resume latency p{int(q * 100)}, {label}", percentile(total, q), "ms",
                spread=f"cut -> first result of the resubmitted operation, p50/p99/max "
                       f"{percentile(total, .5):.1f}/{percentile(total, .99):.1f}/"
                       f"{max(total, default=0):.1f} ms (n={len(total)}); less the wait for "
                       f"the backend's next token {percentile(unpaced, .5):.1f}/"
                       f"{percentile(unpaced, .99):.1f} ms; {count} streams at "
                       f"{1e6 / interval_us:.0f} tokens/s, each its own connection, whose "
                       f"results' delay (backend write -> client, cuts included) was p50/p99 "
                       f"{percentile(delays, .5):.1f}/{percentile(delays, .99):.1f} ms"))
    checked = (f"{tally.whole}/{tally.operations} operations whole; {tally.cuts} cuts, "
               f"{tally.resumes} resumes ({tally.unexpected_reconnects} unexplained) in "
               f"{tally.attempts} attempts, {tally.untimed} untimed; vLLM aborts {aborted}"
               + "".join(f"; {failure}" for failure in tally.failures[:3]))
    return [*figures,
            Figure("events lost across resumes", tally.lost, "events", goal=0, spread=checked),
            Figure("events duplicated across resumes", tally.duplicated, "events", goal=0,
                   spread="a token received twice, or a result the client held sent again"),
            Figure("operations not whole, reordered tokens, cuts not resumed, unexplained "
                   "reconnects, vLLM aborts", tally.incomplete + tally.reordered
                   + tally.cuts_not_resumed + tally.unexpected_reconnects + aborted, "",
                   goal=0, spread=f"{tally.incomplete} / {tally.reordered} / "
                                  f"{tally.cuts_not_resumed} / "
                                  f"{tally.unexpected_reconnects} / {aborted}")]


async def _cuttable(streams: list[CutStream], rng: random.Random, margin: int) -> CutStream:
    with trio.fail_after(10):
        while True:
            candidates = [stream for stream in streams if stream.cuttable(margin)]
            if candidates:
                return rng.choice(candidates)
            await trio.sleep(0.005)


@attrs.frozen
class _DetachedRound:
    """One round of ``_detached_memory``: RSS before, with the streams detached, and
    after their windows; what the gateway said it held; whether it let all go."""

    rss_before: int
    rss_detached: int
    rss_after: int
    #: Held bytes and detached sessions with the streams detached, then once the
    #: windows passed (or when waiting for that gave up).
    held: float
    detached: float
    held_after: float
    detached_after: float
    released_after: float | None
    whole: int


async def _detached_memory(stack: Stack, window: float, quick: bool, progress: Progress
                           ) -> list[Figure]:
    """The memory half of ``resume``: a warm-up round, then ``rounds`` measured."""
    # Ten rounds: the allocator takes memory in steps (a round at times adds a few MiB
    # that later rounds reuse), so the RSS kept per round is a slope, read over many.
    count, tokens, rounds = (20, 200, 1) if quick else (100, 200, 10)
    results = []
    for number in range(rounds + 1):
        progress(f"resume: {count} detached streams of {tokens} tokens, window {window:g} s "
                 f"(round {number + 1} of {rounds + 1})")
        results.append(await _detached_round(stack, window, count, tokens))
    warm, measured = results[0], results[1:]
    last = measured[-1]
    held = last.held / count
    kept = (last.rss_after - measured[0].rss_before) / rounds
    per_stream = sum(r.rss_detached - r.rss_before for r in measured) / rounds / count
    warm_per_stream = (warm.rss_detached - warm.rss_before) / count
    sequence = " -> ".join(f"{r.rss_before / 2**20:.1f}/{r.rss_detached / 2**20:.1f}"
                           for r in results) + f" -> {last.rss_after / 2**20:.1f}"
    left = sum(r.detached_after + r.held_after for r in results)
    slowest = max((r.released_after or math.inf) for r in results)
    return [
        Figure(f"result bytes held per detached stream ({tokens} tokens)", held / 1024, "KiB",
               spread=f"nnrp_gateway_resume_held_bytes {last.held / 2**20:.2f} MiB for "
                      f"{last.detached:.0f} detached sessions ({held / (tokens + 1):.0f} B per "
                      f"event); {sum(r.whole for r in results)}/{count * (rounds + 1)} "
                      f"streams whole before their cut"),
        Figure(f"gateway RSS per detached stream ({count} streams)", per_stream / 1024, "KiB",
               spread=f"RSS with the streams detached over before, mean of {rounds} rounds "
                      f"after a warm-up round ({warm_per_stream / 1024:.1f} KiB a stream in "
                      f"that one: its first connections, upstream pool, allocator)"),
        Figure("gateway RSS kept per round once the windows passed", kept / 1024, "KiB",
               goal=round(held * count / 2 / 1024, 1),
               spread=f"(RSS after the last round - before the first measured) / {rounds}; "
                      f"goal: half what a round's detached streams held (keeping that would "
                      f"be all of it, each round); RSS MiB before/detached per round: "
                      f"{sequence}"),
        Figure("sessions detached and result bytes held once the windows passed", left, "",
               goal=0, spread=f"summed over the rounds; the slowest round let all go "
                              f"{slowest:.1f} s after its cut (window {window:g} s)"),
    ]


async def _detached_round(stack: Stack, window: float, count: int, tokens: int
                          ) -> _DetachedRound:
    pid = stack.gateway_pid
    run = time.monotonic_ns()
    with trio.move_on_after(window + 10):
        await released(stack.admin_url)
    rss_before = process_rss(pid)
    tally = CutTally()
    samples: dict[str, float] = {}
    async with trio.open_nursery() as proxies:
        async with contextlib.AsyncExitStack() as exits:
            streams = [CutStream(("127.0.0.1", stack.nnrp_port), tally) for _ in range(count)]
            for stream in streams:
                await stream.open(proxies, exits, reconnect=False)
            # 0.1 ms apart, so each token is a write of its own with a time of its own.
            await fan_out(count, lambda i: streams[i].run(envelope(
                f"replay:timestamped:{tokens}:100:m{run}-{i}"), tokens))
            for stream in streams:
                stream.cut()  # not resumed: the session stays detached on the gateway
            cut_at = trio.current_time()
            with trio.move_on_after(window / 2):
                while True:
                    samples = await resume_metrics(stack.admin_url)
                    if samples.get(DETACHED) == count:
                        break
                    await trio.sleep(0.02)
            rss_detached = process_rss(pid)
        proxies.cancel_scope.cancel()
    released_after = None
    with trio.move_on_after(window + 10):
        await released(stack.admin_url)
        released_after = trio.current_time() - cut_at
    after = await resume_metrics(stack.admin_url)
    await trio.sleep(0.2)
    return _DetachedRound(rss_before, rss_detached, process_rss(pid),
                          samples.get(HELD_BYTES, 0.0), samples.get(DETACHED, 0.0),
                          after.get(HELD_BYTES, -1.0), after.get(DETACHED, -1.0),
                          released_after, tally.whole)
