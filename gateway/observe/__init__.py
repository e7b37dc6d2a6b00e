"""Observability: one observation record per operation feeds the NNRP diagnostics event,
the canonical log line, the Prometheus metrics and (``serve --otel-traces``) the
OpenTelemetry spans, from what each operation's ``RecordNotes`` hold (the engine's
figures and the pipeline's findings); plus the admin HTTP listener."""

from ._admin import (
    AdminRoutes as AdminRoutes,
    AdminServer as AdminServer,
    RouteUnavailable as RouteUnavailable,
    metrics_route as metrics_route,
    metrics_text as metrics_text,
)
from ._logging import configure_logging as configure_logging
from ._metrics import GatewayMetrics as GatewayMetrics
from ._notes import (
    GatewaySpan as GatewaySpan,
    RecordNotes as RecordNotes,
    notes_of as notes_of,
)
from ._record import (
    ObservationRecord as ObservationRecord,
    build_record as build_record,
)
from ._spans import (
    SpanData as SpanData,
    SpanEvent as SpanEvent,
    Upstream as Upstream,
    build_spans as build_spans,
)
from ._tracing import (
    Tracer as Tracer,
    check_tracing as check_tracing,
    measure_tracing_cost as measure_tracing_cost,
    open_tracer as open_tracer,
    tracing_problem as tracing_problem,
)
