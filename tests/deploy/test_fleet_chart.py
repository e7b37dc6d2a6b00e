"""The chart's part of fleet mode (docs/fleet.md): the gateway's fleet options
wired from values (the pod's IP through the downward API, the key Secret as a read-only
file), the headless Service for pod-to-pod forwards, the NetworkPolicy that keeps the fleet
port to the release's own pods, and nothing of it rendered while fleet mode is off."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import (
    BIN,
    CHART,
    Manifests,
    cli_options,
    fleet,
    gateway_container as _gateway,
    helm,
    opens as _opens,
    render_values,
    secured,
)


def _pod(manifests: Manifests) -> dict[str, Any]:
    return manifests["Deployment"][0]["spec"]["template"]["spec"]


def _selector(manifests: Manifests) -> dict[str, str]:
    selector = manifests["Deployment"][0]["spec"]["selector"]["matchLabels"]
    pod_labels = manifests["Deployment"][0]["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    return selector


def _services(manifests: Manifests) -> tuple[dict[str, Any], dict[str, Any]]:
    """The client Service and the fleet's headless one."""
    name = manifests["Deployment"][0]["metadata"]["name"]
    (client,) = [s for s in manifests["Service"] if s["metadata"]["name"] == name]
    (headless,) = [s for s in manifests["Service"] if s["spec"].get("clusterIP") == "None"]
    return client, headless


# --------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("overrides", [
    {},
    {"sidecarMode": "container", "fleet": {"port": 7800}},
    {"gateway": {"quicPort": 7702, "tls": {"secretName": "nnrp-gateway-tls"}, "wsPort": 0}},
], ids=["ci-values", "container-port-7800", "quic-on-the-same-number"])
def test_fleet_renders_and_validates(overrides: dict[str, Any], tmp_path: Path) -> None:
    """Every manifest of a fleet render passes kubernetes-validate (strict, 1.30) and
    yamllint; the lint of ci/fleet-values.yaml is test_deploy's, with every ci file."""
    manifests = render_values(fleet(**overrides))
    assert {"Deployment", "Service", "NetworkPolicy"} <= set(manifests)
    for kind, documents in manifests.items():
        for number, document in enumerate(documents):
            path = tmp_path / f"{kind}-{number}.yaml"
            path.write_text(yaml.safe_dump(document))
            result = subprocess.run([str(BIN / "yamllint"), "-d", "relaxed", str(path)],
                                    capture_output=True, text=True)
            assert result.returncode == 0, result.stdout
            result = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", "--quiet",
                                     "-k", "1.30.0", str(path)], capture_output=True, text=True)
            assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("sidecar_mode", ["native", "container"])
def test_fleet_wiring(sidecar_mode: str) -> None:
    """The advertised address is the pod's IP (downward API, listed before the variable
    that expands it) and fleet.port; the key file is the Secret's key, mounted read-only;
    the container port is named fleet."""
    manifests = render_values(fleet(sidecarMode=sidecar_mode, fleet={
        "port": 7800, "keySecret": {"name": "fleet-secret", "key": "fleet.key"}}))
    gateway, native = _gateway(manifests)
    assert native == (sidecar_mode == "native")
    env = gateway["env"]
    order = [entry["name"] for entry in env]
    by_name = {entry["name"]: entry for entry in env}
    assert by_name["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert order.index("POD_IP") < order.index("NNRP_GATEWAY_FLEET_ADVERTISE")
    assert by_name["NNRP_GATEWAY_FLEET_ADVERTISE"]["value"] == "$(POD_IP):7800"
    key_file = Path(by_name["NNRP_GATEWAY_FLEET_KEY_FILE"]["value"])
    (mount,) = [m for m in gateway["volumeMounts"] if m["name"] == "fleet-key"]
    assert mount["readOnly"] is True
    assert Path(mount["mountPath"]) == key_file.parent
    (volume,) = [v for v in _pod(manifests)["volumes"] if v["name"] == "fleet-key"]
    assert volume["secret"]["secretName"] == "fleet-secret"
    assert volume["secret"]["items"] == [{"key": "fleet.key", "path": key_file.name}]
    (port,) = [p for p in gateway["ports"] if p["name"] == "fleet"]
    assert (port["containerPort"], port["protocol"]) == (7800, "TCP")
    # The vLLM container sees none of it.
    vllm = next(c for c in _pod(manifests)["containers"] if c["name"] == "vllm")
    assert "fleet-key" not in {m["name"] for m in vllm.get("volumeMounts", [])}
    assert not [e for e in vllm.get("env", []) if e["name"].startswith("NNRP_GATEWAY_FLEET")]
    # Fleet mode changes no argument: the options come as serve's variables.
    assert gateway["args"] == _gateway(render_values({"sidecarMode": sidecar_mode}))[0]["args"]


def test_fleet_variables_are_serves() -> None:
    """The two variables the chart sets are serve's own (issue 35, items 1 and 2, are
    built beside the chart: until serve has them this waits for them)."""
    _, envvars = cli_options("serve")
    wanted = {"NNRP_GATEWAY_FLEET_ADVERTISE", "NNRP_GATEWAY_FLEET_KEY_FILE"}
    if not wanted & envvars:
        pytest.skip("serve has no fleet options yet (issue 35)")
    assert wanted <= envvars
    options, _ = cli_options("serve")
    assert {"--fleet-advertise", "--fleet-key-file"} <= options


def test_fleet_needs_a_key_secret_and_a_port_of_its_own() -> None:
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmError,
                       match=r"fleet\.enabled needs fleet\.keySecret\.name.*create secret"):
        chart.render({"fleet": {"enabled": True}}, name="x")
    with pytest.raises(helm.HelmError, match=r"/fleet/keySecret/key"):
        chart.render({"fleet": {"enabled": True, "keySecret": {"name": "k", "key": ""}}},
                     name="x")
    for taken, values in (("gateway.port", {"gateway": {"port": 7702}}),
                          ("gateway.wsPort", {"gateway": {"wsPort": 7702}}),
                          ("gateway.adminPort", {"gateway": {"adminPort": 7702}}),
                          ("vllm.port", {"vllm": {"port": 7702}})):
        with pytest.raises(helm.HelmError, match=rf"fleet\.port \(7702\) is {taken}'s"):
            chart.render(fleet(**values), name="x")
    for bad in ({"fleet": {"port": 0}}, {"fleet": {"keySecret": {"name": "Not_A_Name"}}},
                {"fleet": {"unknown": 1}}, {"networkPolicy": {"enabled": "yes"}}):
        with pytest.raises(helm.HelmError):
            chart.render(fleet(**bad), name="x")
    # A QUIC port of the same number is UDP: no conflict.
    render_values(fleet(gateway={"quicPort": 7702, "tls": {"secretName": "tls"}}))


def test_fleet_headless_service_selects_the_gateway_pods_and_only_the_fleet_port() -> None:
    manifests = render_values(fleet(fleet={"port": 7800}))
    client, headless = _services(manifests)
    selector = _selector(manifests)
    assert headless["spec"]["selector"] == selector == client["spec"]["selector"]
    assert headless["spec"]["clusterIP"] == "None"
    # A draining pod, no longer ready, still takes forwarded resumes.
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["ports"] == [
        {"name": "fleet", "port": 7800, "targetPort": "fleet", "protocol": "TCP"}]
    assert headless["metadata"]["name"] == f"{client['metadata']['name']}-fleet"
    # The clients' Service does not carry the fleet port.
    assert "fleet" not in {p["name"] for p in client["spec"]["ports"]}
    assert 7800 not in {p["port"] for p in client["spec"]["ports"]}
    # A long release name still gives a DNS label.
    long = render_values(fleet(fullnameOverride="x" * 63))
    assert len(_services(long)[1]["metadata"]["name"]) <= 63


@pytest.mark.parametrize("overrides", [
    {},
    {"fleet": {"port": 7800}, "gateway": {"wsPort": 0}},
    {"gateway": {"quicPort": 7702, "tls": {"secretName": "tls"}},
     "serviceMonitor": {"enabled": True}},
], ids=["ci-values", "port-7800-no-ws", "quic-on-the-same-number"])
def test_network_policy_keeps_the_fleet_port_to_the_release(overrides: dict[str, Any]) -> None:
    """The fleet port's one rule admits exactly the release's own pods; no other rule
    admits the fleet port; the ports clients use stay open to every source (each listed,
    as the policy isolates the pods), the admin port too."""
    values = fleet(**overrides)
    manifests = render_values(values)
    gateway, _ = _gateway(manifests)
    ports = {(p["containerPort"], p["protocol"]): p["name"] for p in gateway["ports"]}
    (fleet_port,) = [number for (number, protocol), name in ports.items() if name == "fleet"]
    (policy,) = manifests["NetworkPolicy"]
    spec = policy["spec"]
    selector = _selector(manifests)
    assert spec["podSelector"] == {"matchLabels": selector}
    assert spec["policyTypes"] == ["Ingress"]
    rules = spec["ingress"]
    (fleet_rule,) = [rule for rule in rules if _opens(rule, fleet_port)]
    assert fleet_rule["from"] == [{"podSelector": {"matchLabels": selector}}]
    assert fleet_rule["ports"] == [{"port": fleet_port, "protocol": "TCP"}]
    for rule in rules:
        if rule is not fleet_rule:
            assert rule.get("ports"), "a rule without ports would open the fleet port"
            assert not _opens(rule, fleet_port)
    # What clients, probes and scrapes reach today stays open to every source.
    open_to_all = [rule for rule in rules if not rule.get("from")]
    for (number, protocol), name in ports.items():
        if name != "fleet":
            assert any(_opens(rule, number, protocol) for rule in open_to_all), name
    # ... and nothing else: the policy opens only ports the container declares.
    for rule in rules:
        for entry in rule["ports"]:
            assert (entry["port"], entry["protocol"]) in ports
            assert "endPort" not in entry


def test_network_policy_can_be_left_out() -> None:
    manifests = render_values(fleet(networkPolicy={"enabled": False}))
    assert "NetworkPolicy" not in manifests
    assert len(manifests["Service"]) == 2


def test_fleet_off_renders_nothing_of_it() -> None:
    """Off (the default), no fleet object, variable, port or volume renders, and the fleet
    values are inert: set but off, the render is the default render, manifest for manifest."""
    default = render_values({})
    assert "NetworkPolicy" not in default
    assert len(default["Service"]) == 1
    gateway, _ = _gateway(default)
    assert not {e["name"] for e in gateway["env"]} & {
        "POD_IP", "NNRP_GATEWAY_FLEET_ADVERTISE", "NNRP_GATEWAY_FLEET_KEY_FILE"}
    assert "fleet" not in {p["name"] for p in gateway["ports"]}
    assert "fleet-key" not in {m["name"] for m in gateway["volumeMounts"]}
    assert "fleet-key" not in {v["name"] for v in _pod(default)["volumes"]}
    assert not [a for a in gateway["args"] if a.startswith("--fleet")]
    inert = render_values({"fleet": {"enabled": False, "port": 7800,
                                     "keySecret": {"name": "fleet-secret", "key": "k"}},
                           "networkPolicy": {"enabled": True}})
    assert inert == default


def test_fleet_leaves_session_affinity_to_the_values() -> None:
    """Fleet mode does not need ClientIP and never sets it; a ClientIP set explicitly is
    kept (it only spares a forward then)."""
    client, _ = _services(render_values(fleet()))
    assert client["spec"]["sessionAffinity"] == "None"
    assert "sessionAffinityConfig" not in client["spec"]
    client, _ = _services(render_values(fleet(service={"sessionAffinity": "ClientIP"})))
    assert client["spec"]["sessionAffinity"] == "ClientIP"


def test_fleet_keeps_the_grace_period_check() -> None:
    """The grace period covers preStop + drain (forwarded resumes to a draining pod are
    part of the drain) in fleet mode as without it; less fails to render."""
    manifests = render_values(fleet())
    gateway, _ = _gateway(manifests)
    args = gateway["args"]
    drain = float(args[args.index("--drain-timeout") + 1])
    assert _pod(manifests)["terminationGracePeriodSeconds"] >= (
        gateway["lifecycle"]["preStop"]["sleep"]["seconds"] + drain + 5)
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmError, match="terminationGracePeriodSeconds"):
        chart.render(fleet(terminationGracePeriodSeconds=30), name="x")


def test_notes_say_what_fleet_mode_changes() -> None:
    chart = helm.Chart.load(str(CHART))
    notes = chart.render(fleet(), name="test", namespace="ml")[
        "nnrp-vllm-gateway/templates/NOTES.txt"]
    assert "test-nnrp-vllm-gateway-fleet" in notes
    assert "create secret generic nnrp-fleet-key" in notes
    assert "kill -HUP 1" in notes
    assert "sessionAffinity (None) is not needed" in notes
    several = chart.render(secured({"replicaCount": 2}), name="test", namespace="ml")[
        "nnrp-vllm-gateway/templates/NOTES.txt"]
    assert "fleet.enabled" in several
    single = chart.render(secured({}), name="test", namespace="ml")[
        "nnrp-vllm-gateway/templates/NOTES.txt"]
    assert "fleet" not in single
