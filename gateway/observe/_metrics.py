"""Prometheus metrics, declared in one place on an injectable registry.

Prefix ``nnrp_gateway_`` (never ``vllm:``, never bare ``http_*``); labels are bounded:
``model_name`` (vLLM's own label name, so PromQL can join our series with vLLM's; only
names the probe listed, anything else is ``other``), ``outcome``, ``transport``, ``kind``.
Ids never become labels. The package never binds a port: the admin listener serves
``generate_latest(registry)`` when metrics are enabled.

Connection-level counters live in ``ServerStats`` as plain ints and are exported by a
custom collector at scrape time, so the hot path pays no lock per frame. Which operations
count as upstream errors, and their outcome label, is ``END_TABLE``'s (gateway.profile).

QUIC listeners keep their own counters (``QuicListener.stats``: what happened to datagrams
before any NNRP connection existed); ``_QuicCollector`` exports them, summed over the
listeners, as ``nnrp_gateway_quic_*`` (``QUIC_COUNTERS`` below), and exports nothing until
a quic:// listener is bound. Labels there are fixed sets: ``direction`` (in, out) and
``reason`` (garbage, invalid_token, refused_initial).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

import gateway
from gateway.nnrp import ForwardOutcome, NotGranted

if TYPE_CHECKING:
    from gateway.server import ServerStats, SessionRegistry
    from gateway.transport.quic import QuicListener
    from gateway.upstream import LoadMonitor, VllmClient

    from ._record import ObservationRecord

_Labelled = TypeVar("_Labelled", bound=MetricWrapperBase)

PREFIX = "nnrp_gateway"
#: Why a trace span was dropped (the ``reason`` label; gateway.observe._otel, rule 3).
TRACE_DROP_REASONS = ("queue_full", "export_failed", "shutdown")
#: vLLM-like buckets (its TTFT histogram starts near 1 ms and reaches minutes).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)


class _StatsCollector(Collector):
    def __init__(self, stats: ServerStats, upstream_ready: Callable[[], bool]) -> None:
        self.stats = stats
        self.upstream_ready = upstream_ready

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        yield GaugeMetricFamily(f"{PREFIX}_connections_active", "Open NNRP connections.",
                                value=s.connections_active)
        yield CounterMetricFamily(f"{PREFIX}_connections", "NNRP connections accepted.",
                                  value=s.connections_total)
        yield CounterMetricFamily(f"{PREFIX}_connections_refused",
                                  "Connections refused at the admission limit.",
                                  value=s.connections_refused)
        yield GaugeMetricFamily(f"{PREFIX}_sessions_active", "Open NNRP sessions.",
                                value=s.sessions_active)
        sessions = CounterMetricFamily(f"{PREFIX}_sessions", "Session opens by outcome.",
                                       labels=["outcome"])
        sessions.add_metric(["opened"], s.sessions_total)
        sessions.add_metric(["refused"], s.sessions_refused)
        yield sessions
        yield GaugeMetricFamily(f"{PREFIX}_inflight_operations", "Operations in flight.",
                                value=s.inflight)
        traffic = CounterMetricFamily(f"{PREFIX}_bytes", "NNRP bytes on the wire.",
                                      labels=["direction"])
        traffic.add_metric(["in"], s.bytes_in)
        traffic.add_metric(["out"], s.bytes_out)
        yield traffic
        yield CounterMetricFamily(f"{PREFIX}_frames_out", "NNRP packets written.",
                                  value=s.frames_out)
        yield CounterMetricFamily(f"{PREFIX}_protocol_errors",
                                  "Connections closed for protocol violations.",
                                  value=s.protocol_errors)
        yield CounterMetricFamily(f"{PREFIX}_auth_failures",
                                  "Session opens refused for bad credentials.",
                                  value=s.auth_failures)
        yield CounterMetricFamily(f"{PREFIX}_refusals_rate_limited",
                                  "Session opens and resumes answered retry_later without a "
                                  "look: their connection collected too many refusals.",
                                  value=s.refusals_rate_limited)
        yield CounterMetricFamily(f"{PREFIX}_refused_submits",
                                  "Submits refused (duplicate id, in-flight limit, closing).",
                                  value=s.refused_submits)
        yield CounterMetricFamily(f"{PREFIX}_ignored_frames",
                                  "Well-formed frames noted and ignored "
                                  "(docs/runtime-controls.md).",
                                  value=s.ignored_frames)
        yield GaugeMetricFamily(f"{PREFIX}_upstream_ready",
                                "1 when vLLM is probed and healthy.",
                                value=1.0 if self.upstream_ready() else 0.0)


#: The QUIC listeners' families: metric -> (label name or None, help).
QUIC_FAMILIES: dict[str, tuple[str | None, str]] = {
    "quic_datagrams": ("direction", "UDP datagrams received and sent by QUIC listeners."),
    "quic_dropped_datagrams": (
        "reason", "Datagrams dropped before reaching a connection: undecodable, for an "
        "unknown connection ID, or an Initial too short or undecryptable (garbage); a Retry "
        "token forged, expired or for another address (invalid_token); an Initial at the "
        "connection cap or while draining (refused_initial)."),
    "quic_retries": (None, "Stateless Retry packets sent (address validation under load)."),
    "quic_version_negotiations": (None, "Version Negotiation packets sent."),
    "quic_handshake_timeouts": (None, "QUIC connections closed with the TLS handshake "
                                "unfinished."),
    "quic_refused_streams": (None, "Streams other than the NNRP stream, refused "
                             "(STOP_SENDING and RESET_STREAM)."),
    "quic_send_errors": (None, "Datagrams the socket would not take (lost; QUIC resends)."),
    "quic_connections": (None, "QUIC connections whose first Initial decrypted."),
}
#: ``QuicStats`` field -> (family, label value). Every counter the listener keeps is here
#: (tests/observe checks), so a new one cannot go unexported.
QUIC_COUNTERS: dict[str, tuple[str, str | None]] = {
    "datagrams_in": ("quic_datagrams", "in"),
    "datagrams_out": ("quic_datagrams", "out"),
    "garbage": ("quic_dropped_datagrams", "garbage"),
    "invalid_tokens": ("quic_dropped_datagrams", "invalid_token"),
    "refused_initials": ("quic_dropped_datagrams", "refused_initial"),
    "retries": ("quic_retries", None),
    "version_negotiations": ("quic_version_negotiations", None),
    "handshake_timeouts": ("quic_handshake_timeouts", None),
    "refused_streams": ("quic_refused_streams", None),
    "send_errors": ("quic_send_errors", None),
    "connections_total": ("quic_connections", None),
}


class _QuicCollector(Collector):
    def __init__(self, listeners: Callable[[], Sequence[QuicListener]]) -> None:
        self.listeners = listeners

    def collect(self) -> Iterator[Metric]:
        listeners = self.listeners()
        if not listeners:
            return
        families = {name: CounterMetricFamily(f"{PREFIX}_{name}", documentation,
                                              labels=[label] if label else None)
                    for name, (label, documentation) in QUIC_FAMILIES.items()}
        for field, (name, label_value) in QUIC_COUNTERS.items():
            value = sum(getattr(listener.stats, field) for listener in listeners)
            families[name].add_metric([label_value] if label_value else [], value)
        yield from families.values()
        yield GaugeMetricFamily(f"{PREFIX}_quic_connections_open",
                                "QUIC connections (handshaking or established).",
                                value=sum(listener.connections_open for listener in listeners))
        yield GaugeMetricFamily(f"{PREFIX}_quic_handshakes_in_progress",
                                "QUIC connections whose TLS handshake has not completed.",
                                value=sum(listener.handshakes_in_progress
                                          for listener in listeners))


#: ``ResumeStats`` field -> (family, help). Every counter the registry keeps is here
#: (tests/observe checks), so a new one cannot go unexported.
RESUME_COUNTERS: dict[str, tuple[str, str]] = {
    "detached_total": ("resume_detached", "Sessions whose connection ended without "
                       "SESSION_CLOSE and were kept for their client."),
    "resumed_total": ("resume_resumed", "Sessions resumed on a new connection."),
    "migrated_total": ("resume_migrated", "Sessions moved by SESSION_MIGRATE."),
    "expired_total": ("resume_expired", "Detached sessions whose window passed (their "
                      "operations were cancelled)."),
    "refused_total": ("resume_refused", "Resumes and migrations refused (a token that "
                      "opens nothing)."),
    "relayed_total": ("resume_relayed", "Connections relayed whole to the worker holding "
                      "the session they resume (--workers)."),
    "replayed_events_total": ("resume_replayed_events", "Results sent again after a "
                              "resume or migration."),
    "replayed_bytes_total": ("resume_replayed_bytes", "Bytes of the frames sent again "
                             "after a resume or migration."),
    "probes_total": ("resume_probes", "Connections asked to show they are alive because "
                     "a resume named a session attached to them."),
    "probe_failures_total": ("resume_probe_failures", "Connections closed because they "
                             "stayed silent when probed (their sessions detached)."),
}
#: ``ResumeStats`` fields exported as one labelled family each, not as counters above.
RESUME_LABELLED = frozenset({"not_granted", "fleet_forwards"})


class _ResumeCollector(Collector):
    def __init__(self, registry: SessionRegistry) -> None:
        self.sessions = registry

    def collect(self) -> Iterator[Metric]:
        registry = self.sessions
        for field, (name, documentation) in RESUME_COUNTERS.items():
            yield CounterMetricFamily(f"{PREFIX}_{name}", documentation,
                                      value=getattr(registry.stats, field))
        sessions = GaugeMetricFamily(f"{PREFIX}_resume_sessions",
                                     "Resumable sessions, attached to a connection or "
                                     "detached (waiting for their client).", labels=["state"])
        detached = registry.detached
        sessions.add_metric(["attached"], registry.sessions - detached)
        sessions.add_metric(["detached"], detached)
        yield sessions
        not_granted = CounterMetricFamily(
            f"{PREFIX}_resume_not_granted", "Sessions that asked for resume and opened "
            "without it, by reason (off, draining, process_cap, client_cap).",
            labels=["reason"])
        for reason in NotGranted:
            not_granted.add_metric([reason.value],
                                   registry.stats.not_granted.get(reason.value, 0))
        yield not_granted
        forwards = CounterMetricFamily(
            f"{PREFIX}_fleet_forwards", "Resumes forwarded to the pod of the fleet that "
            "holds the session (sent, unreachable, refused) and taken from other pods "
            "(accepted, rejected), by outcome.", labels=["outcome"])
        for outcome in ForwardOutcome:
            forwards.add_metric([outcome.value],
                                registry.stats.fleet_forwards.get(outcome.value, 0))
        yield forwards
        yield GaugeMetricFamily(f"{PREFIX}_resume_held_bytes",
                                "Result bytes resumable sessions keep for a replay.",
                                value=registry.budget.held)


class _ReadinessCollector(Collector):
    """What ``/readyz`` answers, as a gauge: an alert on "not ready" needs a series (the
    reasons stay on ``/readyz`` and in the log: free text is no label)."""

    def __init__(self, readiness: Callable[[], Sequence[str]]) -> None:
        self.readiness = readiness

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(f"{PREFIX}_ready",
                                "1 when /readyz answers 200 (listeners accepting, vLLM "
                                "probed and healthy, not draining).",
                                value=0.0 if self.readiness() else 1.0)


class _LoadCollector(Collector):
    """Load-aware admission's view of vLLM (``LoadMonitor``): scrapes, the state the
    decisions rest on, and the last sample, so a failing scrape (admitting all) shows."""

    def __init__(self, monitor: LoadMonitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        from gateway.upstream import LoadState

        m = self.monitor
        scrapes = CounterMetricFamily(f"{PREFIX}_load_scrapes",
                                      "Scrapes of vLLM's load (/metrics or /load), by result.",
                                      labels=["result"])
        scrapes.add_metric(["ok"], m.scrapes_ok)
        scrapes.add_metric(["failed"], m.scrapes_failed)
        yield scrapes
        state = GaugeMetricFamily(f"{PREFIX}_load_state",
                                  "1 for what admission decisions rest on now: fresh, stale "
                                  "or scrape_failing (the last two admit everything).",
                                  labels=["state"])
        current = m.decision().state
        for each in LoadState:
            state.add_metric([str(each)], 1.0 if each is current else 0.0)
        yield state
        sample = m.sample
        if sample is None:
            return
        yield GaugeMetricFamily(f"{PREFIX}_load_sample_age_seconds",
                                "Age of the last good sample of vLLM's load.",
                                value=max(0.0, m.now() - sample.at))
        for name, value, documentation in (
                ("load_waiting_requests", sample.waiting, "vLLM's waiting requests, as sampled."),
                ("load_running_requests", sample.running, "vLLM's running requests, as sampled."),
                ("load_kv_cache_usage", sample.kv_cache_usage,
                 "vLLM's KV-cache use (0..1), as sampled.")):
            if value is not None:
                yield GaugeMetricFamily(f"{PREFIX}_{name}", documentation, value=value)


#: The upstream pool's gauges: ``PoolFigures`` field -> (family, help). Each counts what
#: one process holds, so a ``--workers`` pod's figure is the sum (gateway/workers/_merge.py).
POOL_GAUGES: dict[str, tuple[str, str]] = {
    "size": ("upstream_pool_size", "Upstream request slots: requests that may hold a "
             "connection to vLLM at once (--upstream-pool-size)."),
    "in_use": ("upstream_pool_in_use", "Upstream request slots held by a request now."),
    "idle": ("upstream_pool_idle", "Upstream connections kept open for reuse."),
    "waiting": ("upstream_pool_waiting", "Requests waiting for an upstream slot (every "
                "one busy)."),
}


class _PoolCollector(Collector):
    """The upstream request slots (``VllmClient.pool_figures``): a full pool is where
    backend_overload with no 503 from vLLM comes from."""

    def __init__(self, client: VllmClient) -> None:
        self.client = client

    def collect(self) -> Iterator[Metric]:
        figures = self.client.pool_figures()
        for field, (name, documentation) in POOL_GAUGES.items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", documentation,
                                    value=getattr(figures, field))
        yield CounterMetricFamily(f"{PREFIX}_upstream_pool_wait_timeouts",
                                  "Requests that waited --upstream-queue-timeout for an "
                                  "upstream slot and were refused (backend_overload).",
                                  value=figures.wait_timeouts)
        yield CounterMetricFamily(f"{PREFIX}_upstream_pool_given_way",
                                  "Operations of detached sessions that gave their upstream "
                                  "slot to a waiting live request (they ended).",
                                  value=figures.given_way)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.known_models: frozenset[str] = frozenset()
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], MetricWrapperBase] = {}
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests",
                                "Operations by model, outcome and transport (tcp, ipc, "
                                "websocket, quic).",
                                ["model_name", "outcome", "transport"], registry=r)
        self.duration = Histogram(f"{PREFIX}_request_duration_seconds",
                                  "Submit to terminal, by model and outcome.",
                                  ["model_name", "outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.first_event = Histogram(f"{PREFIX}_first_event_seconds",
                                     "Submit to first event sent.", ["model_name"],
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.events = Counter(f"{PREFIX}_events", "Profile events sent.", ["model_name"],
                              registry=r)
        self.upstream_errors = Counter(f"{PREFIX}_upstream_errors",
                                       "Operations ended by a vLLM failure, by model and "
                                       "error code.", ["model_name", "kind"], registry=r)
        self.cancellations = Counter(f"{PREFIX}_cancellations",
                                     "Operations ended early, by what ended them.", ["kind"],
                                     registry=r)
        self.upstream_aborts = Histogram(f"{PREFIX}_upstream_abort_seconds",
                                         "Cancel received to upstream socket closed.",
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter(f"{PREFIX}_tokens", "Token usage reported by vLLM.",
                              ["model_name", "kind"], registry=r)
        # vLLM's own timings, from its per-request metrics (0.32+, with
        # --enable-per-request-metrics), beside the gateway's first-event histogram.
        self.backend_queue = Histogram(f"{PREFIX}_backend_queue_seconds",
                                       "vLLM's queue time for a request (its per-request "
                                       "metrics' queue_time_ms).", ["model_name"],
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.backend_ttft = Histogram(f"{PREFIX}_backend_ttft_seconds",
                                      "vLLM's time to first token from scheduling (its "
                                      "per-request metrics' time_to_first_token_ms).",
                                      ["model_name"], buckets=LATENCY_BUCKETS, registry=r)
        self.overload_refusals = Counter(
            f"{PREFIX}_overload_refusals",
            "Work refused for load, with a retry time: source vllm (its admission control: "
            "503 or in-stream), gateway (load-aware admission, operations) or "
            "gateway_session (load-aware admission, session opens); by reason.",
            ["source", "reason"], registry=r)
        self.build_info = Gauge(f"{PREFIX}_build_info", "Build information.", ["version"],
                                registry=r)
        self.build_info.labels(gateway.__version__).set(1)

    def attach(self, stats: ServerStats, upstream_ready: Callable[[], bool]) -> None:
        self.registry.register(_StatsCollector(stats, upstream_ready))

    def attach_readiness(self, readiness: Callable[[], Sequence[str]]) -> None:
        """Export readiness (``readiness()``: why not ready, empty when ready)."""
        self.registry.register(_ReadinessCollector(readiness))

    def attach_resume(self, registry: SessionRegistry) -> None:
        """Export what the resumable sessions' registry counts."""
        self.registry.register(_ResumeCollector(registry))

    def attach_pool(self, client: VllmClient) -> None:
        """Export the upstream request slots' gauges and wait timeouts."""
        self.registry.register(_PoolCollector(client))

    def attach_load(self, monitor: LoadMonitor) -> None:
        """Export load-aware admission's scrapes and sample."""
        self.registry.register(_LoadCollector(monitor))

    def attach_quic(self, listeners: Callable[[], Sequence[QuicListener]]) -> None:
        """Export the QUIC listeners' counters (``listeners()`` is read at every scrape:
        listeners bind after the metrics exist)."""
        self.registry.register(_QuicCollector(listeners))

    def attach_tracing(self) -> None:
        """Export tracing's counters (``serve --otel-traces`` only: a gateway without
        tracing has no such series, as the dashboard and the alert rules expect). Every
        drop reason is there from the start, so an alert has a series before the first
        loss."""
        self.trace_spans_dropped = Counter(
            f"{PREFIX}_trace_spans_dropped",
            "Trace spans dropped: the export queue full (queue_full), a batch the "
            "collector did not take (export_failed), still queued at shutdown (shutdown).",
            ["reason"], registry=self.registry)
        for reason in TRACE_DROP_REASONS:
            self.trace_spans_dropped.labels(reason)
        self.trace_spans_exported = Counter(f"{PREFIX}_trace_spans_exported",
                                            "Trace spans the collector accepted.",
                                            registry=self.registry)

    def spans_dropped(self, reason: str, count: int) -> None:
        """Tracing lost ``count`` spans (called from the export thread too: prometheus
        client's counters take their own lock)."""
        self.trace_spans_dropped.labels(reason).inc(count)

    def spans_exported(self, count: int) -> None:
        self.trace_spans_exported.inc(count)

    def _model(self, name: str | None) -> str:
        if not name:
            return "none"
        return name if name in self.known_models else "other"

    def observe(self, record: ObservationRecord) -> None:
        """One ended operation's record into the metrics (once a request)."""
        model = self._model(record.model)
        self._child(self.requests, model, record.outcome, record.transport).inc()
        if record.duration_ms is not None:
            self._child(self.duration, model, record.outcome).observe(record.duration_ms / 1000)
        if record.first_event_ms is not None and record.events:
            self._child(self.first_event, model).observe(record.first_event_ms / 1000)
        if record.events:
            self._child(self.events, model).inc(record.events)
        if record.upstream_error:  # END_TABLE says which end causes are vLLM's
            self._child(self.upstream_errors, model, record.error_code or "unknown").inc()
        if record.cancel_source is not None:
            self._child(self.cancellations, record.cancel_source).inc()
        if record.upstream_abort_ms is not None:
            self.upstream_aborts.observe(record.upstream_abort_ms / 1000)
        if record.backend_queue_ms is not None:
            self._child(self.backend_queue, model).observe(record.backend_queue_ms / 1000)
        if record.backend_ttft_ms is not None:
            self._child(self.backend_ttft, model).observe(record.backend_ttft_ms / 1000)
        if record.refusal_source is not None:
            self._child(self.overload_refusals, record.refusal_source,
                                          record.refusal_reason or "unknown").inc()
        usage = record.usage or {}
        for kind in ("prompt_tokens", "completion_tokens"):
            value = usage.get(kind)
            if isinstance(value, int) and value > 0:
                self._child(self.tokens, model, kind.removesuffix("_tokens")).inc(value)

    def _child(self, metric: _Labelled, *values: str) -> _Labelled:
        """``metric.labels(*values)``, kept: prometheus's ``labels`` checks and converts
        its values and takes a lock on every call (a fifth of ``observe``'s time). The
        label values are bounded (the models known or "other", outcomes, end causes,
        transports, reasons), so the cache is too."""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return cast(_Labelled, child)
