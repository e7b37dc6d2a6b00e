"""``/metrics/vllm`` (issue 24): vLLM's own /metrics passed through the admin listener, for
a Prometheus that cannot reach vLLM on the pod's loopback; a real gateway against the
replay vLLM (which serves the /metrics text recorded from a busy vLLM), and its failures
as 502 and 504 with a line that says so."""

from __future__ import annotations

import attrs
import httpx
import pytest
import trio

from gateway.app import VLLM_METRICS_TIMEOUT, Gateway, GatewayConfig
from gateway.tools.replay import ReplayServer
from gateway.upstream import UpstreamConfig, UpstreamError, VllmClient


@attrs.frozen
class Stack:
    replay: ReplayServer
    admin: str  # the gateway's admin URL
    #: Cancelling it is vLLM gone; ``replay_gone`` is set once its listener has closed.
    replay_scope: trio.CancelScope
    replay_gone: trio.Event


async def start(nursery: trio.Nursery, *, metrics: bool = True) -> Stack:
    """The replay vLLM (in a scope of its own) and a gateway on it."""
    replay, replay_scope, replay_gone = ReplayServer(speed=50.0), trio.CancelScope(), trio.Event()

    async def run_replay(*, task_status: trio.TaskStatus[str]) -> None:
        try:
            with replay_scope:
                await replay.serve(task_status=task_status)
        finally:
            replay_gone.set()

    url = await nursery.start(run_replay)
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",), vllm_url=url,
                                    admin_listen="127.0.0.1:0", metrics=metrics))
    await nursery.start(gateway.run)
    with trio.fail_after(10):
        await gateway.probed.wait()
    return Stack(replay, f"http://127.0.0.1:{gateway.admin.port}", replay_scope, replay_gone)


async def test_vllm_metrics_are_passed_through(nursery: trio.Nursery) -> None:
    stack = await start(nursery)
    replay, admin = stack.replay, stack.admin
    async with httpx.AsyncClient(trust_env=False) as http:
        direct = (await http.get(f"{replay.url}/metrics")).content
        passed = await http.get(f"{admin}/metrics/vllm")
        own = (await http.get(f"{admin}/metrics")).text
    assert passed.status_code == 200
    assert passed.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert passed.content == direct  # vLLM's bytes, untouched
    assert b"vllm:time_to_first_token_seconds_bucket" in passed.content
    assert "vllm:" not in own  # the gateway's own /metrics stays its own


async def test_a_failing_vllm_is_502_and_a_silent_one_504(nursery: trio.Nursery) -> None:
    stack = await start(nursery)
    replay, admin = stack.replay, stack.admin
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        replay.metrics_status = 500
        failed = await http.get(f"{admin}/metrics/vllm")
        assert failed.status_code == 502
        assert failed.json()["error"].startswith(f"vLLM's /metrics ({replay.url}) failed:")
        assert "500" in failed.json()["error"]
        replay.metrics_status, replay.metrics_silent = 200, True
        started = trio.current_time()
        silent = await http.get(f"{admin}/metrics/vllm")
        assert silent.status_code == 504
        assert "did not answer" in silent.json()["error"]
        # Bounded by the gateway's timeout, with room for a busy host (unbounded, the
        # admin listener's 10 s cap would end it without this answer).
        assert trio.current_time() - started < VLLM_METRICS_TIMEOUT + 10
        # The admin listener goes on serving.
        assert (await http.get(f"{admin}/healthz")).status_code == 200


async def test_vllm_gone_is_502(nursery: trio.Nursery) -> None:
    stack = await start(nursery)
    stack.replay_scope.cancel()
    with trio.fail_after(10):
        await stack.replay_gone.wait()
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        answer = await http.get(f"{stack.admin}/metrics/vllm")
    assert answer.status_code == 502
    assert answer.json()["error"].startswith(
        f"vLLM's /metrics ({stack.replay.url}) failed:")


async def test_off_without_metrics(nursery: trio.Nursery) -> None:
    admin = (await start(nursery, metrics=False)).admin
    async with httpx.AsyncClient(trust_env=False) as http:
        assert (await http.get(f"{admin}/metrics/vllm")).status_code == 404


async def test_the_body_is_bounded(nursery: trio.Nursery) -> None:
    replay = ReplayServer(speed=50.0)
    url = await nursery.start(replay.serve)
    client = VllmClient(UpstreamConfig(url))
    try:
        assert len(await client.get_bounded("/metrics", max_bytes=1 << 20)) > 1000
        with pytest.raises(UpstreamError, match="more than 1000 bytes"):
            await client.get_bounded("/metrics", max_bytes=1000)
        # The load scrape's text read keeps the same bound (it reads through it).
        assert "vllm:" in await client.get_text("/metrics", max_bytes=1 << 20)
        with pytest.raises(UpstreamError, match="more than 1000 bytes"):
            await client.get_text("/metrics", max_bytes=1000)
    finally:
        await client.aclose()
