"""The typer CLI, through CliRunner, with real servers behind it where a command needs one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from typer.testing import CliRunner

from cli.main import app
from gateway.tools.replay import load_transcript
from tests.support.cli import served_config
from tests.support.processes import ReplayThread, free_port

runner = CliRunner()


@pytest.fixture
def replay() -> Iterator[ReplayThread]:
    with ReplayThread(speed=50.0) as thread:
        yield thread


def test_version() -> None:
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0
    assert "nnrp-vllm-gateway 0.1.0" in result.output
    assert "vllm>=0.18.0,<0.27 or >=0.32,<0.34" in result.output


def test_light_commands_do_not_load_the_gateway() -> None:
    # `health` runs every few seconds in a container; importing the CLI must not pull in
    # trio, httpx, structlog or the gateway's modules (1.0 s of imports before, 0.2 s now).
    code = ("import sys, cli.main; print(sorted(m for m in sys.modules if m in "
            "('trio', 'httpx', 'structlog', 'attrs', 'gateway.app', 'gateway.nnrp', "
            "'gateway.tools.bench.scenarios', 'gateway.tools.conformance')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"


def test_demo_streams_one_answer() -> None:
    result = runner.invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    assert "The quick brown fox" in result.output
    assert "[response.completed, status 200" in result.output


# What the test extra installs that a plain install does not (pyproject.toml).
TEST_ONLY_MODULES = ("nnrp", "respx", "hypothesis", "pytest", "_pytest", "pytest_trio",
                     "helm_python", "kubernetes_validate", "yamllint", "mypy", "build",
                     "matplotlib")


def test_demo_runs_without_the_test_extra() -> None:
    """`make demo` installs only the runtime dependencies: the demo must not import
    anything from the test extra. Each test-only module is made unimportable, as it is in a
    runtime-only venv (an optional import that copes with its absence is fine)."""
    code = f"""
import sys
from importlib.abc import MetaPathFinder

class TestExtraAbsent(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {TEST_ONLY_MODULES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

for name in [m for m in sys.modules if m.partition(".")[0] in {TEST_ONLY_MODULES!r}]:
    del sys.modules[name]
sys.meta_path.insert(0, TestExtraAbsent())
sys.argv = ["nnrp-gateway", "demo"]
from cli.main import main
main()
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[response.completed, status 200" in result.stdout


def test_capabilities_json(replay: ReplayThread) -> None:
    result = runner.invoke(app, ["capabilities", "--vllm-url", replay.url, "--json",
                                 "--tool-calls"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["operations"][0]["tool_calls"] is True
    assert document["backend"] == {"name": "vllm", "version": "0.26.0", "binding": "0.26.x",
                                   "evidence": "gpu_smoke"}


def test_capabilities_prints_nothing_on_stdout_when_it_fails() -> None:
    # Issue 37: it printed a document (without vLLM's models) before its error line, so
    # `capabilities > caps.json` left a file that looked like an answer.
    result = runner.invoke(app, ["capabilities", "--vllm-url",
                                 f"http://127.0.0.1:{free_port()}"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: vLLM probe failed")


@pytest.mark.parametrize("argv", [["chat", "hi"],
                                  ["conformance", "plan", "--out", "{tmp}/p.json"]],
                         ids=["chat", "conformance-plan"])
def test_a_tool_dialling_vllms_http_port_says_so_at_once(replay: ReplayThread,
                                                         tmp_path: Path,
                                                         argv: list[str]) -> None:
    """Issue 37: `chat` at vLLM's own port waited 11 s (its reconnect window) before
    "no NNRP session". vLLM (uvicorn) answers the hello's bytes with 400 at once, as the
    replay vLLM now does too; the answer is named as soon as it comes."""
    endpoint = "tcp://" + replay.url.removeprefix("http://")
    started = time.monotonic()
    result = runner.invoke(app, [*(arg.format(tmp=tmp_path) for arg in argv),
                                 "--endpoint", endpoint])
    assert time.monotonic() - started < 7  # at once: not after the 11 s reconnect window
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "error: that is an HTTP server (vLLM's own port?), not NNRP: it answered "
        f"'HTTP/1.1 400 Bad Request', {endpoint}"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_replay_server_stops_on_a_signal_with_a_line_and_status_0(
        signum: signal.Signals) -> None:
    """Issue 37: SIGTERM killed it (status 143, no word), and as a container's PID 1,
    which has no default action for SIGTERM, it would not have stopped at all."""
    exe = str(Path(sys.executable).parent / "nnrp-gateway")
    process = subprocess.Popen([exe, "replay-server", "--listen", "127.0.0.1:0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert json.loads(process.stdout.readline())["event"] == "replay vLLM listening"
        process.send_signal(signum)
        rest, stderr = process.communicate(timeout=10)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    (stopping,) = [json.loads(line) for line in rest.splitlines()]
    assert (stopping["event"], stopping["signal"]) == ("replay vLLM stopping", signum.name)


def test_serve_refuses_an_untested_vllm() -> None:
    with ReplayThread(version="0.20.1") as old:
        result = runner.invoke(app, ["serve", "--listen", "tcp://127.0.0.1:0",
                                     "--vllm-url", old.url])
    assert result.exit_code == 3
    assert "vLLM 0.20.1 is not a tested version" in result.output
    assert "0.26.0" in result.output


def test_serve_reports_a_bad_listener() -> None:
    result = runner.invoke(app, ["serve", "--listen", "ftp://x:1", "--vllm-url",
                                 "http://127.0.0.1:9"])
    assert result.exit_code != 0
    assert "tcp://, unix:// or ws://" in str(result.exception) + result.output


def test_record_writes_transcripts(replay: ReplayThread, tmp_path: Path) -> None:
    result = runner.invoke(app, ["record", "--vllm-url", replay.url, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    usage = load_transcript(tmp_path / "stream_usage.jsonl")
    assert usage.status == 200
    assert usage.body.endswith(b"data: [DONE]\n\n")
    assert load_transcript(tmp_path / "error_404_model.jsonl").status == 404
    assert load_transcript(tmp_path / "error_400_stream_options_without_stream.jsonl").status == 400


def test_record_forced_writes_032_recordings_naming_their_version(
        replay: ReplayThread, tmp_path: Path) -> None:
    result = runner.invoke(app, ["record", "--vllm-url", replay.url, "--out", str(tmp_path),
                                 "--forced", "reasoning"])
    assert result.exit_code == 0, result.output
    written = sorted(path.name for path in tmp_path.iterdir())
    assert written == sorted(f"{name}_032.jsonl" for name in (
        "stream_reasoning", "nonstream_reasoning", "stream_reasoning_hidden",
        "stream_reasoning_then_tool_call"))
    transcript = load_transcript(tmp_path / "stream_reasoning_032.jsonl")
    assert transcript.scenario == "stream_reasoning_032"
    assert transcript.note.startswith(f"recorded from vLLM {transcript.vllm_version}: "
                                      "--reasoning-parser deepseek_r1")
    assert transcript.request_body["logit_bias"] == {"7": 3.0}


def test_serve_takes_the_load_and_refusal_options_from_flags_and_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23's options: flags and NNRP_GATEWAY_* variables reach GatewayConfig."""
    config = served_config(monkeypatch, [
        "--load-aware-admission", "--load-max-waiting", "8", "--load-interval", "0.5",
        "--load-refuse-sessions", "--overload-retry-after-ms", "2500"],
        env={"NNRP_GATEWAY_LOAD_MAX_KV_CACHE_USAGE": "0.9", "NNRP_GATEWAY_LOAD_SOURCE": "load",
             "NNRP_GATEWAY_LOAD_RETRY_AFTER_MS": "400"})
    assert attrs.asdict(config.load) == {
        "admission": True, "source": "load", "interval": 0.5, "max_waiting": 8.0,
        "max_kv_cache_usage": 0.9, "stale_after": 0.0, "retry_after_ms": 400,
        "max_retry_after_ms": 30000, "refuse_sessions": True}
    assert config.pipeline.overload_retry_after_ms == 2500
    bad = runner.invoke(app, ["serve", "--print-config", "--load-source", "router"])
    assert bad.exit_code == 2 and "--load-source" in bad.output
    out_of_range = runner.invoke(app, ["serve", "--print-config",
                                       "--load-max-kv-cache-usage", "1.5"])
    assert out_of_range.exit_code == 2


def test_the_vllm_session_header_is_on_unless_a_flag_or_the_environment_says_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert served_config(monkeypatch, []).pipeline.session_header is True
    assert served_config(monkeypatch, ["--no-vllm-session-header"]
                         ).pipeline.session_header is False
    assert served_config(monkeypatch, [], env={"NNRP_GATEWAY_VLLM_SESSION_HEADER": "false"}
                         ).pipeline.session_header is False
    assert served_config(monkeypatch, ["--vllm-session-header"], env={
        "NNRP_GATEWAY_VLLM_SESSION_HEADER": "false"}).pipeline.session_header is True


def test_the_default_close_grace_fits_a_short_drain_and_a_tls_listener_takes_the_cert(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The checks of issue 37 refuse what was given and cannot be had, nothing else: a
    short --drain-timeout under the default 5 s grace (cut to fit, as it always was), a
    grace as long as the drain, a certificate with a TLS listener."""
    from tests.support.quic import make_pki

    assert served_config(monkeypatch, ["--drain-timeout", "1"]).drain_close_grace == 5.0
    assert served_config(monkeypatch, ["--drain-timeout", "2", "--drain-close-grace", "2"]
                         ).drain_close_grace == 2.0
    pki = make_pki(tmp_path)
    config = served_config(monkeypatch, ["--listen", "tcps://127.0.0.1:0", "--tls-cert",
                                         str(pki.cert), "--tls-key", str(pki.key)])
    assert config.tls is not None
    refused = runner.invoke(app, ["serve", "--print-config", "--drain-timeout", "3"],
                            env={"NNRP_GATEWAY_DRAIN_CLOSE_GRACE": "4"})
    assert refused.exit_code == 2
    assert refused.stderr.endswith(", environment variable NNRP_GATEWAY_DRAIN_CLOSE_GRACE\n")


def _environment_footer(argv: list[str]) -> str:
    text = " ".join(runner.invoke(app, [*argv, "--help"]).stdout.split())
    return text[text.index("can also be set in the environment"):]


def test_the_help_footer_gives_an_example_that_follows_the_naming_rule() -> None:
    """Issue 26 review: `conformance run --help`, whose one environment variable is named
    against the rule, read "(--auth-token: NNRP_GATEWAY_CLIENT_AUTH_TOKEN), except
    --auth-token: NNRP_GATEWAY_CLIENT_AUTH_TOKEN"."""
    assert _environment_footer(["conformance", "run"]) == (
        "can also be set in the environment: --auth-token: NNRP_GATEWAY_CLIENT_AUTH_TOKEN. "
        "A flag on the command line wins over the environment.")
    assert _environment_footer(["chat"]) == (
        "can also be set in the environment: NNRP_GATEWAY_ and the option's name in "
        "capitals, dashes as underscores (--endpoint: NNRP_GATEWAY_ENDPOINT), except "
        "--auth-token: NNRP_GATEWAY_CLIENT_AUTH_TOKEN. A flag on the command line wins "
        "over the environment.")


def test_settle_startup_heap_puts_what_starting_left_out_of_the_collectors_reach() -> None:
    """``settle_startup_heap`` (which ``serve`` and each worker call once serving, in a
    process of their own; here a child, not this test process): what starting left
    alive is frozen, so the collector's full collections no longer walk it. (That serve
    calls it is read in cli/main.py and gateway/workers/_worker.py, not tested.)"""
    script = ("import gc, gateway.app; before = gc.get_freeze_count(); "
              "gateway.app.settle_startup_heap(); print(before, gc.get_freeze_count(), "
              "len(gc.get_objects()))")
    before, frozen, left = map(int, subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True,
        timeout=60).stdout.split())
    assert before == 0 and frozen > 20_000 and left < 1_000, (before, frozen, left)
