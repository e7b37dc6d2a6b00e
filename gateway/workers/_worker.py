"""One worker process: a whole gateway on the listeners its supervisor bound.

The supervisor starts ``python -m gateway.workers`` and writes the worker's ``WorkerPlan``
to its stdin (a length-prefixed pickle: the plan holds the parsed configuration,
callables such as the token authenticator included, and travels between two copies of
this program on a private pipe). It then keeps stdin open: end of file there means the
supervisor is gone (even SIGKILLed), and the worker drains and exits rather than serve
on as an orphan. The worker writes one byte to ``started_fd`` once every listener is
serving; SIGTERM drains, SIGHUP re-reads the TLS files, as for a single process.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from typing import TYPE_CHECKING, BinaryIO

import attrs
import structlog
import trio

from gateway.app import Gateway, GatewayConfig, serve_until_signalled, settle_startup_heap
from gateway.transport import Inherited

if TYPE_CHECKING:
    from gateway.server import BoundEndpoint

log = structlog.get_logger("gateway.workers")

#: The exit status for a vLLM the gateway cannot serve (an unsupported version), one
#: process or a worker alike: restarting would fail again, so a supervisor stops with it.
EXIT_FATAL = 3
_LENGTH = struct.Struct("!I")


@attrs.frozen
class WorkerPlan:
    index: int
    config: GatewayConfig
    inherited: tuple[Inherited, ...]
    started_fd: int
    log_level: str = "info"

    def fds(self) -> tuple[int, ...]:
        """Every descriptor the worker must inherit."""
        return (self.started_fd, *(fd for listener in self.inherited for fd in listener.fds))


def encode_plan(plan: WorkerPlan) -> bytes:
    body = pickle.dumps(plan)
    return _LENGTH.pack(len(body)) + body


def read_plan(stream: BinaryIO) -> WorkerPlan:
    (length,) = _LENGTH.unpack(stream.read(_LENGTH.size))
    plan = pickle.loads(stream.read(length))
    if not isinstance(plan, WorkerPlan):
        raise TypeError(f"not a worker plan: {type(plan).__name__}")
    return plan


async def serve_worker(plan: WorkerPlan) -> None:
    structlog.contextvars.bind_contextvars(worker=plan.index)
    gateway_app = Gateway(plan.config, plan.inherited)

    async def started(endpoints: list[BoundEndpoint]) -> None:
        settle_startup_heap()
        log.info("worker serving", pid=os.getpid())
        os.write(plan.started_fd, b"\x01")
        os.close(plan.started_fd)

    async def supervisor_gone() -> None:
        # A copy of the descriptor for trio (which makes the shared file description
        # non-blocking: nothing else in this process reads stdin after the plan).
        async with trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stdin:
            while await stdin.receive_some(4096):
                pass
        log.warning("the supervisor is gone; draining")

    await serve_until_signalled(gateway_app, started, stop_when=supervisor_gone)
