"""The gateway without the ``otel`` extra (issue 24): it starts, never imports
OpenTelemetry unless tracing is asked for, and when it is, says how to enable it in one
``error:`` line, exit 2 (cli/_app.py's rules)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
#: What the extra brings that tracing imports; None in sys.modules makes an import fail
#: as it does where the package is not installed.
OTEL_MODULES = ("opentelemetry", "opentelemetry.sdk", "opentelemetry.exporter",
                "opentelemetry.exporter.otlp", "opentelemetry.exporter.otlp.proto.http")


@pytest.fixture
def without_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_MODULES:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.usefixtures("without_the_extra")
def test_asking_for_traces_without_the_extra_says_how_to_install_it() -> None:
    result = runner.invoke(app, ["serve", "--otel-traces", "--print-config"],
                           env={"NNRP_GATEWAY_DEBUG": None})
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: --otel-traces needs OpenTelemetry"), line
    assert "pip install 'nnrp-vllm-gateway[otel]'" in line
    assert line.endswith(", --otel-traces")


@pytest.mark.usefixtures("without_the_extra")
def test_without_traces_the_extra_is_not_needed() -> None:
    result = runner.invoke(app, ["serve", "--print-config"])
    assert result.exit_code == 0, result.stderr
    assert "otel_traces = false" in result.stdout


def test_serving_imports_no_opentelemetry_unless_traces_are_on() -> None:
    code = ("import sys, cli.main, gateway.app, gateway.observe, gateway.workers\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
            "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
