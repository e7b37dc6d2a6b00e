"""A trio NNRP client: connect, open sessions, submit typed operations, stream events.

    async with connect("tcp://127.0.0.1:7700") as client:
        session = await client.open_session()
        operation = await session.submit(envelope_bytes)
        async for event in operation.events():
            ...                       # PartialReceived*, then ResultReceived or DropReceived
        await session.close()

``operation.cancel()`` sends a real CANCEL (or FRAME_CANCEL / ABORT); the terminal
then arrives as ``DropReceived`` (peer_cancelled).
"""

from __future__ import annotations

import contextlib
import itertools
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import attrs
import trio

from gateway.nnrp import (
    ClientConnection,
    ClientEvent,
    DropReceived,
    ErrorCode,
    ErrorReceived,
    FrameSubmit,
    HelloAcked,
    OtherReceived,
    PartialReceived,
    PressureLevel,
    ProtocolError,
    ResultReceived,
    RetryAfter,
    SessionCloseAcked,
    SessionOpenAnswered,
)
from gateway.transport import (
    PacketTransport,
    QuicClientOptions,
    connect as connect_transport,
)

OperationEvent = PartialReceived | ResultReceived | DropReceived


@attrs.frozen
class Trust:
    """What the tools trust on a TLS endpoint (tcps://, wss://, quic://): the PEM file of
    ``--ca-file`` (the server's certificate or its CA), or the system's store (None).
    One file serves every client: an ``ssl.SSLContext`` for tcps/wss, aioquic's own store
    for quic, DER for nnrp-py's native client."""

    ca_file: Path | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.ca_file is None:
            return None
        return ssl.create_default_context(cafile=str(self.ca_file))

    def quic(self) -> QuicClientOptions:
        return QuicClientOptions(ca_file=self.ca_file)

    def certificate_der(self) -> bytes | None:
        """The file's first certificate, DER (nnrp-py's native QUIC client trusts one)."""
        if self.ca_file is None:
            return None
        text = self.ca_file.read_text()
        begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
        if begin not in text:
            raise ValueError(f"{self.ca_file} holds no PEM certificate")
        start = text.index(begin)
        return ssl.PEM_cert_to_DER_cert(text[start:text.index(end, start) + len(end)])


class ClientError(Exception):
    """The server refused something (a session, a submit) or the connection broke."""


class ClientOperation:
    """One submitted operation; iterate ``events()`` until its terminal."""

    def __init__(self, session: ClientSession, operation_id: int, frame_id: int) -> None:
        self.session = session
        self.operation_id = operation_id
        self.frame_id = frame_id
        self._send, self._receive = trio.open_memory_channel[OperationEvent | ClientError](4096)
        self.terminal: ResultReceived | DropReceived | None = None
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
    def __init__(self, client: NnrpClient, session_id: int) -> None:
        self.client = client
        self.session_id = session_id
        self.operations: dict[int, ClientOperation] = {}
        self._ids = itertools.count(1)
        self.closed = trio.Event()

    async def submit(self, payload: bytes, *, operation_id: int | None = None,
                     frame_id: int | None = None, trace_id: int = 0) -> ClientOperation:
        """FRAME_SUBMIT with one STRUCTURED_EVENT frame holding ``payload``."""
        number = next(self._ids)
        operation_id = operation_id or number
        frame_id = frame_id or number
        operation = ClientOperation(self, operation_id, frame_id)
        self.operations[frame_id] = operation
        await self.client.send(self.client.sans_io.submit(
            self.session_id, operation_id, frame_id, payload, trace_id=trace_id))
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


class NnrpClient:
    def __init__(self, transport: PacketTransport) -> None:
        self.transport = transport
        self.sans_io = ClientConnection()
        self.sessions: dict[int, ClientSession] = {}
        self._hello = trio.Event()
        self._session_answers = trio.open_memory_channel[SessionOpenAnswered](64)
        self._send_lock = trio.Lock()
        self.errors: list[ErrorReceived] = []
        self.failure: Exception | None = None
        self.others: list[ClientEvent] = []

    async def send(self, data: bytes) -> None:
        if self.failure is not None:
            raise ClientError(f"connection failed: {self.failure}")
        async with self._send_lock:
            await self.transport.send([data])

    async def open_session(self, *, requested_session_id: int = 0, auth: bytes = b""
                           ) -> ClientSession:
        """SESSION_OPEN and its answer; raises ClientError when refused."""
        await self.send(self.sans_io.open_session(requested_session_id=requested_session_id,
                                                  auth=auth))
        answer = await self._session_answers[1].receive()
        if not answer.opened:
            raise ClientError(f"session refused (code {answer.ack.session_error_code:#x}): "
                              f"{answer.diagnostic.decode(errors='replace')}")
        session = ClientSession(self, answer.session_id)
        self.sessions[answer.session_id] = session
        return session

    async def _reader(self) -> None:
        try:
            while True:
                data = await self.transport.receive()
                if data is None:
                    raise ClientError("server closed the connection")
                events = (self.sans_io.receive_message(data) if self.transport.message_based
                          else self.sans_io.receive_data(data))
                for event in events:
                    await self._route(event)
        except (ClientError, ProtocolError, trio.BrokenResourceError) as exc:
            self.failure = exc
            error = exc if isinstance(exc, ClientError) else ClientError(str(exc))
            for session in self.sessions.values():
                for operation in session.operations.values():
                    with contextlib.suppress(trio.WouldBlock):
                        operation._send.send_nowait(error)
                session.closed.set()
            self._hello.set()

    async def _route(self, event: ClientEvent) -> None:
        if isinstance(event, HelloAcked):
            self._hello.set()
        elif isinstance(event, SessionOpenAnswered):
            await self._session_answers[0].send(event)
        elif isinstance(event, PartialReceived | ResultReceived | DropReceived):
            session = self.sessions[event.session_id]
            operation = session.operations[event.frame_id]
            await operation._send.send(event)
            if not isinstance(event, PartialReceived):
                del session.operations[event.frame_id]
        elif isinstance(event, SessionCloseAcked):
            if event.session_id in self.sessions:
                self.sessions.pop(event.session_id).closed.set()
        elif isinstance(event, ErrorReceived):
            self.errors.append(event)
            if event.error.is_fatal:
                raise ClientError(f"fatal ERROR {ErrorCode(event.error.code).name}: "
                                  f"{event.diagnostic.decode(errors='replace')}")
        else:
            self.others.append(event)
            packet = event.packet if isinstance(event, OtherReceived) else None
            if packet is not None and isinstance(packet.message, RetryAfter):
                owner = self.sessions.get(packet.session_id)
                waiting = owner.operations.get(packet.frame_id) if owner else None
                if waiting is not None:
                    waiting.retry_after_ms = packet.message.retry_after_ms


@asynccontextmanager
async def connect(uri: str, *, handshake_timeout: float = 10.0,
                  ssl_context: ssl.SSLContext | None = None,
                  quic: QuicClientOptions | None = None) -> AsyncIterator[NnrpClient]:
    """Connect to ``tcp://``, ``unix://``, ``ws://`` (or ``tcps://``, ``wss://``,
    ``quic://``, trusting ``ssl_context``; ``quic`` for QUIC's own options) and complete
    the hello.

    Error handling: a refused or broken handshake raises ``ClientError``; an exception
    from the body propagates as itself (the internal nursery's group is unwrapped).
    """
    try:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(handshake_timeout):
                transport = await connect_transport(uri, nursery, ssl_context, quic=quic)
            client = NnrpClient(transport)
            nursery.start_soon(client._reader)
            try:
                await client.send(client.sans_io.hello())
                with trio.fail_after(handshake_timeout):
                    await client._hello.wait()
                if client.failure is not None:
                    raise ClientError(f"handshake failed: {client.failure}")
                yield client
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await transport.aclose()
    except BaseExceptionGroup as group:
        # The reader never raises; a lone error here is the caller's or the handshake's.
        if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
            raise group.exceptions[0] from None
        raise
