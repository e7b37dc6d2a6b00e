"""``serve --workers N``: one supervising process, N gateway processes, one set of ports.

The supervisor binds every listener once (``gateway.server.bind_shared``: one
SO_REUSEPORT socket per worker on each inet port, one shared socket for unix), starts N
workers (``_worker``) that inherit them, and then only watches:

* **Start-up**: "serving NNRP on ..." (and the target manifest) once every worker says
  its listeners are serving.
* **A worker that exits before it ever served** (a configuration it cannot serve: a bad
  certificate file, say) stops the gateway with its exit status, as one process would.
* **A worker that exits** later, on its own, is restarted (after 0.5 s, doubling to 30 s while
  it keeps failing within 10 s of its start); its sockets stay open meanwhile, so the
  connections that arrive for it wait in its queue. One that exits with ``EXIT_FATAL`` (an
  unsupported vLLM) stops the whole gateway with that status.
* **SIGTERM / SIGINT**: readiness goes false, every worker is told to drain (SIGTERM),
  and the supervisor closes its copies of the listening sockets, so once the workers
  have stopped accepting the kernel refuses new connections instead of queueing them.
  It waits for the workers (their drain timeout and close grace, plus a margin), kills
  any that outlive that, and exits. **SIGHUP** is passed on (TLS files re-read).
* **Admin** (``--admin-listen``): each worker serves its own admin routes on a unix
  socket in a private directory; the supervisor answers for the pod: ``/metrics``
  merged (``_merge``) plus ``nnrp_gateway_workers_running`` and
  ``nnrp_gateway_worker_restarts_total``; ``/readyz`` ready when at least one worker runs,
  every running worker is ready and the supervisor is not draining (a worker away for a
  restart costs capacity, not service: the others take its connections);
  ``/capabilities`` from a running worker; ``/debug/residence`` per worker.

Limits are per worker, as nginx's ``worker_connections`` are: ``--max-connections`` and
``--upstream-pool-size`` hold for each worker. One NNRP connection (and every session on
it) lives in one worker: spreading load needs several connections.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import structlog
import trio
from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.observe import AdminRoutes, AdminServer
from gateway.server import SharedListener, bind_shared, server_context
from gateway.transport import ListenError, parse_endpoint

from ._merge import merged_exposition
from ._worker import EXIT_FATAL, WorkerPlan, encode_plan

if TYPE_CHECKING:
    from gateway.app import GatewayConfig

log = structlog.get_logger("gateway.workers")

FIRST_BACKOFF = 0.5
MAX_BACKOFF = 30.0
#: A worker that ran at least this long before it exited is restarted without delay growth.
STABLE_AFTER = 10.0
#: Beyond the workers' own drain bound, how long the supervisor waits before SIGKILL.
KILL_MARGIN = 5.0
ADMIN_TIMEOUT = 2.0


@attrs.define
class _Slot:
    """One worker position: its current process, if any, and how to reach its admin."""

    index: int
    admin_path: str
    process: trio.Process | None = None
    started: bool = False
    restarts: int = 0


class Supervisor:
    def __init__(self, config: GatewayConfig, workers: int, *, log_level: str = "info",
                 announce: Callable[[list[str]], Awaitable[None]] | None = None) -> None:
        if workers < 2:
            raise ValueError("a supervisor runs two workers or more")
        self.config = config
        self.workers = workers
        self.log_level = log_level
        self.announce = announce
        self.draining = False
        self.exit_status = 0
        self.uris: list[str] = []
        self._runtime_dir = ""
        self._slots: list[_Slot] = []
        self._listeners: list[SharedListener] = []
        self._stop = trio.Event()
        self._changed = trio.Event()  # set (and replaced) when a slot's state changes
        self._registry = CollectorRegistry(auto_describe=True)
        self._running = Gauge("nnrp_gateway_workers_running", "Worker processes running.",
                              registry=self._registry)
        self._restarts = Counter("nnrp_gateway_worker_restarts",
                                 "Worker processes restarted after they exited.",
                                 registry=self._registry)
        self.admin = AdminServer(AdminRoutes(
            self.readiness, self.capabilities,
            self.metrics if config.metrics else None,
            residence=self.residence if config.bench_residence else None))

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[list[str]]
                  = trio.TASK_STATUS_IGNORED) -> int:
        """Serve until a signal (or a fatal worker exit); the exit status."""
        self._runtime_dir = tempfile.mkdtemp(prefix="nnrp-gateway-workers-")
        self._slots = [_Slot(i, os.path.join(self._runtime_dir, f"worker-{i}.sock"))
                       for i in range(self.workers)]
        try:
            if self.config.tls is not None:
                server_context(self.config.tls)  # a bad file: one clear error, not N crashes
            for uri in self.config.listen:
                spec = parse_endpoint(uri)
                if (spec.tls or spec.scheme == "quic") and self.config.tls is None:
                    raise ListenError(f"{spec.scheme}:// needs a certificate (--tls-cert, "
                                      "--tls-key)")
                self._listeners.append(await bind_shared(uri, self.workers))
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT,
                                           signal.SIGHUP) as signals:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_signals, signals)
                    if self.config.admin_listen:
                        await nursery.start(self.admin.serve_address, self.config.admin_listen)
                    async with trio.open_nursery() as workers:
                        for slot in self._slots:
                            workers.start_soon(self._keep_running, slot)
                        if await self._all_started():
                            await self._announce()
                            task_status.started(self.uris)
                        await self._stop.wait()
                        await self._drain()
                    nursery.cancel_scope.cancel()
        finally:
            self._close_listeners()
            for listener in self._listeners:
                if listener.spec.scheme == "unix":
                    with contextlib.suppress(OSError):
                        os.unlink(listener.spec.path)
            shutil.rmtree(self._runtime_dir, ignore_errors=True)
        return self.exit_status

    async def _all_started(self) -> bool:
        """Wait until every worker serves its listeners (False: stopped first)."""
        await self._until(lambda: self._stop.is_set()
                          or all(slot.started for slot in self._slots))
        return not self._stop.is_set()

    async def _announce(self) -> None:
        self.uris = [listener.bound_uri for listener in self._listeners]
        log.info("workers started", workers=self.workers, endpoints=self.uris,
                 pids=list(self.pids))
        if self.announce is not None:
            await self.announce(self.uris)

    async def _watch_signals(self, signals: Any) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:
                self._signal_workers(signal.SIGHUP)
            else:
                self._stop.set()
                self._change()

    async def _drain(self) -> None:
        self.draining = True
        log.info("draining workers", workers=self.workers)
        self._signal_workers(signal.SIGTERM)
        self._close_listeners()
        bound = self.config.drain_timeout + self.config.drain_close_grace + KILL_MARGIN
        with trio.move_on_after(bound) as waited:
            await self._until(lambda: all(slot.process is None for slot in self._slots))
        if waited.cancelled_caught:
            log.error("workers outlived the drain; killing them", bound_s=bound)
            self._signal_workers(signal.SIGKILL)
        log.info("drained")

    async def _until(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition`` holds; it is checked at each change of a slot."""
        while not condition():
            await self._changed.wait()

    def _change(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _signal_workers(self, signum: int) -> None:
        for slot in self._slots:
            if slot.process is not None and slot.process.returncode is None:
                slot.process.send_signal(signum)

    def _close_listeners(self) -> None:
        for listener in self._listeners:
            listener.close()

    async def _keep_running(self, slot: _Slot) -> None:
        backoff = FIRST_BACKOFF
        served = False
        while not self.draining:
            started_at = trio.current_time()
            status = await self._run_once(slot)
            served = served or slot.started
            if self.draining:
                return
            if status == EXIT_FATAL or not served:
                # An unsupported vLLM, or a worker that never got as far as serving (a
                # bad certificate file, say): a restart would fail the same way.
                log.error("worker cannot serve this configuration; stopping",
                          worker=slot.index, status=status)
                self.exit_status = status or 1
                self._stop.set()
                self._change()
                return
            ran = trio.current_time() - started_at
            backoff = FIRST_BACKOFF if ran >= STABLE_AFTER else backoff
            log.error("worker exited; restarting it", worker=slot.index, status=status,
                      ran_s=round(ran, 3), restart_in_s=backoff)
            with trio.move_on_after(backoff):
                await self._stop.wait()
            backoff = min(backoff * 2, MAX_BACKOFF)
            if not self.draining and not self._stop.is_set():
                slot.restarts += 1
                self._restarts.inc()

    async def _run_once(self, slot: _Slot) -> int:
        """Start the slot's worker and wait for it to exit; its exit status."""
        slot.started = False
        started_read, started_write = os.pipe()
        plan = WorkerPlan(
            slot.index,
            attrs.evolve(self.config, admin_listen=f"unix:{slot.admin_path}"),
            tuple(listener.for_worker(slot.index) for listener in self._listeners),
            started_write, self.log_level)
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "gateway.workers"], stdin=subprocess.PIPE,
                pass_fds=plan.fds())
        except BaseException:
            os.close(started_read)
            raise
        finally:
            os.close(started_write)
        slot.process = process
        self._running.inc()
        try:
            assert process.stdin is not None
            # stdin stays open: its end tells the worker this supervisor is gone.
            await process.stdin.send_all(encode_plan(plan))
            async with trio.lowlevel.FdStream(started_read) as started:
                slot.started = bool(await started.receive_some(1))
            self._change()
            return await process.wait()
        except BaseException:
            with trio.CancelScope(shield=True):
                process.kill()
                await process.wait()
            raise
        finally:
            slot.process = None
            self._change()
            self._running.dec()
            if process.stdin is not None:
                with trio.CancelScope(shield=True):
                    await process.stdin.aclose()

    # ------------------------------------------------------------------ admin

    def _running_slots(self) -> list[_Slot]:
        return [slot for slot in self._slots if slot.process is not None and slot.started]

    async def _ask_all(self, path: str) -> list[tuple[_Slot, httpx.Response | None]]:
        """GET ``path`` from every running worker at once (None: it did not answer)."""
        slots = self._running_slots()
        answers: list[httpx.Response | None] = [None] * len(slots)

        async def ask(i: int, slot: _Slot) -> None:
            transport = httpx.AsyncHTTPTransport(uds=slot.admin_path)
            async with httpx.AsyncClient(transport=transport, timeout=ADMIN_TIMEOUT,
                                         base_url="http://worker") as http:
                try:
                    answers[i] = await http.get(path)
                except httpx.HTTPError:
                    answers[i] = None

        async with trio.open_nursery() as nursery:
            for i, slot in enumerate(slots):
                nursery.start_soon(ask, i, slot)
        return list(zip(slots, answers, strict=True))

    async def readiness(self) -> list[str]:
        reasons = ["draining"] if self.draining else []
        answers = await self._ask_all("/readyz")
        if not answers:
            reasons.append("no worker is running")
        for slot, answer in answers:
            if answer is None:
                reasons.append(f"worker {slot.index} does not answer")
            elif answer.status_code != 200:
                reasons += [f"worker {slot.index}: {reason}"
                            for reason in answer.json().get("reasons", [])]
        return reasons

    async def capabilities(self) -> dict[str, Any]:
        for _, answer in await self._ask_all("/capabilities"):
            if answer is not None and answer.status_code == 200:
                document: dict[str, Any] = answer.json()
                return document
        return {"error": "no worker is running"}

    async def metrics(self) -> bytes:
        texts = [answer.text for _, answer in await self._ask_all("/metrics")
                 if answer is not None and answer.status_code == 200]
        return merged_exposition(texts, self._registry)

    async def residence(self) -> dict[str, Any]:
        per_worker = [{"worker": slot.index, **json.loads(answer.content)}
                      for slot, answer in await self._ask_all("/debug/residence")
                      if answer is not None and answer.status_code == 200]
        return {"workers": per_worker,
                "events": sum(figures["events"] for figures in per_worker),
                "reads": sum(figures["reads"] for figures in per_worker)}

    @property
    def pids(self) -> Sequence[int]:
        return [slot.process.pid for slot in self._slots if slot.process is not None]
