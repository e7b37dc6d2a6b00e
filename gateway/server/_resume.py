"""Resumable sessions: the registry that keeps them between connections.

Rules (issue 21; README "Resumable sessions"; the connection's side is
``gateway.nnrp._server`` rule 4):

1. Granted to a SESSION_OPEN with ``allow_resume`` while resume is on (``window`` > 0)
   and fewer than ``max_sessions`` resumable sessions exist, attached or detached. At
   the cap a session opens without resume (``resume_enabled`` clear: the client sees
   it did not get it), so every window that was granted is honoured.
2. Tokens: ``token_bytes`` (24, as nnrp-py's server) from the OS CSPRNG, a new one on
   every resume (a token is good once), compared in constant time, bound to the
   credentials that opened the session when session auth is on, never logged.
3. A session detaches when its connection ends without SESSION_CLOSE (EOF, reset,
   keepalive loss, idle cut, QUIC loss): its operations keep running and write to its
   journal (``_journal``), and its window starts. A connection that fails (a protocol
   violation) or a session that is closing ends instead.
4. Resume (a token for a detached session within its window) attaches the session to
   the new connection; its held operations wait for their resubmission. The token of a
   session still attached is answered retry_later: the old connection's end has not
   been seen yet (a cut without a FIN or RST is found by keepalive or the write timeout).
5. Expiry: a session still detached when its window passes ends: its operations are
   cancelled (vLLM aborts), as if the client had (cause ``resume_expired``). After a
   resume, the operations not resubmitted within the window end the same way.
6. Migration takes the session from wherever it is, a live connection included (the
   client moves), without rotating the token (SESSION_MIGRATE_ACK cannot carry one).
7. Workers (``--workers N``): a token's first byte is the worker that issued it. A
   resume or migration naming another worker's session, first thing on a connection,
   is relayed to that worker whole (``_relay``); anywhere else it is refused.
8. Drain (SIGTERM): no new windows. Detached sessions drain like attached ones (their
   operations finish within the drain time or end); a session whose connection ends
   during the drain ends; resumes are refused retry_later.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Collection
from typing import Protocol

import attrs
import structlog
import trio

from gateway.nnrp import ResumeGrant, ResumeRefused, ServerSession, SessionState
from gateway.profile import EndCause

from ._journal import Budget, Journal
from ._session import Session

log = structlog.get_logger("gateway.server")


@attrs.frozen
class ResumeSettings:
    """What resume costs and allows (``--resume-*``)."""

    #: Seconds a detached session waits for its client; 0 turns resume off.
    window: float = 120.0
    #: Resumable sessions per gateway process, attached or detached.
    max_sessions: int = 1024
    #: Result bytes one session keeps for a replay.
    session_bytes: int = 4 << 20
    #: Result bytes all sessions of the process keep together.
    total_bytes: int = 256 << 20
    token_bytes: int = 24
    #: With ``--workers``: this process's index, and every worker's relay socket (rule 7).
    worker: int = 0
    relays: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.window > 0

    @property
    def window_ms(self) -> int:
        return min(int(self.window * 1000), 0xFFFFFFFF)


@attrs.define
class ResumeStats:
    """Counters for the metrics (exported at scrape time)."""

    detached_total: int = 0
    resumed_total: int = 0
    migrated_total: int = 0
    expired_total: int = 0
    refused_total: int = 0
    relayed_total: int = 0
    replayed_events_total: int = 0
    replayed_bytes_total: int = 0


class Holder(Protocol):
    """A connection, as the registry sees it: it can let a session go elsewhere, and say
    whether it could still be relayed whole to another worker (rule 7)."""

    def release_session(self, session_id: int) -> None: ...

    def can_hand_off(self) -> bool: ...


@attrs.define(eq=False)
class Record:
    protocol: ServerSession
    #: Secrets: never in a repr (a traceback with locals, a debug line).
    token: bytes = attrs.field(repr=False)
    identity: bytes = attrs.field(repr=False)
    #: The I/O session, once the connection that opened it has made it.
    session: Session | None = None
    holder: Holder | None = None
    #: The window running while detached (rule 5), and the one for resubmissions after
    #: a resume: each a timer task's scope, cancelled when the window no longer applies.
    detached_window: trio.CancelScope | None = None
    awaiting_window: trio.CancelScope | None = None
    ended: bool = False

    def cancel_windows(self) -> None:
        for window in (self.detached_window, self.awaiting_window):
            if window is not None:
                window.cancel()
        self.detached_window = self.awaiting_window = None


def _key(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def _forget(session: Session) -> None:
    if session.journal is not None:
        session.journal.clear()
        session.journal.shared.waiting.discard(session)
        session.release_journal()


class SessionRegistry:
    """Every resumable session of this process (rules 1-8). ``run`` hosts the resumable
    sessions' operations, which outlive any one connection."""

    def __init__(self, settings: ResumeSettings | None = None) -> None:
        self.settings = settings or ResumeSettings()
        self.budget = Budget(self.settings.total_bytes)
        self.stats = ResumeStats()
        self._records: dict[bytes, Record] = {}
        self._nursery: trio.Nursery | None = None
        self._timers: trio.Nursery | None = None
        self._stopped = trio.Event()
        self._running = False
        self.draining = False

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None, "SessionRegistry.run() is not running"
        return self._nursery

    @property
    def sessions(self) -> int:
        return len(self._records)

    @property
    def detached(self) -> int:
        return sum(1 for record in self._records.values() if record.holder is None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Host the resumable sessions' operations until the drain is over, and their
        windows' timers until then (the operations still running are waited for)."""
        async with trio.open_nursery() as operations, trio.open_nursery() as timers:
            self._nursery, self._timers = operations, timers
            self._running = True
            task_status.started()
            try:
                await self._stopped.wait()
            finally:
                # The server is going (drained, or cancelled): from now on the nurseries
                # take nothing new; a connection that ends ends its sessions (``detach``
                # says no, ``end`` forgets at once).
                self._running = False
                timers.cancel_scope.cancel()

    def journal(self) -> Journal:
        return Journal(self.settings.session_bytes, self.budget)

    def store(self, holder: Holder) -> Store:
        """The ``SessionStore`` of one connection."""
        return Store(self, holder)

    # ------------------------------------------------------------------ tokens (rules 1, 2)

    def _issue(self, record: Record) -> bytes:
        token = secrets.token_bytes(self.settings.token_bytes)
        if self.settings.relays:  # rule 7: the first byte says which worker holds it
            token = bytes([self.settings.worker]) + token[1:]
        self._records.pop(_key(record.token), None)
        record.token = token
        self._records[_key(token)] = record
        return token

    def _find(self, session_id: int, token: bytes) -> Record | None:
        record = self._records.get(_key(token))
        if (record is None or record.ended or record.protocol.session_id != session_id
                or not hmac.compare_digest(record.token, token)):
            return None
        return record

    def grant(self, protocol: ServerSession, identity: bytes) -> Record | None:
        if (not self.settings.enabled or self.draining
                or len(self._records) >= self.settings.max_sessions):
            return None
        record = Record(protocol, b"", identity)
        self._issue(record)
        return record

    def holder_of(self, token: bytes) -> str | None:
        """The relay socket of the worker that issued ``token``, when it is another."""
        relays = self.settings.relays
        if not relays or not token or token[0] == self.settings.worker:
            return None
        return relays[token[0]] if token[0] < len(relays) else None

    def resume(self, session_id: int, token: bytes, identity: bytes
               ) -> Record | ResumeRefused:
        record = self._find(session_id, token)
        if record is None or not hmac.compare_digest(record.identity, identity):
            self.stats.refused_total += 1
            return ResumeRefused.REJECTED
        if self.draining or record.holder is not None or record.session is None:
            # Rule 4: its old connection is not seen dead yet; rule 8: the drain.
            return ResumeRefused.RETRY_LATER
        self._issue(record)
        return record

    def migrate(self, session_id: int, token: bytes, identities: Collection[bytes] | None
                ) -> Record | None:
        """Rule 6. ``identities``: the credentials this connection has authenticated
        with (None: session auth is off); the session's must be among them."""
        record = self._find(session_id, token)
        if (record is None or record.session is None or self.draining
                or record.protocol.state is not SessionState.OPEN
                or (identities is not None and not any(
                    hmac.compare_digest(record.identity, identity)
                    for identity in identities))):
            self.stats.refused_total += 1
            return None
        if record.holder is not None:
            record.holder.release_session(session_id)  # rule 6: the client moves
        return record

    # ------------------------------------------------------------------ lifecycle

    def attached(self, record: Record, holder: Holder, *, resumed: bool) -> None:
        """``record``'s session is now on ``holder``'s connection: its detached window
        no longer applies; after a resume, the resubmissions' window starts."""
        record.holder = holder
        if record.detached_window is not None:
            record.detached_window.cancel()
            record.detached_window = None
        if resumed:
            self.stats.resumed_total += 1
            session = record.session
            if session is not None and session.held and self._running:
                if record.awaiting_window is not None:
                    record.awaiting_window.cancel()
                record.awaiting_window = self._window(
                    record, trio.current_time() + self.settings.window, self._expire_held)

    def detach(self, record: Record) -> bool:
        """The session's connection ended (rule 3): True when it is kept, detached; False
        when it must end (draining, or resume has been turned off)."""
        if (self.draining or not self._running or record.ended
                or record.session is None):
            return False
        record.holder = None
        self.stats.detached_total += 1
        if record.detached_window is not None:
            record.detached_window.cancel()
        record.detached_window = self._window(
            record, trio.current_time() + self.settings.window, self._expire_detached)
        return True

    def _window(self, record: Record, deadline: float,
                expire: Callable[[Record], None]) -> trio.CancelScope:
        """A timer task that calls ``expire(record)`` at ``deadline`` unless its scope
        (returned) is cancelled first. The deadline is the task's own: whatever happens
        to the record meanwhile, the task only sleeps, then decides."""
        assert self._timers is not None, "SessionRegistry.run() is not running"
        scope = trio.CancelScope()
        self._timers.start_soon(self._run_window, record, scope, deadline, expire)
        return scope

    async def _run_window(self, record: Record, scope: trio.CancelScope, deadline: float,
                          expire: Callable[[Record], None]) -> None:
        with scope:
            await trio.sleep_until(deadline)
            if record.ended:
                return
            try:
                expire(record)
            except Exception:  # a timer must never take the registry (and the server) down
                log.exception("resume window expiry failed",
                              session_id=record.protocol.session_id)

    def end(self, record: Record, cause: EndCause | None = None) -> None:
        """The session is over (closed, expired, failed): forget it; ``cause`` ends its
        operations (their journal goes once they have)."""
        if record.ended:
            return
        record.ended = True
        record.cancel_windows()
        self._records.pop(_key(record.token), None)
        session = record.session
        if session is None:
            return
        if cause is not None:
            session.cancel_all(cause)
        if self._running:
            self.nursery.start_soon(self._forget_when_idle, session)
        else:  # nobody left to wait for: forget now
            _forget(session)

    async def _forget_when_idle(self, session: Session) -> None:
        await session.wait_idle()
        try:
            _forget(session)
        except Exception:  # never the registry's end
            log.exception("forgetting a session's journal failed",
                          session_id=session.session_id)

    def _expire_detached(self, record: Record) -> None:
        """Rule 5: still detached when its window passed: the session ends."""
        if record.holder is not None:
            return  # attached meanwhile (its cancel came too late to stop the task)
        self.stats.expired_total += 1
        log.info("resume window passed; session ends", session_id=record.protocol.session_id,
                 window_s=self.settings.window)
        self.end(record, EndCause.RESUME_EXPIRED)

    def _expire_held(self, record: Record) -> None:
        """Rule 5, after a resume: what was not resubmitted within the window ends, and
        nothing of it reaches the client (its frames never did)."""
        record.awaiting_window = None
        session = record.session
        if session is not None:
            session.abandon_held(EndCause.RESUME_EXPIRED)

    async def drain(self, grace: float) -> None:
        """Rule 8: the detached sessions drain as attached ones do (their operations
        finish within ``grace`` or end), and no session detaches any more."""
        self.draining = True
        detached = [record for record in self._records.values()
                    if record.holder is None and record.session is not None]
        async with trio.open_nursery() as nursery:
            for record in detached:
                assert record.session is not None
                nursery.start_soon(record.session.drain, grace, EndCause.SHUTDOWN)
        for record in detached:
            self.end(record)
        self._stopped.set()


class Store:
    """The ``gateway.nnrp.SessionStore`` of one connection: it claims records for it, and
    the connection picks them up as the matching event comes out (``claimed``)."""

    def __init__(self, registry: SessionRegistry, holder: Holder) -> None:
        self._registry = registry
        self._holder = holder
        self.claimed: dict[int, Record] = {}
        #: The relay socket of the worker a resume was handed off to (rule 7).
        self.handed_to: str | None = None

    def _elsewhere(self, token: bytes) -> bool:
        """Rule 7: another worker holds it; the connection goes there if it can."""
        path = self._registry.holder_of(token)
        if path is None or not self._holder.can_hand_off():
            return False
        self.handed_to = path
        return True

    def grant(self, session: ServerSession, identity: bytes) -> ResumeGrant | None:
        record = self._registry.grant(session, identity)
        if record is None:
            return None
        self.claimed[session.session_id] = record
        return ResumeGrant(record.token, self._registry.settings.window_ms)

    def resume(self, session_id: int, token: bytes, identity: bytes
               ) -> tuple[ServerSession, ResumeGrant] | ResumeRefused:
        if self._elsewhere(token):
            return ResumeRefused.ELSEWHERE
        claimed = self._registry.resume(session_id, token, identity)
        if isinstance(claimed, ResumeRefused):
            return claimed
        self.claimed[session_id] = claimed
        return claimed.protocol, ResumeGrant(claimed.token, self._registry.settings.window_ms)

    def migrate(self, session_id: int, token: bytes, identities: Collection[bytes] | None
                ) -> ServerSession | ResumeRefused:
        if self._elsewhere(token):
            return ResumeRefused.ELSEWHERE
        record = self._registry.migrate(session_id, token, identities)
        if record is None:
            return ResumeRefused.REJECTED
        self.claimed[session_id] = record
        return record.protocol

