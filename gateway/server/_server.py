"""The NNRP server: listeners, admission, connections, graceful shutdown.

The listener set. ``GatewayServer.serve`` is the one owner of every listener it is
given, and treats them as one set:

1. **Bound atomically.** Listeners bind one after another, inside one accept nursery. A
   bind that fails (``ListenError``) cancels that nursery: every listener already bound
   closes (its socket, and a unix socket's file) before the error leaves ``serve``.
   Nothing is served unless everything is.
2. **Closed together.** A listener that fails for good after its bind (a terminal
   ``accept()`` failure, ``transport.ACCEPT_FAILURES``; a QUIC socket that fails)
   raises ``ListenerFailed``, which cancels the accept nursery: every other listener
   stops accepting too, at once, rather than the set silently shrinking. A stream
   listener closes its socket; a QUIC listener keeps its UDP socket while QUIC
   connections it serves remain (their datagrams arrive there) and drops every new
   handshake (``QuicListener.stop_accepting``). ``accepting`` goes
   false and ``listener_failure`` keeps the failure, so readiness fails with the reason
   (``gateway.app.Gateway.readiness``) and ``listener_set_failed`` is set; the
   connections already open are not touched (the process drains them, as on SIGTERM,
   and exits with the failure: ``gateway.app.serve_until_signalled``).
3. **Stopped together.** ``shutdown`` cancels the same accept scope: at once, or, while
   a resumable session lives (attached or waiting detached for its client), once none
   does or the drain time is over. Until then new connections are taken in the drain's
   terms (new sessions retry_later, resumes answered: gateway/nnrp/_resumption.py R12),
   and drained in turn, so a client that lost its connection, before or during the
   drain, collects what finished while it was away. ``shutdown`` returns once every
   connection, those taken during the drain included, has drained.
"""

from __future__ import annotations

import contextlib
import math
import os
import ssl
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs
import structlog
import trio

from gateway.nnrp import (
    ErrorCode,
    ErrorScope,
    ForwardOutcome,
    ResumePolicy,
    ServerConfig,
    ServerConnection,
    SessionIds,
)
from gateway.transport import (
    ACCEPT_BACKOFF,
    Endpoint,
    ListenerFailed,
    ListenError,
    StreamTransport,
    WebSocketTransport,
    accept_failure_is_terminal,
    bound_uri,
    describe_peer,
    fleet_uri,
    open_unix_listener,
    parse_endpoint,
    read_until_closed,
    tune_tcp,
)

from ._connection import Connection, ConnectionLimits, RefusalHandler
from ._notes import OperationNotes
from ._relay import forwarded, relayed
from ._resume import SessionRegistry
from ._stats import ServerStats

if TYPE_CHECKING:
    from gateway.transport import Inherited, PacketTransport, QuicSettings
    from gateway.transport.quic import QuicListener

    from ._operation import OperationHandler
    from ._session import Observer

log = structlog.get_logger("gateway.server")


#: Refused connections (SERVER_BUSY) left open for their client to close, at most at once.
REFUSALS_LINGERING = 64
#: How long a refused connection (its ERROR sent) is left for its client to close.
REFUSAL_LINGER = 1.0
#: Connections to the fleet port still sending their forward header; past it one is
#: closed at once (a slow-header flood holds no more than this, each for HEADER_TIMEOUT).
MAX_PENDING_FORWARDS = 64
#: At most one log line per this many seconds for forwards refused (the count goes on).
FORWARD_WARNING_INTERVAL = 10.0


@attrs.frozen
class BoundEndpoint:
    """A listener after binding: the URI clients use (port 0 resolved)."""

    spec: Endpoint
    uri: str
    host: str = ""
    port: int = 0

    @property
    def transport(self) -> str:
        return self.spec.transport


class GatewayServer:
    """Serves NNRP on any number of listeners, handing operations to ``handler``.

    Args:
        handler: runs one operation to its terminal (the vLLM pipeline).
        config: protocol limits (sessions per connection, in-flight per session, size cap).
        limits: per-connection I/O limits (handshake timeout, output buffer).
        max_connections: beyond this, a new connection gets ERROR SERVER_BUSY and is closed.
        refusal: the answer to a refused submit (the profile's).
        observer: told of every operation once it has ended (logs and metrics).
        notes: the class of each operation's notes: ``OperationNotes``, or an observer's
            subclass with room for what its handler notes (the app's ``RecordNotes``).
        quic: certificate and limits for ``quic://`` listeners (none without it).
        inherited: listeners a ``--workers`` supervisor bound for this process, by URI as
            configured (``gateway.transport.bind_shared``); the others are bound here.
        resume: what resumable sessions may hold (``_resume``); None or a zero window
            refuses resume and migration.
    """

    def __init__(self, handler: OperationHandler, *, config: ServerConfig | None = None,
                 limits: ConnectionLimits | None = None, max_connections: int = 1024,
                 refusal: RefusalHandler | None = None, observer: Observer | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 quic: QuicSettings | None = None,
                 inherited: Sequence[Inherited] = (),
                 resume: ResumePolicy | None = None,
                 notes: type[OperationNotes] = OperationNotes) -> None:
        self.handler = handler
        self._inherited = {listener.uri: listener for listener in inherited}
        self.observer = observer
        self.notes = notes
        self.config = config or ServerConfig()
        self.limits = limits or ConnectionLimits()
        self.max_connections = max_connections
        self._refusals_lingering = 0
        self.refusal = refusal
        self.ssl_context = ssl_context
        self.quic = quic
        self.quic_listeners: list[QuicListener] = []
        self.endpoints: list[BoundEndpoint] = []
        self.connections: set[Connection] = set()
        self.stats = ServerStats()
        #: Every session id of the process (unique across its connections).
        self.ids = SessionIds(random_ids=resume is not None and resume.fleet is not None)
        #: Resumable sessions, between their connections (None: resume is off).
        self.registry = (SessionRegistry(resume, ids=self.ids)
                         if resume is not None and resume.enabled else None)
        #: Set by ``shutdown``: connections taken from now on start drained, their
        #: drains in ``_drains`` (which ``shutdown`` waits for).
        self._drain_deadline: float | None = None
        self._close_grace = 5.0
        self._drains: trio.Nursery | None = None
        self._accept_scope = trio.CancelScope()
        self._connection_nursery: trio.Nursery | None = None
        self._unix_paths: list[str] = []
        self.accepting = False
        #: The listener failure that closed the whole set (module rule 2), if any.
        self.listener_failure: ListenerFailed | None = None
        self.listener_set_failed = trio.Event()

    async def serve(self, uris: list[str], *,
                    task_status: trio.TaskStatus[list[BoundEndpoint]] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Bind every listener (all or none: module rule 1), report the endpoints, and
        serve until cancelled or shut down. A listener failing for good afterwards closes
        the whole set (rule 2); the connections already open go on until they end."""
        specs = [(uri, parse_endpoint(uri)) for uri in uris]
        started = False
        try:
            async with trio.open_nursery() as connections:
                self._connection_nursery = connections
                if self.registry is not None:
                    await connections.start(self.registry.run)
                try:
                    with self._accept_scope:
                        async with trio.open_nursery() as accept:
                            if self.registry is not None and self.registry.settings.relays:
                                await accept.start(self._serve_relays)
                            if self.registry is not None and self.registry.settings.fleet:
                                await accept.start(self._serve_fleet)
                            # Accepting before the first listener starts: a worker's
                            # listener may already hold connections in its backlog (the
                            # supervisor bound it), and the first of them is accepted as
                            # the listener starts.
                            self.accepting = True
                            for uri, spec in specs:
                                endpoint = await accept.start(self._listen, uri, spec)
                                self.endpoints.append(endpoint)
                            started = True
                            task_status.started(list(self.endpoints))
                except* ListenerFailed as failures:
                    if not started:
                        raise  # during the binds: rule 1, the set never served
                    self._listener_set_failed(failures)
                self.accepting = False  # the listeners are gone; the sessions drain
        finally:
            self.accepting = False
            for path in self._unix_paths:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def _listener_set_failed(self, failures: BaseExceptionGroup[ListenerFailed]) -> None:
        """Module rule 2: the accept nursery is over, so every listener is closed."""
        failure = _first_leaf(failures)
        assert isinstance(failure, ListenerFailed)
        self.accepting = False
        self.listener_failure = failure
        log.error("listener failed; the whole listener set is closed",
                  endpoint=failure.uri, transport=failure.transport,
                  error=str(failure.error), connections_open=len(self.connections))
        self.listener_set_failed.set()

    async def shutdown(self, drain_timeout: float, close_grace: float = 5.0) -> None:
        """Drain in-flight operations for ``drain_timeout``, drop what is left, and leave
        each connection for its client to close (``Connection.shutdown``). Accepting
        stops at once, or once no resumable session lives (module rule 3)."""
        deadline = trio.current_time() + drain_timeout
        self._drain_deadline, self._close_grace = deadline, close_grace
        registry = self.registry
        if registry is not None:
            registry.start_draining(deadline)
        async with trio.open_nursery() as drains:
            self._drains = drains
            for connection in list(self.connections):
                drains.start_soon(connection.shutdown, deadline, close_grace)
            if registry is not None and registry.sessions and self.accepting:
                log.info("draining; resumes are still taken", sessions=registry.sessions,
                         detached=registry.detached)
                with trio.move_on_at(deadline):
                    await registry.wait_no_sessions()
            self.accepting = False
            self._accept_scope.cancel()
        self._drains = None
        if registry is not None:
            registry.finish()

    # ------------------------------------------------------------------ listeners

    async def _listen(self, uri: str, spec: Endpoint,
                      task_status: trio.TaskStatus[BoundEndpoint]) -> None:
        inherited = self._inherited.get(uri)
        if spec.scheme == "quic":
            await self._listen_quic(spec, inherited, task_status)
            return
        if spec.tls and self.ssl_context is None:
            raise ListenError(f"{spec.scheme}:// needs a certificate (--tls-cert, --tls-key)")
        try:
            listeners = await self._stream_listeners(spec, inherited)
        except OSError as exc:
            raise ListenError.cannot_bind(uri, exc) from exc
        sockname = listeners[0].socket.getsockname()
        endpoint = (BoundEndpoint(spec, bound_uri(spec, sockname)) if spec.scheme == "unix"
                    else BoundEndpoint(spec, bound_uri(spec, sockname), *sockname[:2]))
        log.info("listening", endpoint=endpoint.uri, transport=endpoint.transport)
        task_status.started(endpoint)
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept_loop, endpoint.uri, listener,
                                   spec.transport, spec.tls,
                                   spec.path if spec.transport == "websocket" else None)

    async def _stream_listeners(self, spec: Endpoint, inherited: Inherited | None
                                ) -> list[trio.SocketListener]:
        """The worker's inherited sockets (``--workers``), or bind our own."""
        if inherited is not None:
            return [trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                    for sock in inherited.adopt()]
        if spec.scheme == "unix":
            listener = await open_unix_listener(spec.path)
            self._unix_paths.append(spec.path)  # ours to remove (a worker's is not)
            return [listener]
        return await trio.open_tcp_listeners(spec.port, host=spec.host)

    async def _accept_loop(self, uri: str, listener: trio.SocketListener, transport: str,
                           tls: bool = False, websocket_path: str | None = None) -> None:
        def take(stream: trio.SocketStream) -> None:
            assert self._connection_nursery is not None
            peer = describe_peer(stream)
            wrapped: trio.abc.Stream = stream
            if tls:
                # The handshake runs on first read, inside the connection's handshake
                # timeout; a failed one closes only this connection.
                assert self.ssl_context is not None
                # wss:// clients (browsers) may end without TLS's close_notify.
                wrapped = trio.SSLStream(stream, self.ssl_context, server_side=True,
                                         https_compatible=transport == "websocket")
            carrier: PacketTransport
            if transport == "websocket":  # its handshake runs on first use, timed as TLS's
                carrier = WebSocketTransport(wrapped, peer, path=websocket_path)
            else:
                carrier = StreamTransport(wrapped, transport, peer)
            self._connection_nursery.start_soon(self._serve_connection, carrier)

        await self._accept_each(uri, listener, transport, take)

    @staticmethod
    async def _accept_each(uri: str, listener: trio.SocketListener, transport: str,
                           take: Callable[[trio.SocketStream], None]) -> None:
        """Accept until the listener fails for good (module rule 2), each stream tuned
        and given to ``take``."""
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except (OSError, trio.ClosedResourceError) as exc:
                    if accept_failure_is_terminal(exc):  # transport.ACCEPT_FAILURES
                        raise ListenerFailed(uri, transport, exc) from exc
                    log.warning("accept failed; backing off", endpoint=uri, error=str(exc))
                    await trio.sleep(ACCEPT_BACKOFF)
                    continue
                tune_tcp(stream)
                take(stream)

    async def _listen_quic(self, spec: Endpoint, inherited: Inherited | None,
                           task_status: trio.TaskStatus[BoundEndpoint]) -> None:
        """One UDP socket. Its datagram loop lives in the connection nursery (a draining
        server keeps serving established QUIC connections); this task only stops it
        accepting when the accept scope ends."""
        from gateway.transport.quic import QuicListener  # aioquic: only when QUIC is served

        if self.quic is None:
            raise ListenError("quic:// needs a certificate (--tls-cert, --tls-key)")
        try:
            listener = (QuicListener(self.quic, inherited.adopt()[0]) if inherited
                        else await QuicListener.bind(self.quic, spec.host, spec.port))
        except ValueError as exc:
            raise ListenError(f"quic://{spec.host}:{spec.port}: {exc}") from exc
        except OSError as exc:
            raise ListenError.cannot_bind(f"quic://{spec.host}:{spec.port}", exc) from exc
        self.quic_listeners.append(listener)
        assert self._connection_nursery is not None
        failed: list[OSError] = []
        socket_failed = trio.Event()

        async def run_datagrams() -> None:
            try:
                await listener.run(self._serve_connection)
            except* OSError as failures:  # its socket failed for good (module rule 2)
                error = _first_leaf(failures)
                assert isinstance(error, OSError)
                failed.append(error)
                socket_failed.set()

        self._connection_nursery.start_soon(run_datagrams)
        endpoint = BoundEndpoint(spec, bound_uri(spec, (listener.host, listener.port)),
                                 listener.host, listener.port)
        log.info("listening", endpoint=endpoint.uri, transport=endpoint.transport,
                 alpn=self.quic.alpn.value)
        task_status.started(endpoint)
        try:
            await socket_failed.wait()
            raise ListenerFailed(endpoint.uri, spec.transport, failed[0]) from failed[0]
        finally:
            listener.stop_accepting()

    async def _serve_relays(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Connections another worker hands over whole: resumes of sessions held here
        that the kernel gave to it (``_relay``; gateway/nnrp/_resumption.py R11)."""
        assert self.registry is not None
        settings = self.registry.settings
        path = settings.relays[settings.worker]
        listener = await open_unix_listener(path)
        self._unix_paths.append(path)
        task_status.started()
        assert self._connection_nursery is not None
        nursery = self._connection_nursery

        async def take(stream: trio.SocketStream) -> None:
            try:
                transport = await relayed(stream)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            if transport is None:
                await trio.aclose_forcefully(stream)
                return
            await self._serve_connection(transport, relayed=True)

        async with listener:
            while True:
                stream = await listener.accept()
                try:
                    nursery.start_soon(take, stream)
                except RuntimeError:  # the server is going: nobody to take it
                    await trio.aclose_forcefully(stream)
                    raise

    async def _serve_fleet(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Connections other pods of the fleet forward whole: resumes of sessions held
        here that the load balancer gave to them (``_relay``; gateway/nnrp/_fleet.py). On
        the ``--fleet-advertise`` address, under the accept scope, so a draining pod takes
        them while a resumable session lives (module rule 3)."""
        assert self.registry is not None
        fleet = self.registry.settings.fleet
        assert fleet is not None
        uri = fleet_uri(fleet.advertise)
        spec = parse_endpoint(uri)
        try:
            listeners = await self._stream_listeners(spec, self._inherited.get(uri))
        except OSError as exc:
            raise ListenError(f"cannot listen for the fleet on {fleet.advertise} "
                              f"(--fleet-advertise): {exc.strerror or exc}") from exc
        log.info("taking forwarded resumes from the fleet", advertise=fleet.advertise)
        task_status.started()
        assert self._connection_nursery is not None
        nursery = self._connection_nursery
        stats = self.registry.stats
        pending = 0  # connections still sending their header
        last_warning = -math.inf
        quiet = 0  # rejections not logged since the last warning

        def rejected(stream: trio.SocketStream, why: str) -> None:
            nonlocal last_warning, quiet
            stats.count_forward(ForwardOutcome.REJECTED)
            # A scan or a health check of the fleet port is not worth a line each.
            if trio.current_time() - last_warning < FORWARD_WARNING_INTERVAL:
                quiet += 1
                return
            log.warning(f"a forward that is not the fleet's was refused ({why})",
                        peer=describe_peer(stream), refused_since_last=quiet)
            last_warning, quiet = trio.current_time(), 0

        async def take(stream: trio.SocketStream) -> None:
            nonlocal pending
            if pending >= MAX_PENDING_FORWARDS:
                rejected(stream, "too many still sending their header")
                await trio.aclose_forcefully(stream)
                return
            pending += 1
            try:
                transport = await forwarded(stream, fleet)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            finally:
                pending -= 1
            if transport is None:
                rejected(stream, "another key, another pod's, a stale or replayed header")
                await trio.aclose_forcefully(stream)
                return
            stats.count_forward(ForwardOutcome.ACCEPTED)
            await self._serve_connection(transport, forwarded=True)

        def start(stream: trio.SocketStream) -> None:
            nursery.start_soon(take, stream)

        async with trio.open_nursery() as accepting:
            for listener in listeners:
                accepting.start_soon(self._accept_each, uri, listener, "fleet", start)

    def reload_quic_tls(self) -> None:
        """SIGHUP: new QUIC handshakes use the re-read files (a bad file keeps the old)."""
        for listener in self.quic_listeners:
            try:
                listener.reload_tls()
            except (OSError, ValueError) as exc:
                log.error("QUIC TLS reload failed; keeping the previous certificate",
                          error=str(exc), port=listener.port)

    # ------------------------------------------------------------------ connections

    async def _serve_connection(self, transport: PacketTransport, *, relayed: bool = False,
                                forwarded: bool = False) -> None:
        if not self.accepting:
            self.stats.connections_refused += 1
            await self._refuse(transport, "the gateway is shutting down; retry later")
            return
        if len(self.connections) >= self.max_connections:
            self.stats.connections_refused += 1
            await self._refuse(transport, "connection limit reached; retry later")
            return
        connection = Connection(transport, self.handler, self.config, self.limits,
                                refusal=self.refusal, observer=self.observer, stats=self.stats,
                                registry=self.registry, ids=self.ids, relayed=relayed,
                                forwarded=forwarded, notes=self.notes)
        if self._drain_deadline is not None:  # module rule 3: taken in the drain's terms
            if self._drains is None:  # the drain is over: nobody would drain it
                self.stats.connections_refused += 1
                await self._refuse(transport, "the gateway is shutting down; retry later")
                return
            connection.protocol.start_draining()
            self._drains.start_soon(connection.shutdown, self._drain_deadline,
                                    self._close_grace)
        self.connections.add(connection)
        self.stats.connections_active += 1
        self.stats.connections_total += 1
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)
            self.stats.connections_active -= 1

    async def _refuse(self, transport: PacketTransport, message: str) -> None:
        """Admission refusal: one fatal ERROR SERVER_BUSY, then close (fast, bounded)."""
        reply = ServerConnection().send_error(
            ErrorCode.SERVER_BUSY, message, fatal=True,
            scope=ErrorScope.CONNECTION)
        with trio.move_on_after(REFUSAL_LINGER), contextlib.suppress(
                trio.BrokenResourceError, trio.ClosedResourceError):
            await transport.send([reply])
            # Let the client read it and close first (NNRP has no GOAWAY: a client that
            # meets the end of stream before its poll may lose the frame): bounded in
            # time, and in number, so a storm of refused connections cannot hold more
            # than REFUSALS_LINGERING sockets for that second.
            if self._refusals_lingering < REFUSALS_LINGERING:
                self._refusals_lingering += 1
                try:
                    await read_until_closed(transport)
                finally:
                    self._refusals_lingering -= 1
        await transport.aclose()


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception of a (possibly nested) group that is not a group."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found
