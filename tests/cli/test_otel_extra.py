"""The gateway without the ``otel`` extra (issue 24): it starts, never imports
OpenTelemetry unless tracing is asked for, and when it is, says how to enable it in one
``error:`` line, exit 2 (cli/_app.py's rules), in a checkout as from a wheel. With it,
``OTEL_TRACES_EXPORTER`` is otlp, console or none, anything else one line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
ROOT = Path(__file__).parents[2]
#: The install commands that work: a checkout's (its .venv has uv, no pip; the project is
#: on no package index) and a wheel's.
CHECKOUT = ".venv/bin/uv pip install -e '.[otel]'"
WHEEL = "pip install 'nnrp-vllm-gateway[otel]'"
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
    for command in ("make otel", CHECKOUT, WHEEL):
        assert command in line, line
    assert line.endswith(", --otel-traces")


def test_the_docs_and_the_makefile_say_the_same_install_commands() -> None:
    doc = (ROOT / "docs" / "observability.md").read_text()
    (traces,) = re.findall(r"^## Traces\n(.*?)^#", doc, re.M | re.S)
    for command in ("make otel", CHECKOUT, WHEEL):
        assert command in traces, command
    makefile = (ROOT / "Makefile").read_text()
    (recipe,) = re.findall(r"^otel:.*\n\t(.*)$", makefile, re.M)
    assert recipe == "$(call install,-e '.[otel]')"


@pytest.mark.parametrize("value", ["zipkin", "otlp,console", "jaeger"])
def test_an_exporter_the_gateway_does_not_have_is_one_line(value: str) -> None:
    result = runner.invoke(app, ["serve", "--otel-traces", "--print-config"],
                           env={"OTEL_TRACES_EXPORTER": value, "NNRP_GATEWAY_DEBUG": None})
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: OTEL_TRACES_EXPORTER={value!r}: the gateway exports "
                           "spans with one of otlp (the default), console"), line
    assert line.endswith(", --otel-traces")


@pytest.mark.parametrize("value", ["otlp", "console", "none", "Console", ""])
def test_the_exporters_the_gateway_has_are_accepted(value: str) -> None:
    result = runner.invoke(app, ["serve", "--otel-traces", "--print-config"],
                           env={"OTEL_TRACES_EXPORTER": value})
    assert (result.exit_code, result.stderr) == (0, ""), result.output


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
