"""Flow control the client asks for: its credits, BACKPRESSURE and FLOW_UPDATE gate our output.

Rules (docs/reference/nnrp-wire.md section 3; the reference adapter's pressure.py for what a
window counts):

1. Windows exist per connection, per session and per operation. A BACKPRESSURE or
   CREDIT_UPDATE names its scope with flags (bit0 connection, bit1 operation with scope_id
   = operation_id; neither: the session); a FLOW_UPDATE with its ``scope`` field.
2. Until a client sends one, a scope has no window: output is not limited (a client that
   never speaks flow control is never throttled).
3. A window counts PARTIAL_RESULTs. Each one spends one credit of every scope that applies
   to it (connection, session, operation). Terminals are not gated: once the partials
   before it have gone out, the outcome is always delivered.
4. CREDIT_UPDATE's ``credit_window`` and FLOW_UPDATE's credits set the window (absolute,
   not added; 0 means none left). BACKPRESSURE (levels soft, hard, paused only; level
   none is a malformed BACKPRESSURE) sets a window only when its own is non-zero. Level
   paused holds every partial of the scope until a later update lifts it: a CREDIT_UPDATE
   or BACKPRESSURE below paused, or FLOW_UPDATE resume or grant; FLOW_UPDATE resume
   without credits removes the window altogether. A retry time holds output until it has
   passed.
5. FLOW_UPDATE's credit_epoch is a grant generation: an update older than the last one
   seen for its scope is stale and ignored (epoch 0 is "unnumbered" and always applies).

6. Windows exist only for what is there: an operation window only for an operation in
   flight (the server ignores the rest), forgotten when the operation ends; a session's
   with its session. So a client cannot make the server keep state without bound.

Nothing is dropped: an operation waiting for credit stops reading its upstream, so the
pause reaches vLLM's socket as TCP backpressure and memory stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from ._constants import FlowFlag, FlowReason, FlowScope, PressureFlag, PressureLevel
from ._messages import CreditUpdate

if TYPE_CHECKING:
    from ._messages import Backpressure, FlowUpdate


@attrs.define
class Window:
    """One scope's send window."""

    credits: int | None = None  # None: no window granted, output unlimited (rule 2)
    paused: bool = False
    not_before: float = 0.0
    epoch: int = 0

    def wait(self, now: float) -> float | None:
        """0: may send; seconds until it may; None: until an update (rule 4)."""
        if self.paused or self.credits == 0:
            return None
        return max(0.0, self.not_before - now)


class FlowControl:
    """The client's windows over our output, for one connection."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.connection = Window()
        self.sessions: dict[int, Window] = {}
        self.operations: dict[tuple[int, int], Window] = {}

    @property
    def active(self) -> bool:
        """Whether any client has limited anything (the fast path skips all this)."""
        if self.sessions or self.operations:
            return True
        # Field by field rather than ``!= Window()``: asked once per event, and a fresh
        # Window to compare with showed in the profile.
        connection = self.connection
        return (connection.credits is not None or connection.paused
                or connection.not_before != 0.0 or connection.epoch != 0)

    def _window(self, scope: int, session_id: int, operation_id: int) -> Window:
        if scope == FlowScope.CONNECTION:
            return self.connection
        if scope == FlowScope.OPERATION:
            return self.operations.setdefault((session_id, operation_id), Window())
        return self.sessions.setdefault(session_id, Window())

    def on_pressure(self, message: Backpressure | CreditUpdate, session_id: int) -> None:
        """BACKPRESSURE / CREDIT_UPDATE (rules 1, 4)."""
        if message.flags & PressureFlag.CONNECTION:
            scope = FlowScope.CONNECTION
        elif message.flags & PressureFlag.OPERATION:
            scope = FlowScope.OPERATION
        else:
            scope = FlowScope.SESSION
        window = self._window(scope, session_id, message.scope_id)
        window.paused = message.level == PressureLevel.PAUSED
        if not window.paused and (isinstance(message, CreditUpdate) or message.credit_window):
            window.credits = message.credit_window
        if message.retry_after_ms:
            window.not_before = self._clock() + message.retry_after_ms / 1000

    def on_flow_update(self, message: FlowUpdate, session_id: int) -> bool:
        """FLOW_UPDATE (rules 1, 4, 5). False when it was stale."""
        window = self._window(message.scope, session_id, message.operation_id)
        if message.credit_epoch:
            if message.credit_epoch < window.epoch:
                return False
            window.epoch = message.credit_epoch
        credit = (message.connection_credit, message.session_credit,
                  message.operation_credit)[message.scope]
        if message.reason == FlowReason.PAUSE:
            window.paused = True
        elif message.reason in (FlowReason.RESUME, FlowReason.GRANT):
            window.paused = False
        if message.flags & FlowFlag.CREDIT_VALID and message.reason != FlowReason.PAUSE:
            window.credits = credit
        elif message.reason == FlowReason.RESUME:
            window.credits = None  # resumed without a window: unlimited again
        if message.flags & FlowFlag.RETRY_AFTER_VALID and message.retry_after_ms:
            window.not_before = self._clock() + message.retry_after_ms / 1000
        return True

    def _applicable(self, session_id: int, operation_id: int) -> list[Window]:
        windows = [self.connection]
        session = self.sessions.get(session_id)
        if session is not None:
            windows.append(session)
        operation = self.operations.get((session_id, operation_id))
        if operation is not None:
            windows.append(operation)
        return windows

    def wait(self, session_id: int, operation_id: int) -> float | None:
        """0: the next partial may go now; seconds to wait; None: wait for an update."""
        now = self._clock()
        longest = 0.0
        for window in self._applicable(session_id, operation_id):
            wait = window.wait(now)
            if wait is None:
                return None
            longest = max(longest, wait)
        return longest

    def spend(self, session_id: int, operation_id: int) -> None:
        """One partial went out (rule 3)."""
        for window in self._applicable(session_id, operation_id):
            if window.credits is not None and window.credits > 0:
                window.credits -= 1

    def forget_operation(self, session_id: int, operation_id: int) -> None:
        self.operations.pop((session_id, operation_id), None)

    def forget_session(self, session_id: int) -> None:
        self.sessions.pop(session_id, None)
        for key in [key for key in self.operations if key[0] == session_id]:
            del self.operations[key]
