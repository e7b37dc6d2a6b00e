"""A sans-IO server connection with one session open, as the runtime-controls tests and
the server's unit tests drive it: the hello, the open, the tokens it grants, a submit."""

from __future__ import annotations

from typing import Any

from gateway import nnrp
from tests.support.wire import pk

HELLO = nnrp.ClientHello(profile_bitmap=0b11)
OPEN = nnrp.SessionOpen(profile_id=2, schema_id=0x1001, schema_version=3, max_in_flight=2)
TOKENS = frozenset({"control.cancel_abort", "control.credit_backpressure",
                    "control.progress_partial", "control.trace_context"})


def submit(operation_id: int, frame_id: int, session_id: int = 1, **kw: Any) -> bytes:
    return pk(nnrp.FrameSubmit(operation_id=operation_id, payload_kind_bitmap=0x10,
                               payload_frame_count=1),
              session_id=session_id, frame_id=frame_id, body=nnrp.pack_single_frame(b"{}"),
              **kw)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def connected(**config: Any) -> nnrp.ServerConnection:
    clock = config.pop("clock", Clock())
    config.setdefault("max_in_flight", 2)
    conn = nnrp.ServerConnection(nnrp.ServerConfig(
        runtime_tokens=config.pop("tokens", TOKENS), **config), clock=clock)
    conn.receive_data(pk(HELLO) + pk(OPEN))
    return conn
