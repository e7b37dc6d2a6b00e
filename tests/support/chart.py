"""The chart as the deployment tests render it (tests/deploy): helm-python-sdk's render
of helm/nnrp-vllm-gateway by kind, the values the chart requires, the CLI's real options
to hold the chart's flags to, and the fleet values and NetworkPolicy reading the fleet
tests share."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from cli.main import app

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "nnrp-vllm-gateway"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
BIN = Path(sys.executable).parent

helm = pytest.importorskip("helm_python")


#: The one value the chart requires (session auth: test_chart_security.py): a token Secret.
TOKENS = {"gateway": {"auth": {"tokenSecret": {"name": "nnrp-tokens"}}}}


def render(values_file: Path | None) -> dict[str, list[dict[str, Any]]]:
    return render_values(yaml.safe_load(values_file.read_text()) if values_file else {})


def secured(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the token Secret of ``TOKENS`` unless they say something of auth."""
    if "auth" in values.get("gateway", {}):
        return values
    merged = {**values, "gateway": {**values.get("gateway", {}), **TOKENS["gateway"]}}
    return merged


def render_values(values: dict[str, Any], *, add_auth: bool = True
                  ) -> dict[str, list[dict[str, Any]]]:
    """The chart rendered with ``values`` (and, unless ``add_auth`` is false or they give
    their own, the token Secret the chart requires): its manifests by kind."""
    chart = helm.Chart.load(str(CHART))
    rendered = chart.render(secured(values) if add_auth else values, name="test",
                            namespace="ml")
    out: dict[str, list[dict[str, Any]]] = {}
    for path, text in rendered.items():
        if path.endswith(".yaml"):
            for document in yaml.safe_load_all(text):
                if document:
                    out.setdefault(document["kind"], []).append(document)
    return out


def cli_options(command: str) -> tuple[set[str], set[str]]:
    """The long options and the NNRP_GATEWAY_* variables a CLI command really has."""
    group: Any = typer.main.get_command(app)
    cmd = group.commands[command]
    options = {opt for param in cmd.params for opt in getattr(param, "opts", [])
               if opt.startswith("--")}
    options |= {opt for param in cmd.params for opt in getattr(param, "secondary_opts", [])}
    envvars = {param.envvar for param in cmd.params if isinstance(getattr(param, "envvar", None),
                                                                   str)}
    return options, envvars


def gateway_container(manifests: dict[str, list[dict[str, Any]]]) -> tuple[dict[str, Any], bool]:
    spec = manifests["Deployment"][0]["spec"]["template"]["spec"]
    for container in spec.get("initContainers", []):
        if container["name"] == "gateway":
            return container, True
    return next(c for c in spec["containers"] if c["name"] == "gateway"), False


FLEET_VALUES = yaml.safe_load((CHART / "ci" / "fleet-values.yaml").read_text())
Manifests = dict[str, list[dict[str, Any]]]


def fleet(**overrides: Any) -> dict[str, Any]:
    """ci/fleet-values.yaml with ``overrides`` merged in (one level per dict)."""
    values = copy.deepcopy(FLEET_VALUES)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    return values


def opens(rule: dict[str, Any], port: int, protocol: str = "TCP") -> bool:
    """Whether a NetworkPolicy ingress rule admits traffic to ``port``/``protocol``: a rule
    without ports admits every port, a port entry without a port every port of its
    protocol, a named port whatever it names (the fleet's is named), a range its range."""
    ports = rule.get("ports")
    if not ports:
        return True
    for entry in ports:
        if entry.get("protocol", "TCP") != protocol:
            continue
        number = entry.get("port")
        if number is None or isinstance(number, str):
            return True
        if number <= port <= entry.get("endPort", number):
            return True
    return False


