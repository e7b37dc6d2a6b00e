"""Observability: one observation record per operation feeds the NNRP diagnostics event,
the canonical log line and the Prometheus metrics; plus the admin HTTP listener."""

from ._admin import (
    AdminRoutes as AdminRoutes,
    AdminServer as AdminServer,
    RouteUnavailable as RouteUnavailable,
    metrics_route as metrics_route,
)
from ._logging import configure_logging as configure_logging
from ._metrics import GatewayMetrics as GatewayMetrics
from ._record import (
    ObservationRecord as ObservationRecord,
    build_record as build_record,
)
