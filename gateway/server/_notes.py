"""``OperationNotes``, apart from ``_operation``: that module is compiled in the compiled
build (gateway/compiled.py), and an observer subclasses the notes (``RecordNotes``), which
compiled code would refuse where it is passed (rule 7). It stays interpreted."""

from __future__ import annotations

import time

import attrs
import trio


@attrs.define
class OperationNotes:
    """What the engine notes of one operation for its observers (the observation record)
    and never reads back, written as it happens: the transport it came by, when it
    arrived (monotonic, and on the wall clock: trio's clock has no epoch), when its
    handler started, its first and last event, the widest gap between two, the bytes it
    sent, the PRIORITY_UPDATEs it got, when its session was resumed or migrated while it
    ran, and the events replayed to the client. An observer's subclass adds what the
    handler notes (``GatewayServer(notes=...)``)."""

    transport: str
    received_at: float = attrs.field(factory=trio.current_time)
    received_unix_ns: int = attrs.field(factory=time.time_ns)
    started_at: float | None = None
    first_event_at: float | None = None
    last_event_at: float | None = None
    max_gap: float = 0.0
    bytes_sent: int = 0
    priority_updates: int = 0
    reattached_at: list[float] = attrs.field(factory=list)
    replayed_events: int = 0
