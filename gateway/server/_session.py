"""One NNRP session: it owns its operations, and has one drain.

The session starts each operation, forgets it when it has ended, and reports it to the
observer. ``drain`` is the one way a session stops: SESSION_CLOSE (drain or abort), the
gateway's shutdown, a closing connection and an expired resume window all use it. It
lets operations finish for a grace period, ends the rest with ``cause``, and returns once
every operation task has ended.

A session is attached to at most one connection (``link``), which carries its frames.
A resumable session may lose its connection and keep running, and a resume or a
migration attaches it to a new connection (``attach``). Where each frame goes (the
wire, the journal, both) is the sans-IO session's decision (``ServerSession``'s
outputs, gateway/nnrp/_server_session.py rule 5a): this module only waits (for room,
for the client's window, for the journal's bound) and writes what it is given.

Each operation reaches the wire only through its ``_Port``, bound to (session,
operation).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

import structlog
import trio

from gateway.nnrp import (
    OPENAI_EVENT_FRAME,
    CacheMissReason,
    DropReason,
    FrameShape,
    ServerConnection,
    ServerSession,
    Stage,
)
from gateway.profile import EndCause

from ._operation import CancelInfo, Operation, OperationHandler

if TYPE_CHECKING:
    from ._outbox import Outbox
    from ._stats import ServerStats

log = structlog.get_logger("gateway.server")

#: Told of every operation once it has ended (the observation record is built from it).
Observer = Callable[[Operation], None]
#: Told of each PARTIAL_RESULT right after it is put on a connection's outbox.
PartialObserver = Callable[["Outbox"], None]

#: The process's partial observer: None but under a benchmark (``serve --bench-residence``
#: installs the residence probe's for its run, ``observe_partials``). The write path keeps
#: nothing for it; off, its cost is this one check per partial.
_partial_observer: PartialObserver | None = None


def observe_partials(observer: PartialObserver | None) -> None:
    """Install ``observer`` for this process (None: remove it)."""
    global _partial_observer
    _partial_observer = observer


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
                 *, client: bytes | None = None) -> None:
        self.protocol = protocol
        self.session_id = protocol.session_id
        #: An opaque random id, drawn once: stable for the session's whole life (a resume
        #: or a migration keeps this object) and, unlike ``session_id`` (numbered from 1
        #: in every process), unique across gateways. Each operation carries it
        #: (``Operation.session_uid``); what it becomes upstream is the handler's choice.
        self.uid = secrets.token_hex(8)
        self._nursery = nursery
        self._handler = handler
        self._observer = observer
        self._stats = stats
        #: Resumable: the client it counts against (``_resumption`` R2).
        self.client = client
        self.operations: dict[int, Operation] = {}
        #: The connection carrying the session's frames; None while detached.
        self.link: Link | None = None
        self._idle = trio.Event()
        self._idle.set()
        #: Set (and replaced) on attach, detach and whenever the journal makes room.
        self._changed = trio.Event()
        #: How many times it was resumed or migrated (for the observation records).
        self.reattachments = 0

    @property
    def resumable(self) -> bool:
        return self.protocol.journal is not None

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

    def left_alone(self) -> None:
        """Detached and waiting for its client (not ending, not moved elsewhere): a live
        request waiting for an upstream slot may have one of its operations'."""
        for operation in self.operations.values():
            operation.unattended_now()

    def changed(self) -> None:
        """Where frames go changed (attached, detached, an operation resubmitted, room
        made in a journal's bound): operations waiting on it look again."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    # ------------------------------------------------------------------ operations

    def port(self, operation_id: int) -> _Port:
        return _Port(self, operation_id)

    def start(self, operation: Operation) -> None:
        operation.session_uid = self.uid
        self.operations[operation.operation_id] = operation
        if self.link is not None:
            self.link.count_operations(1)
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
            self._stats.inflight -= 1
            if not self.operations:
                self._idle.set()
            if operation.end_cause is None and not operation.is_terminal:
                # Cancelled from outside its own scope (the gateway's task ends without a
                # drain: a second signal, a test's teardown): a shutdown, not an "ok".
                operation.end_cause = EndCause.SHUTDOWN
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


async def until_then_cancel(wait: Callable[[], Awaitable[object]], scope: trio.CancelScope
                            ) -> None:
    """``wait()``, then end the waits that share ``scope``."""
    await wait()
    scope.cancel()


class _Port:
    """The wire as one operation sees it: bound to (session, operation), it writes what
    the sans-IO session's outputs return to whatever connection the session is attached
    to now (nothing, while its frames reach no client: the journal has them)."""

    __slots__ = ("_session", "operation_id", "session_id")

    def __init__(self, session: Session, operation_id: int) -> None:
        self._session = session
        self.session_id = session.session_id
        self.operation_id = operation_id

    def ready(self) -> bool:
        """Whether a PARTIAL_RESULT may go now with nothing to wait for: attached and
        delivered, room in the connection's buffer, no flow window set by the client, no
        SUPERSEDE waiting. What ``room`` and ``credit`` would return at once for, asked
        without their coroutines (the common case, once per event)."""
        session = self._session
        link = session.link
        protocol = session.protocol
        return (link is not None and link.outbox.has_room
                and protocol.delivers(self.operation_id) and not link.protocol.flow.active
                and protocol.supersede_hold_left(self.operation_id) is None)

    def paused(self) -> bool:
        """Whether it waits for its journal's bound while its frames reach no client
        (a detached operation at its bound: it gives up its upstream slot first when a
        live request needs one)."""
        journal = self._session.protocol.journal
        return journal is not None and self.detached() and journal.over_budget()

    def detached(self) -> bool:
        """Whether its frames reach no client now (detached, or awaiting resubmission)."""
        return not self._session.protocol.delivers(self.operation_id)

    async def room(self) -> None:
        session = self._session
        protocol = session.protocol
        while True:
            link = session.link
            journal = protocol.journal
            if link is None or not protocol.delivers(self.operation_id):
                # Its frames reach no client: only the journal's bounds apply, and
                # waiting for room here stops the upstream read (``_journal`` J4).
                if journal is None or not journal.over_budget():
                    return
                for budget in journal.bounds:
                    if budget.over:  # room another session makes there wakes it
                        budget.waiting.add(session)
                await session.wait_changed()
                continue
            outbox = link.outbox
            if outbox.has_room or outbox.closed:
                await outbox.wait_for_room()  # a checkpoint, as every wait here
            else:
                # Room, or the session moved (a migration away from a connection that no
                # longer reads: its outbox may never drain).
                async with trio.open_nursery() as waits:
                    waits.start_soon(until_then_cancel, outbox.wait_for_room, waits.cancel_scope)
                    waits.start_soon(until_then_cancel, session.wait_changed, waits.cancel_scope)
                if session.link is not link:
                    continue
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
        if link is None or not session.protocol.delivers(self.operation_id):
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

    def send_partial(self, body: bytes, *, defer: bool = False) -> None:
        session = self._session
        packet = session.protocol.send_partial(self.operation_id, body)
        link = session.link
        if packet is not None and link is not None:
            link.outbox.put(packet, defer=defer)
            if _partial_observer is not None:  # a benchmark's probe (``observe_partials``)
                _partial_observer(link.outbox)

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
        session = self._session
        packet = session.protocol.send_progress(self.operation_id, stage)
        link = session.link
        if packet is not None and link is not None:
            link.outbox.put(packet)

    def send_result(self, status: int, payload: bytes, retry_after_ms: int | None,
                    frame: FrameShape = OPENAI_EVENT_FRAME) -> None:
        session = self._session
        packets = session.protocol.send_result(self.operation_id, status, payload,
                                               retry_after_ms=retry_after_ms, frame=frame)
        link = session.link
        if packets and link is not None:
            link.outbox.put_all(packets, defer=True)
        self.flush()

    def send_drop(self, reason: DropReason, diagnostic: bytes, traced: bool) -> None:
        session = self._session
        packets = session.protocol.send_drop(self.operation_id, reason, diagnostic,
                                             traced=traced)
        link = session.link
        if link is not None:
            if packets:
                link.outbox.put_all(packets, defer=True)
            link.outbox.flush(direct=False)

    def negotiated(self, token: str) -> bool:
        return token in self._session.protocol.tokens

    def read_object(self, object_id: int, version: int) -> bytes | str:
        protocol = self._session.protocol
        read = protocol.objects.read(
            object_id, version, self.operation_id,
            operation_in_flight=self.operation_id in protocol.operations)
        return read if isinstance(read, bytes) else read.text

    def read_cached(self, namespace: int, key_hi: int, key_lo: int
                    ) -> bytes | memoryview | str:
        protocol = self._session.protocol
        read = protocol.objects.cache.read(
            (namespace, key_hi, key_lo), self.operation_id,
            operation_in_flight=self.operation_id in protocol.operations)
        if not isinstance(read, CacheMissReason):
            return read
        return (f"the session's cache holds no such entry ({read.name.lower()}: never put, "
                "expired or invalidated); CACHE_PUT it first")

    def supersede_hold_left(self) -> float | None:
        return self._session.protocol.supersede_hold_left(self.operation_id)
