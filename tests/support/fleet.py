"""A fleet of gateways on loopback, as the fleet tests run it: each "pod" a gateway with
its own replay vLLM and its own ``--fleet-advertise`` address, one key file for all, and
Debian's HAProxy in front as the Kubernetes Service would be (round robin, TCP mode)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio

from gateway.app import FleetConfig, Gateway, GatewayConfig
from gateway.tools.replay import ReplayServer
from tests.support.processes import free_port

if TYPE_CHECKING:
    from gateway.nnrp import ForwardOutcome
    from gateway.server import SessionRegistry

KEY = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"


@attrs.define
class Pod:
    gateway: Gateway
    replay: ReplayServer
    advertise: str

    @property
    def registry(self) -> SessionRegistry:
        registry = self.gateway.server.registry
        assert registry is not None
        return registry

    def uri(self, scheme: str) -> str:
        return next(e.uri for e in self.gateway.endpoints if e.uri.startswith(f"{scheme}://"))

    def forwards(self, outcome: ForwardOutcome) -> int:
        return self.registry.stats.fleet_forwards.get(outcome.value, 0)

    @property
    def posts(self) -> int:
        """Chat requests this pod's vLLM was sent."""
        return len([r for r in self.replay.requests if r.method == "POST"])


def key_file(directory: Path, key: bytes = KEY) -> Path:
    path = directory / "fleet.key"
    path.write_bytes(key + b"\n")
    path.chmod(0o600)
    return path


async def start_fleet(nursery: trio.Nursery, directory: Path, pods: int = 3, *,
                      key: Path | None = None, listen: tuple[str, ...] = (
                          "tcp://127.0.0.1:0", "ws://127.0.0.1:0/nnrp"),
                      **config: Any) -> list[Pod]:
    """``pods`` gateways of one fleet, each serving ``listen`` against its own replay."""
    key = key or key_file(directory)
    started = []
    for _ in range(pods):
        replay = ReplayServer(speed=1.0, token_interval_ms=5.0)
        url = await nursery.start(replay.serve)
        advertise = f"127.0.0.1:{free_port()}"
        gateway = Gateway(GatewayConfig(
            listen=listen, vllm_url=url, fleet=FleetConfig(advertise, key),
            **{"probe_interval": 0.05, "health_interval": 0.2, **config}))
        await nursery.start(gateway.run)
        with trio.fail_after(5):
            await gateway.probed.wait()
        started.append(Pod(gateway, replay, advertise))
    return started


def haproxy_binary() -> str:
    """Debian's haproxy (``make`` puts one in .venv/bin); the test skips without one,
    unless NNRP_REQUIRE_HAPROXY=1 (CI) makes that a failure."""
    venv = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "haproxy"
    found = str(venv) if venv.exists() else shutil.which("haproxy")
    if found is None:
        if os.environ.get("NNRP_REQUIRE_HAPROXY") == "1":
            pytest.fail("haproxy is required (NNRP_REQUIRE_HAPROXY=1): `make .venv/bin/haproxy`")
        pytest.skip("haproxy is not installed (`make .venv/bin/haproxy` unpacks Debian's)")
    return found


@asynccontextmanager
async def haproxy(directory: Path, backends: list[str]) -> AsyncIterator[str]:
    """HAProxy in TCP mode, round robin over ``backends`` (HOST:PORT each), as a
    Kubernetes Service spreads connections over pods; yields its HOST:PORT."""
    binary = haproxy_binary()
    port = free_port()
    servers = "\n".join(f"  server pod{i} {backend}" for i, backend in enumerate(backends))
    config = directory / "haproxy.cfg"
    config.write_text(f"""global
  maxconn 256
defaults
  mode tcp
  timeout connect 2s
  timeout client 120s
  timeout server 120s
frontend nnrp
  bind 127.0.0.1:{port}
  default_backend pods
backend pods
  balance roundrobin
{servers}
""")
    log = directory / "haproxy.log"
    with log.open("wb") as output:
        process = await trio.lowlevel.open_process([binary, "-db", "-f", str(config)],
                                                   stdout=output, stderr=subprocess.STDOUT)
    try:
        with trio.fail_after(10):
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"haproxy exited {process.returncode}: "
                                       f"{log.read_text()}")
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                except OSError:
                    await trio.sleep(0.02)
                    continue
                await stream.aclose()
                break
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        with trio.CancelScope(shield=True):
            with trio.move_on_after(5):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
