"""The processes a benchmark runs against (a replay backend, a null relay and a gateway,
each on a free loopback port) and the client-side helpers every scenario shares: the
request envelope, sessions spread over connections, a fan-out of streams."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import trio

from gateway.tools.client import ClientSession, connect

Progress = Callable[[str], None]


def free_port() -> int:
    """A loopback TCP port that is free now (for processes started with it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Stack:
    """A replay backend, a gateway (with the residence probe on: ``gateway.residence``)
    and a null relay to the backend (``relay``), as processes, on free loopback ports."""

    def __init__(self, *, speed: float = 1.0, gateway_args: tuple[str, ...] = (),
                 log_dir: Path | None = None, residence: bool = True,
                 env: dict[str, str] | None = None) -> None:
        self.speed = speed
        #: More environment for the gateway process (the OTEL_* variables of tracing).
        self.env = env
        self.gateway_args = (*gateway_args, "--bench-residence") if residence else gateway_args
        #: Where the processes' output goes (gateway.log, replay.log); discarded if None.
        self.log_dir = log_dir
        self._logs: list[Any] = []
        exe = Path(sys.executable).parent / "nnrp-gateway"
        self.exe = str(exe) if exe.exists() else "nnrp-gateway"
        self.vllm_port, self.nnrp_port, self.admin_port, self.relay_port = (
            free_port(), free_port(), free_port(), free_port())
        self.vllm_url = f"http://127.0.0.1:{self.vllm_port}"
        #: The backend through the null relay: direct HTTP plus one process hop.
        self.relay_url = f"http://127.0.0.1:{self.relay_port}"
        self.endpoint = f"tcp://127.0.0.1:{self.nnrp_port}"
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.startup_seconds = 0.0

    @property
    def gateway_pid(self) -> int:
        return self.processes[-1].pid

    def _log_file(self, name: str) -> Any:
        if self.log_dir is None:
            return subprocess.DEVNULL
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._logs.append((self.log_dir / name).open("wb"))  # closed in __aexit__
        return self._logs[-1]

    async def __aenter__(self) -> Stack:
        try:
            await self._start()
        except BaseException:  # a process that never came up: none outlives the bench
            with trio.CancelScope(shield=True):
                await self.__aexit__()
            raise
        return self

    async def _start(self) -> None:
        log = self._log_file("replay.log")
        self.processes.append(subprocess.Popen(  # noqa: ASYNC220 - started, not awaited
            [self.exe, "replay-server", "--listen", f"127.0.0.1:{self.vllm_port}",
             "--speed", str(self.speed)], stdout=log, stderr=log))
        await self._wait(f"{self.vllm_url}/health")
        self.processes.append(subprocess.Popen(  # noqa: ASYNC220 - started, not awaited
            [self.exe, "bench", "relay", "--listen", f"127.0.0.1:{self.relay_port}",
             "--target", f"127.0.0.1:{self.vllm_port}"], stdout=log, stderr=log))
        await self._wait(f"{self.relay_url}/health")
        start = time.perf_counter()
        log = self._log_file("gateway.log")
        self.processes.append(subprocess.Popen(  # noqa: ASYNC220 - started, not awaited
            [self.exe, "serve", "--listen", self.endpoint, "--vllm-url", self.vllm_url,
             "--admin-listen", f"127.0.0.1:{self.admin_port}", "--log-level", "warning",
             *self.gateway_args], stdout=log, stderr=log,
            env={**os.environ, **self.env} if self.env else None))
        await self._wait(f"{self.admin_url}/readyz")
        self.startup_seconds = time.perf_counter() - start

    async def _wait(self, url: str) -> None:
        async with httpx.AsyncClient(trust_env=False) as client:
            with trio.fail_after(30):
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(url, timeout=1)).status_code == 200:
                            return
                    await trio.sleep(0.02)

    async def __aexit__(self, *exc: object) -> None:
        for process in reversed(self.processes):
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                await trio.to_thread.run_sync(process.wait, 10)
            except subprocess.TimeoutExpired:
                process.kill()
        for log_file in self._logs:
            log_file.close()

    async def residence(self) -> dict[str, Any]:
        """The gateway's residence figures since the last call (``gateway.residence``)."""
        async with httpx.AsyncClient(trust_env=False) as client:
            document: dict[str, Any] = (
                await client.get(f"{self.admin_url}/debug/residence")).json()
            return document

    async def backend_log(self) -> dict[str, Any]:
        async with httpx.AsyncClient(trust_env=False) as client:
            document: dict[str, Any] = (await client.get(f"{self.vllm_url}/__replay/log")).json()
            return document


def envelope(request_id: str, *, stream: bool = True, max_tokens: int | None = None,
              model: str = "example-model") -> bytes:
    body: dict[str, Any] = {"model": model, "stream": stream,
                            "messages": [{"role": "user", "content": "benchmark"}]}
    if max_tokens:
        body["max_tokens"] = max_tokens
    return json.dumps({"schema_version": "openai-compatible/1",
                       "operation": "chat.completions.create", "request_id": request_id,
                       "body": body}).encode()


def chat_body(request_id: str, stream: bool = True) -> dict[str, Any]:
    return json.loads(envelope(request_id, stream=stream))["body"]  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def open_sessions(endpoint: str, count: int, *, connections: int | None = None
                    ) -> AsyncIterator[list[ClientSession]]:
    """``count`` sessions spread over ``connections`` connections (default: up to 16, as
    the gateway's default per-connection session limit needs)."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(connect(endpoint))
                   for _ in range(connections or min(16, count))]
        sessions = [await clients[i % len(clients)].open_session() for i in range(count)]
        yield sessions


async def fan_out(count: int, job: Callable[[int], Any]) -> None:
    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(job, index)
