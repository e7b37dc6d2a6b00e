"""One NNRP connection: a nursery with a reader, a writer, and its sessions' operations.

Malformed input policy (architecture.md rule 5; nnrp-wire.md section 5):

    | input                                        | outcome                                   |
    |----------------------------------------------|-------------------------------------------|
    | garbage / bad magic / non-hello first        | close, no reply                           |
    | no CLIENT_HELLO within handshake_timeout     | close, no reply (slowloris)               |
    | framing/header error inside a session        | every operation in flight: DROP           |
    |   (bad meta_len, reserved bits, size cap,    |   transport_closed; then ERROR is_fatal=1 |
    |   an unknown msg_type)                       |   (MALFORMED_*, LIMIT_EXCEEDED); close    |
    |                                              |   once the client has (FAILURE_LINGER)    |
    | WebSocket text message                       | the same, ERROR MALFORMED_HEADER          |
    | bad typed body                               | that operation fails (invalid_submit_body)|
    | duplicate operation id / in-flight limit     | that submit is refused on its frame       |
    | op/frame mismatch, unknown operation         | ERROR_RECOVERABLE, nothing else changes   |

Nothing in this table touches another connection: each runs in its own nursery and
no exception leaves ``Connection.run`` (``Cancelled`` excepted).

The connection owns the sans-IO protocol state and the outbox; sessions own their
operations; each operation reaches the wire only through the ``_Port`` bound to it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import assert_never

import attrs
import structlog
import trio

from gateway import residence
from gateway.nnrp import (
    OPENAI_EVENT_FRAME,
    BudgetRequested,
    CapabilitiesNegotiated,
    ConnectionFailed,
    DeadlineUpdated,
    DropReason,
    ErrorCode,
    Event,
    FlowChanged,
    FrameIgnored,
    FrameShape,
    HandshakeCompleted,
    LocalProtocolError,
    OperationCancelled,
    OperationSubmitted,
    PeerClosed,
    PeerError,
    PriorityRequested,
    RemoteProtocolError,
    SendBytes,
    ServerConfig,
    ServerConnection,
    SessionCloseRequested,
    SessionError,
    SessionOpened,
    SessionOpenRefused,
    Stage,
    SubmitRefused,
    TraceContextUpdated,
)
from gateway.profile import CANCEL_CAUSES, END_TABLE, EndCause
from gateway.transport import PacketTransport, TextMessageError, read_until_closed

from ._operation import CancelInfo, Operation, OperationHandler
from ._outbox import Outbox
from ._session import Observer, Session
from ._stats import ServerStats

log = structlog.get_logger("gateway.server")
#: After a fatal ERROR, how long the connection waits for its client to close it.
FAILURE_LINGER = 1.0
_connection_ids = itertools.count(1)


@attrs.frozen
class ConnectionLimits:
    """Per-connection limits; the sans-IO ``ServerConfig`` holds the protocol ones."""

    handshake_timeout: float = 10.0
    #: A connection with no operation in flight and nothing received for this long is
    #: closed (a client that vanished without closing; TCP keepalive covers busy ones).
    idle_timeout: float = 300.0
    outbox_high_water: int = 1 << 20
    default_drain_timeout: float = 30.0
    write_timeout: float = 30.0


#: Builds the (status, payload) answer to a refused submit; the profile supplies it.
RefusalHandler = Callable[[SubmitRefused], tuple[int, bytes]]


def plain_refusal(refusal: SubmitRefused) -> tuple[int, bytes]:
    """Default for servers without a profile: 503 and the reason as text."""
    return 503, refusal.message.encode()


class _Port:
    """The wire as one operation sees it: bound to (session, operation)."""

    __slots__ = ("_connection", "operation_id", "session_id")

    def __init__(self, connection: Connection, session_id: int, operation_id: int) -> None:
        self._connection = connection
        self.session_id = session_id
        self.operation_id = operation_id

    async def room(self) -> None:
        outbox = self._connection.outbox
        await outbox.wait_for_room()
        if outbox.closed:
            # The connection is gone and its nursery cancelled: deliver that cancel here,
            # or a handler emitting in a loop would never reach a checkpoint.
            await trio.lowlevel.checkpoint()

    async def credit(self) -> None:
        connection = self._connection
        protocol = connection.protocol
        if not protocol.flow.active and not protocol.holding:  # the fast path
            return
        while True:
            # Held for a replacement (rule 9): until it comes (the old operation is then
            # cancelled, which ends this wait) or the hold is over.
            held = protocol.supersede_hold_left(self.session_id, self.operation_id)
            wait = held if held is not None else protocol.flow_wait(self.session_id,
                                                                  self.operation_id)
            if wait is not None and wait <= 0:
                return
            # Held by the client: we stop reading upstream, so vLLM's socket fills and
            # the pause reaches it as TCP backpressure (nothing is buffered or dropped).
            # What this operation deferred goes out first: the client may be waiting
            # for it before it opens the window again.
            self.flush()
            with trio.move_on_after(math.inf if wait is None else wait):
                await connection.flow_changed.wait()

    def send_partial(self, body: bytes, *, defer: bool = False) -> None:
        connection = self._connection
        packet = connection.protocol.send_partial(self.session_id, self.operation_id, body)
        if residence.PROBE is None:
            connection.outbox.put(packet, defer=defer)
        else:  # a benchmark: the packet carries when its upstream bytes were read
            connection.outbox.put(packet, read_at=residence.PROBE.read_at(), defer=defer)

    def flush(self) -> None:
        connection = self._connection
        # Directly only for a connection's lone operation (the latency case): with more
        # in flight, the writer coalesces their packets into one write per pass, and a
        # client reading many streams on one connection wakes once per pass, not once
        # per stream (gateway/server/_outbox.py, "The direct path").
        connection.outbox.flush(direct=connection.operations == 1)

    def send_progress(self, stage: Stage) -> None:
        connection = self._connection
        connection.outbox.put(connection.protocol.send_progress(
            self.session_id, self.operation_id, stage))

    def send_result(self, status: int, payload: bytes, retry_after_ms: int | None,
                    frame: FrameShape = OPENAI_EVENT_FRAME) -> None:
        connection = self._connection
        connection.outbox.put_all(connection.protocol.send_result(
            self.session_id, self.operation_id, status, payload,
            retry_after_ms=retry_after_ms, frame=frame), defer=True)
        self.flush()

    def negotiated(self, token: str) -> bool:
        return token in self._connection.protocol.session_tokens(self.session_id)

    def superseding(self) -> bool:
        return self._connection.protocol.superseding(self.session_id, self.operation_id)

    def send_drop(self, reason: DropReason, diagnostic: bytes, traced: bool) -> None:
        connection = self._connection
        connection.outbox.put_all(connection.protocol.send_drop(
            self.session_id, self.operation_id, reason, diagnostic, traced=traced))


class Connection:
    def __init__(self, transport: PacketTransport, handler: OperationHandler,
                 config: ServerConfig, limits: ConnectionLimits, *,
                 refusal: RefusalHandler | None = None, observer: Observer | None = None,
                 stats: ServerStats | None = None) -> None:
        self.connection_id = next(_connection_ids)
        self.transport = transport
        self.handler = handler
        self.refusal = refusal or plain_refusal
        self.observer = observer
        self.limits = limits
        #: The sans-IO protocol state (connection, sessions, operations as NNRP sees them).
        self.protocol = ServerConnection(config)
        self.outbox = Outbox(limits.outbox_high_water, send_now=transport.send_now,
                             on_written=self._count_written)
        #: The open sessions, each owning its running operations.
        self.sessions: dict[int, Session] = {}
        #: Operations started and not yet ended, over every session (``operations``).
        self._in_flight = 0
        self.stats = stats or ServerStats()
        self.sessions_opened = 0
        self.closed = trio.Event()
        #: Set (and replaced) whenever the client changes a flow window.
        self.flow_changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._handshake_done = trio.Event()
        self._last_receive = trio.current_time()
        self.log = log.bind(connection_id=self.connection_id, transport=transport.kind)

    @property
    def operations(self) -> int:
        """Operations in flight on this connection (counted as they start and end: the
        direct-write policy asks on every flush)."""
        return self._in_flight

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Serve until the peer leaves, a fatal error, or cancellation. Never raises."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                nursery.start_soon(self._handshake_watchdog)
                nursery.start_soon(self._idle_watchdog)
                await self._reader()
                # The reader ended: the peer is gone or broke the protocol.
                self._end_all(EndCause.DISCONNECTED)
                nursery.cancel_scope.cancel()
        except Exception:
            self.log.exception("connection crashed")
        finally:
            self.outbox.close()
            self._end_all(EndCause.DISCONNECTED)
            # Sessions that never sent SESSION_CLOSE end with their connection.
            self.stats.sessions_active -= len(self.sessions)
            self.sessions.clear()
            with trio.CancelScope(shield=True):
                await self.transport.aclose()
            self.closed.set()

    async def shutdown(self, drain_timeout: float, close_grace: float = 5.0) -> None:
        """Graceful end, for ``drain_timeout`` at most:

        1. new sessions and submits are refused, recoverably ("try elsewhere");
        2. every session drains: operations finish, those still running when the time is
           up end with their drop;
        3. the output is flushed;
        4. the connection is left for the client to close, for ``close_grace`` (within
           the drain time), and only then closed. NNRP has no GOAWAY: a client that has
           not yet read its last frames when the server closes may lose them (nnrp-py's
           native client raises on the end of stream before handing over what it holds).
        """
        deadline = trio.current_time() + drain_timeout
        self.protocol.start_draining()
        async with trio.open_nursery() as nursery:
            for session in list(self.sessions.values()):
                nursery.start_soon(session.drain, drain_timeout)
        with trio.move_on_at(deadline):
            await self.outbox.wait_flushed()
        with trio.move_on_at(min(deadline, trio.current_time() + close_grace)):
            await self.closed.wait()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _end_all(self, cause: EndCause) -> None:
        for session in self.sessions.values():
            session.cancel_all(cause)

    async def _idle_watchdog(self) -> None:
        timeout = self.limits.idle_timeout
        while True:
            await trio.sleep_until(self._last_receive + timeout)
            if self.operations:  # work in flight: the idle time starts when it ends
                self._last_receive = trio.current_time()
                continue
            if trio.current_time() < self._last_receive + timeout:
                continue  # something arrived while we slept
            self.log.info("idle timeout; closing connection", idle_s=timeout,
                          peer=self.transport.peer)
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()
            return

    async def _handshake_watchdog(self) -> None:
        with trio.move_on_after(self.limits.handshake_timeout):
            await self._handshake_done.wait()
            return
        self.log.info("handshake timeout", peer=self.transport.peer)
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    # ------------------------------------------------------------------ I/O tasks

    async def _reader(self) -> None:
        protocol = self.protocol
        while True:
            # Stop reading while our output backs up: the peer then feels TCP backpressure.
            await self.outbox.wait_for_room()
            try:
                data = await self.transport.receive()
            except TextMessageError as exc:
                await self._fail(protocol.protocol_failure(
                    RemoteProtocolError(str(exc), code=ErrorCode.MALFORMED_HEADER)))
                return
            if data is None:
                return
            self._last_receive = trio.current_time()
            self.stats.bytes_in += len(data)
            events = (protocol.receive_message(data) if self.transport.message_based
                      else protocol.receive_data(data))
            for event in events:
                if isinstance(event, ConnectionFailed):
                    await self._fail(event)
                    return
                if isinstance(event, PeerClosed):
                    return
                self._handle(event)
                if isinstance(event, PeerError) and event.fatal:
                    return

    async def _writer(self) -> None:
        outbox = self.outbox
        while True:
            batch = await outbox.take()
            if not batch:
                return
            try:
                await self._write(batch)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                    OSError):
                self.outbox.close()
                assert self._nursery is not None
                self._nursery.cancel_scope.cancel()
                return
            outbox.written(batch)

    async def _write(self, batch: list[bytes]) -> None:
        """Write a batch in order; bounded by the write timeout only when it must wait.
        On a plain socket what the kernel takes at once goes without trio's send layers
        (most batches: the writer runs once per pass with what the pass queued)."""
        send_now = self.transport.send_now
        if send_now is not None:
            data = batch[0] if len(batch) == 1 else b"".join(batch)
            sent = send_now(data)
            if sent == len(data):
                return
            batch = [data[sent:]]
        with trio.fail_after(self.limits.write_timeout):
            await self.transport.send(batch)

    def _count_written(self, nbytes: int, packets: int) -> None:
        self.stats.bytes_out += nbytes
        self.stats.frames_out += packets

    async def _fail(self, failure: ConnectionFailed) -> None:
        """A fatal protocol violation: every operation ends now (the protocol wrote their
        drops, its state is gone), then the replies are flushed before the close."""
        self.stats.protocol_errors += 1
        self._end_all(EndCause.PROTOCOL_FAILURE)
        self.log.info("protocol violation; closing connection", error=str(failure.error),
                      code=failure.error.code.name, replied=bool(failure.replies))
        if failure.replies:
            self.outbox.put_all(list(failure.replies))
            with trio.move_on_after(1.0) as scope:
                scope.shield = True
                await self.outbox.wait_flushed()
            # Then the client closes first, as after a drain (bounded): NNRP has no
            # GOAWAY, and a client that meets the end of stream before it has read the
            # ERROR may never see why (nnrp-py's native client raises on it first).
            # What it still sends is not read as NNRP: the protocol state is gone.
            with trio.move_on_after(FAILURE_LINGER):
                await read_until_closed(self.transport)

    # ------------------------------------------------------------------ events

    def _handle(self, event: Event) -> None:
        """One protocol event, in order; never awaits (the reader's order is the wire's)."""
        match event:
            case SendBytes(data=data):
                self.outbox.put(data)
            case OperationSubmitted():
                self._start_operation(event)
            case OperationCancelled():
                session = self.sessions.get(event.session_id)
                if session is not None:
                    session.cancel(event.operation_id, CANCEL_CAUSES[event.source], CancelInfo(
                        event.source, event.reason, event.diagnostic, trio.current_time()))
            case DeadlineUpdated():
                operation = self._operation(event.session_id, event.operation_id)
                if operation is not None:
                    operation.set_deadline(event.deadline_unix_ms,
                                           DropReason(event.drop_reason))
            case TraceContextUpdated():
                self._apply_trace(event)
            case PriorityRequested():
                self._apply_priority(event)
            case BudgetRequested():
                if event.operation_id is not None:
                    operation = self._operation(event.session_id, event.operation_id)
                    if operation is not None:
                        operation.update_budget(event.token_budget, increment=event.increment)
            case FlowChanged():
                self.flow_changed.set()
                self.flow_changed = trio.Event()
            case CapabilitiesNegotiated():
                self.log.info("runtime capabilities negotiated", session_id=event.session_id,
                              tokens=sorted(event.tokens))
            case FrameIgnored():
                self.stats.ignored_frames += 1
                self.log.debug("frame noted and ignored", session_id=event.session_id,
                               msg_type=event.msg_type, reason=event.reason)
            case SubmitRefused():
                self.stats.refused_submits += 1
                status, payload = self.refusal(event)
                recoverable = END_TABLE[EndCause(event.reason.value)].recoverable
                self.outbox.put_all(self.protocol.send_refusal(
                    event.session_id, event.frame_id, event.operation_id, status, payload,
                    retry_after_ms=(self.protocol.config.busy_retry_after_ms if recoverable
                                    else None)))
            case SessionCloseRequested():
                assert self._nursery is not None
                self._nursery.start_soon(self._close_session, event)
            case HandshakeCompleted():
                self._handshake_done.set()
            case SessionOpened():
                self._open_session(event.session_id)
            case SessionOpenRefused():
                self._session_refused(event)
            case PeerError():
                self.log.info("peer sent ERROR", code=event.error.code, fatal=event.fatal)
            case ConnectionFailed() | PeerClosed():
                pass  # the reader ends the connection on these before they get here
            case _:
                assert_never(event)

    def _operation(self, session_id: int, operation_id: int) -> Operation | None:
        session = self.sessions.get(session_id)
        return session.operations.get(operation_id) if session is not None else None

    def _apply_priority(self, event: PriorityRequested) -> None:
        """PRIORITY_UPDATE: honoured before dispatch when vLLM schedules by priority (the
        operator declares it: ``control.priority_update`` is then a runtime token), else
        refused as an unsupported live update (the reference adapter's answer)."""
        operation = self._operation(event.session_id, event.operation_id)
        if operation is None:
            return
        schedules = "control.priority_update" in self.protocol.config.runtime_tokens
        if schedules and operation.request_priority(event.priority_class,
                                                     event.priority_delta):
            return
        if not schedules:
            operation.priority_updates += 1
        reason = ("live_priority_update_unsupported: the request has reached vLLM"
                  if schedules else "priority_update_unsupported: vLLM does not schedule "
                  "by priority here")
        self.outbox.put(self.protocol.refuse_control(
            event.session_id, event.frame_id, ErrorCode.UNSUPPORTED_CAPABILITY, reason))

    def _apply_trace(self, event: TraceContextUpdated) -> None:
        session = self.sessions.get(event.session_id)
        if session is None:
            return
        if event.operation_id is not None:
            operation = session.operations.get(event.operation_id)
            if operation is not None:
                operation.update_trace(event.trace, operation_scoped=True)
            return
        for operation in session.operations.values():
            operation.update_trace(event.trace, operation_scoped=False)

    # ------------------------------------------------------------------ sessions

    def _open_session(self, session_id: int) -> None:
        assert self._nursery is not None
        self.sessions[session_id] = Session(session_id, self._nursery, self.handler,
                                            self._operation_ended, self.stats)
        self.sessions_opened += 1
        self.stats.sessions_active += 1
        self.stats.sessions_total += 1

    def _session_refused(self, event: SessionOpenRefused) -> None:
        self.stats.sessions_refused += 1
        if event.error_code == SessionError.AUTH_FAILED:
            self.stats.auth_failures += 1
            self.log.warning("session authentication failed", peer=self.transport.peer)
        else:
            self.log.info("session refused", error_code=event.error_code, reason=event.message)

    def _operation_ended(self, operation: Operation) -> None:
        self._in_flight -= 1
        if self.observer is not None:
            self.observer(operation)

    def _start_operation(self, event: OperationSubmitted) -> None:
        session = self.sessions[event.session_id]
        self._in_flight += 1
        session.start(Operation(
            _Port(self, event.session_id, event.operation_id),
            connection_id=self.connection_id, transport=self.transport.kind,
            session_id=event.session_id, operation_id=event.operation_id,
            frame_id=event.frame_id, typed_body=event.typed_body, body_error=event.body_error,
            header_trace_id=event.header_trace_id, trace=event.trace,
            deadline_unix_ms=event.deadline_unix_ms,
            deadline_drop_reason=event.deadline_drop_reason,
            priority_class=event.priority_class, token_budget=event.token_budget))

    async def _close_session(self, event: SessionCloseRequested) -> None:
        session = self.sessions[event.session_id]
        timeout = (event.drain_timeout_ms / 1000 if event.drain_timeout_ms
                   else self.limits.default_drain_timeout)
        await session.drain(timeout)
        if self.sessions.pop(event.session_id, None) is not None:
            self.stats.sessions_active -= 1
        try:
            self.outbox.put(self.protocol.send_session_close_ack(event.session_id))
        except LocalProtocolError as exc:  # the connection failed while the session drained
            self.log.info("session close ack not sent", error=str(exc))
