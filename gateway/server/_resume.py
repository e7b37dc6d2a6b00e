"""Resumable sessions in the I/O layer: where their operations run, the one timer of
their windows, and which connection holds which protocol state.

Every decision about them (who gets resume, which token opens what, when a window
passes, what a client may hold) is the sans-IO ``SessionBook``'s
(gateway/nnrp/_resumption.py, rules R1-R12). This module only carries those decisions
out in time and across tasks:

1. The resumable sessions' operations run in ``run``'s nursery: they may outlive any
   one connection.
2. One timer task sleeps until the book's next deadline and applies what ``expire``
   returns: a detached session past its window ends (its operations are cancelled: vLLM
   aborts; during a drain, as a shutdown), and a resumed session's operations not
   resubmitted in time end unseen. A new earlier deadline wakes it.
3. A session's journal is cleared once its operations have ended (a running operation
   may still write to it until its terminal).
4. Drain: the book stops granting and clips every window to the drain's end (R12); the
   server keeps accepting while a resumable session lives, so a client that lost its
   connection can collect what finished while it was away (``GatewayServer.shutdown``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import structlog
import trio

from gateway.nnrp import (
    Expiry,
    ExpiryKind,
    ResumePolicy,
    ServerConnection,
    SessionBook,
    SessionIds,
)
from gateway.profile import EndCause

if TYPE_CHECKING:
    from gateway.nnrp import Budget

    from ._session import Session


class Attached(Protocol):
    """A connection of this process, as the sessions' events need it (``Connection``)."""

    def probe(self, ping: bytes, timeout: float) -> None: ...

    def take_session(self, session_id: int, notice: bytes) -> None: ...

log = structlog.get_logger("gateway.server")

class SessionRegistry:
    """The I/O side of the process's resumable sessions (rules 1-5)."""

    def __init__(self, settings: ResumePolicy | None = None, *,
                 ids: SessionIds | None = None) -> None:
        self.settings = settings or ResumePolicy()
        self.book = SessionBook(self.settings, ids=ids, clock=trio.current_time)
        self.book.on_earlier_deadline = self._deadline_changed
        self.stats = self.book.stats
        #: The I/O session of every resumable session (attached or detached), by id.
        self.by_id: dict[int, Session] = {}
        self._connections: dict[ServerConnection, Attached] = {}
        self._nursery: trio.Nursery | None = None
        self._wake = trio.Event()
        self._stopped = trio.Event()
        self._running = False
        #: Set (and replaced) whenever a session detaches, is resumed or ends.
        self._sessions_changed = trio.Event()

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None, "SessionRegistry.run() is not running"
        return self._nursery

    @property
    def budget(self) -> Budget:
        """Every journal's bytes together (``--resume-max-bytes``)."""
        return self.book.total

    @property
    def sessions(self) -> int:
        """Resumable sessions, attached or detached."""
        return self.book.sessions

    @property
    def detached(self) -> int:
        return self.book.detached

    @property
    def draining(self) -> bool:
        return self.book.draining

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Host the resumable sessions' operations (rule 1) and the windows' timer (rule
        2) until the drain is over; the operations still running are waited for."""
        async with trio.open_nursery() as operations:
            self._nursery = operations
            self._running = True
            timer = trio.CancelScope()
            operations.start_soon(self._timer, timer)
            task_status.started()
            try:
                await self._stopped.wait()
            finally:
                self._running = False
                timer.cancel()

    async def _timer(self, scope: trio.CancelScope) -> None:
        """Rule 2."""
        with scope:
            while True:
                deadline = self.book.next_deadline()
                with trio.move_on_at(math.inf if deadline is None else deadline):
                    await self._wake.wait()
                self._wake = trio.Event()
                for expiry in self.book.expire():
                    try:
                        self._apply(expiry)
                    except Exception:  # a timer must never take the server down
                        log.exception("resume window expiry failed",
                                      session_id=expiry.record.session.session_id)

    def _deadline_changed(self) -> None:
        self._wake.set()

    def _apply(self, expiry: Expiry) -> None:
        session_id = expiry.record.session.session_id
        session = self.by_id.get(session_id)
        if session is None:
            return
        if expiry.kind is ExpiryKind.WINDOW:
            cause = EndCause.SHUTDOWN if self.book.draining else EndCause.RESUME_EXPIRED
            log.info("resume window passed; session ends", session_id=session_id,
                     window_s=self.settings.window, draining=self.book.draining)
            self.ended(session, cause)
            return
        for operation_id in expiry.abandoned:
            session.cancel(operation_id, EndCause.RESUME_EXPIRED)

    # ------------------------------------------------------------------ connections

    def register(self, protocol: ServerConnection, connection: Attached) -> None:
        self._connections[protocol] = connection

    def unregister(self, protocol: ServerConnection) -> None:
        self._connections.pop(protocol, None)

    def connection_of(self, protocol: object) -> Attached | None:
        """The I/O connection of a protocol state a sans-IO event names."""
        return self._connections.get(protocol) if isinstance(
            protocol, ServerConnection) else None

    # ------------------------------------------------------------------ sessions

    def adopt(self, session: Session) -> None:
        """A session granted resume: its I/O side, kept here for as long as it lives."""
        self.by_id[session.session_id] = session

    def sessions_changed(self) -> None:
        """Sessions of this process detached, were resumed or ended: whoever waits on
        them (the drain) looks again."""
        self._sessions_changed.set()
        self._sessions_changed = trio.Event()

    def ended(self, session: Session, cause: EndCause | None = None) -> None:
        """The session is over (its record ended in the book): ``cause`` ends its
        operations, and its journal is cleared once they have (rule 3)."""
        if self.by_id.get(session.session_id) is session:
            del self.by_id[session.session_id]
        self.sessions_changed()
        if cause is not None:
            session.cancel_all(cause)
        if self._running:
            self.nursery.start_soon(self._forget_when_idle, session)
        else:  # nobody left to wait for
            self._forget(session)

    async def _forget_when_idle(self, session: Session) -> None:
        await session.wait_idle()
        try:
            self._forget(session)
        except Exception:  # never the registry's end
            log.exception("forgetting a session's journal failed",
                          session_id=session.session_id)

    def _forget(self, session: Session) -> None:
        journal = session.protocol.journal
        if journal is not None:
            journal.clear()
            for budget in journal.bounds:
                budget.waiting.discard(session)
        record_client = session.client
        if record_client is not None:
            self.book.forget_client_if_idle(record_client)

    # ------------------------------------------------------------------ drain (rule 5)

    def start_draining(self, deadline: float) -> None:
        self.book.start_draining(deadline)

    async def wait_no_sessions(self) -> None:
        """Until no resumable session lives (attached or detached)."""
        while self.book.sessions:
            await self._sessions_changed.wait()

    def finish(self) -> None:
        """The drain is over: every session still detached ends (a shutdown), and the
        operations' nursery closes once they have."""
        for record in self.book.close():
            session = self.by_id.get(record.session.session_id)
            if session is not None:
                self.ended(session, EndCause.SHUTDOWN)
        self._stopped.set()
