"""Tracing as the rest of the gateway sees it: a ``Tracer`` (decide a span, export a
record), opened only when ``serve --otel-traces`` asks for it.

OpenTelemetry is an optional extra (``INSTALL_HINT``: ``make otel`` in a checkout,
``pip install 'nnrp-vllm-gateway[otel]'`` from a wheel): nothing here imports it;
``open_tracer`` imports ``_otel`` (the one module that does) and turns a missing
package into a ``ConfigError`` that says how to install it. Everything else
is configured the OpenTelemetry way, by the standard ``OTEL_*`` variables
(docs/observability.md), and ``OTEL_SDK_DISABLED=true`` switches it off as it switches off
every OpenTelemetry SDK (one log line says so).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

import structlog

from gateway.errors import ConfigError

if TYPE_CHECKING:
    from gateway.nnrp import TraceInfo

    from ._notes import GatewaySpan
    from ._otel import TracingCost
    from ._record import ObservationRecord

log = structlog.get_logger("gateway.observe.traces")

#: What to install for tracing, said wherever it is missing: the project is not on a
#: package index, and a checkout's .venv has uv but no pip.
INSTALL_HINT = ("install the otel extra: in a checkout, make otel (which runs "
                ".venv/bin/uv pip install -e '.[otel]'); from a wheel, pip install "
                "'nnrp-vllm-gateway[otel]'")
#: The packages the extra brings that tracing imports.
_NEEDED = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")


class Tracer(Protocol):
    """What the pipeline and the gateway ask of tracing (``_otel.OtelTracer``)."""

    #: The models vLLM serves: a span name names one of them, else ``other``.
    known_models: frozenset[str]

    def decide(self, trace: TraceInfo | None) -> GatewaySpan:
        """The gateway's span for one operation: ids and the sampler's word."""
        ...

    def export(self, record: ObservationRecord) -> None:
        """Queue the record's spans for export; never blocks (a full queue drops)."""
        ...

    def start(self) -> None:
        """Say where spans go (one log line), then start the export thread."""
        ...

    def close(self, timeout: float) -> None:
        """Export what is queued for at most ``timeout`` seconds, count the rest dropped,
        and stop (blocking: call it from a worker thread)."""
        ...


def tracing_disabled(env: Mapping[str, str] | None = None) -> bool:
    """``OTEL_SDK_DISABLED=true`` (case-insensitive, as the SDK reads it): no tracer."""
    env = os.environ if env is None else env
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


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
    OTEL_* setting cannot be used (checked before serving, so the CLI says it once).
    With ``OTEL_SDK_DISABLED=true`` nothing is checked: nothing will be used."""
    if tracing_disabled():
        return
    problem = tracing_problem()
    if problem is not None:
        raise ConfigError(problem)
    from ._otel import check_environment

    check_environment(os.environ)


def open_tracer(*, vllm_url: str, dropped: Callable[[str, int], None],
                exported: Callable[[int], None]) -> Tracer | None:
    """The OpenTelemetry tracer, configured from the ``OTEL_*`` environment. ``dropped``
    counts spans lost (reason, count), ``exported`` those the collector took. None, said
    in one log line, when ``OTEL_SDK_DISABLED=true``. ``OTEL_TRACES_EXPORTER=none`` opens
    one that decides spans and exports none; its ``start`` says so, as it says where
    spans go otherwise (``_otel`` rule 5)."""
    if tracing_disabled():
        log.info("OTEL_SDK_DISABLED=true: --otel-traces is off, no span is exported")
        return None
    problem = tracing_problem()
    if problem is not None:
        raise ConfigError(problem)
    from ._otel import OtelTracer

    return OtelTracer.from_environment(vllm_url=vllm_url, dropped=dropped, exported=exported)


def measure_tracing_cost(record: ObservationRecord, trace: TraceInfo | None, *,
                         operations: int, vllm_url: str) -> TracingCost:
    """CPU per operation that tracing adds, in this process (``bench run --scenario
    tracing``; ``_otel.measure_cost``). Needs the extra, as ``open_tracer`` does."""
    problem = tracing_problem()
    if problem is not None:
        raise ConfigError(problem)
    from ._otel import measure_cost

    return measure_cost(record, trace, operations=operations, vllm_url=vllm_url)
