"""Helpers for tests that start real processes or threads: free ports, readiness, a replay
vLLM in its own thread (CliRunner commands call ``trio.run`` themselves)."""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import TypeVar

import httpx
import trio

from gateway.tools.replay import ReplayServer
from tests.support.waits import wait_for

T = TypeVar("T")


def stop_gateway(process: subprocess.Popen[str] | subprocess.Popen[bytes],
                 timeout: float = 20.0) -> None:
    """SIGTERM (the gateway drains and exits); killed if it has not exited in ``timeout``."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def free_port() -> int:
    """A loopback TCP port that is free now (for processes started with it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def served_endpoints(log_text: str) -> list[str]:
    """The endpoints a ``serve`` process announced in its log (JSON lines: the event
    "serving NNRP", once all listeners, of every worker, serve)."""
    endpoints = []
    for line in log_text.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("event") == "serving NNRP":
                endpoints.append(record["endpoint"])
    return endpoints


def wait_ready(admin_url: str, seconds: float = 20.0) -> None:
    """Poll a gateway process's /readyz until it answers 200; AssertionError after
    ``seconds``."""

    def ready() -> bool:
        try:
            return httpx.get(f"{admin_url}/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, seconds, what=f"{admin_url}/readyz")


class ReplayThread:
    """A replay vLLM in its own thread and trio loop (CliRunner commands call trio.run)."""

    def __init__(self, **kwargs: object) -> None:
        self.server = ReplayServer(**kwargs)  # type: ignore[arg-type]
        self.url = ""
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        self._stop = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self.url = await nursery.start(self.server.serve)
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def call(self, function: Callable[..., T], *args: object, **kwargs: object) -> T:
        """``function(*args, **kwargs)`` in the replay's own thread (where its trio objects
        live: ``server.hold(...)``, ``hold.release()``); from any other thread."""
        assert self._token is not None
        return trio.from_thread.run_sync(functools.partial(function, *args, **kwargs),
                                         trio_token=self._token)

    def __enter__(self) -> ReplayThread:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None and self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(10)
