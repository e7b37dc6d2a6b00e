"""The gateway process: vLLM probe and health loop, the chat pipeline, the NNRP server.

Start-up never waits on vLLM (a sidecar starts long before the model is loaded): the
probe loop retries until ``GET /version`` answers, selects the version binding, and
only then marks the upstream ready. Until then, and whenever ``/health`` fails later,
operations fail fast with ``backend_unavailable``. An untested vLLM version is fatal
(``UnsupportedVersion``) unless ``allow_untested`` is set.

When /health fails: an answer other than 200 (vLLM says its engine is dead) marks vLLM
down at once; an unanswered check counts as a miss, and ``health_failure_threshold``
misses in a row mark it down. A check that goes unanswered while a response stream
delivered bytes is not a miss: a vLLM busy streaming is alive.
"""

from __future__ import annotations

import gc
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import structlog
import trio

import gateway
from gateway import residence
from gateway.errors import GatewayError
from gateway.nnrp import (
    FleetIdentity,
    FleetKeyError,
    FleetKeys,
    ResumePolicy,
    ServerConfig,
    key_material,
)
from gateway.observe import (
    AdminRoutes,
    AdminServer,
    GatewayMetrics,
    RecordNotes,
    RouteUnavailable,
    Tracer,
    build_record,
    metrics_route,
    notes_of,
    open_tracer,
)
from gateway.pipeline import (
    MEDIA_DIR_CAPACITY,
    ChatPipeline,
    MediaDelivery,
    MediaDirectory,
    PipelineLimits,
    profile_refusal,
)
from gateway.profile import (
    EnvelopeResubmission,
    Listener,
    MediaCapabilities,
    capability_document,
    runtime_tokens,
)
from gateway.server import (
    BoundEndpoint,
    ConnectionLimits,
    GatewayServer,
    Operation,
    TokenAuthenticator,
    observe_partials,
)
from gateway.transport import (
    AlpnPolicy,
    Inherited,
    QuicSettings,
    TlsConfig,
    load_tls,
    server_context,
)
from gateway.upstream import (
    LoadMonitor,
    LoadPolicy,
    LoadSource,
    UnsupportedVersion,
    UpstreamConfig,
    UpstreamError,
    UpstreamTimeout,
    VllmClient,
    VllmInfo,
    observe_reads,
)

log = structlog.get_logger("gateway")
operation_log = structlog.get_logger("gateway.operation")
#: The standard library's level numbers by structlog's method names ("info": 20).
_LEVELS = {name.lower(): number for name, number in logging.getLevelNamesMapping().items()}

#: ``/metrics/vllm``'s bounds: under the admin listener's 10 s per connection and a
#: ``--workers`` supervisor's 8 s wait for a worker (the supervisor asks a worker), and
#: far above vLLM's text (tens of KiB; more per LoRA adapter and engine).
VLLM_METRICS_TIMEOUT = 5.0
VLLM_METRICS_MAX_BYTES = 16 << 20


@attrs.frozen
class LoadSettings:
    """Load-aware admission (opt-in, docs/operations.md): vLLM's published
    load sampled every ``interval`` seconds from ``source`` (metrics: GET /metrics; load:
    GET /load), and new operations (with ``refuse_sessions``, new sessions too) refused
    with a retry time while it is past a threshold. A failing or stale scrape admits."""

    admission: bool = False
    source: str = "metrics"
    interval: float = 1.0
    #: Refuse while vLLM has this many requests waiting (None: no such rule).
    max_waiting: float | None = None
    #: Refuse while vLLM's KV cache is this full, 0..1 (None: no such rule).
    max_kv_cache_usage: float | None = None
    #: A sample older than this admits (fail open); 0: three intervals.
    stale_after: float = 0.0
    retry_after_ms: int = 1000
    max_retry_after_ms: int = 30_000
    refuse_sessions: bool = False

    def policy(self) -> LoadPolicy:
        return LoadPolicy(self.max_waiting, self.max_kv_cache_usage,
                          self.stale_after or 3 * self.interval, self.retry_after_ms,
                          self.max_retry_after_ms)


@attrs.frozen
class FleetConfig:
    """A fleet of gateways (docs/resume.md, docs/fleet.md; gateway/nnrp/_fleet.py): how
    the others reach this one (``--fleet-advertise``) and the key they share."""

    advertise: str
    key_file: Path


def read_fleet_key(path: Path) -> list[bytes]:
    """The fleet keys in ``path`` (gateway/nnrp/_fleet.py F3: one per line, the first
    seals); ``FleetKeyError`` naming the file for keys that cannot be read or used."""
    try:
        materials = key_material(path.read_bytes())
    except OSError as exc:
        raise FleetKeyError(f"{path}: {exc.strerror or exc}") from exc
    try:
        FleetKeys(materials, clock=time.monotonic, keep_previous=0)
    except FleetKeyError as exc:
        raise FleetKeyError(f"{path}: {exc} (make one with `openssl rand -hex 32`)") from None
    return materials


@attrs.frozen
class GatewayConfig:
    listen: tuple[str, ...] = ("tcp://127.0.0.1:7700",)
    vllm_url: str = "http://127.0.0.1:8000"
    upstream_api_key: str | None = attrs.field(default=None, repr=False)
    allow_untested_vllm: bool = False
    tool_calls: bool = False
    probe_interval: float = 1.0
    health_interval: float = 5.0
    #: Unanswered /health checks in a row before vLLM counts as down. An answer saying
    #: unhealthy (503: the engine died) counts at once; silence may be a busy server.
    health_failure_threshold: int = 3
    drain_timeout: float = 30.0
    #: After a drain, how long a connection is left for its client to close first.
    drain_close_grace: float = 5.0
    max_connections: int = 1024
    #: Resumable sessions (docs/resume.md); a zero window turns them off.
    resume: ResumePolicy = attrs.field(factory=ResumePolicy)
    #: A fleet of gateways: resumes that reach this pod for another's are forwarded.
    fleet: FleetConfig | None = None
    server: ServerConfig = attrs.field(factory=ServerConfig)
    connection: ConnectionLimits = attrs.field(factory=ConnectionLimits)
    pipeline: PipelineLimits = attrs.field(factory=PipelineLimits)
    #: Media frames reach vLLM as files here (a directory vLLM reads:
    #: ``--allowed-local-media-path``), not as data URIs (gateway/pipeline/_media.py).
    media_dir: Path | None = None
    #: The bytes a process may hold in ``media_dir`` at once (gateway/pipeline/_media.py D2).
    media_dir_bytes: int = MEDIA_DIR_CAPACITY
    upstream_connect_timeout: float = 2.0
    upstream_pool_size: int = 256
    #: A request waits this long for one of the pool's connections, then is refused as
    #: overload (recoverable, with a retry time) rather than queue on.
    upstream_queue_timeout: float = 10.0
    #: The share of the pool operations of detached sessions may keep while a request
    #: waits (gateway/upstream/_slots.py rule 2).
    upstream_detached_share: float = 0.5
    admin_listen: str | None = None  # "host:port"; off unless given
    metrics: bool = False
    tls: TlsConfig | None = None
    #: quic:// listeners: "any" (the spec's nnrp/1 or none at all, as nnrp-py's native
    #: client offers), "nnrp/1" or "none" (AlpnPolicy says why "any" is the default).
    quic_alpn: str = "any"
    #: A QUIC client silent this long is gone (its sessions detach or end).
    quic_idle_timeout: float = 30.0
    #: Benchmarks only: record each event's residence time, served at /debug/residence.
    bench_residence: bool = False
    #: Load-aware admission (off unless ``load.admission``).
    load: LoadSettings = attrs.field(factory=LoadSettings)
    #: OpenTelemetry traces (the ``otel`` extra), configured by the OTEL_* environment.
    otel_traces: bool = False
    #: At shutdown, how long queued spans may take to reach the collector.
    trace_flush_timeout: float = 2.0


class Gateway:
    """One gateway process. ``inherited``: listeners a ``--workers`` supervisor bound."""

    def __init__(self, config: GatewayConfig, inherited: Sequence[Inherited] = ()) -> None:
        self.config = config
        self.client = VllmClient(UpstreamConfig(
            config.vllm_url, config.upstream_api_key, config.upstream_connect_timeout,
            config.upstream_pool_size, queue_timeout=config.upstream_queue_timeout,
            detached_share=config.upstream_detached_share))
        self.info: VllmInfo | None = None
        self.upstream_healthy = False
        #: Why the last probe or health check of vLLM failed (readiness says it).
        self.upstream_problem: str | None = None
        # While vLLM is not ready, the next probe may change that: tell clients then.
        pipeline_limits = attrs.evolve(config.pipeline, unavailable_retry_after_ms=int(
            max(config.probe_interval, 1.0) * 1000))
        self.metrics = GatewayMetrics()
        self.tracer: Tracer | None = None
        if config.otel_traces:
            self.tracer = open_tracer(vllm_url=config.vllm_url,
                                      dropped=self.metrics.spans_dropped,
                                      exported=self.metrics.spans_exported)
            if self.tracer is not None:  # None: OTEL_SDK_DISABLED=true (said in the log)
                self.metrics.attach_tracing()
        self.load: LoadMonitor | None = None
        if config.load.admission:
            self.load = LoadMonitor(self.client, config.load.policy(),
                                    interval=config.load.interval,
                                    source=LoadSource(config.load.source))
            self.metrics.attach_load(self.load)
        directory = None
        if config.media_dir is not None:
            # A --workers worker sweeps only its own files (_media D4).
            directory = MediaDirectory(config.media_dir, worker=config.resume.worker
                                       if config.resume.relays else None,
                                       capacity=config.media_dir_bytes)
            directory.prepare()  # writable, and what a previous run left swept (D4)
        self.media = MediaDelivery(directory)
        self.pipeline = ChatPipeline(self.client, self.ready_info, self.capabilities,
                                     pipeline_limits, load=self.load,
                                     admission=self.load is not None,
                                     on_engine_dead=self.engine_died, tracer=self.tracer,
                                     media=self.media)
        self.ssl_context = server_context(config.tls) if config.tls else None
        # The runtime tokens negotiation may grant are what this configuration implements;
        # a resubmission after a resume is compared as the profile reads an envelope.
        server_config = attrs.evolve(config.server, runtime_tokens=runtime_tokens(
            priority_scheduling=config.pipeline.priority_scheduling),
            resubmission=EnvelopeResubmission(),
            spill=directory.spill if directory is not None else None)  # _media D5
        if self.load is not None and config.load.refuse_sessions:
            server_config = attrs.evolve(server_config, admit_session=self._admit_session)
        #: This pod in its fleet (None: a single pod); its key is re-read on SIGHUP.
        self.fleet: FleetIdentity | None = None
        resume = config.resume
        if config.fleet is not None:
            # A key a reload drops stays good for one resume window (_fleet F3).
            keys = FleetKeys(read_fleet_key(config.fleet.key_file), clock=time.monotonic,
                             keep_previous=max(resume.window, 1.0))
            self.fleet = FleetIdentity(config.fleet.advertise, keys, wall_clock=time.time)
            resume = attrs.evolve(resume, fleet=self.fleet)
        self.server = GatewayServer(self.pipeline, config=server_config,
                                    limits=config.connection,
                                    max_connections=config.max_connections,
                                    refusal=profile_refusal, observer=self._observe,
                                    # room for what the pipeline and the tracer note
                                    notes=RecordNotes,
                                    ssl_context=self.ssl_context,
                                    quic=QuicSettings(config.tls, AlpnPolicy(config.quic_alpn),
                                                      idle_timeout=config.quic_idle_timeout,
                                                      max_connections=config.max_connections)
                                    if config.tls else None, inherited=inherited,
                                    resume=resume)
        self.endpoints: list[BoundEndpoint] = []
        self.probed = trio.Event()
        self.draining = False
        self.metrics.attach(self.server.stats, lambda: self.upstream_healthy)
        self.metrics.attach_readiness(self.readiness)
        self.metrics.attach_pool(self.client)
        if self.server.registry is not None:
            self.metrics.attach_resume(self.server.registry)
        self.metrics.attach_quic(lambda: self.server.quic_listeners)
        #: Benchmarks only (``serve --bench-residence``): installed for ``run``'s length.
        self.residence = residence.ResidenceProbe() if config.bench_residence else None
        self.admin = AdminServer(AdminRoutes(
            self.readiness, self.capabilities,
            metrics_route(self.metrics.registry) if config.metrics else None,
            vllm_metrics=self.vllm_metrics if config.metrics else None,
            residence=self.residence.take if self.residence is not None else None))

    async def vllm_metrics(self) -> bytes:
        """vLLM's /metrics for ``/metrics/vllm``, within ``VLLM_METRICS_TIMEOUT`` and
        ``VLLM_METRICS_MAX_BYTES``; a failure is the admin listener's 502 or 504."""
        where = f"vLLM's /metrics ({self.config.vllm_url})"
        with trio.move_on_after(VLLM_METRICS_TIMEOUT):
            try:
                return await self.client.get_bounded("/metrics",
                                                     max_bytes=VLLM_METRICS_MAX_BYTES)
            except UpstreamTimeout as exc:
                raise RouteUnavailable(f"{where} did not answer: {exc}", status=504) from exc
            except UpstreamError as exc:
                raise RouteUnavailable(f"{where} failed: {exc}", status=502) from exc
        raise RouteUnavailable(f"{where} did not answer within {VLLM_METRICS_TIMEOUT:g} s",
                               status=504)

    def readiness(self) -> list[str]:
        """Why the gateway is not ready (empty when it is)."""
        reasons = []
        if self.server.listener_failure is not None:
            reasons.append(str(self.server.listener_failure))
        elif not self.endpoints or not self.server.accepting:
            reasons.append("listeners are not accepting")
        problem = f": {self.upstream_problem}" if self.upstream_problem else ""
        if self.info is None:
            reasons.append(f"vLLM has not answered the probe yet{problem}")
        elif not self.upstream_healthy:
            reasons.append(f"vLLM health check failed{problem}")
        if self.draining:
            reasons.append("draining")
        return reasons

    def engine_died(self) -> None:
        """vLLM answered with its dead-engine error: not ready from now on, until a
        probe finds ``/health`` answering 200 again (``_upstream_loop``)."""
        if self.upstream_healthy:
            log.warning("vLLM reports its engine dead; not ready until /health recovers")
        self.upstream_healthy = False
        self.client.recheck()  # the health loop re-probes now, not at its next interval

    def _admit_session(self) -> str | None:
        """Load-aware admission of a new session (``ServerConfig.admit_session``)."""
        assert self.load is not None
        decision = self.load.decision()
        if not decision.refused:
            return None
        self.metrics.overload_refusals.labels("gateway_session", str(decision.reason)).inc()
        return (f"vLLM is loaded past this gateway's threshold ({decision.reason}); "
                f"retry after {decision.retry_after_ms} ms or elsewhere")

    def _observe(self, op: Operation) -> None:
        """The canonical log line, the metrics and the trace spans, from one record per
        operation. One that ended before its upstream request was built gets its span
        decided here."""
        notes = notes_of(op)
        if self.tracer is not None and notes.span is None:
            notes.span = self.tracer.decide(op.trace)
        record = build_record(op)
        self.metrics.observe(record)
        # One bound logger per line (the proxy binds on every call): asked whether the
        # line is kept before the record is turned into its fields, which costs about
        # as much as the rest of this method (a filtered line costs nothing).
        logger = operation_log.bind()
        if logger.is_enabled_for(_LEVELS[record.log_level]):
            getattr(logger, record.log_level)("operation", **record.as_dict())
        if self.tracer is not None:
            self.tracer.export(record)

    def reload(self) -> None:
        """SIGHUP: re-read the certificate files, the auth token file and the fleet key."""
        self.reload_tls()
        self.reload_fleet_key()
        authenticate = self.config.server.authenticate
        if isinstance(authenticate, TokenAuthenticator):
            problem = authenticate.reload()
            if problem is not None:
                log.error("auth token reload failed; keeping the previous tokens",
                          error=problem)
            else:
                log.info("auth tokens reloaded")

    def reload_fleet_key(self) -> None:
        """SIGHUP: the key file's keys from now on (its first seals); a key it dropped is
        still accepted for one resume window (_fleet F3). A bad file keeps the keys in
        use."""
        if self.fleet is None or self.config.fleet is None:
            return
        try:
            rotated = self.fleet.keys.rotate(read_fleet_key(self.config.fleet.key_file))
        except FleetKeyError as exc:
            log.error("fleet key reload failed; keeping the keys in use", error=str(exc))
            return
        if rotated:
            log.info("fleet keys reloaded; a key dropped is accepted for one resume window",
                     keys=len(self.fleet.keys.accepted()),
                     keep_previous_s=self.fleet.keys.keep_previous)

    def reload_tls(self) -> None:
        """SIGHUP: re-read the certificate files; new handshakes use them."""
        if self.config.tls is None or self.ssl_context is None:
            return
        try:
            load_tls(self.ssl_context, self.config.tls)
        except (OSError, ValueError) as exc:  # keep serving with the old certificate
            log.error("TLS reload failed; keeping the previous certificate", error=str(exc))
            return
        self.server.reload_quic_tls()
        log.info("TLS certificate reloaded", cert=str(self.config.tls.cert_file))

    async def drain(self) -> None:
        """SIGTERM: readiness goes false, stop accepting, drain, then drop the rest."""
        self.draining = True
        log.info("draining", timeout_s=self.config.drain_timeout,
                 inflight=self.server.stats.inflight)
        await self.server.shutdown(self.config.drain_timeout, self.config.drain_close_grace)
        log.info("drained")

    def ready_info(self) -> VllmInfo | None:
        """The probe result while vLLM is healthy; None means backend_unavailable."""
        return self.info if self.upstream_healthy else None

    def capabilities(self) -> dict[str, Any]:
        info = self.info
        models = info.models if info else ()
        return capability_document(
            adapter=f"nnrp-vllm-gateway {gateway.__version__}", models=models,
            tool_calls=self.config.tool_calls,
            priority_scheduling=self.config.pipeline.priority_scheduling,
            vllm_version=info.version if info else None,
            backend_family=info.binding.family if info else None,
            backend_evidence=info.binding.evidence if info else None,
            listeners=tuple(
                Listener(e.transport, e.uri,
                         self.config.quic_alpn if e.transport == "quic" else None)
                for e in self.endpoints),
            media=MediaCapabilities(max_bytes=self.config.pipeline.max_media_bytes,
                                    delivery=self.media.mode))

    async def run(self, *, task_status: trio.TaskStatus[list[BoundEndpoint]]
                  = trio.TASK_STATUS_IGNORED) -> None:
        """Probe vLLM and serve NNRP until cancelled. UnsupportedVersion ends the run."""
        if self.tracer is not None:
            self.tracer.start()
        if self.residence is not None:  # the probe attaches from outside the write path
            observe_reads(self.residence.read)
            observe_partials(self.residence.queued)
        try:
            async with trio.open_nursery() as nursery:
                if self.config.admin_listen:
                    await nursery.start(self.admin.serve_address, self.config.admin_listen)
                self.endpoints = await nursery.start(self.server.serve,
                                                     list(self.config.listen))
                nursery.start_soon(self._upstream_loop)
                nursery.start_soon(self._prune_loop)
                if self.load is not None:
                    nursery.start_soon(self.load.run)
                log.info("gateway started", version=gateway.__version__,
                         endpoints=[e.uri for e in self.endpoints],
                         vllm_url=self.config.vllm_url)
                task_status.started(self.endpoints)
        finally:
            if self.residence is not None:
                observe_reads(None)
                observe_partials(None)
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await self.client.aclose()
            if self.tracer is not None:
                await self._close_tracer(self.tracer)

    async def _close_tracer(self, tracer: Tracer) -> None:
        """The spans still queued go to the collector within the flush timeout (the
        export thread is joined off the event loop); the rest count as dropped."""
        timeout = self.config.trace_flush_timeout
        with trio.CancelScope(shield=True), trio.move_on_after(timeout + 1):
            await trio.to_thread.run_sync(tracer.close, timeout, abandon_on_cancel=True)

    async def probe_once(self) -> VllmInfo:
        """Version, binding and models, then health: a dead engine still answers /version."""
        info = await self.client.probe(allow_untested=self.config.allow_untested_vllm)
        if not await self.client.health():
            raise UpstreamError("vLLM answers but /health reports the engine unhealthy")
        if info.untested:
            log.warning("untested vLLM version; using the nearest binding",
                        vllm_version=info.version, binding=info.binding.family)
        self.info = info
        self.metrics.known_models = frozenset(info.models)
        if self.tracer is not None:  # the span name's model, bounded as the label is
            self.tracer.known_models = self.metrics.known_models
        self.upstream_healthy = True
        self.upstream_problem = None
        self.probed.set()
        log.info("vLLM ready", vllm_version=info.version, binding=info.binding.family,
                 models=list(info.models))
        return info

    async def _prune_loop(self) -> None:
        """Close idle upstream connections before vLLM does (no CLOSE-WAIT build-up)."""
        while True:
            await trio.sleep(1.0)
            await self.client.prune_idle()

    async def _upstream_loop(self) -> None:
        """Probe until vLLM answers, then watch /health; re-probe after an outage."""
        waiting_logged = False
        misses = 0
        while True:
            if not self.upstream_healthy:
                try:
                    await self.probe_once()
                except UnsupportedVersion:
                    raise
                except UpstreamError as exc:
                    self.upstream_problem = str(exc)
                    if not waiting_logged:
                        log.info("waiting for vLLM", vllm_url=self.config.vllm_url,
                                 reason=str(exc))
                        waiting_logged = True
                    await trio.sleep(self.config.probe_interval)
                    continue
                waiting_logged = False
            # Until the next check, or at once when a request finds vLLM's port refusing.
            with trio.move_on_after(self.config.health_interval):
                await self.client.refused()
            reads_before = self.client.body_reads
            health = await self.client.health_check()
            if health is None and self.client.body_reads > reads_before:
                # No answer to /health in time, but vLLM streamed to us while we waited:
                # busy, not dead (its API server answers probes behind the token stream).
                health = True
            misses = 0 if health else misses + 1
            if health is False or misses >= self.config.health_failure_threshold:
                self.upstream_problem = (
                    "/health answered unhealthy, or its port refused" if health is False
                    else f"/health unanswered {misses} times in a row")
                misses = 0
                self.upstream_healthy = False
                log.warning("vLLM health check failed; new operations fail fast",
                            answered=health is False)
            elif health is None:
                log.info("vLLM did not answer /health", misses=misses,
                         threshold=self.config.health_failure_threshold)


def settle_startup_heap() -> None:
    """Called once a serving process is up (``nnrp-gateway serve`` and each worker; not
    a gateway a test starts in its own process): collect what starting left, then move
    every object still alive (modules, classes, the configuration: about 75,000) out of
    the cyclic collector's reach (``gc.freeze``). Its full collections then walk only
    what serving made: against the real vLLM at 32 streams one had stopped the event
    loop for 35 ms, and the collector's share of the gateway's CPU fell from about 5 %
    to 1 % (docs/benchmarks.md, "Split reads, the per-request record, the startup
    heap")."""
    gc.collect()
    gc.freeze()


class DrainInterrupted(GatewayError):
    """A second SIGTERM or SIGINT during the drain: exit now, status 1 (as uvicorn and
    vLLM do); what was still in flight is cut."""


async def serve_until_signalled(
        gateway_app: Gateway,
        started: Callable[[list[BoundEndpoint]], Awaitable[None]] | None = None,
        stop_when: Callable[[], Awaitable[None]] | None = None) -> None:
    """Serve until SIGTERM or SIGINT (or ``stop_when`` returns), then drain; SIGHUP
    re-reads the TLS files and the auth token file, during the drain too. Another
    SIGTERM or SIGINT during the drain raises ``DrainInterrupted`` at once.

    A listener that fails for good has already closed the whole listener set (the
    server's rule; readiness says so): the gateway then drains as on SIGTERM and raises
    that ``ListenerFailed``, so the process ends with an error its supervisor sees (a
    pod restarted, not left alive and unready forever).

    The signal receiver opens before anything binds, so a signal that arrives during
    start-up is a drain, never the default handler's abrupt exit.
    """
    stop = trio.Event()

    async def watch_signals(signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:
                gateway_app.reload()
            elif stop.is_set():
                log.warning("second signal during the drain; exiting now",
                            signal=signal.Signals(signum).name,
                            inflight=gateway_app.server.stats.inflight)
                raise DrainInterrupted("stopped by a second signal during the drain; "
                                       "operations still in flight were cut")
            else:
                stop.set()

    async def watch(condition: Callable[[], Awaitable[None]]) -> None:
        await condition()
        stop.set()

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_signals, signals)
            if stop_when is not None:
                nursery.start_soon(watch, stop_when)
            endpoints = await nursery.start(gateway_app.run)
            nursery.start_soon(watch, gateway_app.server.listener_set_failed.wait)
            if started is not None:
                await started(endpoints)
            await stop.wait()
            await gateway_app.drain()
            nursery.cancel_scope.cancel()
    if gateway_app.server.listener_failure is not None:
        raise gateway_app.server.listener_failure
