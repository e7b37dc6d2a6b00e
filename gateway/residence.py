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

Off in production: it is switched on by ``serve --bench-residence`` (hidden) and read at
the admin listener's ``/debug/residence``. Off, its cost is one module-global check per
upstream read and per partial. The read time travels with the operation's task in a
context variable (the task that reads upstream is the task that queues the partial),
then with the packet in the outbox (``server._outbox``) to the writer.
"""

from __future__ import annotations

import contextvars
import time
from typing import Any

#: When (perf_counter ns) this task last read upstream bytes.
_read_at: contextvars.ContextVar[int] = contextvars.ContextVar("nnrp_gateway_read_at")
#: Samples kept between two ``take``s (some 40 MB of Python ints at most): a probe left
#: on stays bounded; past it, samples are counted as dropped.
MAX_SAMPLES = 1 << 20


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

    @staticmethod
    def read_at() -> int | None:
        """When the calling task last read upstream (None: it never did)."""
        return _read_at.get(None)

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


#: The process's probe; None (the default) in production.
PROBE: ResidenceProbe | None = None


def enable() -> ResidenceProbe:
    """Switch the probe on for this process (``serve --bench-residence``)."""
    global PROBE
    if PROBE is None:
        PROBE = ResidenceProbe()
    return PROBE


def disable() -> None:
    """Switch the probe off again (tests; a process under benchmark keeps it on)."""
    global PROBE
    PROBE = None
