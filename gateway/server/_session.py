"""One NNRP session: it owns its operations, and has one drain.

The session starts each operation, forgets it when it has ended, and reports it to the
observer. ``drain`` is the one way a session stops: SESSION_CLOSE (drain or abort), the
gateway's shutdown, a closing connection and an expired resume window all use it. It
lets operations finish for a grace period, ends the rest with ``cause``, and returns once
every operation task has ended.

A session is attached to at most one connection (``link``), which carries its frames.
A resumable session (``journal`` set) may lose its connection and keep running: its
operations then write only to the journal, and a resume or a migration attaches it to a
new connection (``attach``). After a resume, an operation's frames reach the client
again only once the client has resubmitted it (``resubmitted``): what the client may
have missed is replayed first, then it goes on live.

Each operation reaches the wire only through its ``_Port``, bound to (session,
operation): the port asks the session where its frames go now.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import structlog
import trio

from gateway import residence
from gateway.nnrp import (
    OPENAI_EVENT_FRAME,
    DropReason,
    FrameShape,
    ServerConnection,
    ServerSession,
    Stage,
)
from gateway.profile import EndCause

from ._operation import CancelInfo, Operation, OperationHandler

if TYPE_CHECKING:
    from ._journal import Journal
    from ._outbox import Outbox
    from ._stats import ServerStats

log = structlog.get_logger("gateway.server")

#: Told of every operation once it has ended (the observation record is built from it).
Observer = Callable[[Operation], None]


class Link(Protocol):
    """What a session needs of the connection it is attached to."""

    outbox: Outbox
    protocol: ServerConnection
    #: Set (and replaced) whenever the client changes a flow window.
    flow_changed: trio.Event

    @property
    def operations(self) -> int:
        """Operations in flight on the connection, over all its sessions."""
        ...

    def count_operations(self, change: int) -> None:
        """An attached session's operations came (+) or went (-)."""
        ...


class Session:
    def __init__(self, protocol: ServerSession, nursery: trio.Nursery,
                 handler: OperationHandler, observer: Observer | None, stats: ServerStats,
                 *, journal: Journal | None = None) -> None:
        self.protocol = protocol
        self.session_id = protocol.session_id
        self._nursery = nursery
        self._handler = handler
        self._observer = observer
        self._stats = stats
        self.journal = journal
        self.operations: dict[int, Operation] = {}
        #: The connection carrying the session's frames; None while detached.
        self.link: Link | None = None
        self._idle = trio.Event()
        self._idle.set()
        #: Set (and replaced) on attach, detach and whenever the journal makes room.
        self._changed = trio.Event()
        #: How many times it was resumed or migrated (for the observation records).
        self.reattachments = 0
        #: After a resume: the operations whose frames wait for the client to resubmit
        #: them (only a resubmission takes one out: ``resubmitted``).
        self.held: set[int] = set()
        #: Operations whose frames never reach the client again (their resubmission was
        #: refused on their frame, which has had its terminal; or never came).
        self.muted: set[int] = set()

    @property
    def resumable(self) -> bool:
        return self.journal is not None

    # ------------------------------------------------------------------ attachment

    def attach(self, link: Link) -> None:
        self.link = link
        link.count_operations(len(self.operations))
        self.changed()

    def detach(self) -> None:
        if self.link is not None:
            self.link.count_operations(-len(self.operations))
        self.link = None
        self.changed()

    def changed(self) -> None:
        """Where frames go changed (attached, detached, an operation resubmitted, room
        made in the journal): operations waiting on it look again."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def live(self, operation_id: int) -> bool:
        """Whether the operation's frames go to the client now: attached, not waiting for
        its resubmission after a resume, not muted."""
        return (self.link is not None and operation_id not in self.held
                and operation_id not in self.muted)

    def resumed(self) -> None:
        """Attached again after a resume: what is held waits for its resubmission."""
        self.held = set(self.protocol.awaiting)

    def resubmitted(self, operation_id: int) -> None:
        """The client resubmitted it: it goes on live (what it missed is replayed first)."""
        self.held.discard(operation_id)
        self.changed()

    def abandon(self, operation_id: int, cause: EndCause) -> None:
        """Nothing more of the operation reaches the client (its frame has had, or will
        never have, a terminal the client knows of); it ends, and its journal goes."""
        self.held.discard(operation_id)
        self.muted.add(operation_id)
        self.cancel(operation_id, cause)
        if self.journal is not None:
            self.journal.forget(operation_id)
            self.release_journal()

    def abandon_held(self, cause: EndCause) -> None:
        """Every operation still waiting for its resubmission ends unseen (the window
        passed, or the session closes)."""
        for operation_id in list(self.held):
            self.abandon(operation_id, cause)

    def release_journal(self) -> None:
        """Tell the protocol state which operations the journal no longer holds."""
        journal = self.journal
        if journal is not None and journal.released:
            for operation_id in journal.released:
                self.protocol.release_results(operation_id)
            journal.released.clear()
            self.changed()  # room was made: detached operations may go on

    # ------------------------------------------------------------------ operations

    def port(self, operation_id: int) -> _Port:
        return _Port(self, operation_id)

    def start(self, operation: Operation, payload: bytes = b"") -> None:
        self.operations[operation.operation_id] = operation
        if self.link is not None:
            self.link.count_operations(1)
        if self.journal is not None:
            self.journal.start(operation.operation_id, operation.frame_id, payload)
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        self._nursery.start_soon(self._run, operation)

    async def _run(self, operation: Operation) -> None:
        self._stats.inflight += 1
        try:
            await operation.run(self._handler)
        finally:
            del self.operations[operation.operation_id]
            if self.link is not None:
                self.link.count_operations(-1)
            self.muted.discard(operation.operation_id)
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

    async def wait_idle(self) -> None:
        await self._idle.wait()


class _Port:
    """The wire as one operation sees it: bound to (session, operation), it sends through
    whatever connection the session is attached to now, and into the session's journal
    when it is resumable."""

    __slots__ = ("_session", "operation_id", "session_id")

    def __init__(self, session: Session, operation_id: int) -> None:
        self._session = session
        self.session_id = session.session_id
        self.operation_id = operation_id

    def ready(self) -> bool:
        """Whether a PARTIAL_RESULT may go now with nothing to wait for: attached and
        live, room in the connection's buffer, no flow window set by the client, no
        SUPERSEDE waiting. What ``room`` and ``credit`` would return at once for, asked
        without their coroutines (issue 25: the common case, once per event)."""
        session = self._session
        link = session.link
        return (link is not None and link.outbox.has_room
                and session.live(self.operation_id) and not link.protocol.flow.active
                and session.protocol.supersede_hold_left(self.operation_id) is None)

    async def room(self) -> None:
        session = self._session
        while True:
            link = session.link
            journal = session.journal
            if link is None or not session.live(self.operation_id):
                # Detached (or held for a resubmission): only the journal's bound
                # applies, and waiting for room here stops the upstream read.
                if journal is None or not journal.over_budget():
                    return
                journal.shared.waiting.add(session)  # room another session makes wakes it
                await session.wait_changed()
                continue
            outbox = link.outbox
            await outbox.wait_for_room()
            if outbox.closed:
                # The connection is gone: its end detaches or ends the session. Deliver a
                # checkpoint here, or a handler emitting in a loop would never reach one.
                await trio.lowlevel.checkpoint()
                if session.link is link:
                    await session.wait_changed()
                continue
            return

    async def credit(self) -> None:
        session = self._session
        link = session.link
        if link is None or not session.live(self.operation_id):
            return  # nobody to hold back for: the journal's bound applies (``room``)
        protocol = link.protocol
        if not protocol.flow.active:  # the fast path
            return
        while True:
            wait = protocol.flow_wait(self.session_id, self.operation_id)
            if wait is not None and wait <= 0:
                return
            # Held by the client: we stop reading upstream, so vLLM's socket fills and
            # the pause reaches it as TCP backpressure (nothing is buffered or dropped).
            # What this operation deferred goes out first: the client may be waiting
            # for it before it opens the window again.
            self.flush()
            with trio.move_on_after(math.inf if wait is None else wait):
                await link.flow_changed.wait()
            if session.link is not link:
                return  # moved or detached meanwhile

    def _deliver(self, packets: list[bytes], *, defer: bool = True) -> None:
        link = self._session.link
        if link is not None and self._session.live(self.operation_id):
            link.outbox.put_all(packets, defer=defer)

    def _keep(self, packets: list[bytes], *, sequence: int = 0, terminal: bool = False
              ) -> None:
        session = self._session
        journal = session.journal
        if journal is not None:
            # What the client cannot have seen is never trimmed (only looked up when
            # there is something to trim: this runs per event).
            held_back = (session.held | session.muted if journal.over_budget()
                         else frozenset())
            journal.add(self.operation_id, packets, sequence=sequence, terminal=terminal,
                        attached=session.link is not None, held_back=held_back)
            if journal.released:
                session.release_journal()

    def send_partial(self, body: bytes, *, defer: bool = False) -> None:
        session = self._session
        link = session.link
        if link is not None and session.live(self.operation_id):
            # Through the connection: it counts the partial against the client's windows.
            packet = link.protocol.send_partial(self.session_id, self.operation_id, body)
            if residence.PROBE is None:
                link.outbox.put(packet, defer=defer)
            else:  # a benchmark: the packet carries when its upstream bytes were read
                link.outbox.put(packet, read_at=residence.PROBE.read_at(), defer=defer)
        else:
            packet = session.protocol.send_partial(self.operation_id, body)
        if session.journal is not None:
            self._keep([packet], sequence=session.protocol.operations[
                self.operation_id].sequence)

    def flush(self) -> None:
        link = self._session.link
        if link is None:
            return
        # Directly only for a connection's lone operation (the latency case): with more
        # in flight, the writer coalesces their packets into one write per pass, and a
        # client reading many streams on one connection wakes once per pass, not once
        # per stream (gateway/server/_outbox.py, "The direct path").
        link.outbox.flush(direct=link.operations == 1)

    def send_progress(self, stage: Stage) -> None:
        packet = self._session.protocol.send_progress(self.operation_id, stage)
        self._keep([packet])
        self._deliver([packet], defer=False)

    def send_result(self, status: int, payload: bytes, retry_after_ms: int | None,
                    frame: FrameShape = OPENAI_EVENT_FRAME) -> None:
        session = self._session
        packets = session.protocol.send_result(self.operation_id, status, payload,
                                               retry_after_ms=retry_after_ms, frame=frame)
        self._end(packets)
        self.flush()

    def send_drop(self, reason: DropReason, diagnostic: bytes, traced: bool) -> None:
        session = self._session
        packets = session.protocol.send_drop(self.operation_id, reason, diagnostic,
                                             traced=traced)
        self._end(packets)
        link = session.link
        if link is not None:
            link.outbox.flush(direct=False)

    def _end(self, packets: list[bytes]) -> None:
        """The terminal's packets: kept, and sent with the session's credit now
        (nnrp._server_controls rule 12), which the journal does not keep: it is the
        session's state, not a result."""
        session = self._session
        self._keep(packets, terminal=True)
        link = session.link
        if link is not None:
            link.protocol.flow.forget_operation(self.session_id, self.operation_id)
            if session.live(self.operation_id):
                link.outbox.put_all([*packets, *session.protocol.credit_packets()],
                                    defer=True)

    def negotiated(self, token: str) -> bool:
        return token in self._session.protocol.tokens

    def supersede_hold_left(self) -> float | None:
        return self._session.protocol.supersede_hold_left(self.operation_id)
