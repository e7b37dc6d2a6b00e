"""The metrics reference, docs/metrics.md, generated from the code: every family that
``/metrics`` serves on a gateway with every feature on (resume, load-aware admission,
tracing, QUIC), and those the ``--workers`` supervisor adds, by name, type and help, as
prometheus_client exposes them. ``python -m gateway.tools.metrics_reference`` prints it;
tests/observe/test_metrics_reference.py holds the file to it.
"""

from __future__ import annotations

import os
import sys

import trio

from gateway.app import Gateway, GatewayConfig, LoadSettings
from gateway.observe import metrics_text
from gateway.workers import Supervisor

HEADER = """# Metrics reference

Generated from the code by `python -m gateway.tools.metrics_reference > docs/metrics.md`
(a test fails when this page and the code differ). Every family `/metrics` serves on the
admin listener (`--admin-listen`, with `--metrics`), on a gateway with every feature on;
a family of a feature that is off is absent. Labels and what to alert on:
[observability.md](observability.md) and the chart's alert rules.

| family | type | what it counts |
|---|---|---|
"""


def _families(text: str) -> dict[str, tuple[str, str]]:
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            helps[name] = doc.replace("\\\\", "\\").replace("\\n", " ")
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            types[name] = kind
    return {name: (types.get(name, "untyped"), doc) for name, doc in helps.items()}


async def _exposition() -> str:
    # Traced, nothing sent; and only here: the environment is the caller's (a test run
    # in-process that left this set would silence every later gateway's exporter).
    saved = os.environ.get("OTEL_TRACES_EXPORTER")
    os.environ.setdefault("OTEL_TRACES_EXPORTER", "none")
    try:
        gateway = Gateway(GatewayConfig(metrics=True, otel_traces=True,
                                        load=LoadSettings(admission=True)))
    finally:
        if saved is None:
            del os.environ["OTEL_TRACES_EXPORTER"]
    supervisor = Supervisor(GatewayConfig(metrics=True), 2)
    return (metrics_text(gateway.metrics.registry) + await supervisor.metrics()).decode()


def reference() -> str:
    """docs/metrics.md as the code now has it."""
    families = _families(trio.run(_exposition))
    rows = [f"| `{name}` | {kind} | {doc.replace('|', '/')} |"
            for name, (kind, doc) in sorted(families.items())]
    return HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference())
