"""One NNRP session: it owns its operations, and has one drain.

The session starts each operation in the connection's nursery, forgets it when it has
ended, and reports it to the observer. ``drain`` is the one way a session stops:
SESSION_CLOSE (drain or abort), the gateway's shutdown and a closing connection all use
it. It lets operations finish for a grace period, ends the rest with ``cause``, and
returns once every operation task has ended.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
import trio

from gateway.profile import EndCause

from ._operation import CancelInfo, Operation, OperationHandler

if TYPE_CHECKING:
    from ._stats import ServerStats

log = structlog.get_logger("gateway.server")

#: Told of every operation once it has ended (the observation record is built from it).
Observer = Callable[[Operation], None]


class Session:
    def __init__(self, session_id: int, nursery: trio.Nursery, handler: OperationHandler,
                 observer: Observer | None, stats: ServerStats) -> None:
        self.session_id = session_id
        self._nursery = nursery
        self._handler = handler
        self._observer = observer
        self._stats = stats
        self.operations: dict[int, Operation] = {}
        self._idle = trio.Event()
        self._idle.set()

    def start(self, operation: Operation) -> None:
        self.operations[operation.operation_id] = operation
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        self._nursery.start_soon(self._run, operation)

    async def _run(self, operation: Operation) -> None:
        self._stats.inflight += 1
        try:
            await operation.run(self._handler)
        finally:
            del self.operations[operation.operation_id]
            self._stats.inflight -= 1
            if not self.operations:
                self._idle.set()
            if self._observer is not None:
                try:
                    self._observer(operation)
                except Exception:
                    log.exception("operation observer failed")

    def cancel(self, operation_id: int, cause: EndCause, info: CancelInfo | None = None
               ) -> None:
        operation = self.operations.get(operation_id)
        if operation is not None:
            operation.cancel(cause, info)

    def cancel_all(self, cause: EndCause) -> None:
        for operation in list(self.operations.values()):
            operation.cancel(cause)

    async def drain(self, grace: float = math.inf, cause: EndCause = EndCause.SHUTDOWN
                    ) -> None:
        """Let in-flight operations finish for ``grace`` seconds, end the rest with
        ``cause``, and wait until every one has sent its terminal."""
        with trio.move_on_after(grace):
            await self._idle.wait()
        self.cancel_all(cause)
        await self._idle.wait()
