"""Operations: admin endpoints, metrics, logs, configuration, health/check/chat, drain."""

from __future__ import annotations

import functools
import json
import logging
import re
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
import trio
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from cli.main import app
from gateway.app import Gateway, GatewayConfig
from gateway.observe import ObservationRecord
from gateway.tools.client import ClientError, connect
from gateway.tools.replay import ReplayServer
from tests.support.processes import ReplayThread, free_port, wait_ready
from tests.support.stack import chat, envelope, run_operation, stream_through_signal
from tests.support.waits import until, until_async, wait_for

runner = CliRunner()


async def start(nursery: trio.Nursery, **config: Any) -> tuple[Gateway, ReplayServer, str]:
    replay = ReplayServer(speed=50.0)
    url = await nursery.start(replay.serve)
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",), vllm_url=url,
                                    admin_listen="127.0.0.1:0", probe_interval=0.05,
                                    health_interval=0.1, **config))
    await nursery.start(gateway.run)
    return gateway, replay, f"http://127.0.0.1:{gateway.admin.port}"


async def start_with_silent_health(nursery: trio.Nursery
                                   ) -> tuple[Gateway, ReplayServer, str]:
    """A ready gateway whose vLLM then stops answering /health (checks time out in 0.2 s)."""
    gateway, replay, admin = await start(nursery)
    with trio.fail_after(5):
        await gateway.probed.wait()
    gateway.client._probe_client.timeout = httpx.Timeout(0.2)
    replay.health_silent = True
    return gateway, replay, admin


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False) as client:
        return await client.get(url)


async def readyz_is(admin: str, status: int) -> bool:
    return (await get(f"{admin}/readyz")).status_code == status


async def scrape(admin: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample /metrics exports, by (name, sorted labels)."""
    text = (await get(f"{admin}/metrics")).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_unanswered_health_checks_mark_down_only_after_the_threshold(
        nursery: trio.Nursery) -> None:
    # A vLLM too busy to answer /health is not dead: one silent check must not fail every
    # new request (found by the 1,000-stream soak); three in a row do.
    gateway, replay, admin = await start_with_silent_health(nursery)
    silent_since = trio.current_time()
    with trio.fail_after(10):
        await until(lambda: not gateway.upstream_healthy)
    # Three silent checks (0.2 s each, 0.1 s apart), not one: one would take 0.3 s at
    # most (less the part of a check already under way when vLLM fell silent).
    assert trio.current_time() - silent_since >= 0.5
    replay.health_silent = False
    with trio.fail_after(10):
        await until_async(lambda: readyz_is(admin, 200))


async def test_a_vllm_busy_streaming_is_alive_though_health_is_silent(
        nursery: trio.Nursery) -> None:
    # Under load vLLM's API server may answer /health late; bytes arriving on a response
    # stream while a check waits show it alive, so only checks with nothing flowing count.
    gateway, _, _ = await start_with_silent_health(nursery)
    async with connect(gateway.endpoints[0].uri) as client:
        session = await client.open_session()
        # 30 tokens 100 ms apart (5 s at the backend's speed 50): about ten silent checks.
        request = envelope(chat(stream=True), request_id="replay:timestamped:30:5000000:busy")
        outcome = await run_operation(session, request)
        assert outcome.final["type"] == "response.completed"
        assert gateway.upstream_healthy
        # Nothing flowing now: three silent checks in a row mark vLLM down.
        with trio.fail_after(5):
            await until(lambda: not gateway.upstream_healthy)


async def test_health_readiness_and_drain(nursery: trio.Nursery) -> None:
    gateway, replay, admin = await start(nursery)
    assert (await get(f"{admin}/healthz")).status_code == 200
    with trio.fail_after(5):
        await gateway.probed.wait()
    ready = await get(f"{admin}/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ready": True, "reasons": []}
    assert (await get(f"{admin}/metrics")).status_code == 404  # metrics are opt-in
    capabilities = (await get(f"{admin}/capabilities")).json()
    assert capabilities["profile"] == "openai-compatible"
    # vLLM goes away: readiness false, liveness unaffected; it comes back: ready again.
    replay.kill_engine()
    with trio.fail_after(5):
        await until_async(lambda: readyz_is(admin, 503))
    # The reason says why (the failed check, or the re-probe after it: either says so).
    (reason,) = (await get(f"{admin}/readyz")).json()["reasons"]
    assert reason.startswith("vLLM health check failed: ") and "unhealthy" in reason, reason
    assert (await get(f"{admin}/healthz")).status_code == 200
    replay.revive()
    with trio.fail_after(5):
        await until_async(lambda: readyz_is(admin, 200))
    await gateway.drain()
    reasons = (await get(f"{admin}/readyz")).json()["reasons"]
    assert "draining" in reasons
    # The container check reads a 503 as an answer: exit 1, and says why.
    result = await trio.to_thread.run_sync(runner.invoke, app,
                                           ["health", "--admin-url", admin, "--ready"])
    assert result.exit_code == 1
    assert result.output.startswith("503 ") and "draining" in result.output


async def test_readiness_says_why_the_probe_failed(nursery: trio.Nursery) -> None:
    # Issue 22: not "not probed yet" while the probe fails: what it failed with.
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",),
                                    vllm_url=f"http://127.0.0.1:{free_port()}",
                                    admin_listen="127.0.0.1:0", probe_interval=0.05))
    await nursery.start(gateway.run)
    admin = f"http://127.0.0.1:{gateway.admin.port}"
    with trio.fail_after(10):
        await until(lambda: gateway.upstream_problem is not None)
    (reason,) = (await get(f"{admin}/readyz")).json()["reasons"]
    assert reason.startswith("vLLM has not answered the probe yet: ")
    assert "ConnectError" in reason, reason


async def test_metrics_after_real_operations(nursery: trio.Nursery) -> None:
    gateway, _, admin = await start(nursery, metrics=True)
    await gateway.probed.wait()
    async with connect(gateway.endpoints[0].uri) as client:
        session = await client.open_session()
        await run_operation(session, envelope(chat(stream=True, max_tokens=3,
                                                   stream_options={"include_usage": True})))
        await run_operation(session, envelope(chat("no-such-model")))
        operation = await session.submit(envelope(chat(stream=True),
                                                  request_id="replay:long_stream:m"))
        async for _first in operation.events():
            await operation.cancel()
            break
        async for _ in operation.events():
            pass
        # The cancelled operation is counted once it has ended on the gateway's side
        # (its upstream abort timed), which may be after its terminal reached us.
        with trio.fail_after(5):
            samples = await scrape(admin)
            while samples.get(("nnrp_gateway_upstream_abort_seconds_count", ())) != 1:
                await trio.sleep(0.05)  # between scrapes: /metrics is polled
                samples = await scrape(admin)
    assert samples[("nnrp_gateway_requests_total",
                    (("model_name", "example-model"), ("outcome", "ok"),
                     ("transport", "tcp")))] == 1
    assert samples[("nnrp_gateway_requests_total",
                    (("model_name", "other"), ("outcome", "upstream_error"),
                     ("transport", "tcp")))] == 1
    assert samples[("nnrp_gateway_requests_total",
                    (("model_name", "example-model"), ("outcome", "cancelled"),
                     ("transport", "tcp")))] == 1
    assert samples[("nnrp_gateway_tokens_total",
                    (("kind", "completion"), ("model_name", "example-model")))] == 3
    assert samples[("nnrp_gateway_cancellations_total", (("kind", "cancel"),))] == 1
    assert samples[("nnrp_gateway_upstream_abort_seconds_count", ())] == 1
    assert samples[("nnrp_gateway_sessions_active", ())] == 1
    assert samples[("nnrp_gateway_upstream_ready", ())] == 1
    assert samples[("nnrp_gateway_ready", ())] == 1
    assert samples[("nnrp_gateway_build_info", (("version", "0.1.0"),))] == 1
    assert samples[("nnrp_gateway_bytes_total", (("direction", "out"),))] > 0
    assert not any(name.startswith(("vllm:", "http_")) for name, _ in samples)
    # Issue 37: prometheus_client's creation time of every counter and histogram series
    # doubled the series; nothing reads them.
    assert [name for name, _ in samples if name.endswith("_created")] == []


async def test_canonical_log_line_and_no_secrets(nursery: trio.Nursery) -> None:
    replay = ReplayServer(speed=50.0, api_key="sk-very-secret")
    url = await nursery.start(replay.serve)
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",), vllm_url=url,
                                    upstream_api_key="sk-very-secret"))
    await nursery.start(gateway.run)
    await gateway.probed.wait()
    with structlog.testing.capture_logs() as logs:
        async with connect(gateway.endpoints[0].uri) as client:
            session = await client.open_session()
            await session.trace_context(trace_id=5, span_id=6, attributes=b"user=alice")
            await run_operation(session, envelope(chat(stream=True, max_tokens=2),
                                                  request_id="log-1"))
            # The line is written once the server side has finished: wait for it.
            with trio.fail_after(5):
                await until(lambda: any(line["event"] == "operation" for line in logs))
    lines = [line for line in logs if line["event"] == "operation"]
    assert len(lines) == 1
    line = lines[0]
    assert line["outcome"] == "ok"
    assert line["request_id"] == "log-1"
    assert line["events"] == 2
    assert line["trace_attribute_bytes"] == len(b"user=alice")
    assert line["trace_id"] == f"{5:032x}"  # OpenTelemetry's format: logs join traces
    dump = json.dumps(logs, default=str)
    assert "sk-very-secret" not in dump
    assert "alice" not in dump


async def test_the_operation_line_follows_the_log_level(
        nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
    """At --log-level warning a completed operation's info line is dropped before its
    record is turned into fields (issue 25: a filtered line costs nothing); a failure's
    warning line is still written, whole."""
    gateway, _replay, _url = await start(nursery)
    await gateway.probed.wait()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    built: list[str] = []
    as_dict = ObservationRecord.as_dict

    def counted(record: ObservationRecord) -> dict[str, Any]:
        built.append(record.outcome)
        return as_dict(record)

    monkeypatch.setattr(ObservationRecord, "as_dict", counted)
    with structlog.testing.capture_logs() as logs:
        async with connect(gateway.endpoints[0].uri) as client:
            session = await client.open_session()
            await run_operation(session, envelope(chat(stream=True, max_tokens=2),
                                                  request_id="quiet-1"))
            await run_operation(session, envelope(chat(stream=True),
                                                  request_id="replay:error_503_retryable"))
            # An operation is observed in the same step that takes it out of the count.
            with trio.fail_after(5):
                await until(lambda: gateway.server.stats.inflight == 0)
    lines = [line for line in logs if line["event"] == "operation"]
    assert [(line["request_id"], line["log_level"]) for line in lines] == [
        ("replay:error_503_retryable", "warning")]
    assert lines[0]["outcome"] == "upstream_error"
    assert built == ["upstream_error"]


def test_config_precedence_and_masking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('vllm_url = "http://file:1"\nmax_connections = 7\n'
                      '[serve]\nidle_timeout = 11.0\nupstream_api_key = "from-file"\n')
    result = runner.invoke(app, ["serve", "--config", str(config), "--print-config"])
    assert result.exit_code == 0, result.output
    effective = tomllib.loads(result.stdout)
    assert effective["vllm_url"] == "http://file:1"
    assert effective["max_connections"] == 7
    assert effective["idle_timeout"] == 11.0
    assert "upstream_api_key" not in effective  # a secret: said to be set, never printed
    assert "# upstream_api_key: set (not printed)" in result.stdout
    assert "from-file" not in result.output
    monkeypatch.setenv("NNRP_GATEWAY_VLLM_URL", "http://env:2")
    monkeypatch.setenv("NNRP_GATEWAY_MAX_CONNECTIONS", "8")
    monkeypatch.setenv("NNRP_GATEWAY_HEALTH_FAILURE_THRESHOLD", "5")
    effective = tomllib.loads(runner.invoke(app, ["serve", "--config", str(config),
                                                  "--print-config"]).stdout)
    assert (effective["vllm_url"], effective["max_connections"]) == ("http://env:2", 8)
    assert effective["health_failure_threshold"] == 5
    effective = tomllib.loads(runner.invoke(app, ["serve", "--config", str(config),
                                                  "--vllm-url", "http://flag:3",
                                                  "--print-config"]).stdout)
    assert effective["vllm_url"] == "http://flag:3"


def test_bad_flags_are_one_line_errors() -> None:
    result = runner.invoke(app, ["serve", "--max-connections", "0"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["serve", "--listen", "http://x:1"])
    assert result.exit_code == 2
    assert "scheme must be" in result.output
    result = runner.invoke(app, ["serve", "--workers", "0"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    # With workers, the supervisor binds: a TLS listener without a certificate, or a
    # port in use, is the same one-line error as for one process.
    result = runner.invoke(app, ["serve", "--workers", "2", "--listen", "tcps://127.0.0.1:0"])
    assert (result.exit_code, "Traceback" in result.output) == (2, False)
    assert "needs a certificate" in result.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["serve", "--workers", "2", "--listen",
                                     f"tcp://127.0.0.1:{port}"])
    assert (result.exit_code, "Traceback" in result.output) == (2, False)
    assert "cannot listen" in result.output
    # Two listeners on one port clash, as they do for one process (SO_REUSEPORT alone
    # would have put both in one group and split their connections).
    port = free_port()
    result = runner.invoke(app, ["serve", "--workers", "2", "--listen",
                                 f"tcp://127.0.0.1:{port}", "--listen",
                                 f"ws://127.0.0.1:{port}/nnrp"])
    assert (result.exit_code, "Traceback" in result.output) == (2, False)
    assert "cannot listen" in result.output and "in use" in result.output


def test_check_and_health_commands() -> None:
    with ReplayThread(speed=50.0) as replay:
        result = runner.invoke(app, ["check", "--vllm-url", replay.url, "--json"])
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert (report["binding"], report["ready"]) == ("0.26.x", True)
    with ReplayThread(version="0.21.0") as old:
        result = runner.invoke(app, ["check", "--vllm-url", old.url])
        assert result.exit_code == 1
        assert "not a tested version" in result.output
    result = runner.invoke(app, ["check", "--vllm-url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "unreachable" in result.output
    result = runner.invoke(app, ["health", "--admin-url", "http://127.0.0.1:9", "--quiet"])
    assert result.exit_code == 1


@pytest.fixture
def served_stack(tmp_path: Path) -> Any:
    """``serve`` as a real process (signals need a real process), in front of a replay
    vLLM in a thread of this one (so a test can hold its replies)."""
    exe = str(Path(sys.executable).parent / "nnrp-gateway")
    nnrp_port, admin_port = free_port(), free_port()
    with ReplayThread() as replay:
        gateway = subprocess.Popen(
            [exe, "serve", "--listen", f"tcp://127.0.0.1:{nnrp_port}", "--vllm-url",
             replay.url, "--admin-listen", f"127.0.0.1:{admin_port}", "--drain-timeout", "5"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_ready(f"http://127.0.0.1:{admin_port}")
            yield (gateway, f"tcp://127.0.0.1:{nnrp_port}", f"http://127.0.0.1:{admin_port}",
                   replay)
        finally:
            gateway.kill()
            gateway.wait()
            assert gateway.stdout is not None
            gateway.stdout.close()


def test_a_second_signal_during_the_drain_exits_at_once(served_stack: Any) -> None:
    # Issue 22: as uvicorn and vLLM do. The stream is held, so the drain would wait its
    # whole --drain-timeout (5 s); the second signal ends the process now, status 1.
    gateway, endpoint, admin, replay = served_stack
    hold = replay.call(replay.server.hold, lambda request: request.method == "POST",
                       after=8)

    def draining() -> bool:
        return "draining" in httpx.get(f"{admin}/readyz").json()["reasons"]

    async def stream_through_two_signals() -> tuple[int, list[BaseException]]:
        broken: list[BaseException] = []
        async with connect(endpoint) as client, trio.open_nursery() as nursery:

            async def stream() -> None:
                try:
                    await stream_through_signal(client, gateway.pid, signal.SIGTERM)
                except ClientError as exc:  # the connection dies with the process
                    broken.append(exc)

            nursery.start_soon(stream)
            await trio.to_thread.run_sync(functools.partial(wait_for, draining,
                                                            what="the drain"))
            gateway.send_signal(signal.SIGINT)
            # The process exits with the stream still held: it waited for no drain.
            status = await trio.to_thread.run_sync(functools.partial(gateway.wait, 4))
            await trio.to_thread.run_sync(replay.call, hold.release)
        return status, broken

    status, broken = trio.run(stream_through_two_signals)
    assert status == 1
    assert len(broken) == 1
    output = gateway.stdout.read()
    assert "second signal during the drain; exiting now" in output
    assert "error: stopped by a second signal during the drain" in output
    assert "Traceback" not in output


def test_sigterm_drains_in_flight_stream(served_stack: Any) -> None:
    gateway, endpoint, admin, replay = served_stack
    assert runner.invoke(app, ["health", "--admin-url", admin, "--ready"]).exit_code == 0
    # The stream is held mid-way (its role chunk and seven tokens; the signal goes after
    # five events) until the gateway is draining: in flight when the drain begins.
    hold = replay.call(replay.server.hold, lambda request: request.method == "POST",
                       after=8)

    def draining() -> bool:
        reasons = httpx.get(f"{admin}/readyz").json()["reasons"]
        return "draining" in reasons

    async def stream_through_sigterm() -> list[Any]:
        async with connect(endpoint) as client, trio.open_nursery() as nursery:
            events: list[Any] = []

            async def stream() -> None:
                events.extend(await stream_through_signal(client, gateway.pid,
                                                          signal.SIGTERM))

            nursery.start_soon(stream)
            await trio.to_thread.run_sync(functools.partial(wait_for, draining,
                                                            what="the drain"))
            await trio.to_thread.run_sync(replay.call, hold.release)
        return events

    events = trio.run(stream_through_sigterm)
    assert type(events[-1]).__name__ == "ResultReceived"  # drained, not dropped
    assert len(events) == 61
    assert gateway.wait(timeout=15) == 0
    records = [json.loads(line) for line in gateway.stdout.read().splitlines()
               if line.startswith("{")]
    (began,) = [r for r in records if r["event"] == "draining"]
    assert began["inflight"] == 1  # the stream was in flight when the drain began
    assert any(r["event"] == "drained" for r in records)


def test_chat_one_shot(served_stack: Any) -> None:
    _, endpoint, _, _ = served_stack
    result = runner.invoke(app, ["chat", "Hello there", "--endpoint", endpoint,
                                 "--max-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert "The quick brown fox" in result.output
    # Issue 37: the usage was a Python dict ({'completion_tokens': 4, ...}).
    assert re.search(r"^\[usage: prompt \d+ tokens, completion 4 tokens, total \d+\]$",
                     result.stdout, re.M), result.stdout


def test_interactive_chat_says_how_to_leave_and_ends_its_line_at_the_end(
        served_stack: Any) -> None:
    """Issue 37: nothing said how to leave, and Ctrl-D left the shell's prompt on the
    line of chat's own ("you> $")."""
    _, endpoint, _, _ = served_stack
    result = runner.invoke(app, ["chat", "--endpoint", endpoint, "--max-tokens", "4"],
                           input="Hello there\n")
    assert result.exit_code == 0, result.output
    assert "Ctrl-D or an empty line leaves" in result.stderr
    assert "The quick brown fox" in result.stdout
    assert result.stdout.endswith("you> \n"), result.stdout


def test_a_config_file_is_checked_key_by_key(tmp_path: Path) -> None:
    # Structured by cattrs against serve's own options: an unknown key or a value of the
    # wrong TOML type is named, never silently ignored.
    config = tmp_path / "gateway.toml"
    config.write_text('max_connections = "7"\nsurprise = 1\n[serve]\ndrain_timeout = 2\n')
    result = runner.invoke(app, ["serve", "--config", str(config), "--print-config"])
    assert result.exit_code == 2
    assert result.stderr == (f"error: expected an integer, got a string, key max_connections "
                             f"in {config}\n")
    config.write_text('surprise = 1\n')
    result = runner.invoke(app, ["serve", "--config", str(config), "--print-config"])
    assert (result.exit_code, result.stderr) == (2, f"error: unknown key 'surprise', {config}\n")
    config.write_text('listen = ["tcp://127.0.0.1:9"]\ndrain_timeout = 2\nmetrics = true\n')
    result = runner.invoke(app, ["serve", "--config", str(config), "--print-config"])
    assert result.exit_code == 0, result.output
    effective = tomllib.loads(result.stdout)
    assert (effective["listen"], effective["drain_timeout"], effective["metrics"]) == (
        ["tcp://127.0.0.1:9"], 2.0, True)


async def test_a_killed_vllm_is_not_ready_at_once_and_back_when_it_answers(
        nursery: trio.Nursery) -> None:
    """Issue 17: a refused port is a vLLM that is not serving (not ready now, not after
    three health intervals); silence alone still counts as busy. The replay vLLM runs as a
    process, killed and started again on the same port."""
    port = free_port()
    command = [sys.executable, "-m", "cli.main", "replay-server", "--listen",
               f"127.0.0.1:{port}", "--speed", "50"]

    async def replay_process(task_status: trio.TaskStatus[trio.Process]) -> None:
        process = await trio.lowlevel.open_process(command, stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL)
        task_status.started(process)
        await process.wait()

    vllm = await nursery.start(replay_process)
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",),
                                    vllm_url=f"http://127.0.0.1:{port}",
                                    admin_listen="127.0.0.1:0", probe_interval=0.05,
                                    health_interval=30.0))  # the periodic check won't help
    await nursery.start(gateway.run)
    admin = f"http://127.0.0.1:{gateway.admin.port}"
    with trio.fail_after(20):
        await gateway.probed.wait()
    assert (await get(f"{admin}/readyz")).status_code == 200
    vllm.kill()
    await vllm.wait()
    async with connect(gateway.endpoints[0].uri) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(chat(stream=True)))
    assert outcome.final["error"]["code"] == "backend_unavailable"
    with trio.fail_after(10):  # not the next 30 s health interval: a third of one
        await until_async(lambda: readyz_is(admin, 503))
    restarted = await nursery.start(replay_process)
    try:
        with trio.fail_after(20):
            await until_async(lambda: readyz_is(admin, 200))
    finally:
        restarted.kill()
        await restarted.wait()


def test_ctrl_c_in_a_one_shot_chat_cancels_and_exits_130(served_stack: Any) -> None:
    # Issue 22: before, it printed "[cancelled]" and exited 0. The CANCEL is real: vLLM's
    # request is aborted (the replay sees its client go mid-reply).
    _, endpoint, _, replay = served_stack
    hold = replay.call(replay.server.hold, lambda request: request.method == "POST", after=3)
    exe = str(Path(sys.executable).parent / "nnrp-gateway")
    chat_process = subprocess.Popen([exe, "chat", "Hello", "--endpoint", endpoint,
                                     "--max-tokens", "60"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: bool(hold.waiting), what="the answer held mid-way")
        chat_process.send_signal(signal.SIGINT)
        _, stderr = chat_process.communicate(timeout=15)
    finally:
        chat_process.kill()
        replay.call(hold.release)
    assert chat_process.returncode == 130, stderr
    assert "[cancelled]" in stderr and "Traceback" not in stderr
    wait_for(lambda: len(replay.server.disconnects) == 1, what="vLLM's request aborted")


def test_chat_and_conformance_present_a_session_token(tmp_path: Path) -> None:
    # Issue 22: against a gateway that requires tokens, the tools now get in.
    exe = str(Path(sys.executable).parent / "nnrp-gateway")
    nnrp_port = free_port()
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    with ReplayThread(speed=50.0) as replay:
        gateway = subprocess.Popen(
            [exe, "serve", "--listen", f"tcp://127.0.0.1:{nnrp_port}", "--vllm-url",
             replay.url, "--auth-token-file", str(token), "--admin-listen",
             f"127.0.0.1:{(admin := free_port())}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(f"http://127.0.0.1:{admin}")
            endpoint = f"tcp://127.0.0.1:{nnrp_port}"
            refused = runner.invoke(app, ["chat", "Hi", "--endpoint", endpoint])
            assert refused.exit_code == 1 and "session refused" in refused.stderr
            chatted = runner.invoke(app, ["chat", "Hi", "--endpoint", endpoint,
                                          "--max-tokens", "4", "--auth-token-file", str(token)])
            assert chatted.exit_code == 0, chatted.stderr
            planned = runner.invoke(app, ["conformance", "plan", "--out",
                                          str(tmp_path / "plan.json"), "--endpoint", endpoint,
                                          "--auth-token", "s3cret-token"])
            assert planned.exit_code == 0, planned.stderr
            assert json.loads((tmp_path / "plan.json").read_text())["cases"]
            probed = runner.invoke(app, ["conformance", "wire-probe", "--out",
                                         str(tmp_path / "wire.json"), "--endpoint", endpoint,
                                         "--auth-token-file", str(token)])
            assert probed.exit_code == 0, probed.stdout + probed.stderr
        finally:
            gateway.terminate()
            gateway.wait(timeout=20)


def test_health_follows_the_admin_listen_variable(served_stack: Any) -> None:
    # The image's HEALTHCHECK runs `nnrp-gateway health` with the container's environment:
    # a moved admin port (NNRP_GATEWAY_ADMIN_LISTEN) is where it looks.
    _, _, admin, _ = served_stack
    port = admin.rsplit(":", 1)[1]
    for listen in (f"127.0.0.1:{port}", f"0.0.0.0:{port}"):
        result = runner.invoke(app, ["health"], env={"NNRP_GATEWAY_ADMIN_LISTEN": listen,
                                                     "NNRP_GATEWAY_ADMIN_URL": None})
        assert result.exit_code == 0, result.stderr
        assert result.stdout.startswith("200 ")
    result = runner.invoke(app, ["health"], env={"NNRP_GATEWAY_ADMIN_LISTEN": None,
                                                 "NNRP_GATEWAY_ADMIN_URL": None})
    assert (result.exit_code, "http://127.0.0.1:9090/healthz" in result.stderr) == (1, True)


def test_metrics_without_an_admin_listener_warns(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).parent / "nnrp-gateway")
    process = subprocess.Popen([exe, "serve", "--listen", "tcp://127.0.0.1:0", "--metrics",
                                "--vllm-url", f"http://127.0.0.1:{free_port()}"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        first = json.loads(process.stdout.readline())
    finally:
        process.terminate()
        process.communicate(timeout=20)
    assert first["level"] == "warning"
    assert first["event"] == ("--metrics has no effect without --admin-listen: no /metrics "
                              "is served")


def test_chat_gives_up_on_a_gateway_that_is_gone(served_stack: Any) -> None:
    # Review of issue 22: chat tried to resume for the gateway's whole two-minute window,
    # silent, after the gateway was killed mid-answer. It gives up after --reconnect-for
    # (10 s unless told; 1 s here).
    gateway, endpoint, _, replay = served_stack
    hold = replay.call(replay.server.hold, lambda request: request.method == "POST", after=3)
    exe = str(Path(sys.executable).parent / "nnrp-gateway")
    chat_process = subprocess.Popen([exe, "chat", "Hello", "--endpoint", endpoint,
                                     "--max-tokens", "60", "--reconnect-for", "1"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: bool(hold.waiting), what="the answer held mid-way")
        gateway.kill()
        _, stderr = chat_process.communicate(timeout=60)  # not 120 s and more
    finally:
        chat_process.kill()
        replay.call(hold.release)
    assert chat_process.returncode == 1, stderr
    (line,) = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert "gave up after 1 s" in line and endpoint in line, line
