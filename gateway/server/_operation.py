"""One NNRP operation, from its FRAME_SUBMIT to its single terminal: what a handler sees.

The operation owns its whole lifecycle (docs/reference/conventions.md: one owner per lifecycle):

    submitted ─▶ run(handler) ─▶ emit()* ─▶ close(cause, payload)     the handler ends it
                      │                                               (or returns without
                      └─ cancel(cause) from outside ─▶ scope cancelled  ending it: a bug)
                                        └──────────────▶ _end(cause): the terminal the
                                                         outcome table gives (a drop, or
                                                         nothing when the peer is gone)

It talks to the wire only through its ``OperationPort``, bound by the connection to this
(session, operation): room (the connection's buffer), credit (the client's flow window),
send partial, progress, result, drop. Which terminal each end cause gets, and whether
the client is told when to retry, is ``END_TABLE``'s decision (gateway.profile).

Runtime controls reach it from the connection: a deadline tightens its scope; a
priority or a token budget is taken before dispatch (the handler reads them when it
builds the upstream request: what a priority class becomes there is the handler's
business) and a budget also applies live, counted in tokens as they stream; PROGRESS
stages are recorded and sent when the client asked for them (negotiated
``control.progress_partial``, or the envelope's ``nnrp.progress``).

The operation holds what running it needs. What only its observers read (when it
arrived, started and sent its events, the bytes, its session's resumes, the replays,
the PRIORITY_UPDATEs) the engine writes into its ``notes`` as it happens and never reads
back; an observer may give every operation a subclass of ``OperationNotes`` that also
holds what its handler notes (``GatewayServer(notes=...)``; the app's is
``gateway.observe.RecordNotes``). The engine knows no handler's or observer's types.

A SUPERSEDE whose replacement has not arrived (``supersede``) ends the operation's work at
once, as a cancel does (its scope cancelled, its upstream closed: vLLM stops generating
what nobody can receive); ``run`` then keeps only what the rule needs, the operation's
place, until the replacement comes or the hold is over, and sends the superseded drop
(nnrp._server_controls rule 9).

Error handling: once a cancel has arrived, ``emit`` and ``close`` raise ``trio.Cancelled``
through the cancelled scope (a cancelled operation sends nothing more); after the
terminal they raise ``LocalProtocolError``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol

import attrs
import structlog
import trio

from gateway.nnrp import (
    OPENAI_EVENT_FRAME,
    CancelSource,
    DropReason,
    FrameShape,
    LocalProtocolError,
    Stage,
    TraceInfo,
    TypedBody,
)
from gateway.profile import END_TABLE, Drop, EndCause, Outcome, Push

from ._notes import OperationNotes

log = structlog.get_logger("gateway.server")


class OperationPort(Protocol):
    """The wire, as one operation may use it (bound to its session and operation ids)."""

    def ready(self) -> bool:
        """Whether one more PARTIAL_RESULT may go now: ``room`` and ``credit`` would not
        wait, and no SUPERSEDE of the operation waits for its replacement. It must err
        towards False: a True while a wait would block lets an event past backpressure
        or the client's window (``emit`` then skips the waits)."""
        ...

    async def room(self) -> None:
        """Wait until the connection can take more output (backpressure)."""
        ...

    async def credit(self) -> None:
        """Wait until the client's windows let one more PARTIAL_RESULT through."""
        ...

    def send_partial(self, body: bytes, *, defer: bool = False) -> None:
        """A PARTIAL_RESULT; ``defer`` holds it for the next ``flush`` (one write for the
        events of one upstream read)."""
        ...

    def flush(self) -> None:
        """Hand what was deferred to the connection's write path now."""
        ...

    def send_progress(self, stage: Stage) -> None: ...

    def send_result(self, status: int, payload: bytes, retry_after_ms: int | None,
                    frame: FrameShape = OPENAI_EVENT_FRAME) -> None:
        """The terminal RESULT_PUSH, ``payload`` as one typed frame of shape ``frame``;
        with ``retry_after_ms`` the client is told when to try again (ERROR_RECOVERABLE
        + RETRY_AFTER first)."""
        ...

    def send_drop(self, reason: DropReason, diagnostic: bytes, traced: bool) -> None: ...

    def negotiated(self, token: str) -> bool:
        """Whether the session negotiated a runtime capability token."""
        ...

    def read_object(self, object_id: int, version: int) -> bytes | str:
        """A copy of one of the session's runtime objects, whole, at ``version`` (0: the
        current one); the operation then depends on it (released with invalidation, the
        operation is dropped). A string says why not (``gateway.nnrp._objects`` O9)."""
        ...

    def read_cached(self, namespace: int, key_hi: int, key_lo: int
                    ) -> bytes | memoryview | str:
        """The bytes of an object the session put in its cache (CACHE_PUT); the operation
        then depends on the entry (invalidated or replaced, the operation is dropped). A
        string says why not (``gateway.nnrp._cache`` C6)."""
        ...

    def supersede_hold_left(self) -> float | None:
        """Seconds a SUPERSEDE of this operation still waits for its replacement (0 or
        less: the wait is over); None when no SUPERSEDE waits."""
        ...

    def detached(self) -> bool:
        """Whether its results reach no client now (its session detached, or it awaits
        its resubmission after a resume)."""
        ...

    def paused(self) -> bool:
        """Whether, reaching no client, it must wait for its session's journal to make
        room before it may produce more."""
        ...


@attrs.frozen
class CancelInfo:
    """What a peer's cancel said (feeds the observation record)."""

    source: CancelSource
    reason: int
    diagnostic: bytes
    at: float  # trio.current_time() when the cancel arrived


#: The retry time of a recoverable failure whose cause says nothing better.
DEFAULT_RETRY_AFTER_MS = 1000

#: Which end cause an expired DEADLINE / EXPIRE_AT gives (their drop reasons differ).
_DEADLINE_CAUSES = {DropReason.DEADLINE_EXPIRED: EndCause.DEADLINE_EXPIRED,
                    DropReason.SUPERSEDED: EndCause.EXPIRED_AT}


class Operation:
    """One operation. A handler reads the ids (``session_uid`` among them), ``typed_body``
    (or ``body_error``), ``trace`` (the best trace context so far), ``deadline_unix_ms``
    and what runtime controls asked before dispatch (``priority_class``,
    ``priority_delta``, ``token_budget``); it calls ``emit`` per event and ends with
    exactly one ``close``. It runs inside ``cancel_scope``. ``notes`` (made for it from
    the class ``notes``, with its ``transport``) is where the engine, and the handler
    when the class has room for it, write what observers read."""

    def __init__(self, port: OperationPort, *, connection_id: int, transport: str,
                 session_id: int, operation_id: int, frame_id: int,
                 typed_body: TypedBody | None, body_error: str | None, header_trace_id: int,
                 trace: TraceInfo | None, deadline_unix_ms: int | None,
                 deadline_drop_reason: int, priority_class: int = 0,
                 token_budget: int | None = None,
                 notes: type[OperationNotes] = OperationNotes) -> None:
        self._port = port
        self.notes = notes(transport)
        self.connection_id = connection_id
        self.session_id = session_id
        #: Its session's opaque id, unique across gateways and kept across resumes
        #: (``Session.uid``; set when the session starts it).
        self.session_uid: str | None = None
        self.operation_id = operation_id
        self.frame_id = frame_id
        self.typed_body = typed_body
        self.body_error = body_error
        self.header_trace_id = header_trace_id
        self.trace = trace
        self._operation_trace: TraceInfo | None = None
        self.deadline_unix_ms: int | None = None
        self.deadline_drop_reason = DropReason(deadline_drop_reason
                                               or DropReason.DEADLINE_EXPIRED)
        self.cancel_scope = trio.CancelScope()
        #: Why it ended (None while it runs); set from outside by ``cancel``.
        self.end_cause: EndCause | None = None
        self.cancel_info: CancelInfo | None = None
        #: When its terminal went (or it ended with nothing to send); None while it runs.
        self.terminal_at: float | None = None
        self.events_sent = 0
        #: The session's priority class and what PRIORITY_UPDATE asked (before dispatch).
        self.priority_class = priority_class
        self.priority_delta = 0
        self.priority_requested = False
        #: When the handler sent the upstream request: live updates come too late then.
        self.dispatched_at: float | None = None
        self.token_budget = token_budget
        self.tokens_used = 0
        #: Closes the upstream exchange at once when the operation is cancelled.
        self._abort_upstream: Callable[[], object] | None = None
        #: A SUPERSEDE waits for its replacement: the work has stopped (``supersede``).
        self.superseded = False
        #: Set by ``cancel``: ends the wait for a replacement (``_await_replacement``).
        self._cancelled = trio.Event()
        #: Called when nobody reads it any more, or it starts to wait for its journal's
        #: room while nobody does (the handler's upstream slot may then serve a live
        #: request that waits: upstream/_slots.py).
        self.may_give_way: Callable[[], object] | None = None
        #: Stage transitions (monotonic time): PROGRESS when asked for, and the record's.
        self.stages: list[tuple[Stage, float]] = []
        self._progress = port.negotiated("control.progress_partial")
        if deadline_unix_ms:
            self.set_deadline(deadline_unix_ms, self.deadline_drop_reason)
        self.stage(Stage.QUEUED)
        self.stage(Stage.INPUT_RECEIVED)

    # ------------------------------------------------------------------ lifecycle

    async def run(self, handler: OperationHandler) -> None:
        """Run ``handler`` to this operation's terminal; end it here if the handler did not
        (cancelled, expired, or a bug). Never raises but ``Cancelled``."""
        self.notes.started_at = trio.current_time()
        self.stage(Stage.ADMITTED)
        with self.cancel_scope:
            try:
                await handler(self)
            except LocalProtocolError as exc:
                log.error("handler broke the operation rules", error=str(exc),
                          session_id=self.session_id, operation_id=self.operation_id)
            except Exception:
                log.exception("operation handler failed", session_id=self.session_id,
                              operation_id=self.operation_id)
        if self.is_terminal:
            return
        if self.end_cause is None and self._port.supersede_hold_left() is not None:
            await self._await_replacement()
        cause = self.end_cause
        if cause is None and self._port.supersede_hold_left() is not None:
            cause = EndCause.SUPERSEDED  # the only end the client may still see (rule 9)
        if cause is None:
            if self.cancel_scope.cancelled_caught:
                cause = _DEADLINE_CAUSES[self.deadline_drop_reason]
            else:
                log.error("handler returned without a terminal",
                          operation_id=self.operation_id)
                cause = EndCause.NO_TERMINAL
        self._end(cause)

    def cancel(self, cause: EndCause, info: CancelInfo | None = None) -> None:
        """End the operation from outside (a peer's cancel, a drain, a lost connection).
        The first cause wins; the handler's scope is cancelled."""
        if self.end_cause is None and not self.is_terminal:
            self.end_cause = cause
            self.cancel_info = info
        self._cancelled.set()
        self._stop_work()

    def supersede(self) -> None:
        """A SUPERSEDE waits for this operation's replacement (nnrp._server_controls rule
        9). The client counts it superseded already and nothing more of it can be
        delivered, so its work stops now, upstream included; ``run`` sends the
        superseded drop once the replacement comes (``cancel``) or the hold is over."""
        if self.end_cause is None and not self.is_terminal:
            self.superseded = True
            self._stop_work()

    def _stop_work(self) -> None:
        self.cancel_scope.cancel()
        abort, self._abort_upstream = self._abort_upstream, None
        if abort is not None:
            abort()  # vLLM learns now, not when this operation's task next runs

    async def _await_replacement(self) -> None:
        """What the supersede rule still needs of a stopped operation: its place, until
        the replacement arrives (or is refused, or the session closes: a ``cancel`` each),
        a drain or a lost connection ends it (``cancel``), or the hold is over. The
        drop must not come first: the replacement is admitted before the old operation
        is dropped (rule 9)."""
        left = self._port.supersede_hold_left()
        if left is not None and left > 0:
            with trio.move_on_after(left):
                await self._cancelled.wait()

    @contextlib.contextmanager
    def aborts_upstream(self, abort: Callable[[], object]) -> Iterator[None]:
        """While in this block, a cancel also calls ``abort`` (synchronous: it closes the
        upstream socket), so the upstream learns of the cancel as soon as the reader
        applies it, not after the operation's task has been scheduled and unwound behind
        every other busy stream (the cancel -> upstream closed p99 of docs/benchmarks.md)."""
        self._abort_upstream = abort
        try:
            yield
        finally:
            self._abort_upstream = None

    def _end(self, cause: EndCause) -> None:
        """The terminal the outcome table gives a cause that ended us from outside."""
        self.end_cause = cause
        terminal = END_TABLE[cause].terminal
        if isinstance(terminal, Drop):
            self.stage(Stage.DROPPED)
            # The client's own words when its control ended us (the reference adapter's
            # drop diagnostic), else the reason's name; EXPIRE_AT's drop carries none.
            told = self.cancel_info.diagnostic if self.cancel_info is not None else b""
            diagnostic = (told or terminal.diagnostic) if terminal.explained else b""
            # LocalProtocolError: the connection's protocol state is gone (a fatal error).
            with contextlib.suppress(LocalProtocolError):
                self._port.send_drop(terminal.reason, diagnostic, terminal.traced)
        self._mark_terminal()

    # ------------------------------------------------------------------ inputs

    def set_deadline(self, deadline_unix_ms: int, drop_reason: DropReason) -> None:
        """Apply an absolute deadline (DEADLINE / EXPIRE_AT) to the operation's scope."""
        if self.deadline_unix_ms is not None and deadline_unix_ms >= self.deadline_unix_ms:
            return  # only ever tighten
        self.deadline_unix_ms = deadline_unix_ms
        self.deadline_drop_reason = drop_reason
        remaining = deadline_unix_ms / 1000 - time.time()
        self.cancel_scope.deadline = min(self.cancel_scope.deadline,
                                         trio.current_time() + max(remaining, 0.0))

    def request_priority(self, priority_class: int, priority_delta: int) -> bool:
        """PRIORITY_UPDATE: taken if the upstream request has not gone yet (the handler
        reads ``priority_class`` and ``priority_delta`` when it builds it); False means
        too late."""
        self.notes.priority_updates += 1
        if self.dispatched_at is not None:
            return False
        self.priority_class, self.priority_delta = priority_class, priority_delta
        self.priority_requested = True
        return True

    def update_budget(self, token_budget: int, *, increment: bool) -> None:
        """BUDGET_UPDATE's token budget. Before dispatch it caps the request; after, the
        operation ends (budget_exceeded) as soon as it has used more than the budget."""
        if increment:
            if self.token_budget is None:
                return  # more on top of no limit is still no limit
            token_budget += self.token_budget
        self.token_budget = token_budget
        if self.tokens_used > self.token_budget:
            self.cancel(EndCause.BUDGET_EXCEEDED)

    def spend_tokens(self, count: int) -> bool:
        """``count`` more tokens are about to reach the client; False (and the operation
        ends: budget_exceeded) when that would pass the token budget."""
        if self.token_budget is not None and self.tokens_used + count > self.token_budget:
            self.cancel(EndCause.BUDGET_EXCEEDED)
            return False
        self.tokens_used += count
        return True

    def stage(self, stage: Stage) -> None:
        """Record a stage transition; send it as PROGRESS when the client asked for it
        (never after a cancel: its operation is already terminal to the client)."""
        if self.stages and self.stages[-1][0] is stage:
            return
        self.stages.append((stage, trio.current_time()))
        if self._progress:
            self._send_progress(stage)

    def read_object(self, object_id: int, version: int) -> bytes | str:
        """The bytes of one of the session's runtime objects (``OperationPort``)."""
        return self._port.read_object(object_id, version)

    def read_cached(self, namespace: int, key_hi: int, key_lo: int
                    ) -> bytes | memoryview | str:
        """The bytes of one of the session's cached objects (``OperationPort``)."""
        return self._port.read_cached(namespace, key_hi, key_lo)

    def enable_progress(self) -> None:
        """The envelope asked for PROGRESS: send the stages so far, then each as it comes."""
        if self._progress:
            return
        self._progress = True
        for stage, _ in self.stages:
            self._send_progress(stage)

    def _send_progress(self, stage: Stage) -> None:
        if self.end_cause in _CONTROL_ENDED or self.superseded or self.is_terminal:
            return
        with contextlib.suppress(LocalProtocolError):  # cancelled meanwhile: not sent
            self._port.send_progress(stage)

    def update_trace(self, trace: TraceInfo, *, operation_scoped: bool) -> None:
        """A TRACE_CONTEXT arrived; operation scope beats the session default."""
        if operation_scoped:
            self._operation_trace = trace
            self.trace = trace
        elif self._operation_trace is None:
            self.trace = trace

    # ------------------------------------------------------------------ outputs

    @property
    def is_terminal(self) -> bool:
        return self.terminal_at is not None

    @property
    def outcome(self) -> Outcome | None:
        """The outcome label of how it ended (None while it runs)."""
        return END_TABLE[self.end_cause].outcome if self.end_cause is not None else None

    @property
    def unattended(self) -> bool:
        """Nobody reads its results now (``OperationPort.detached``)."""
        return self._port.detached()

    @property
    def held_at_bound(self) -> bool:
        """Nobody reads it and it waits for its journal's room (``OperationPort.paused``)."""
        return self._port.paused()

    def unattended_now(self) -> None:
        """Its session detached and waits for its client: ``may_give_way``."""
        if self.may_give_way is not None:
            self.may_give_way()

    async def _sendable(self) -> None:
        if self.may_give_way is not None and self._port.paused():
            self.may_give_way()
        await self._port.room()
        self._stop_if_superseded()
        if self.end_cause is not None or self.superseded:
            await trio.lowlevel.checkpoint()  # raises Cancelled: the cancel is ours

    def _stop_if_superseded(self) -> None:
        """A SUPERSEDE waiting for its replacement that has not reached us yet (``supersede``
        is called as the connection reads it; a port may know first): stop now."""
        if not self.superseded and self._port.supersede_hold_left() is not None:
            self.supersede()

    async def emit(self, body: bytes, *, flush: bool = True) -> None:
        """Send one non-terminal event (a PARTIAL_RESULT), waiting out backpressure and
        the client's flow window.

        By default it is queued and the connection's writer woken: events emitted in a
        tight loop leave together, in the writer's next write. ``flush=False`` leaves it
        for this task's next ``flush()``, which may write it at once itself, with the
        other events of the same upstream read (every wait here flushes first).

        When nothing holds it (``OperationPort.ready``, the common case) it goes out
        without a wait or a checkpoint, as it would through the waits, which return at
        once then: the handler's upstream read is its checkpoint.
        """
        if self.end_cause is not None or self.superseded or not self._port.ready():
            await self._sendable()
            await self._port.credit()
            self._stop_if_superseded()  # it may have come while we waited for credit
            if self.end_cause is not None or self.superseded:
                await trio.lowlevel.checkpoint()
        if not self.events_sent:
            self.stage(Stage.PRODUCING_PARTIAL)
        self._port.send_partial(body, defer=not flush)
        # The observers' figures, in the notes: no more work an event than as attributes.
        notes, now = self.notes, trio.current_time()
        last = notes.last_event_at
        if last is None:
            if notes.first_event_at is None:
                notes.first_event_at = now
        elif now - last > notes.max_gap:
            notes.max_gap = now - last
        notes.last_event_at = now
        self.events_sent += 1
        notes.bytes_sent += len(body)

    def flush(self) -> None:
        """Write the events emitted with ``flush=False`` (synchronous)."""
        self._port.flush()

    async def close(self, cause: EndCause, payload: bytes, *,
                    retry_after_ms: int | None = None,
                    frame: FrameShape = OPENAI_EVENT_FRAME) -> None:
        """End the operation: the terminal RESULT_PUSH that ``cause`` gets, carrying
        ``payload`` (the profile's terminal event, or ``frame``'s kind of result). A
        recoverable cause tells the client to retry after ``retry_after_ms`` (or a
        default)."""
        spec = END_TABLE[cause]
        terminal = spec.terminal
        if not isinstance(terminal, Push):
            raise LocalProtocolError(f"{cause} is not a handler's terminal")
        # Yield once even when the outbox has room: a cancel, supersede or deadline the
        # reader has already applied must win over a terminal not yet on the wire (the
        # only end a superseded operation may still see is its drop).
        await trio.lowlevel.checkpoint()
        await self._sendable()
        self.stage(Stage.COMPLETED if cause is EndCause.COMPLETED else Stage.FAILED)
        retry = (retry_after_ms or DEFAULT_RETRY_AFTER_MS) if spec.recoverable else None
        self._port.send_result(terminal.status, payload, retry, frame)
        self.end_cause = cause
        self._mark_terminal()
        self.notes.bytes_sent += len(payload)

    def _mark_terminal(self) -> None:
        self.terminal_at = trio.current_time()
        if self.notes.first_event_at is None:
            self.notes.first_event_at = self.terminal_at


#: Causes after which the client already holds the operation as ended (its own control).
_CONTROL_ENDED = frozenset({EndCause.PEER_CANCELLED, EndCause.SUPERSEDED,
                            EndCause.DISCONNECTED})

#: The interface the vLLM pipeline implements: run one operation to its terminal.
OperationHandler = Callable[[Operation], Awaitable[None]]
