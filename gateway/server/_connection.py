"""One NNRP connection: a nursery with a reader, a writer and a task per operation.

Malformed input policy (architecture.md rule 5; nnrp-wire.md section 5):

    | input                                        | outcome                                   |
    |----------------------------------------------|-------------------------------------------|
    | garbage / bad magic / non-hello first        | close, no reply                           |
    | no CLIENT_HELLO within handshake_timeout     | close, no reply (slowloris)               |
    | framing/header error inside a session        | ERROR is_fatal=1 (MALFORMED_HEADER/BODY,  |
    |   (bad meta_len, reserved bits, size cap)    |   LIMIT_EXCEEDED), then close             |
    | WebSocket text message                       | ERROR is_fatal=1 MALFORMED_HEADER, close  |
    | bad typed body                               | that operation fails (invalid_submit_body)|
    | duplicate operation id / in-flight limit     | that submit is refused on its frame       |
    | op/frame mismatch, unknown operation         | non-fatal ERROR, nothing else changes     |

Nothing in this table touches another connection: each runs in its own nursery and
no exception leaves ``Connection.run`` (``Cancelled`` excepted).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import structlog
import trio

from gateway.nnrp import (
    CancelSource,
    ConnectionFailed,
    DeadlineUpdated,
    DropReason,
    ErrorCode,
    Event,
    HandshakeCompleted,
    LocalProtocolError,
    OperationCancelled,
    OperationSubmitted,
    PeerClosed,
    PeerError,
    RemoteProtocolError,
    SendBytes,
    ServerConfig,
    ServerConnection,
    SessionCloseRequested,
    SessionError,
    SessionOpened,
    SessionOpenRefused,
    SubmitRefused,
    TraceContextUpdated,
)

from ._operation import CancelInfo, EndReason, OperationContext, OperationHandler
from ._outbox import Outbox
from ._transport import TextMessageError

if TYPE_CHECKING:
    from ._transport import PacketTransport

log = structlog.get_logger("gateway.server")
_connection_ids = itertools.count(1)

#: Diagnostics of RESULT_DROP_REASON, ASCII as the mapping requires (section 4).
_DROP_DIAGNOSTIC = {
    DropReason.PEER_CANCELLED: b"peer_cancelled",
    DropReason.DEADLINE_EXPIRED: b"deadline_expired",
    DropReason.SUPERSEDED: b"superseded",
    DropReason.TRANSPORT_CLOSED: b"transport_closed",
}


@attrs.define
class ServerStats:
    """Counters shared by a server's connections (exported at scrape time, no locks)."""

    connections_active: int = 0
    connections_total: int = 0
    connections_refused: int = 0
    sessions_active: int = 0
    sessions_total: int = 0
    sessions_refused: int = 0
    refused_submits: int = 0
    inflight: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    frames_out: int = 0
    protocol_errors: int = 0
    auth_failures: int = 0
    #: Called with each operation once it has ended (observation records).
    observers: list[Callable[[OperationContext], None]] = attrs.field(factory=list)


_OUTCOMES: dict[EndReason | None, str] = {
    EndReason.PEER_CANCEL: "cancelled", EndReason.DEADLINE: "deadline",
    EndReason.SHUTDOWN: "shutdown",
}


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


class Connection:
    def __init__(self, transport: PacketTransport, handler: OperationHandler,
                 config: ServerConfig, limits: ConnectionLimits,
                 refusal: RefusalHandler | None = None,
                 stats: ServerStats | None = None) -> None:
        self.connection_id = next(_connection_ids)
        self.transport = transport
        self.handler = handler
        self.refusal = refusal or plain_refusal
        self.limits = limits
        self.sans_io = ServerConnection(config)
        self.outbox = Outbox(limits.outbox_high_water)
        self.operations: dict[tuple[int, int], OperationContext] = {}
        self._session_tasks: dict[int, int] = {}
        self._session_idle: dict[int, trio.Event] = {}
        self._nursery: trio.Nursery | None = None
        self._handshake_done = trio.Event()
        self._last_receive = trio.current_time()
        self.closed = trio.Event()
        self.sessions_opened = 0
        self.stats = stats or ServerStats()
        self.log = log.bind(connection_id=self.connection_id, transport=transport.kind)

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
                self._end_all(EndReason.DISCONNECT)
                nursery.cancel_scope.cancel()
        except Exception:
            self.log.exception("connection crashed")
        finally:
            self.outbox.close()
            self._end_all(EndReason.DISCONNECT)
            # Sessions that never sent SESSION_CLOSE end with their connection.
            self.stats.sessions_active -= len(self._session_tasks)
            self._session_tasks.clear()
            with trio.CancelScope(shield=True):
                await self.transport.aclose()
            self.closed.set()

    async def shutdown(self, drain_timeout: float) -> None:
        """Graceful end: let operations finish for ``drain_timeout``, drop the rest, flush."""
        with trio.move_on_after(drain_timeout):
            while self.operations:
                ops = list(self.operations.values())
                await ops[0].finished.wait()
        for operation in list(self.operations.values()):
            operation.cancel(EndReason.SHUTDOWN)
        with trio.move_on_after(min(drain_timeout, 5.0) + 1.0):
            while self.operations:
                await next(iter(self.operations.values())).finished.wait()
            await self.outbox.wait_flushed()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

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
        sans_io = self.sans_io
        while True:
            # Stop reading while our output backs up: the peer then feels TCP backpressure.
            await self.outbox.wait_for_room()
            try:
                data = await self.transport.receive()
            except TextMessageError as exc:
                failure = sans_io.protocol_failure(
                    RemoteProtocolError(str(exc), code=ErrorCode.MALFORMED_HEADER))
                await self._fail(failure)
                return
            if data is None:
                return
            self._last_receive = trio.current_time()
            self.stats.bytes_in += len(data)
            events = (sans_io.receive_message(data) if self.transport.message_based
                      else sans_io.receive_data(data))
            for event in events:
                if isinstance(event, ConnectionFailed):
                    await self._fail(event)
                    return
                if isinstance(event, PeerClosed):
                    return
                self._handle_event(event)
                if isinstance(event, PeerError) and event.fatal:
                    return

    async def _writer(self) -> None:
        outbox = self.outbox
        while True:
            batch = await outbox.take()
            if not batch:
                return
            try:
                with trio.fail_after(self.limits.write_timeout):
                    await self.transport.send(batch)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
                self.outbox.close()
                assert self._nursery is not None
                self._nursery.cancel_scope.cancel()
                return
            outbox.written(batch)
            self.stats.bytes_out += sum(map(len, batch))
            self.stats.frames_out += len(batch)

    async def _fail(self, failure: ConnectionFailed) -> None:
        self.stats.protocol_errors += 1
        self.log.info("protocol violation; closing connection", error=str(failure.error),
                      code=failure.error.code.name, replied=failure.reply is not None)
        if failure.reply is not None:
            self.write(failure.reply)
            with trio.move_on_after(1.0) as scope:
                scope.shield = True
                await self.outbox.wait_flushed()

    def write(self, data: bytes) -> None:
        self.outbox.put(data)

    # ------------------------------------------------------------------ events

    def _handle_event(self, event: Event) -> None:
        if isinstance(event, SendBytes):
            self.write(event.data)
        elif isinstance(event, OperationSubmitted):
            self._start_operation(event)
        elif isinstance(event, OperationCancelled):
            operation = self.operations.get((event.session_id, event.operation_id))
            if operation is not None:
                operation.cancel(EndReason.PEER_CANCEL, CancelInfo(
                    event.source, event.reason, event.diagnostic, trio.current_time()))
        elif isinstance(event, DeadlineUpdated):
            operation = self.operations.get((event.session_id, event.operation_id))
            if operation is not None:
                operation.set_deadline(event.deadline_unix_ms, DropReason(event.drop_reason))
        elif isinstance(event, TraceContextUpdated):
            self._apply_trace(event)
        elif isinstance(event, SubmitRefused):
            self.stats.refused_submits += 1
            status, payload = self.refusal(event)
            self.write(self.sans_io.send_refusal(event.session_id, event.frame_id, status,
                                                 payload))
        elif isinstance(event, SessionCloseRequested):
            assert self._nursery is not None
            self._nursery.start_soon(self._close_session, event)
        elif isinstance(event, HandshakeCompleted):
            self._handshake_done.set()
        elif isinstance(event, SessionOpened):
            self.sessions_opened += 1
            self.stats.sessions_active += 1
            self.stats.sessions_total += 1
            self._session_tasks[event.session_id] = 0
        elif isinstance(event, SessionOpenRefused):
            self.stats.sessions_refused += 1
            if event.error_code == SessionError.AUTH_FAILED:
                self.stats.auth_failures += 1
                self.log.warning("session authentication failed", peer=self.transport.peer)
            else:
                self.log.info("session refused", error_code=event.error_code,
                              reason=event.message)
        elif isinstance(event, PeerError):
            self.log.info("peer sent ERROR", code=event.error.code, fatal=event.fatal)

    def _apply_trace(self, event: TraceContextUpdated) -> None:
        if event.operation_id is not None:
            operation = self.operations.get((event.session_id, event.operation_id))
            if operation is not None:
                operation.update_trace(event.trace, operation_scoped=True)
            return
        for (session_id, _), operation in self.operations.items():
            if session_id == event.session_id:
                operation.update_trace(event.trace, operation_scoped=False)

    # ------------------------------------------------------------------ operations

    def _start_operation(self, event: OperationSubmitted) -> None:
        operation = OperationContext(
            self, event.session_id, event.operation_id, event.frame_id, event.typed_body,
            event.body_error, event.header_trace_id, event.trace, event.deadline_unix_ms,
            event.deadline_drop_reason)
        self.operations[(event.session_id, event.operation_id)] = operation
        self._session_tasks[event.session_id] = self._session_tasks.get(event.session_id, 0) + 1
        assert self._nursery is not None
        self._nursery.start_soon(self._run_operation, operation)

    async def _run_operation(self, operation: OperationContext) -> None:
        self.stats.inflight += 1
        operation.started_at = trio.current_time()
        try:
            with operation.cancel_scope:
                try:
                    await self.handler(operation)
                except LocalProtocolError as exc:
                    self.log.error("handler broke the operation rules", error=str(exc),
                                   session_id=operation.session_id,
                                   operation_id=operation.operation_id)
                except Exception:
                    self.log.exception("operation handler failed",
                                       session_id=operation.session_id,
                                       operation_id=operation.operation_id)
            self._end_operation(operation)
        finally:
            key = (operation.session_id, operation.operation_id)
            self.operations.pop(key, None)
            count = self._session_tasks.get(operation.session_id, 1) - 1
            self._session_tasks[operation.session_id] = count
            idle = self._session_idle.get(operation.session_id)
            if count == 0 and idle is not None:
                idle.set()
            self.stats.inflight -= 1
            operation.finished.set()
            for observer in self.stats.observers:
                try:
                    observer(operation)
                except Exception:
                    self.log.exception("operation observer failed")

    def _end_operation(self, operation: OperationContext) -> None:
        """After the handler: make sure exactly one terminal went out (rule 8)."""
        if operation.is_terminal:
            return
        reason = operation.end_reason
        if reason is None and operation.cancel_scope.cancelled_caught:
            reason = EndReason.DEADLINE
        drop = {
            EndReason.PEER_CANCEL: DropReason.PEER_CANCELLED,
            EndReason.DEADLINE: operation.deadline_drop_reason,
            EndReason.SHUTDOWN: DropReason.TRANSPORT_CLOSED,
            None: DropReason.TRANSPORT_CLOSED,  # the handler returned without a terminal
        }.get(reason)
        operation.end_reason = reason
        if drop is None:  # DISCONNECT: nobody to tell
            operation._mark_terminal("disconnected")
            return
        if reason is None:
            self.log.error("handler returned without a terminal",
                           operation_id=operation.operation_id)
        # LocalProtocolError: the connection state is gone (fatal error); nothing may be sent.
        with contextlib.suppress(LocalProtocolError):
            self.write(self.sans_io.send_drop(operation.session_id, operation.operation_id,
                                              drop, _DROP_DIAGNOSTIC[drop]))
        operation._mark_terminal(_OUTCOMES.get(reason, "internal_error"))

    def _end_all(self, reason: EndReason) -> None:
        for operation in list(self.operations.values()):
            operation.cancel(reason)

    async def _close_session(self, event: SessionCloseRequested) -> None:
        session_id = event.session_id
        timeout = (event.drain_timeout_ms / 1000 if event.drain_timeout_ms
                   else self.limits.default_drain_timeout)
        if self._session_tasks.get(session_id, 0):
            idle = self._session_idle[session_id] = trio.Event()
            with trio.move_on_after(timeout):
                await idle.wait()
            for (sid, _), operation in list(self.operations.items()):
                if sid == session_id:
                    operation.cancel(EndReason.SHUTDOWN)
            if self._session_tasks.get(session_id, 0):
                await idle.wait()
        self._session_idle.pop(session_id, None)
        self._session_tasks.pop(session_id, None)
        self.stats.sessions_active -= 1
        try:
            self.write(self.sans_io.send_session_close_ack(session_id))
        except LocalProtocolError as exc:
            self.log.warning("session close ack not sent", error=str(exc))


# CancelSource is re-exported for handlers that inspect ``cancel_info``.
__all__ = ["CancelSource", "Connection", "ConnectionLimits", "RefusalHandler", "ServerStats"]
