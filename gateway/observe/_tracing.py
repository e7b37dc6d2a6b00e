"""Tracing as the rest of the gateway sees it: a ``Tracer`` (decide a span, export a
record), opened only when ``serve --otel-traces`` asks for it.

OpenTelemetry is an optional extra (``pip install 'nnrp-vllm-gateway[otel]'``): nothing
here imports it; ``open_tracer`` imports ``_otel`` (the one module that does) and turns
a missing package into a ``ConfigError`` that says how to install it. Everything else
is configured the OpenTelemetry way, by the standard ``OTEL_*`` variables (README,
"Observability").
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gateway.errors import ConfigError

if TYPE_CHECKING:
    from gateway.nnrp import TraceInfo
    from gateway.server import GatewaySpan

    from ._record import ObservationRecord

#: What to install for tracing, said wherever it is missing.
INSTALL_HINT = "pip install 'nnrp-vllm-gateway[otel]'"
#: The packages the extra brings that tracing imports.
_NEEDED = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")


class Tracer(Protocol):
    """What the pipeline and the gateway ask of tracing (``_otel.OtelTracer``)."""

    def decide(self, trace: TraceInfo | None) -> GatewaySpan:
        """The gateway's span for one operation: ids and the sampler's word."""
        ...

    def export(self, record: ObservationRecord) -> None:
        """Queue the record's spans for export; never blocks (a full queue drops)."""
        ...

    def start(self) -> None:
        """Start the export thread."""
        ...

    def close(self, timeout: float) -> None:
        """Export what is queued for at most ``timeout`` seconds, count the rest dropped,
        and stop (blocking: call it from a worker thread)."""
        ...


def tracing_problem() -> str | None:
    """Why tracing cannot be switched on here (the extra is not installed), or None."""
    missing = [name for name in _NEEDED if not _importable(name)]
    if missing:
        return (f"--otel-traces needs OpenTelemetry ({', '.join(missing)} not installed): "
                f"{INSTALL_HINT}")
    return None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing, or a None in sys.modules
        return False


def check_tracing() -> None:
    """Raise ``ConfigError`` when tracing cannot start here: the extra is missing, or an
    OTEL_* setting cannot be used (checked before serving, so the CLI says it once)."""
    problem = tracing_problem()
    if problem is not None:
        raise ConfigError(problem)
    from ._otel import check_environment

    check_environment(os.environ)


def open_tracer(*, vllm_url: str, dropped: Callable[[str, int], None],
                exported: Callable[[int], None]) -> Tracer:
    """The OpenTelemetry tracer, configured from the ``OTEL_*`` environment. ``dropped``
    counts spans lost (reason, count), ``exported`` those the collector took."""
    problem = tracing_problem()
    if problem is not None:
        raise ConfigError(problem)
    from ._otel import OtelTracer

    return OtelTracer.from_environment(vllm_url=vllm_url, dropped=dropped, exported=exported)
