"""A session and its operations as the caller holds them: submit, cancel, iterate the
events; the ticket that reopens a session elsewhere; the client's errors. The connection
they go through is ``_client``'s ``NnrpClient`` (``SessionClient`` here: what a session
needs of it)."""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Callable
from typing import Literal, Protocol

import attrs
import trio

from gateway.nnrp import (
    ClientConnection,
    DropReceived,
    FrameSubmit,
    PartialReceived,
    PressureLevel,
    ResultReceived,
    SessionAckFlag,
    SessionOpenAnswered,
)

OperationEvent = PartialReceived | ResultReceived | DropReceived
#: Ended operations' frames a session remembers (``_client`` rule 3's repeats).
MAX_ENDED_FRAMES = 1024


class SessionClient(Protocol):
    """The client a session belongs to, as the session and its operations see it
    (``_client.NnrpClient``): the connection's state machine, its sessions, and the
    sends. A migration moves a session from one client to another."""

    sans_io: ClientConnection
    sessions: dict[int, ClientSession]

    async def send(self, data: bytes) -> None: ...

    async def ping(self) -> int | None: ...

    async def _submit(self, operation: ClientOperation,
                      encode: Callable[[ClientConnection], bytes]) -> None: ...


class ClientError(Exception):
    """The server refused something (a session, a submit) or the connection broke.
    ``retry_later``: the server said to try again (a draining server, a session whose
    old connection it has not yet seen die), or the connection broke (try again on a new
    one)."""

    def __init__(self, message: str, *, retry_later: bool = False) -> None:
        super().__init__(message)
        self.retry_later = retry_later


class ConnectionLost(ClientError):
    """The connection ended under a request: not an answer, so worth another attempt."""

    def __init__(self, message: str = "server closed the connection") -> None:
        super().__init__(message, retry_later=True)


@attrs.frozen
class ResumeTicket:
    """What reopens a session on another connection: its id, its current token (a
    secret: never printed), and how long the server keeps it after a drop."""

    session_id: int
    token: bytes = attrs.field(repr=False)
    window_ms: int

    @classmethod
    def of(cls, answer: SessionOpenAnswered) -> ResumeTicket | None:
        ack = answer.ack
        if not ack.session_flags_ack & SessionAckFlag.RESUME_ENABLED:
            return None
        return cls(answer.session_id, answer.diagnostic[:ack.resume_token_bytes],
                   ack.resume_window_ms)


def resubmission(payload: bytes, after: int) -> bytes:
    """``payload`` declaring the results the client holds (``nnrp.resume_after_sequence``);
    a payload that is not a JSON object goes as it was (the server then replays from the
    start and the repeats are dropped here)."""
    try:
        document = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return payload
    if not isinstance(document, dict):
        return payload
    policy = document.get("nnrp")
    document["nnrp"] = {**(policy if isinstance(policy, dict) else {}),
                        "resume_after_sequence": after}
    return json.dumps(document).encode()


class ClientOperation:
    """One submitted operation; iterate ``events()`` until its terminal."""

    def __init__(self, session: ClientSession, operation_id: int, frame_id: int,
                 payload: bytes | None = None) -> None:
        self.session = session
        self.operation_id = operation_id
        self.frame_id = frame_id
        #: What was submitted (to resubmit it after a resume); None: not resubmittable.
        self.payload = payload
        #: The last result_sequence received.
        self.sequence = 0
        #: The sequence it held when it was last resubmitted after a resume: the results
        #: after it came on the new connection (None: never resubmitted).
        self.resubmitted_after: int | None = None
        #: The connection state its FRAME_SUBMIT was last encoded for (a recovery that
        #: resubmitted it on a new connection set this: it is not sent there again).
        self._submitted_on: ClientConnection | None = None
        self._send, self._receive = trio.open_memory_channel[OperationEvent | ClientError](4096)
        self.terminal: ResultReceived | DropReceived | None = None
        #: Where its terminal came among what the connection received (``received``):
        #: what came before a PONG was sent before the server read the PING (``ping``).
        self.terminal_at: int | None = None
        #: Set when the server said (RETRY_AFTER) when to try this operation again: its
        #: refusal or failure is recoverable.
        self.retry_after_ms: int | None = None

    def events(self) -> _OperationEvents:
        """Partial results in order, then the terminal; ends after the terminal.

        An iterator object rather than an async generator: callers may stop early
        (``break``) without leaving a suspended generator behind."""
        return _OperationEvents(self)

    async def cancel(self, how: Literal["cancel", "abort", "frame_cancel"] = "cancel", *,
                     reason: int = 1, diagnostic: bytes = b"") -> None:
        client = self.session.client
        if how == "frame_cancel":
            data = client.sans_io.frame_cancel(self.session.session_id, self.frame_id)
        else:
            data = client.sans_io.cancel(self.session.session_id, self.operation_id,
                                         frame_id=self.frame_id, reason=reason,
                                         abort=how == "abort", diagnostic=diagnostic)
        await client.send(data)

    async def trace_context(self, *, trace_id: int, span_id: int, trace_flags: int = 1,
                            attributes: bytes = b"") -> None:
        """Operation-scoped TRACE_CONTEXT (header.frame_id = this operation's frame)."""
        client = self.session.client
        await client.send(client.sans_io.trace_context(
            self.session.session_id, trace_id=trace_id, span_id=span_id,
            trace_flags=trace_flags, frame_id=self.frame_id, attributes=attributes))


class _OperationEvents:
    def __init__(self, operation: ClientOperation) -> None:
        self.operation = operation

    def __aiter__(self) -> _OperationEvents:
        return self

    async def __anext__(self) -> OperationEvent:
        operation = self.operation
        if operation.terminal is not None:
            raise StopAsyncIteration
        item = await operation._receive.receive()
        if isinstance(item, ClientError):
            raise item
        if isinstance(item, ResultReceived | DropReceived):
            operation.terminal = item
        return item


class ClientSession:
    def __init__(self, client: SessionClient, session_id: int, *,
                 ticket: ResumeTicket | None = None, auth: bytes = b"") -> None:
        self.client = client
        self.session_id = session_id
        self.operations: dict[int, ClientOperation] = {}
        self._ids = itertools.count(1)
        self.closed = trio.Event()
        #: Set while the session is resumable (rotated on every resume).
        self.ticket = ticket
        self._auth = auth
        #: How many times the session was resumed (or migrated) on a new connection.
        self.resumes = 0
        self.migrations = 0
        #: Frames of the most recent operations that ended (their terminal is held): what
        #: a migration sends again of them is a repeat (``ClientConnection.adopt_session``).
        self.ended_frames: deque[int] = deque(maxlen=MAX_ENDED_FRAMES)

    async def submit(self, payload: bytes, *, operation_id: int | None = None,
                     frame_id: int | None = None, trace_id: int = 0) -> ClientOperation:
        """FRAME_SUBMIT with one STRUCTURED_EVENT frame holding ``payload``."""
        number = next(self._ids)
        operation_id = operation_id or number
        frame_id = frame_id or number
        operation = ClientOperation(self, operation_id, frame_id, payload)
        self.operations[frame_id] = operation
        await self.client._submit(operation, lambda sans_io: sans_io.submit(
            self.session_id, operation_id, frame_id, payload, trace_id=trace_id))
        return operation

    async def resubmit(self, payload: bytes, *, operation_id: int, frame_id: int,
                       after: int = 0) -> ClientOperation:
        """After ``resume_session``: an operation of the lost connection again, on its ids,
        declaring the results it holds (those after ``after`` come; a server may send the
        held ones again, which are dropped)."""
        operation = ClientOperation(self, operation_id, frame_id, payload)
        operation.sequence = operation.resubmitted_after = after
        self.operations[frame_id] = operation
        await self.client._submit(operation, lambda sans_io: sans_io.submit(
            self.session_id, operation_id, frame_id, resubmission(payload, after) if after
            else payload, after_sequence=after))
        return operation

    async def submit_frame(self, meta: FrameSubmit, body: bytes, *,
                           frame_id: int | None = None) -> ClientOperation:
        """FRAME_SUBMIT with metadata and typed body as given (another profile's request,
        such as NNRP's token profile)."""
        frame_id = frame_id or next(self._ids)
        operation = ClientOperation(self, meta.operation_id, frame_id)
        self.operations[frame_id] = operation
        await self.client.send(self.client.sans_io.submit_frame(self.session_id, frame_id,
                                                                meta, body))
        return operation

    async def trace_context(self, *, trace_id: int, span_id: int, trace_flags: int = 1,
                            attributes: bytes = b"") -> None:
        """Session-default TRACE_CONTEXT (header.frame_id 0)."""
        await self.client.send(self.client.sans_io.trace_context(
            self.session_id, trace_id=trace_id, span_id=span_id, trace_flags=trace_flags,
            attributes=attributes))

    async def backpressure(self, level: PressureLevel, *, operation_id: int = 0) -> None:
        """BACKPRESSURE (soft, hard, paused) over this session's output."""
        await self.client.send(self.client.sans_io.backpressure(
            self.session_id, level, operation_id=operation_id))

    async def credit(self, window: int, *, operation_id: int = 0) -> None:
        """CREDIT_UPDATE: ``window`` more PARTIAL_RESULTs may come."""
        await self.client.send(self.client.sans_io.credit_update(
            self.session_id, window, operation_id=operation_id))

    async def resume(self) -> None:
        """FLOW_UPDATE resume: output flows again without a window."""
        await self.client.send(self.client.sans_io.flow_resume(self.session_id))

    async def close(self, *, abort: bool = False) -> None:
        """SESSION_CLOSE, then wait for SESSION_CLOSE_ACK (bound it with a cancel scope)."""
        await self.client.send(self.client.sans_io.close_session(self.session_id, abort=abort))
        await self.closed.wait()

    def resubmissions(self, sans_io: ClientConnection) -> list[bytes]:
        """After a resume (on the connection ``sans_io`` speaks for): every operation in
        flight again, declaring what it holds."""
        packets = []
        for operation in self.operations.values():
            payload = operation.payload
            if payload is None:
                continue  # not resubmittable (another profile's frame): its results wait
            operation.resubmitted_after = operation.sequence
            operation._submitted_on = sans_io
            packets.append(sans_io.submit(
                self.session_id, operation.operation_id, operation.frame_id,
                resubmission(payload, operation.sequence), after_sequence=operation.sequence))
        return packets
