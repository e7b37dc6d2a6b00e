"""Residence time: how long a streamed event spends inside the gateway, a benchmark probe.

    upstream bytes read (``upstream._stream``)  ──▶  translate, encode, queue  ──▶
        its NNRP bytes handed to the socket (the connection's writer)  =  one sample

It separates the time an event spends in the gateway's hands from the rest of a
benchmark's path: a load generator and a backend sharing two cores with the
gateway make end-to-end latency a figure of the machine. What it covers exactly: from
the moment the operation's task has the body bytes (one read of the upstream socket,
de-chunked; bytes waiting in the kernel before that are not in it) to the moment the
writer has handed the packet to the socket, so time waiting on the client (backpressure,
flow control) and for the connection's writer is in it. "Reads" counts those reads.

It attaches from outside the write path. ``serve --bench-residence`` builds one and the
app installs its two observers for its run: ``read`` as the upstream's read observer
(``upstream.observe_reads``: the reading task's context variable gets the read time) and
``queued`` as the engine's partial observer (``server.observe_partials``: told of each
PARTIAL_RESULT put on an outbox, by the task that read its bytes). The probe keeps each
outbox's stamps itself, numbered by the outbox's packets, and wraps that outbox's
``on_written`` hook the first time, so it learns when they are on the socket. Not
installed (production), the outbox carries nothing for it and the cost is one ``is None``
check per upstream read and per partial. Read at the admin listener's
``/debug/residence``.
"""

from __future__ import annotations

import collections
import contextvars
import time
from collections.abc import Callable
from typing import Any, Protocol

#: When (perf_counter ns) this task last read upstream bytes.
_read_at: contextvars.ContextVar[int] = contextvars.ContextVar("nnrp_gateway_read_at")
#: Samples kept between two ``take``s (some 40 MB of Python ints at most): a probe left
#: on stays bounded; past it, samples are counted as dropped.
MAX_SAMPLES = 1 << 20

#: An outbox's written hook: (bytes, packets) as they reach the transport, in order.
WrittenHook = Callable[[int, int], None]


class Watched(Protocol):
    """What the probe needs of an outbox (``server._outbox.Outbox``)."""

    on_written: WrittenHook

    @property
    def packets_unwritten(self) -> int: ...

    @property
    def closed(self) -> bool: ...


class ResidenceProbe:
    """Samples since the last ``take``: residence per event, reads, events."""

    def __init__(self) -> None:
        self.samples_ns: list[int] = []
        self.reads = 0
        self.dropped = 0

    def read(self) -> None:
        """The calling task just got an HTTP body chunk from upstream."""
        self.reads += 1
        _read_at.set(time.perf_counter_ns())

    def queued(self, outbox: Watched) -> None:
        """The calling task just put a partial on ``outbox`` (its last packet): it gets
        the task's last read time, sampled once the outbox has written it."""
        read_at = _read_at.get(None)
        if read_at is None or outbox.closed:  # never read upstream; or put to no one
            return
        watch = outbox.on_written
        if not isinstance(watch, _Watch):
            watch = outbox.on_written = _Watch(self, watch)
        watch.stamps.append((watch.written + outbox.packets_unwritten - 1, read_at))

    def written(self, read_at: list[int]) -> None:
        """Packets stamped ``read_at`` were just handed to the socket."""
        if len(self.samples_ns) >= MAX_SAMPLES:
            self.dropped += len(read_at)
            return
        now = time.perf_counter_ns()
        self.samples_ns.extend(now - stamp for stamp in read_at)

    def take(self) -> dict[str, Any]:
        """The figures so far (microseconds), and start again."""
        samples = sorted(self.samples_ns)
        reads, dropped = self.reads, self.dropped
        self.samples_ns, self.reads, self.dropped = [], 0, 0

        def percentile(q: float) -> float | None:
            if not samples:
                return None
            return samples[min(len(samples) - 1, int(q * len(samples)))] / 1000

        events = len(samples) + dropped
        return {"events": events, "reads": reads, "dropped": dropped,
                "events_per_read": events / reads if reads else None,
                "p50_us": percentile(0.50), "p99_us": percentile(0.99),
                "max_us": samples[-1] / 1000 if samples else None}


class _Watch:
    """One outbox's written hook as the probe wraps it: packets counted as they are
    written, the stamps of its partials by packet number (from the wrapping on)."""

    __slots__ = ("_inner", "_probe", "stamps", "written")

    def __init__(self, probe: ResidenceProbe, inner: WrittenHook) -> None:
        self._probe = probe
        self._inner = inner
        #: Packets written since the probe wrapped the hook.
        self.written = 0
        #: (packet number, read time) of the partials not yet written, in order.
        self.stamps: collections.deque[tuple[int, int]] = collections.deque()

    def __call__(self, nbytes: int, packets: int) -> None:
        if packets:
            self.written += packets
            stamps = self.stamps
            if stamps and stamps[0][0] < self.written:
                done = []
                while stamps and stamps[0][0] < self.written:
                    done.append(stamps.popleft()[1])
                self._probe.written(done)
        self._inner(nbytes, packets)
