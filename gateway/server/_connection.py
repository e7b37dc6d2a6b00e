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
operations; each operation reaches the wire only through its session's port. A resumable
session outlives the connection: when it ends without SESSION_CLOSE the session detaches
(``gateway.server._resume``, rule 3) instead of ending, and a resume or a migration
attaches it to another connection (``_adopt``), which replays what its client may have
missed (``_resubmitted``, ``_migrated``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, assert_never

import attrs
import structlog
import trio

from gateway.nnrp import (
    BudgetRequested,
    CapabilitiesNegotiated,
    ConnectionFailed,
    DeadlineUpdated,
    DropReason,
    ErrorCode,
    Event,
    FlowChanged,
    FrameIgnored,
    HandedOff,
    HandshakeCompleted,
    LocalProtocolError,
    MsgType,
    OperationCancelled,
    OperationResubmitted,
    OperationSubmitted,
    OperationSuperseding,
    PeerClosed,
    PeerError,
    PriorityRequested,
    RefusalReason,
    RemoteProtocolError,
    SendBytes,
    ServerConfig,
    ServerConnection,
    SessionCloseRequested,
    SessionError,
    SessionMigrated,
    SessionOpened,
    SessionOpenRefused,
    SessionResumed,
    SessionState,
    SubmitRefused,
    TraceContextUpdated,
    TransportId,
)
from gateway.profile import CANCEL_CAUSES, END_TABLE, EndCause, compare_resubmission
from gateway.transport import PacketTransport, TextMessageError, read_until_closed

from ._journal import ReplayGap
from ._operation import CancelInfo, Operation, OperationHandler
from ._outbox import Outbox
from ._relay import relay
from ._session import Observer, Session
from ._stats import ServerStats

if TYPE_CHECKING:
    from ._resume import Record, SessionRegistry

log = structlog.get_logger("gateway.server")
#: After a fatal ERROR, how long the connection waits for its client to close it.
FAILURE_LINGER = 1.0
#: Bytes kept of a connection before its first session, to relay it whole (``_relay``):
#: a hello, a resume, a resubmission or a few.
MAX_PREAMBLE = 256 << 10
_connection_ids = itertools.count(1)
#: The SESSION_MIGRATE transport id of each carrier kind (nnrp-wire.md section 1).
TRANSPORT_IDS = {"quic": TransportId.QUIC, "tcp": TransportId.TCP, "ipc": TransportId.IPC,
                 "websocket": TransportId.WEBSOCKET}


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
                 config: ServerConfig, limits: ConnectionLimits, *,
                 refusal: RefusalHandler | None = None, observer: Observer | None = None,
                 stats: ServerStats | None = None,
                 registry: SessionRegistry | None = None) -> None:
        self.connection_id = next(_connection_ids)
        self.transport = transport
        self.handler = handler
        self.refusal = refusal or plain_refusal
        self.observer = observer
        self.limits = limits
        self.registry = registry
        #: Claims resumable sessions for this connection (None: resume is refused).
        self._store = registry.store(self) if registry is not None else None
        #: The sans-IO protocol state (connection, sessions, operations as NNRP sees them).
        self.protocol = ServerConnection(config, store=self._store,
                                         transport_id=TRANSPORT_IDS.get(transport.kind))
        self.outbox = Outbox(limits.outbox_high_water, send_now=transport.send_now,
                             on_written=self._count_written)
        #: The sessions attached here, each owning its running operations.
        self.sessions: dict[int, Session] = {}
        #: Operations in flight of the sessions whose link is this connection.
        self._operations = 0
        #: The registry's record of each resumable session attached here.
        self._records: dict[int, Record] = {}
        self.stats = stats or ServerStats()
        self.closed = trio.Event()
        #: Set (and replaced) whenever the client changes a flow window.
        self.flow_changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._handshake_done = trio.Event()
        self._failed = False
        #: Every byte received until a session opens (a resume naming another worker's
        #: session is relayed there from the first byte: ``_relay``); None after, and
        #: from the start where there is no other worker to relay to.
        self._preamble: bytearray | None = (
            bytearray() if registry is not None and registry.settings.relays else None)
        #: The worker's relay socket this connection was handed to (``HandedOff``), and
        #: the answer it gets instead when that worker cannot be reached.
        self._handed_to: str | None = None
        self._hand_off_refusal = b""
        self._last_receive = trio.current_time()
        self.log = log.bind(connection_id=self.connection_id, transport=transport.kind)

    @property
    def operations(self) -> int:
        """Operations in flight on this connection, over every session attached to it.
        The direct-write policy asks on every flush, so it is a count kept as they come
        and go (``count_operations``), not a sum over the sessions (1.5 % of the samples
        at 256 streams, 16 sessions a connection: docs/benchmarks.md, issue 25)."""
        return self._operations

    def count_operations(self, change: int) -> None:
        """An attached session's operations came or went (``Session``: started, ended,
        attached here, detached from here)."""
        self._operations += change

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
                if self._handed_to is not None:
                    with trio.move_on_after(self.limits.write_timeout):
                        await self.outbox.wait_flushed()  # our hello ack goes first
                else:  # the peer is gone or broke the protocol
                    self._leave()
                nursery.cancel_scope.cancel()
            if self._handed_to is not None and self._preamble is not None:
                await self._relay(self._handed_to, bytes(self._preamble))
        except Exception:
            self.log.exception("connection crashed")
        finally:
            self.outbox.close()
            self._leave()
            with trio.CancelScope(shield=True):
                await self.transport.aclose()
            self.closed.set()

    def _leave(self) -> None:
        """The connection is over: each session that never sent SESSION_CLOSE detaches
        (a resumable one, while the server keeps it: ``_resume`` rule 3) or ends."""
        for session_id, session in list(self.sessions.items()):
            record = self._records.pop(session_id, None)
            self.sessions.pop(session_id)
            self.stats.sessions_active -= 1
            keep = (record is not None and not self._failed
                    and session.protocol.state is SessionState.OPEN
                    and self.registry is not None and self.registry.detach(record))
            if keep:
                self.protocol.detach(session_id)
                session.detach()
                self.log.info("session detached; it waits for its client to resume",
                              session_id=session_id, operations=len(session.operations))
                continue
            session.cancel_all(EndCause.PROTOCOL_FAILURE if self._failed
                               else EndCause.DISCONNECTED)
            if record is not None and self.registry is not None:
                self.registry.end(record)
        self._flow_changed()  # an operation held by the client's window looks again

    async def _relay(self, path: str, preamble: bytes) -> None:
        assert self.registry is not None
        self.registry.stats.relayed_total += 1
        self.log.info("resume relayed to the worker holding the session", worker_socket=path)
        try:
            holder = await trio.open_unix_socket(path)
        except OSError as exc:
            # That worker is gone (restarted), its sessions with it: the client is told
            # so, as for any token that opens nothing, and can open a new session.
            self.log.warning("the worker holding the session cannot be reached",
                             worker_socket=path, error=str(exc))
            with trio.move_on_after(self.limits.write_timeout):
                await self.transport.send([self._hand_off_refusal])
            return
        await relay(self.transport, holder, preamble)

    def can_hand_off(self) -> bool:
        """Nothing but the handshake has happened here: the connection can go whole."""
        return self._preamble is not None and not self.sessions

    def release_session(self, session_id: int) -> None:
        """A migration takes the session to another connection (``_resume`` rule 6):
        it leaves this one as it is, operations and all."""
        session = self.sessions.pop(session_id, None)
        self._records.pop(session_id, None)
        if session is not None:
            self.protocol.detach(session_id)
            session.detach()
            self.stats.sessions_active -= 1
            self._flow_changed()  # its operations held by our windows look again
            self.log.info("session migrated away", session_id=session_id)

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
            preamble = self._preamble
            if preamble is not None:
                preamble += data
                if len(preamble) > MAX_PREAMBLE:
                    self._preamble = None
            events = (protocol.receive_message(data) if self.transport.message_based
                      else protocol.receive_data(data))
            for event in events:
                if isinstance(event, ConnectionFailed):
                    await self._fail(event)
                    return
                if isinstance(event, PeerClosed):
                    return
                if isinstance(event, HandedOff):
                    assert self._store is not None
                    self._handed_to = self._store.handed_to
                    self._hand_off_refusal = event.refusal
                    return
                self._handle(event)
                if isinstance(event, PeerError) and event.fatal:
                    return
            if self.sessions:
                self._preamble = None

    async def _writer(self) -> None:
        try:
            await self.outbox.run_writer(self.transport.send, self.limits.write_timeout)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                OSError):
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()

    def _count_written(self, nbytes: int, packets: int) -> None:
        self.stats.bytes_out += nbytes
        self.stats.frames_out += packets

    async def _fail(self, failure: ConnectionFailed) -> None:
        """A fatal protocol violation: every operation ends now (the protocol wrote their
        drops, its state is gone), then the replies are flushed before the close."""
        self.stats.protocol_errors += 1
        self._failed = True
        for session in self.sessions.values():
            # The protocol wrote their drops (rule 2); nothing of them may follow.
            session.muted.update(session.operations)
            session.cancel_all(EndCause.PROTOCOL_FAILURE)
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
            case OperationResubmitted():
                self._resubmitted(event)
            case OperationCancelled():
                session = self.sessions.get(event.session_id)
                if session is not None:
                    session.cancel(event.operation_id, CANCEL_CAUSES[event.source], CancelInfo(
                        event.source, event.reason, event.diagnostic, trio.current_time()))
            case OperationSuperseding():
                operation = self._operation(event.session_id, event.operation_id)
                if operation is not None:
                    operation.supersede()
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
                self._flow_changed()
            case CapabilitiesNegotiated():
                self.log.info("runtime capabilities negotiated", session_id=event.session_id,
                              tokens=sorted(event.tokens))
            case FrameIgnored():
                self.stats.ignored_frames += 1
                self.log.debug("frame noted and ignored", session_id=event.session_id,
                               msg_type=event.msg_type, reason=event.reason)
            case SubmitRefused():
                self._refuse_submit(event)
            case SessionCloseRequested():
                assert self._nursery is not None
                self._nursery.start_soon(self._close_session, event)
            case HandshakeCompleted():
                self._handshake_done.set()
            case SessionOpened():
                self._open_session(event)
            case SessionResumed():
                self._adopt(event.session_id, resumed=True)
            case SessionMigrated():
                self._migrated(event)
            case SessionOpenRefused():
                self._session_refused(event)
            case PeerError():
                self.log.info("peer sent ERROR", code=event.error.code, fatal=event.fatal)
            case ConnectionFailed() | PeerClosed() | HandedOff():
                pass  # the reader ends the connection on these before they get here
            case _:
                assert_never(event)

    def _flow_changed(self) -> None:
        self.flow_changed.set()
        self.flow_changed = trio.Event()

    def _operation(self, session_id: int, operation_id: int) -> Operation | None:
        session = self.sessions.get(session_id)
        return session.operations.get(operation_id) if session is not None else None

    def _refuse_submit(self, event: SubmitRefused) -> None:
        self.stats.refused_submits += 1
        status, payload = self.refusal(event)
        recoverable = END_TABLE[EndCause(event.reason.value)].recoverable
        self.outbox.put_all(self.protocol.send_refusal(
            event.session_id, event.frame_id, event.operation_id, status, payload,
            retry_after_ms=(self.protocol.config.busy_retry_after_ms if recoverable
                            else None)))

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

    def _open_session(self, event: SessionOpened) -> None:
        assert self._nursery is not None
        protocol = self.protocol.session(event.session_id)
        assert protocol is not None
        record = None
        if event.resumable and self._store is not None and self.registry is not None:
            record = self._store.claimed.pop(event.session_id)
            session = Session(protocol, self.registry.nursery, self.handler, self.observer,
                              self.stats, journal=self.registry.journal())
            record.session = session
        else:
            session = Session(protocol, self._nursery, self.handler, self.observer,
                              self.stats)
        self._attach(session, record)
        self.stats.sessions_total += 1
        by_transport = self.stats.sessions_by_transport
        by_transport[self.transport.kind] = by_transport.get(self.transport.kind, 0) + 1
        if record is not None and self.registry is not None:
            self.registry.attached(record, self, resumed=False)

    def _attach(self, session: Session, record: Record | None) -> None:
        self.sessions[session.session_id] = session
        if record is not None:
            self._records[session.session_id] = record
        session.attach(self)
        self.stats.sessions_active += 1

    def _adopt(self, session_id: int, *, resumed: bool) -> Session:
        """A resumed or migrated session is attached here (``_resume`` rules 4, 6)."""
        assert self._store is not None
        assert self.registry is not None
        record = self._store.claimed.pop(session_id)
        session = record.session
        assert session is not None
        session.reattachments += 1
        for operation in session.operations.values():
            operation.reattached += 1
            operation.reattached_at.append(trio.current_time())
        if resumed:
            session.resumed()
        self._attach(session, record)
        self.registry.attached(record, self, resumed=resumed)
        self.log.info("session resumed" if resumed else "session migrated here",
                      session_id=session_id, operations=len(session.operations),
                      awaiting=len(session.held))
        return session

    def _migrated(self, event: SessionMigrated) -> None:
        """The results of frames after the client's last are replayed, then go on live
        (rule 4c of gateway.nnrp._server)."""
        assert self.registry is not None
        session = self._adopt(event.session_id, resumed=False)
        self.registry.stats.migrated_total += 1
        journal = session.journal
        if journal is None:
            return
        for record in sorted(journal.records.values(), key=lambda r: r.frame_id):
            if (record.frame_id > event.last_result_frame_id and record.entries
                    and session.live(record.operation_id)):  # not held, not muted
                self._send_again(session, record.operation_id,
                                 journal.kept(record.operation_id), None)
        session.changed()

    def _resubmitted(self, event: OperationResubmitted) -> None:
        """After a resume the client submitted an operation again: the same request gets
        what it may have missed, then goes on live; anything else is refused on its
        frame, and the operation it named ends (its results reach no one)."""
        session = self.sessions.get(event.session_id)
        journal = session.journal if session is not None else None
        record = journal.records.get(event.operation_id) if journal is not None else None
        if session is None or record is None:
            self._refuse_resubmission(event, RefusalReason.RESULTS_UNAVAILABLE,
                                      "the results of this operation are no longer held")
            return
        payload = b"".join(frame.payload for frame in event.typed_body.frames) if (
            event.typed_body is not None) else b""
        check = compare_resubmission(record.payload, payload)
        if not check.same:
            self._abandon(session, event.operation_id)
            self._refuse_resubmission(event, RefusalReason.RESUBMISSION_DIFFERS,
                                      "the resubmission is not the request it resubmits")
            return
        try:
            self._replay(session, event.operation_id, check.resume_after)
        except ReplayGap as gap:
            self._abandon(session, event.operation_id)
            self._refuse_resubmission(event, RefusalReason.RESULTS_UNAVAILABLE,
                                      f"{gap}; submit it anew")
            return
        session.resubmitted(event.operation_id)

    def _replay(self, session: Session, operation_id: int, after: int | None) -> None:
        assert session.journal is not None
        self._send_again(session, operation_id, session.journal.replay(operation_id, after),
                         after)

    def _send_again(self, session: Session, operation_id: int, packets: list[bytes],
                    after: int | None) -> None:
        assert self.registry is not None
        self.outbox.put_all(packets)
        partials = sum(1 for packet in packets if packet[6] == MsgType.PARTIAL_RESULT)
        operation = session.operations.get(operation_id)
        if operation is not None:
            operation.replayed_events += partials
        stats = self.registry.stats
        stats.replayed_events_total += partials
        stats.replayed_bytes_total += sum(map(len, packets))
        self.log.info("results replayed", session_id=session.session_id,
                      operation_id=operation_id, events=partials, after=after,
                      running=operation is not None)

    def _abandon(self, session: Session, operation_id: int) -> None:
        """Its resubmission was refused: nothing more of it may reach the client (the
        refusal is the frame's terminal), and it ends."""
        session.abandon(operation_id, EndCause.RESUME_ABANDONED)

    def _refuse_resubmission(self, event: OperationResubmitted, reason: RefusalReason,
                             message: str) -> None:
        self._refuse_submit(SubmitRefused(event.session_id, event.operation_id,
                                          event.frame_id, reason, message))

    def _session_refused(self, event: SessionOpenRefused) -> None:
        self.stats.sessions_refused += 1
        if event.error_code == SessionError.AUTH_FAILED:
            self.stats.auth_failures += 1
            self.log.warning("session authentication failed", peer=self.transport.peer)
        else:
            self.log.info("session refused", error_code=event.error_code, reason=event.message)

    def _start_operation(self, event: OperationSubmitted) -> None:
        session = self.sessions[event.session_id]
        typed = event.typed_body
        session.start(Operation(
            session.port(event.operation_id),
            connection_id=self.connection_id, transport=self.transport.kind,
            session_id=event.session_id, operation_id=event.operation_id,
            frame_id=event.frame_id, typed_body=typed, body_error=event.body_error,
            header_trace_id=event.header_trace_id, trace=event.trace,
            deadline_unix_ms=event.deadline_unix_ms,
            deadline_drop_reason=event.deadline_drop_reason,
            priority_class=event.priority_class, token_budget=event.token_budget),
            payload=b"".join(frame.payload for frame in typed.frames) if typed else b"")

    async def _close_session(self, event: SessionCloseRequested) -> None:
        session = self.sessions[event.session_id]
        # What the client never resubmitted after a resume it does not know of: it ends
        # unseen (its frames must not reach a client that holds no such operation).
        session.abandon_held(EndCause.RESUME_ABANDONED)
        timeout = (event.drain_timeout_ms / 1000 if event.drain_timeout_ms
                   else self.limits.default_drain_timeout)
        await session.drain(timeout)
        if self.sessions.pop(event.session_id, None) is not None:
            self.stats.sessions_active -= 1
        record = self._records.pop(event.session_id, None)
        if record is not None and self.registry is not None:
            self.registry.end(record)
        try:
            self.outbox.put(self.protocol.send_session_close_ack(event.session_id))
        except LocalProtocolError as exc:  # the connection failed while the session drained
            self.log.info("session close ack not sent", error=str(exc))
