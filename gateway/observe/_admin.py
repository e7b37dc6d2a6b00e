"""The opt-in admin HTTP listener (trio + h11): health, readiness, metrics, capabilities.

* ``/healthz``: 200 while the process serves; never depends on vLLM (a liveness or
  native-sidecar startup probe that did would restart-loop or deadlock the pod during
  model load; conventions.md A1).
* ``/readyz``: 200 when every NNRP listener is bound, vLLM is probed and healthy, and the
  gateway is not draining; otherwise 503 with the reasons as JSON.
* ``/metrics``: Prometheus text, only when metrics are enabled.
* ``/capabilities``: the capability document.
* ``/debug/residence``: only under ``serve --bench-residence`` (a benchmark): the residence
  times recorded since the last read of it (``gateway.residence``), which starts anew.

It binds loopback unless told otherwise; it is off unless ``--admin-listen`` is given.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import h11
import structlog
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = structlog.get_logger("gateway.admin")
MAX_REQUEST = 16 * 1024


@attrs.frozen
class AdminRoutes:
    readiness: Callable[[], list[str]]  # empty list = ready; else the reasons
    capabilities: Callable[[], dict[str, Any]]
    registry: CollectorRegistry | None = None  # None: /metrics is off
    residence: Callable[[], dict[str, Any]] | None = None  # None: /debug/residence is off


class AdminServer:
    def __init__(self, routes: AdminRoutes) -> None:
        self.routes = routes
        self.port = 0

    async def serve(self, host: str, port: int, *,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(port, host=host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("admin listening", host=host, port=self.port,
                 metrics=self.routes.registry is not None)
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, "application/json", b'{"error":"method not allowed"}'
        path = path.split("?")[0]
        if path == "/healthz":
            return 200, "application/json", b'{"status":"ok"}'
        if path == "/readyz":
            reasons = self.routes.readiness()
            body = json.dumps({"ready": not reasons, "reasons": reasons}).encode()
            return (200 if not reasons else 503), "application/json", body
        if path == "/metrics" and self.routes.registry is not None:
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.routes.registry)
        if path == "/capabilities":
            return 200, "application/json", json.dumps(self.routes.capabilities()).encode()
        if path == "/debug/residence" and self.routes.residence is not None:
            return 200, "application/json", json.dumps(self.routes.residence()).encode()
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
                        status, content_type, body = self.respond(
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
