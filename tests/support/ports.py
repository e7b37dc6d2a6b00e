"""An OperationPort that records what an operation sends, and an operation on one: operations
tested alone."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from gateway.nnrp import OPENAI_EVENT_FRAME, DropReason, FrameShape, Stage
from gateway.server import Operation


@attrs.define
class RecordingPort:
    """An OperationPort that records what the operation sent (units alone: no wire)."""

    sent: list[tuple[Any, ...]] = attrs.field(factory=list)
    blocked: trio.Event | None = None
    tokens: frozenset[str] = frozenset()
    progress: list[Stage] = attrs.field(factory=list)
    superseded: bool = False  # a SUPERSEDE of the operation waits for its replacement
    #: How long that SUPERSEDE still waits (None with ``superseded``: over at once).
    hold_left: float | None = None
    frames: list[FrameShape] = attrs.field(factory=list)  # each result's frame shape
    #: Partials per write: each undeferred partial is one, a flush writes the deferred.
    writes: list[int] = attrs.field(factory=list)
    deferred: int = 0
    #: Whether ``ready`` may say yes (as a real port does with room, no window and no
    #: SUPERSEDE waiting); off, every emit takes the waits and checkpoints in them.
    fast: bool = False
    #: How many times an emit or a close waited for room (the slow way).
    waits: int = 0
    #: Nobody reads its results (a detached session), and whether it is held at its
    #: journal's bound.
    unattended: bool = False
    at_bound: bool = False

    def ready(self) -> bool:
        return self.fast and self.blocked is None and self.supersede_hold_left() is None

    async def room(self) -> None:
        self.waits += 1
        if self.blocked is not None:
            await self.blocked.wait()
        await trio.lowlevel.checkpoint()

    async def credit(self) -> None:
        await trio.lowlevel.checkpoint()

    def send_partial(self, body: bytes, *, defer: bool = False) -> None:
        self.sent.append(("partial", body))
        if defer:
            self.deferred += 1
        else:
            self.flush()
            self.writes.append(1)

    def flush(self) -> None:
        if self.deferred:
            self.writes.append(self.deferred)
            self.deferred = 0

    def send_progress(self, stage: Stage) -> None:
        self.progress.append(stage)

    def send_result(self, status: int, payload: bytes, retry_after_ms: int | None,
                    frame: FrameShape = OPENAI_EVENT_FRAME) -> None:
        self.sent.append(("result", status, payload) if retry_after_ms is None
                         else ("result", status, payload, retry_after_ms))
        self.frames.append(frame)

    def send_drop(self, reason: DropReason, diagnostic: bytes, traced: bool) -> None:
        self.sent.append(("drop", reason, diagnostic))

    def negotiated(self, token: str) -> bool:
        return token in self.tokens

    def read_object(self, object_id: int, version: int) -> bytes | str:
        return f"object {object_id} is not declared in this session"

    def read_cached(self, namespace: int, key_hi: int, key_lo: int) -> bytes | str:
        return "the session's cache holds no such entry"

    def supersede_hold_left(self) -> float | None:
        if not self.superseded:
            return None
        return 0.0 if self.hold_left is None else self.hold_left

    def detached(self) -> bool:
        return self.unattended

    def paused(self) -> bool:
        return self.unattended and self.at_bound


def operation(port: RecordingPort, operation_id: int = 1, **kw: Any) -> Operation:
    """An operation of connection 1, session 1, on ``port``; ``deadline_unix_ms`` and
    ``deadline_drop_reason`` as keywords."""
    return Operation(port, connection_id=1, transport="tcp", session_id=1,
                     operation_id=operation_id, frame_id=operation_id, typed_body=None,
                     body_error=None, header_trace_id=0, trace=None,
                     deadline_unix_ms=kw.pop("deadline_unix_ms", None),
                     deadline_drop_reason=kw.pop("deadline_drop_reason", 0))
