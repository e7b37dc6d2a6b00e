"""One NNRP connection: a nursery with a reader, a writer, and its sessions' operations.

Malformed input policy (docs/reference/original-plan.md rule 5; docs/reference/nnrp-wire.md
section 5):

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
session outlives the connection: every decision about it is the sans-IO layer's
(gateway/nnrp/_resumption.py, gateway/nnrp/_server_lifecycle.py rule 4), and this module carries
out the events it returns: a session that detached (``_leave``), one resumed or
migrated here (``_adopt``), replays to write (``OperationResumed``, ``SessionMigrated``),
operations that end unseen (``OperationAbandoned``), a session another connection took
(``take_session``), and a liveness probe (``probe``).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, assert_never

import attrs
import structlog
import trio

from gateway.nnrp import (
    AbandonCause,
    BudgetRequested,
    CapabilitiesNegotiated,
    ConnectionFailed,
    DeadlineUpdated,
    DropReason,
    ErrorCode,
    Event,
    FlowChanged,
    ForwardOutcome,
    FrameIgnored,
    HandedOff,
    HandshakeCompleted,
    HolderProbed,
    LocalProtocolError,
    OperationAbandoned,
    OperationCancelled,
    OperationResumed,
    OperationSubmitted,
    OperationSuperseding,
    PeerClosed,
    PeerError,
    PriorityRequested,
    RemoteProtocolError,
    RequestKeyWanted,
    SendBytes,
    ServerConfig,
    ServerConnection,
    SessionCloseRequested,
    SessionError,
    SessionIds,
    SessionMigrated,
    SessionOpened,
    SessionOpenRefused,
    SessionResumed,
    SessionTaken,
    SubmitRefused,
    TraceContextUpdated,
)
from gateway.profile import CANCEL_CAUSES, END_TABLE, EndCause
from gateway.transport import (
    TRANSPORT_IDS,
    PacketTransport,
    TextMessageError,
    read_until_closed,
    tune_tcp,
)

from ._notes import OperationNotes
from ._operation import CancelInfo, Operation, OperationHandler
from ._outbox import Outbox
from ._relay import WORKER_MAGIC, RelayEnd, fields, relay, without_probes
from ._session import Observer, Session, until_then_cancel
from ._stats import ServerStats

if TYPE_CHECKING:
    from ._resume import SessionRegistry

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
    #: How long a forward waits to connect to the pod that holds the session.
    fleet_connect_timeout: float = 2.0


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
                 registry: SessionRegistry | None = None, ids: SessionIds | None = None,
                 relayed: bool = False, forwarded: bool = False,
                 notes: type[OperationNotes] = OperationNotes) -> None:
        self.connection_id = next(_connection_ids)
        self.transport = transport
        self.handler = handler
        self.refusal = refusal or plain_refusal
        self.observer = observer
        #: The class of each operation's notes (``GatewayServer``'s ``notes``).
        self.notes = notes
        self.limits = limits
        self.registry = registry
        #: The sans-IO protocol state (connection, sessions, operations as NNRP sees them).
        self.protocol = ServerConnection(
            config, book=registry.book if registry is not None else None, ids=ids,
            transport_id=TRANSPORT_IDS.get(transport.kind), relayed=relayed,
            forwarded=forwarded)
        self._credentials_known = False
        self.outbox = Outbox(limits.outbox_high_water, send_now=transport.send_now,
                             on_written=self._count_written)
        #: The sessions attached here, each owning its running operations.
        self.sessions: dict[int, Session] = {}
        #: Operations in flight of the sessions whose link is this connection.
        self._operations = 0
        self.stats = stats or ServerStats()
        self.closed = trio.Event()
        #: Set (and replaced) whenever the client changes a flow window.
        self.flow_changed = trio.Event()
        #: Set (and replaced) when a session is attached here (a drain waits for it).
        self._session_attached = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._handshake_done = trio.Event()
        self._failed = False
        #: The gateway closes it itself at the end of its drain: its sessions end.
        self._drained = False
        #: Every byte received while the connection may be handed to another worker or
        #: pod (``may_hand_off``, rule 4d: at most ``MAX_HAND_OFF_BYTES``), to relay it
        #: there from the first byte (``_relay``); None after, and from the start where
        #: there is nowhere to relay to: no other worker, no fleet (or forwarded here
        #: already), or relayed here by a worker (``_relay`` rule 1).
        settings = registry.settings if registry is not None else None
        self._preamble: bytearray | None = (
            bytearray() if settings is not None and not relayed
            and (settings.relays or (settings.fleet is not None and not forwarded))
            else None)
        #: Where this connection was handed to, and the answers it gets instead when that
        #: process cannot be reached or does not answer (``HandedOff``).
        self._handed_off: HandedOff | None = None
        self._last_receive = trio.current_time()
        self.log = log.bind(connection_id=self.connection_id, transport=transport.kind)

    @property
    def operations(self) -> int:
        """Operations in flight on this connection, over every session attached to it.
        The direct-write policy asks on every flush, so it is a count kept as they come
        and go (``count_operations``), not a sum over the sessions (1.5 % of the samples
        at 256 streams, 16 sessions a connection: docs/benchmarks.md)."""
        return self._operations

    def count_operations(self, change: int) -> None:
        """An attached session's operations came or went (``Session``: started, ended,
        attached here, detached from here)."""
        self._operations += change

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Serve until the peer leaves, a fatal error, or cancellation. Never raises."""
        if self.registry is not None:
            self.registry.register(self.protocol, self)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                nursery.start_soon(self._handshake_watchdog)
                nursery.start_soon(self._idle_watchdog)
                await self._reader()
                if self._handed_off is not None:
                    with trio.move_on_after(self.limits.write_timeout):
                        await self.outbox.wait_flushed()  # our hello ack goes first
                else:  # the peer is gone or broke the protocol
                    self._leave()
                nursery.cancel_scope.cancel()
            if self._handed_off is not None:
                # Kept while the protocol could hand it off (rule 4d), so it is all here.
                assert self._preamble is not None
                await self._relay(self._handed_off, bytes(self._preamble))
        except Exception:
            self.log.exception("connection crashed")
        finally:
            self.outbox.close()
            self._leave()
            if self.registry is not None:
                self.registry.unregister(self.protocol)
            with trio.CancelScope(shield=True):
                await self.transport.aclose()
            self.closed.set()

    def _leave(self) -> None:
        """The connection is over: each resumable session that never sent SESSION_CLOSE
        detaches and waits for its client (the book decides: ``connection_lost``); every
        other session ends, its operations with it."""
        lost = self.protocol.connection_lost(detach=not self._drained)
        for session_id in lost.detached:
            session = self.sessions.pop(session_id)
            self.stats.sessions_active -= 1
            session.detach()
            session.left_alone()
            self.log.info("session detached; it waits for its client to resume",
                          session_id=session_id, operations=len(session.operations))
        if lost.detached and self.registry is not None:
            self.registry.sessions_changed()
        cause = (EndCause.PROTOCOL_FAILURE if self._failed
                 else EndCause.SHUTDOWN if self._drained else EndCause.DISCONNECTED)
        for session_id, session in list(self.sessions.items()):
            del self.sessions[session_id]  # ended (lost.ended, or with the failure)
            self.stats.sessions_active -= 1
            session.detach()
            session.cancel_all(cause)
            if session.resumable and self.registry is not None:
                self.registry.ended(session)
        self._flow_changed()  # an operation held by the client's window looks again

    async def _relay(self, handed_off: HandedOff, preamble: bytes) -> None:
        """``_relay`` rules 1-4: to the worker or the pod that holds the session."""
        assert self.registry is not None
        destination = handed_off.destination
        settings = self.registry.settings
        peer = fields(self.transport, self.protocol.peer)
        pod = destination.pod
        holder: trio.SocketStream | None
        client_bytes = without_probes(preamble)
        if pod is not None:
            assert settings.fleet is not None
            holder = await self._reach_pod(pod)
            sealed = settings.fleet.seal_forward(pod, peer, client_bytes)
            opening, proof = sealed.opening, sealed.proof
        else:
            self.registry.stats.relayed_total += 1
            self.stats.notices.relayed.note(worker=destination.worker)
            try:
                holder = await trio.open_unix_socket(settings.relays[destination.worker])
            except OSError as exc:
                self.log.warning("the worker holding the session cannot be reached",
                                 worker=destination.worker, error=str(exc))
                holder = None
            opening, proof = WORKER_MAGIC + peer + client_bytes, b""
        if holder is None:  # rule 4: gone (a worker) or out of reach (a pod)
            await self._answer_instead(handed_off.refusal)
            return
        end = await relay(self.transport, holder, opening, proof,
                          on_greeted=lambda: self._count_forward(pod, ForwardOutcome.SENT))
        if end is RelayEnd.GREETED or end is RelayEnd.CLIENT_ENDED:
            self._count_forward(pod, ForwardOutcome.ABANDONED
                                if end is RelayEnd.CLIENT_ENDED else None)
            return
        self.log.warning("the process holding the session ended the relay before "
                         "answering; the client is told to retry", worker=destination.worker,
                         pod=pod, end=end.value)
        self._count_forward(pod, ForwardOutcome.UNREACHABLE if end is RelayEnd.UNSENT
                            else ForwardOutcome.REFUSED)
        await self._answer_instead(handed_off.refusal if end is RelayEnd.UNSENT
                                   else handed_off.busy)

    async def _reach_pod(self, pod: str) -> trio.SocketStream | None:
        """A connection to the pod ``pod`` (its ``--fleet-advertise`` address), tuned as
        a client's is (keepalive); None if it cannot be had in time."""
        host, _, port = pod.rpartition(":")
        try:
            with trio.fail_after(self.limits.fleet_connect_timeout):
                stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
        except (OSError, ValueError, trio.TooSlowError) as exc:
            self._count_forward(pod, ForwardOutcome.UNREACHABLE)
            self.log.warning("the pod holding the session cannot be reached; the client "
                             "is told to retry", pod=pod, error=str(exc) or type(exc).__name__)
            return None
        tune_tcp(stream)
        return stream

    def _count_forward(self, pod: str | None, outcome: ForwardOutcome | None) -> None:
        if pod is None or outcome is None:
            return
        assert self.registry is not None
        self.registry.stats.count_forward(outcome)

    async def _answer_instead(self, refusal: bytes) -> None:
        with trio.move_on_after(self.limits.write_timeout), contextlib.suppress(
                trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await self.transport.send([refusal])

    def take_session(self, session_id: int, notice: bytes) -> None:
        """A migration took the session to another connection (``_resumption`` R9): it
        leaves this one, operations and all, and the client here is told."""
        session = self.sessions.pop(session_id, None)
        if session is not None:
            session.detach()
            self.stats.sessions_active -= 1
            self._flow_changed()  # its operations held by our windows look again
            self.log.info("session migrated away", session_id=session_id)
        self.outbox.put(notice)

    def probe(self, ping: bytes, timeout: float) -> None:
        """A resume named a session attached here (``_resumption`` R8): show we are alive.
        Nothing at all from the client within ``timeout`` closes the connection, which
        detaches its resumable sessions."""
        if self._nursery is None:
            return
        self.outbox.put(ping)
        self._nursery.start_soon(self._probe_watchdog, trio.current_time() + timeout)

    async def _probe_watchdog(self, deadline: float) -> None:
        await trio.sleep_until(deadline)
        if self.protocol.probe_failed():
            if self.registry is not None:
                self.registry.stats.probe_failures_total += 1
            self.log.info("silent while its session was asked for elsewhere; closing",
                          peer=self.transport.peer)
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()

    async def shutdown(self, deadline: float, close_grace: float = 5.0) -> None:
        """Graceful end, by ``deadline`` at the latest:

        1. new sessions and submits are refused, recoverably ("try elsewhere"); resumes
           of this process's sessions are still answered (``_resumption`` R12);
        2. every session drains: operations finish, those still running at the deadline
           end with their drop;
        3. the output is flushed;
        4. the connection is left for the client to close, for ``close_grace`` (within
           the deadline), and only then closed. NNRP has no GOAWAY: a client that has
           not yet read its last frames when the server closes may lose them (nnrp-py's
           native client raises on the end of stream before handing over what it holds).
           A session resumed here meanwhile drains in turn (steps 2 to 4 again).
        """
        self.protocol.start_draining()
        while True:
            attached = self._session_attached
            async with trio.open_nursery() as nursery:
                for session in list(self.sessions.values()):
                    nursery.start_soon(session.drain,
                                       max(0.0, deadline - trio.current_time()))
            with trio.move_on_at(deadline):
                await self.outbox.wait_flushed()
            with trio.move_on_at(min(deadline, trio.current_time() + close_grace)):
                async with trio.open_nursery() as waits:
                    waits.start_soon(until_then_cancel, self.closed.wait, waits.cancel_scope)
                    waits.start_soon(until_then_cancel, attached.wait, waits.cancel_scope)
            if (self.closed.is_set() or not attached.is_set()
                    or trio.current_time() >= deadline):
                break
        # Closed by the gateway, everything delivered: its sessions end, none waits for a
        # resume (one whose client dropped meanwhile has detached already and may).
        self._drained = True
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
                data = await self.transport.receive(protocol.awaited)
            except TextMessageError as exc:
                await self._fail(protocol.protocol_failure(
                    RemoteProtocolError(str(exc), code=ErrorCode.MALFORMED_HEADER)))
                return
            if data is None:
                return
            if not self._credentials_known:
                # The carrier knows its client once bytes came (a TLS handshake is done).
                protocol.peer = self.transport.credentials()
                self._credentials_known = True
            self._last_receive = trio.current_time()
            self.stats.bytes_in += len(data)
            if self._preamble is not None:
                self._preamble += data
            # A message is the carrier's to give (gateway/transport/_websocket.py).
            events = (protocol.receive_message(data, given_away=True)
                      if self.transport.message_based else protocol.receive_data(data))
            while True:
                wanted: RequestKeyWanted | None = None
                for event in events:
                    if isinstance(event, ConnectionFailed):
                        await self._fail(event)
                        return
                    if isinstance(event, PeerClosed):
                        return
                    if isinstance(event, HandedOff):
                        self._handed_off = event
                        return
                    if isinstance(event, RequestKeyWanted):
                        wanted = event  # nothing but a failure after it
                        continue
                    self._handle(event)
                    if isinstance(event, PeerError) and event.fatal:
                        return
                if wanted is None:
                    break
                # ``_server_session`` rule 5c: a big request's key, computed where hashing
                # (which releases the GIL) holds no other connection's events; what
                # this client sent after it waits, in order, as while its bytes arrive.
                read = await trio.to_thread.run_sync(
                    protocol.config.resubmission.read, wanted.body, abandon_on_cancel=True)
                events = protocol.request_keyed(read)
            if not protocol.may_hand_off:
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
        drops and ended the sessions: nothing more of them goes out), then the replies
        are flushed before the close."""
        self.stats.protocol_errors += 1
        self._failed = True
        for session in self.sessions.values():
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
            case OperationResumed():
                self._operation_resumed(event)
            case OperationAbandoned():
                session = self.sessions.get(event.session_id)
                if session is not None:
                    session.cancel(event.operation_id, ABANDON_CAUSES[event.cause])
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
            case SessionTaken():
                previous = (self.registry.connection_of(event.previous)
                            if self.registry is not None else None)
                if previous is not None:
                    previous.take_session(event.session_id, event.notice)
            case HolderProbed():
                holder = (self.registry.connection_of(event.holder)
                          if self.registry is not None else None)
                if holder is not None:
                    holder.probe(event.ping, event.timeout)
            case SessionOpenRefused():
                self._session_refused(event)
            case PeerError():
                self.log.info("peer sent ERROR", code=event.error.code, fatal=event.fatal)
            case ConnectionFailed() | PeerClosed() | HandedOff() | RequestKeyWanted():
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
            operation.notes.priority_updates += 1
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
        registry = self.registry
        if event.resumable and registry is not None:
            record = registry.book.record_of(event.session_id)
            assert record is not None
            session = Session(protocol, registry.nursery, self.handler, self.observer,
                              self.stats, client=record.client)
            registry.adopt(session)
        else:
            session = Session(protocol, self._nursery, self.handler, self.observer,
                              self.stats)
            if event.not_granted is not None:
                self.stats.notices.not_granted.note(reason=event.not_granted)
        self._attach(session)
        self.stats.sessions_total += 1
        by_transport = self.stats.sessions_by_transport
        by_transport[self.transport.kind] = by_transport.get(self.transport.kind, 0) + 1

    def _attach(self, session: Session) -> None:
        self.sessions[session.session_id] = session
        session.attach(self)
        self.stats.sessions_active += 1
        self._session_attached.set()
        self._session_attached = trio.Event()

    def _adopt(self, session_id: int, *, resumed: bool) -> Session:
        """A resumed or migrated session is attached here (``_resumption`` R7, R9)."""
        assert self.registry is not None
        session = self.registry.by_id[session_id]
        session.reattachments += 1
        for operation in session.operations.values():
            operation.notes.reattached_at.append(trio.current_time())
        self._attach(session)
        self.registry.sessions_changed()
        self.log.info("session resumed" if resumed else "session migrated here",
                      session_id=session_id, operations=len(session.operations),
                      awaiting=len(session.protocol.awaiting))
        return session

    def _migrated(self, event: SessionMigrated) -> None:
        """What is held of frames after the client's last goes out, then the session goes
        on live (rule 4c of gateway.nnrp._server_lifecycle)."""
        session = self._adopt(event.session_id, resumed=False)
        if event.replay:
            self._replayed(session, None, event.replay, event.replayed_events, None)
        session.changed()

    def _operation_resumed(self, event: OperationResumed) -> None:
        """A resubmission was accepted (``_server_session`` rule 5b): its replay goes out,
        then the operation goes on live."""
        session = self.sessions.get(event.session_id)
        if session is None:
            return
        self._replayed(session, event.operation_id, event.replay, event.replayed_events,
                       event.after)
        session.changed()

    def _replayed(self, session: Session, operation_id: int | None,
                  packets: tuple[bytes, ...], events: int, after: int | None) -> None:
        assert self.registry is not None
        self.outbox.put_all(list(packets))
        operation = (session.operations.get(operation_id) if operation_id is not None
                     else None)
        if operation is not None:
            operation.notes.replayed_events += events
        stats = self.registry.stats
        stats.replayed_events_total += events
        stats.replayed_bytes_total += sum(map(len, packets))
        self.log.info("results replayed", session_id=session.session_id,
                      operation_id=operation_id, events=events, after=after,
                      running=operation is not None)

    def _session_refused(self, event: SessionOpenRefused) -> None:
        """Counted always; logged at most once a second a kind when a client could
        provoke it at will (``Notice``)."""
        stats, notices = self.stats, self.stats.notices
        stats.sessions_refused += 1
        if event.rate_limited:
            stats.refusals_rate_limited += 1
            notices.rate_limited.note(peer=self.transport.peer)
        elif event.error_code == SessionError.AUTH_FAILED:
            stats.auth_failures += 1
            notices.auth_failed.note(peer=self.transport.peer)
        elif event.resume:
            notices.resume_refused.note(error_code=event.error_code, reason=event.message,
                                        peer=self.transport.peer)
        else:
            self.log.info("session refused", error_code=event.error_code, reason=event.message)

    def _start_operation(self, event: OperationSubmitted) -> None:
        session = self.sessions[event.session_id]
        session.start(Operation(
            session.port(event.operation_id),
            connection_id=self.connection_id, transport=self.transport.kind,
            session_id=event.session_id, operation_id=event.operation_id,
            frame_id=event.frame_id, typed_body=event.typed_body, body_error=event.body_error,
            header_trace_id=event.header_trace_id, trace=event.trace,
            deadline_unix_ms=event.deadline_unix_ms,
            deadline_drop_reason=event.deadline_drop_reason,
            priority_class=event.priority_class, token_budget=event.token_budget,
            notes=self.notes))

    async def _close_session(self, event: SessionCloseRequested) -> None:
        session = self.sessions[event.session_id]
        timeout = (event.drain_timeout_ms / 1000 if event.drain_timeout_ms
                   else self.limits.default_drain_timeout)
        await session.drain(timeout)
        if self.sessions.pop(event.session_id, None) is not None:
            self.stats.sessions_active -= 1
            session.detach()
        try:
            self.outbox.put(self.protocol.send_session_close_ack(event.session_id))
        except LocalProtocolError as exc:  # the connection failed while the session drained
            self.log.info("session close ack not sent", error=str(exc))
        if session.resumable and self.registry is not None:
            self.registry.ended(session)



#: How an operation abandoned after a resume ends (the outcome table's causes).
ABANDON_CAUSES = {AbandonCause.RESUBMISSION_REFUSED: EndCause.RESUME_ABANDONED,
                  AbandonCause.SESSION_CLOSED: EndCause.RESUME_ABANDONED}
