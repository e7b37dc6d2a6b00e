"""``serve --workers N``: one supervising process, N gateway processes, one set of ports.

The supervisor binds every listener once (``gateway.server.bind_shared``: one
SO_REUSEPORT socket per worker on each inet port, one shared socket for unix), starts N
workers (``_worker``) that inherit them, and then only watches. Each worker position (a
``_Slot``) has one task that owns its process from spawn to exit: it starts it, passes
signals, restarts it, and stops it. The rules:

* **Start-up**: "serving NNRP on ..." (and the target manifest) once every worker says
  its listeners are serving.
* **A worker that exits before it ever served** (it cannot serve this configuration)
  stops the gateway with its exit status, as one process would; so does one that exits
  with ``EXIT_FATAL`` (an unsupported vLLM) at any time.
* **A worker that exits** later, on its own, is restarted (after 0.5 s, doubling to 30 s
  while it keeps failing within 10 s of its start). Its TCP sockets are closed at once,
  so new connections go to the workers still running; it gets fresh ones on restart.
* **SIGTERM / SIGINT** (the supervisor's only: workers run in their own process group,
  so a terminal's Ctrl-C reaches them through here): readiness goes false, no worker is
  started any more, each slot's task sends its worker SIGTERM (the worker drains as one
  process does) and waits for it, up to the drain timeout and close grace plus a margin,
  then SIGKILLs it. Once no worker can be started, the supervisor closes its copies of
  the listening sockets, so the kernel refuses new connections instead of queueing them.
  **SIGHUP** is passed to the workers that are serving (TLS files re-read; one still
  starting reads the current files anyway, and would die of a SIGHUP before its handler).
* **A second SIGTERM / SIGINT** during the drain is passed on: each worker exits at
  once (its second signal), and so does the gateway (``DrainInterrupted``, status 1).
* **Exit status**: 0 after a drain; a fatal worker's status otherwise, a worker killed by
  signal S as 128 + S (``exit_status``).
* **Admin** (``--admin-listen``): each worker serves its own admin routes on a unix
  socket in a private directory; the supervisor answers for the pod: ``/metrics``
  (``_merge.PodMetrics``: monotonic across worker restarts) plus
  ``nnrp_gateway_workers_running`` and ``nnrp_gateway_worker_restarts_total``;
  ``/readyz`` ready when at least one worker serves, every serving worker is ready and
  the supervisor is not draining (a worker away for a restart costs capacity, not
  service: its TCP share moves to the others); ``/capabilities`` and ``/metrics/vllm``
  (vLLM's own, its 502 or 504 as the worker gave it) from a serving worker;
  ``/debug/residence`` per worker. A worker that does not answer within
  ``ADMIN_TIMEOUT`` (below the chart's probe timeout: a saturated worker answers late)
  is reported so.

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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import structlog
import trio
from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.app import DrainInterrupted
from gateway.observe import AdminRoutes, AdminServer, RouteUnavailable
from gateway.transport import (
    ListenError,
    SharedListener,
    bind_shared,
    fleet_uri,
    parse_endpoint,
    server_context,
)

from ._merge import PodMetrics
from ._worker import EXIT_FATAL, WorkerPlan, encode_plan

if TYPE_CHECKING:
    from gateway.app import GatewayConfig

log = structlog.get_logger("gateway.workers")

FIRST_BACKOFF = 0.5
MAX_BACKOFF = 30.0
#: A worker that ran at least this long before it exited is restarted without delay growth.
STABLE_AFTER = 10.0
#: Beyond the workers' own drain bound, how long a worker is waited for before SIGKILL.
KILL_MARGIN = 5.0
#: How long the admin routes wait for a worker (the chart's probe timeout is 10 s).
ADMIN_TIMEOUT = 8.0


def exit_status(status: int) -> int:
    """A worker's status as the gateway's exit status: killed by signal S is 128 + S
    (the shell's convention; Popen reports it as -S); 0 from a worker that never
    served is still a failure (1)."""
    if status < 0:
        return 128 - status
    return status or 1


@attrs.define
class _Slot:
    """One worker position: its current process, if any, and how to reach its admin."""

    index: int
    admin_path: str
    process: trio.Process | None = None
    #: The current process said its listeners are serving.
    started: bool = False
    #: Some process of this slot has served (a later exit is a crash, not a bad config).
    served: bool = False
    #: Between deciding to start a process and having it (sockets must stay open).
    spawning: bool = False
    http: httpx.AsyncClient | None = None


class Supervisor:
    def __init__(self, config: GatewayConfig, workers: int, *, log_level: str = "info",
                 announce: Callable[[list[str]], Awaitable[None]] | None = None) -> None:
        if workers < 2:
            raise ValueError("a supervisor runs two workers or more")
        self.config = config
        self.workers = workers
        self.log_level = log_level
        self.announce = announce
        self.exit_status = 0
        #: A second SIGTERM/SIGINT came during the drain (run raises DrainInterrupted).
        self.interrupted = False
        self.uris: list[str] = []
        self._runtime_dir = ""
        self._relays: tuple[str, ...] = ()
        self._slots: list[_Slot] = []
        self._listeners: list[SharedListener] = []
        #: The fleet's listener among them (``--fleet-advertise``), not an NNRP endpoint.
        self._fleet_uri: str | None = None
        self._stop = trio.Event()
        self._changed = trio.Event()  # set (and replaced) when a slot's state changes
        self._pod_metrics = PodMetrics()
        self._registry = CollectorRegistry(auto_describe=True)
        self._running = Gauge("nnrp_gateway_workers_running", "Worker processes running.",
                              registry=self._registry)
        self._restarts = Counter("nnrp_gateway_worker_restarts",
                                 "Worker processes restarted after they exited.",
                                 registry=self._registry)
        self.admin = AdminServer(AdminRoutes(
            self.readiness, self.capabilities,
            self.metrics if config.metrics else None,
            vllm_metrics=self.vllm_metrics if config.metrics else None,
            residence=self.residence if config.bench_residence else None))

    @property
    def draining(self) -> bool:
        return self._stop.is_set()

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[list[str]]
                  = trio.TASK_STATUS_IGNORED) -> int:
        """Serve until a signal (or a fatal worker exit); the exit status."""
        # Open first: a SIGTERM while binding is a stop, not the default handler's exit.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT,
                                       signal.SIGHUP) as signals:
            async with self._resources(), trio.open_nursery() as nursery:
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
                    log.info("draining workers", workers=self.workers)
                    await self._until(lambda: not any(s.spawning for s in self._slots))
                    self._close_listeners()
                log.info("drained")
                nursery.cancel_scope.cancel()
        if self.interrupted:
            raise DrainInterrupted("stopped by a second signal during the drain; operations "
                                   "still in flight were cut")
        return self.exit_status

    @contextlib.asynccontextmanager
    async def _resources(self) -> AsyncIterator[None]:
        """The runtime directory, the bound listeners, an admin client per slot; all
        given back on the way out, whatever happened."""
        self._runtime_dir = tempfile.mkdtemp(prefix="nnrp-gateway-workers-")
        try:
            self._slots = [_Slot(i, os.path.join(self._runtime_dir, f"worker-{i}.sock"))
                           for i in range(self.workers)]
            # Where each worker takes the resumes the kernel gave another (its sessions'
            # tokens name it: gateway/nnrp/_resumption.py R11).
            self._relays = tuple(os.path.join(self._runtime_dir, f"worker-{i}.relay")
                                 for i in range(self.workers))
            if self.config.tls is not None:
                server_context(self.config.tls)  # a bad file: one clear error, not N crashes
            for uri in self.config.listen:
                spec = parse_endpoint(uri)
                if (spec.tls or spec.scheme == "quic") and self.config.tls is None:
                    raise ListenError(f"{spec.scheme}:// needs a certificate (--tls-cert, "
                                      "--tls-key)")
                self._listeners.append(await bind_shared(uri, self.workers))
            if self.config.fleet is not None:
                # Forwards from other pods reach any worker, which relays them on to the
                # one holding the session (gateway/server/_relay.py rule 1).
                self._fleet_uri = fleet_uri(self.config.fleet.advertise)
                self._listeners.append(await bind_shared(self._fleet_uri, self.workers))
            for slot in self._slots:
                slot.http = httpx.AsyncClient(
                    transport=httpx.AsyncHTTPTransport(uds=slot.admin_path),
                    timeout=ADMIN_TIMEOUT, base_url="http://worker")
            yield
        finally:
            self._close_listeners()
            for listener in self._listeners:
                if listener.spec.scheme == "unix":
                    with contextlib.suppress(OSError):
                        os.unlink(listener.spec.path)
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                for slot in self._slots:
                    if slot.http is not None:
                        await slot.http.aclose()
            shutil.rmtree(self._runtime_dir, ignore_errors=True)

    async def _all_started(self) -> bool:
        """Wait until every worker serves its listeners (False: stopped first)."""
        await self._until(lambda: self._stop.is_set()
                          or all(slot.started for slot in self._slots))
        return not self._stop.is_set()

    async def _announce(self) -> None:
        self.uris = [listener.bound_uri for listener in self._listeners
                     if listener.uri != self._fleet_uri]
        log.info("workers started", workers=self.workers, endpoints=self.uris,
                 pids=list(self.pids))
        if self.announce is not None:
            await self.announce(self.uris)

    async def _watch_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:
                for slot in self._slots:
                    if slot.started and slot.process is not None:
                        slot.process.send_signal(signal.SIGHUP)
            elif self._stop.is_set():
                # A second signal: each worker gets its second too and exits at once.
                log.warning("second signal during the drain; stopping the workers now",
                            signal=signal.Signals(signum).name)
                self.interrupted = True
                for slot in self._slots:
                    if slot.process is not None:
                        slot.process.send_signal(signal.SIGTERM)
            else:
                self._begin_stop()

    def _begin_stop(self, status: int = 0) -> None:
        if not self._stop.is_set():
            self.exit_status = status
            self._stop.set()
            self._change()

    async def _until(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition`` holds; it is checked at each change of a slot."""
        while not condition():
            await self._changed.wait()

    def _change(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _close_listeners(self) -> None:
        for listener in self._listeners:
            listener.close()

    # ------------------------------------------------------------------ one slot

    async def _keep_running(self, slot: _Slot) -> None:
        """The slot's worker, started and restarted until the gateway stops."""
        backoff = FIRST_BACKOFF
        while not self._stop.is_set():
            started_at = trio.current_time()
            status = await self._run_once(slot)
            for listener in self._listeners:
                listener.release(slot.index)
            if self._stop.is_set():
                return
            if status == EXIT_FATAL or not slot.served:
                log.error("worker cannot serve this configuration; stopping",
                          worker=slot.index, status=status)
                self._begin_stop(exit_status(status))
                return
            ran = trio.current_time() - started_at
            backoff = FIRST_BACKOFF if ran >= STABLE_AFTER else backoff
            log.error("worker exited; restarting it", worker=slot.index, status=status,
                      ran_s=round(ran, 3), restart_in_s=backoff)
            with trio.move_on_after(backoff):
                await self._stop.wait()
            backoff = min(backoff * 2, MAX_BACKOFF)
            if not self._stop.is_set():
                self._restarts.inc()

    async def _run_once(self, slot: _Slot) -> int:
        """Start the slot's worker and own it until it exits; its exit status (a start
        that failed is reported as status 1)."""
        slot.started = False
        slot.spawning = True
        try:
            try:
                started_read, started_write = os.pipe()
            except OSError as exc:  # out of descriptors: a failed start, not a crash
                log.error("could not start a worker", worker=slot.index, error=str(exc))
                return 1
            async with trio.lowlevel.FdStream(started_read) as started:
                try:
                    for listener in self._listeners:
                        listener.renew(slot.index)
                    plan = WorkerPlan(
                        slot.index,
                        attrs.evolve(self.config, admin_listen=f"unix:{slot.admin_path}",
                                     resume=attrs.evolve(self.config.resume,
                                                         worker=slot.index,
                                                         relays=self._relays)),
                        tuple(listener.for_worker(slot.index) for listener in self._listeners),
                        started_write, self.log_level)
                    message = encode_plan(plan)
                    process = await trio.lowlevel.open_process(
                        [sys.executable, "-m", "gateway.workers"], stdin=subprocess.PIPE,
                        pass_fds=plan.fds(), process_group=0)
                except OSError as exc:  # a process limit, EMFILE, a bind: a failed start
                    log.error("could not start a worker", worker=slot.index, error=str(exc))
                    return 1
                finally:
                    os.close(started_write)
                    slot.spawning = False
                    self._change()
                return await self._own(slot, process, message, started)
        finally:
            slot.spawning = False

    async def _own(self, slot: _Slot, process: trio.Process, message: bytes,
                   started: trio.lowlevel.FdStream) -> int:
        slot.process = process
        self._running.inc()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._hand_over, slot, process, message, started)
                nursery.start_soon(self._stop_on_request, process)
                status = await process.wait()
                nursery.cancel_scope.cancel()
            return status
        except BaseException:
            with trio.CancelScope(shield=True):
                process.kill()
                await process.wait()
            raise
        finally:
            slot.process = None
            slot.started = False
            self._running.dec()
            self._pod_metrics.retire(slot.index)
            self._change()
            if process.stdin is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await process.stdin.aclose()

    async def _hand_over(self, slot: _Slot, process: trio.Process, message: bytes,
                         started: trio.lowlevel.FdStream) -> None:
        """The plan to the worker (stdin then stays open: its end tells the worker its
        supervisor is gone), then its word that it serves."""
        assert process.stdin is not None
        with contextlib.suppress(trio.BrokenResourceError):  # it died: wait() says how
            await process.stdin.send_all(message)
        if await started.receive_some(1):
            slot.started = slot.served = True
            self._change()

    async def _stop_on_request(self, process: trio.Process) -> None:
        await self._stop.wait()
        process.send_signal(signal.SIGTERM)
        bound = self.config.drain_timeout + self.config.drain_close_grace + KILL_MARGIN
        await trio.sleep(bound)
        log.error("a worker outlived the drain; killing it", pid=process.pid, bound_s=bound)
        process.kill()

    # ------------------------------------------------------------------ admin

    def _serving(self) -> list[_Slot]:
        return [slot for slot in self._slots if slot.process is not None and slot.started]

    async def _ask_all(self, path: str) -> list[tuple[_Slot, httpx.Response | None]]:
        """GET ``path`` from every serving worker at once (None: it did not answer, or
        its process exited meanwhile: an answer is only ever its current process's)."""
        slots = self._serving()
        processes = [slot.process for slot in slots]
        answers: list[httpx.Response | None] = [None] * len(slots)

        async def ask(i: int, slot: _Slot) -> None:
            assert slot.http is not None
            with contextlib.suppress(httpx.HTTPError):
                answers[i] = await slot.http.get(path)

        async with trio.open_nursery() as nursery:
            for i, slot in enumerate(slots):
                nursery.start_soon(ask, i, slot)
        return [(slot, answer if slot.process is process else None)
                for slot, process, answer in zip(slots, processes, answers, strict=True)]

    async def readiness(self) -> list[str]:
        reasons = ["draining"] if self.draining else []
        answers = await self._ask_all("/readyz")
        if not answers:
            reasons.append("no worker is serving")
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
        raise RouteUnavailable("no worker is serving")

    async def metrics(self) -> bytes:
        for slot, answer in await self._ask_all("/metrics"):
            if answer is not None and answer.status_code == 200:
                self._pod_metrics.update(slot.index, answer.text)
        return self._pod_metrics.exposition(self._registry)

    async def vllm_metrics(self) -> bytes:
        """vLLM's /metrics through one worker (every worker reaches the same vLLM); its
        502 or 504 passed on as it is."""
        for slot in self._serving():
            assert slot.http is not None
            try:
                answer = await slot.http.get("/metrics/vllm")
            except httpx.HTTPError:
                continue  # try the next worker
            if answer.status_code == 200:
                return answer.content
            try:
                reason = str(answer.json()["error"])
            except (ValueError, KeyError, TypeError):
                reason = answer.text[:200]
            raise RouteUnavailable(reason, status=answer.status_code)
        raise RouteUnavailable("no worker is serving")

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
