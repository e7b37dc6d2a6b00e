"""Connection-level counters, exported by a custom Prometheus collector at scrape time."""

from __future__ import annotations

import attrs


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
