"""Prometheus metrics, declared in one place on an injectable registry.

Prefix ``nnrp_gateway_`` (never ``vllm:``, never bare ``http_*``); labels are bounded:
``model_name`` (vLLM's own label name, so PromQL can join our series with vLLM's; only
names the probe listed, anything else is ``other``), ``outcome``, ``transport``, ``kind``.
Ids never become labels. The package never binds a port: the admin listener serves
``generate_latest(registry)`` when metrics are enabled.

Connection-level counters live in ``ServerStats`` as plain ints and are exported by a
custom collector at scrape time, so the hot path pays no lock per frame. Which operations
count as upstream errors, and their outcome label, is ``END_TABLE``'s (gateway.profile).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import gateway

if TYPE_CHECKING:
    from gateway.server import ServerStats

    from ._record import ObservationRecord

PREFIX = "nnrp_gateway"
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


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.known_models: frozenset[str] = frozenset()
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "Operations by model and outcome.",
                                ["model_name", "outcome"], registry=r)
        self.duration = Histogram(f"{PREFIX}_request_duration_seconds",
                                  "Submit to terminal, by model and outcome.",
                                  ["model_name", "outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.first_event = Histogram(f"{PREFIX}_first_event_seconds",
                                     "Submit to first event sent.", ["model_name"],
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.events = Counter(f"{PREFIX}_events", "Profile events sent.", ["model_name"],
                              registry=r)
        self.upstream_errors = Counter(f"{PREFIX}_upstream_errors",
                                       "Operations ended by a vLLM failure, by error code.",
                                       ["kind"], registry=r)
        self.cancellations = Counter(f"{PREFIX}_cancellations",
                                     "Operations ended early, by what ended them.", ["kind"],
                                     registry=r)
        self.upstream_aborts = Histogram(f"{PREFIX}_upstream_abort_seconds",
                                         "Cancel received to upstream socket closed.",
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter(f"{PREFIX}_tokens", "Token usage reported by vLLM.",
                              ["model_name", "kind"], registry=r)
        self.build_info = Gauge(f"{PREFIX}_build_info", "Build information.", ["version"],
                                registry=r)
        self.build_info.labels(gateway.__version__).set(1)

    def attach(self, stats: ServerStats, upstream_ready: Callable[[], bool]) -> None:
        self.registry.register(_StatsCollector(stats, upstream_ready))

    def _model(self, name: str | None) -> str:
        if not name:
            return "none"
        return name if name in self.known_models else "other"

    def observe(self, record: ObservationRecord) -> None:
        model = self._model(record.model)
        self.requests.labels(model, record.outcome).inc()
        if record.duration_ms is not None:
            self.duration.labels(model, record.outcome).observe(record.duration_ms / 1000)
        if record.first_event_ms is not None and record.events:
            self.first_event.labels(model).observe(record.first_event_ms / 1000)
        if record.events:
            self.events.labels(model).inc(record.events)
        if record.upstream_error:  # END_TABLE says which end causes are vLLM's
            self.upstream_errors.labels(record.error_code or "unknown").inc()
        if record.cancel_source is not None:
            self.cancellations.labels(record.cancel_source).inc()
        if record.upstream_abort_ms is not None:
            self.upstream_aborts.observe(record.upstream_abort_ms / 1000)
        usage = record.usage or {}
        for kind in ("prompt_tokens", "completion_tokens"):
            value = usage.get(kind)
            if isinstance(value, int) and value > 0:
                self.tokens.labels(model, kind.removesuffix("_tokens")).inc(value)
