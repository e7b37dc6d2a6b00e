"""Connection-level counters, exported by a custom Prometheus collector at scrape time,
and the log lines a client could otherwise multiply (one per refusal it collects)."""

from __future__ import annotations

import math
from typing import Any

import attrs
import structlog
import trio

log = structlog.get_logger("gateway.server")


class Notice:
    """One kind of log line a client can provoke at will (a refused resume, a failed
    authentication, a relay): written at most once per ``interval`` seconds, with how
    many there were since the last one (a client guessing tokens wrote a line
    per guess)."""

    def __init__(self, event: str, level: str = "info", interval: float = 1.0) -> None:
        self.event = event
        self.level = level
        self.interval = interval
        self._next_line = -math.inf
        self._count = 0

    def note(self, **fields: Any) -> None:
        self._count += 1
        now = trio.current_time()
        if now < self._next_line:
            return
        getattr(log, self.level)(self.event, count=self._count, **fields)
        self._count = 0
        self._next_line = now + self.interval


@attrs.define
class Notices:
    """The rate-limited lines of a server (``Notice``)."""

    auth_failed: Notice = attrs.field(
        factory=lambda: Notice("session authentication failed", "warning"))
    resume_refused: Notice = attrs.field(factory=lambda: Notice("resume refused"))
    rate_limited: Notice = attrs.field(
        factory=lambda: Notice("refusals rate-limited on a connection", "warning"))
    not_granted: Notice = attrs.field(factory=lambda: Notice("session opened without resume"))
    relayed: Notice = attrs.field(
        factory=lambda: Notice("resume relayed to the worker holding the session"))


@attrs.define
class ServerStats:
    """Counters shared by a server's connections (exported at scrape time, no locks)."""

    connections_active: int = 0
    connections_total: int = 0
    connections_refused: int = 0
    sessions_active: int = 0
    sessions_total: int = 0
    sessions_refused: int = 0
    #: Sessions opened, by the transport kind of their connection (tcp, ipc, websocket,
    #: quic): which listener of the set served them.
    sessions_by_transport: dict[str, int] = attrs.field(factory=dict)
    refused_submits: int = 0
    ignored_frames: int = 0
    inflight: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    frames_out: int = 0
    protocol_errors: int = 0
    auth_failures: int = 0
    #: Session opens and resumes answered without a look (a connection past its rate).
    refusals_rate_limited: int = 0
    notices: Notices = attrs.field(factory=Notices, repr=False)
