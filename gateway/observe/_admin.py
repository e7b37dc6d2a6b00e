"""The opt-in admin HTTP listener (trio + h11): health, readiness, metrics, capabilities.

* ``/healthz``: 200 while the process serves; never depends on vLLM (a liveness or
  native-sidecar startup probe that did would restart-loop or deadlock the pod during
  model load; docs/reference/conventions.md A1).
* ``/readyz``: 200 when every NNRP listener is bound, vLLM is probed and healthy, and the
  gateway is not draining; otherwise 503 with the reasons as JSON.
* ``/metrics``: Prometheus text, only when metrics are enabled; without the ``*_created``
  series prometheus_client adds to each counter, histogram and summary (a second series
  per series, a creation time nothing here reads: ``metrics_text``).
* ``/metrics/vllm``: vLLM's own ``/metrics``, passed through as it is (only when metrics
  are enabled): in the chart vLLM binds loopback inside the pod, so Prometheus reaches it
  only here (a ServiceMonitor endpoint of its own job). Bounded in time and size by the
  route's owner; 502 when vLLM fails or answers otherwise than 200, 504 when it is silent,
  each with one line saying so.
* ``/capabilities``: the capability document.
* ``/debug/residence``: only under ``serve --bench-residence`` (a benchmark): the residence
  times recorded since the last read of it (``gateway.residence``), which starts anew.

It binds loopback unless told otherwise (``host:port``, or ``unix:PATH``: a ``--workers``
supervisor reaches each worker's this way); it is off unless ``--admin-listen`` is given.
A route may answer now or later (an awaitable): the supervisor's ask the workers.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import attrs
import h11
import structlog
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gateway.transport import ListenError, open_unix_listener

log = structlog.get_logger("gateway.admin")
MAX_REQUEST = 16 * 1024
#: The content type of Prometheus' text exposition format, as vLLM serves it.
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
T = TypeVar("T")
Route = Callable[[], T | Awaitable[T]]


@attrs.frozen
class AdminRoutes:
    readiness: Route[list[str]]  # empty list = ready; else the reasons
    capabilities: Route[dict[str, Any]]
    metrics: Route[bytes] | None = None  # Prometheus text; None: /metrics is off
    vllm_metrics: Route[bytes] | None = None  # vLLM's /metrics; None: /metrics/vllm is off
    residence: Route[dict[str, Any]] | None = None  # None: /debug/residence is off


class RouteUnavailable(Exception):
    """A route cannot answer now: 503, or ``status`` (502: what it passes on failed; 504:
    what it passes on did not answer in time), with the message as the reason."""

    def __init__(self, message: str, *, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


def metrics_route(registry: CollectorRegistry) -> Route[bytes]:
    """/metrics for one process's registry."""
    return lambda: metrics_text(registry)


def metrics_text(registry: Collector) -> bytes:
    """Prometheus text of ``registry``'s families, less their ``*_created`` samples.

    prometheus_client gives every counter, histogram and summary series a ``_created``
    twin (its creation time): as many series again for Prometheus to store, and no query,
    alert or dashboard here reads them (Prometheus takes a restart from the counter going
    back). The switch prometheus_client has for this (``disable_created_metrics``) is the
    whole process's: this leaves every other registry of the process as it is."""
    return generate_latest(_WithoutCreated(registry))


class _WithoutCreated(Collector):
    def __init__(self, registry: Collector) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [sample for sample in family.samples
                            if not (sample.name == f"{family.name}_created"
                                    and family.type in _WITH_CREATED)]
            yield kept


#: The families prometheus_client gives a ``_created`` sample.
_WITH_CREATED = frozenset({"counter", "histogram", "summary"})


async def _answer(route: Route[T]) -> T:
    answer = route()
    if inspect.isawaitable(answer):
        return await answer
    return answer


class AdminServer:
    def __init__(self, routes: AdminRoutes) -> None:
        self.routes = routes
        self.port = 0

    async def serve(self, host: str, port: int, *,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        await self._serve_listeners(await trio.open_tcp_listeners(port, host=host),
                                    task_status=task_status)

    async def _serve_listeners(self, listeners: list[trio.SocketListener], *,
                               task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
                               ) -> None:
        host, self.port = listeners[0].socket.getsockname()[:2]
        log.info("admin listening", host=host, port=self.port,
                 metrics=self.routes.metrics is not None)
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def serve_address(self, address: str, *,
                            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                            ) -> None:
        """``host:port`` or ``unix:PATH`` (see the module's doc); a failed bind is a
        ``ListenError`` that names this listener."""
        try:
            if address.startswith("unix:"):
                listener = await open_unix_listener(address.removeprefix("unix:"))
            else:
                host, _, port = address.rpartition(":")
                listeners = await trio.open_tcp_listeners(int(port),
                                                          host=host.strip("[]") or "127.0.0.1")
        except OSError as exc:
            raise ListenError.cannot_bind(f"admin listener {address}", exc) from exc
        if address.startswith("unix:"):
            task_status.started()
            await trio.serve_listeners(self._handle, [listener])
            return
        async with trio.open_nursery() as nursery:
            await nursery.start(self._serve_listeners, listeners)
            task_status.started()

    async def _respond_safely(self, method: str, path: str) -> tuple[int, str, bytes]:
        """``respond``, with a route's failure as an answer: it must not end the listener
        (nor, in a supervisor, the workers it would cancel)."""
        try:
            return await self.respond(method, path)
        except RouteUnavailable as exc:
            return exc.status, "application/json", json.dumps({"error": str(exc)}).encode()
        except Exception:
            log.exception("admin route failed", path=path)
            return 500, "application/json", b'{"error":"internal error"}'

    async def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, "application/json", b'{"error":"method not allowed"}'
        path = path.split("?")[0]
        if path == "/healthz":
            return 200, "application/json", b'{"status":"ok"}'
        if path == "/readyz":
            reasons = await _answer(self.routes.readiness)
            body = json.dumps({"ready": not reasons, "reasons": reasons}).encode()
            return (200 if not reasons else 503), "application/json", body
        if path == "/metrics" and self.routes.metrics is not None:
            return 200, CONTENT_TYPE_LATEST, await _answer(self.routes.metrics)
        if path == "/metrics/vllm" and self.routes.vllm_metrics is not None:
            # vLLM's text as vLLM wrote it: Prometheus' text format (asked for without
            # OpenMetrics in Accept).
            return 200, PROMETHEUS_TEXT, await _answer(self.routes.vllm_metrics)
        if path == "/capabilities":
            document = await _answer(self.routes.capabilities)
            return 200, "application/json", json.dumps(document).encode()
        if path == "/debug/residence" and self.routes.residence is not None:
            figures = await _answer(self.routes.residence)
            return 200, "application/json", json.dumps(figures).encode()
        return 404, "application/json", b'{"error":"not found"}'

    async def _handle(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST)
        try:
            with trio.move_on_after(10):
                while True:
                    event = connection.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(MAX_REQUEST)
                        if not data:
                            return
                        connection.receive_data(data)
                        continue
                    if isinstance(event, h11.Request):
                        status, content_type, body = await self._respond_safely(
                            event.method.decode(), event.target.decode())
                        headers = [("content-type", content_type),
                                   ("content-length", str(len(body))), ("connection", "close")]
                        await stream.send_all(connection.send(h11.Response(
                            status_code=status, headers=headers)))
                        if event.method != b"HEAD":
                            await stream.send_all(connection.send(h11.Data(data=body)))
                        await stream.send_all(connection.send(h11.EndOfMessage()))
                        return
                    return
        except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await trio.aclose_forcefully(stream)
