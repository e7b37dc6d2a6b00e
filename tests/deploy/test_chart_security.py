"""The chart deploys authenticated NNRP, TLS when given a certificate, and keeps the admin
port (with vLLM's own /metrics) off the Service clients use: session auth from a token
Secret is required unless turned off by a value that says so; one kubernetes.io/tls Secret
serves tcps://, wss:// and QUIC; scraping goes through a metrics-only Service; the image
tag is the one docs/deploy.md builds and pushes; kubeVersion covers what the templates use;
the NetworkPolicy can keep the admin port to given peers without fleet mode; NOTES.txt
says how to connect with the token and the CA."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import cli.main
from tests.support.chart import (
    CHART,
    ROOT,
    TOKENS,
    cli_options,
    fleet,
    gateway_container as _gateway,
    helm,
    opens as _opens,
    render_values,
    secured,
)
from tests.support.cli import served_config
from tests.support.quic import make_pki

Manifests = dict[str, list[dict[str, Any]]]
NAME = "test-nnrp-vllm-gateway"  # the full name as render_values renders it
TLS = {"tls": {"secretName": "nnrp-gateway-tls"}}


def _pod(manifests: Manifests) -> dict[str, Any]:
    return manifests["Deployment"][0]["spec"]["template"]["spec"]


def _vllm(manifests: Manifests) -> dict[str, Any]:
    return next(c for c in _pod(manifests)["containers"] if c["name"] == "vllm")


def _service(manifests: Manifests, name: str) -> dict[str, Any]:
    (service,) = [s for s in manifests["Service"] if s["metadata"]["name"] == name]
    return service


def _listeners(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == "--listen"]


def _value(args: list[str], flag: str) -> str:
    return str(args[args.index(flag) + 1])


def _render_error(values: dict[str, Any]) -> str:
    with pytest.raises(helm.HelmError) as error:
        helm.Chart.load(str(CHART)).render(values, name="x")
    return " ".join(str(error.value).split())


def _notes(values: dict[str, Any]) -> str:
    return helm.Chart.load(str(CHART)).render(values, name="test", namespace="ml")[
        "nnrp-vllm-gateway/templates/NOTES.txt"]


def _on_this_machine(args: list[str], files: dict[str, Path]) -> list[str]:
    """The gateway's args with the files the pod mounts from Secrets replaced by local
    ones, and the admin listener left out: what serve would be given in the pod."""
    out = [str(files.get(a, a)) for a in args]
    at = out.index("--admin-listen")
    return out[:at] + out[at + 2:]


# --------------------------------------------------------------------------- session auth


def test_auth_is_required_and_the_error_says_how_to_make_the_secret() -> None:
    message = _render_error({})
    assert "gateway.auth.tokenSecret.name is required" in message
    assert ("kubectl create secret generic nnrp-tokens "
            "--from-literal=tokens=$(openssl rand -hex 32)") in message
    assert "gateway.auth.tokenSecret.name=nnrp-tokens" in message
    assert "gateway.auth.allowUnauthenticated=true" in message
    # values.yaml holds no token Secret and auth on.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["gateway"]["auth"] == {"tokenSecret": {"name": "", "key": "tokens"},
                                         "allowUnauthenticated": False}
    # Both at once is a contradiction, refused.
    message = _render_error({"gateway": {"auth": {"tokenSecret": {"name": "t"},
                                                  "allowUnauthenticated": True}}})
    assert "are both set" in message
    # The schema: a boolean that says so, a Secret name Kubernetes accepts, a key.
    for bad in ({"allowUnauthenticated": "yes"}, {"tokenSecret": {"name": "Not_A_Name"}},
                {"tokenSecret": {"name": "t", "key": ""}}, {"enabled": False}):
        with pytest.raises(helm.HelmError):
            helm.Chart.load(str(CHART)).render({"gateway": {"auth": bad}}, name="x")


def test_auth_off_only_when_said() -> None:
    manifests = render_values({"gateway": {"auth": {"allowUnauthenticated": True}}})
    gateway, _ = _gateway(manifests)
    assert "--auth-token-file" not in gateway["args"]
    assert "auth-tokens" not in {m["name"] for m in gateway["volumeMounts"]}
    assert "auth-tokens" not in {v["name"] for v in _pod(manifests)["volumes"]}
    notes = " ".join(_notes({"gateway": {"auth": {"allowUnauthenticated": True}}}).split())
    assert "Session auth is OFF" in notes
    assert "--auth-token-file" not in notes


@pytest.mark.parametrize("sidecar_mode", ["native", "container"])
def test_auth_token_secret_is_a_read_only_file_given_to_serve(sidecar_mode: str) -> None:
    manifests = render_values({"sidecarMode": sidecar_mode, "gateway": {"auth": {
        "tokenSecret": {"name": "gateway-tokens", "key": "session-tokens"}}}})
    gateway, native = _gateway(manifests)
    assert native == (sidecar_mode == "native")
    token_file = Path(_value(gateway["args"], "--auth-token-file"))
    (mount,) = [m for m in gateway["volumeMounts"] if m["name"] == "auth-tokens"]
    assert mount["readOnly"] is True
    assert Path(mount["mountPath"]) == token_file.parent
    (volume,) = [v for v in _pod(manifests)["volumes"] if v["name"] == "auth-tokens"]
    # A whole-volume mount (no subPath): the kubelet refreshes the file, SIGHUP re-reads it.
    assert "subPath" not in mount
    assert volume["secret"] == {"secretName": "gateway-tokens",
                                "items": [{"key": "session-tokens", "path": token_file.name}]}
    # vLLM sees none of it; the option is serve's.
    assert "auth-tokens" not in {m["name"] for m in _vllm(manifests).get("volumeMounts", [])}
    options, envvars = cli_options("serve")
    assert "--auth-token-file" in options and "NNRP_GATEWAY_AUTH_TOKEN_FILE" in envvars


def test_the_chart_token_file_authenticates_and_an_empty_one_stops_the_gateway(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """serve, given the chart's args with the Secret's file here: a token from the file
    opens sessions and another does not; an empty key (an empty file) stops the gateway
    with a usage error at start-up, never an open gateway."""
    gateway, _ = _gateway(render_values({}))
    token_file = _value(gateway["args"], "--auth-token-file")
    tokens = tmp_path / "tokens"
    tokens.write_text("0123456789abcdef" * 4 + "\n")
    config = served_config(monkeypatch, _on_this_machine(gateway["args"],
                                                         {token_file: tokens}))
    authenticate = config.server.authenticate
    assert authenticate is not None
    assert authenticate(("0123456789abcdef" * 4).encode())
    assert not authenticate(b"not-the-token")
    empty = tmp_path / "empty"
    empty.write_text("")

    async def never_served(*_: object) -> None:
        raise AssertionError("serve started with an empty token file")

    monkeypatch.setattr(cli.main, "_serve", never_served)
    result = CliRunner().invoke(cli.main.app, ["serve", *_on_this_machine(
        gateway["args"], {token_file: empty})])
    assert result.exit_code == 2, result.output
    assert "auth" in result.stderr.lower()


# --------------------------------------------------------------------------- TLS


def test_without_tls_the_listeners_are_plaintext() -> None:
    gateway, _ = _gateway(render_values({}))
    assert _listeners(gateway["args"]) == ["tcp://0.0.0.0:7700", "ws://0.0.0.0:7701/nnrp"]
    assert not [a for a in gateway["args"] if a.startswith("--tls")]
    assert "tls" not in {m["name"] for m in gateway["volumeMounts"]}


@pytest.mark.parametrize("quic", [False, True], ids=["tcps-wss", "tcps-wss-quic"])
def test_tls_secret_serves_tcps_wss_and_quic(quic: bool) -> None:
    """One kubernetes.io/tls Secret, mounted read-only once: the TCP and WebSocket ports
    serve tcps:// and wss:// (no plaintext listener is left), QUIC the same certificate;
    the Service carries the same ports, the container's names."""
    values: dict[str, Any] = {"gateway": {**TLS, **({"quicPort": 7703} if quic else {})}}
    manifests = render_values(values)
    gateway, _ = _gateway(manifests)
    args = gateway["args"]
    expected = ["tcps://0.0.0.0:7700", "wss://0.0.0.0:7701/nnrp"]
    assert _listeners(args) == expected + (["quic://0.0.0.0:7703"] if quic else [])
    (mount,) = [m for m in gateway["volumeMounts"] if m["name"] == "tls"]
    assert mount["readOnly"] is True and "subPath" not in mount
    assert args.count("--tls-cert") == args.count("--tls-key") == 1
    assert _value(args, "--tls-cert") == f"{mount['mountPath']}/tls.crt"
    assert _value(args, "--tls-key") == f"{mount['mountPath']}/tls.key"
    (volume,) = [v for v in _pod(manifests)["volumes"] if v["name"] == "tls"]
    assert volume["secret"] == {"secretName": "nnrp-gateway-tls"}
    container_ports = {p["name"]: (p["containerPort"], p["protocol"]) for p in gateway["ports"]}
    service_ports = {p["name"]: (p["port"], p["protocol"])
                     for p in _service(manifests, NAME)["spec"]["ports"]}
    assert service_ports == {name: container_ports[name] for name in service_ports}
    assert service_ports["nnrp"] == (7700, "TCP") and service_ports["nnrp-ws"] == (7701, "TCP")
    assert (service_ports.get("nnrp-quic") == (7703, "UDP")) == quic
    options, _ = cli_options("serve")
    assert {"--tls-cert", "--tls-key"} <= options


def test_the_chart_tls_args_serve_with_the_certificate(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    gateway, _ = _gateway(render_values({"gateway": {**TLS, "quicPort": 7703}}))
    args = gateway["args"]
    pki = make_pki(tmp_path / "tls")
    here = _on_this_machine(args, {_value(args, "--tls-cert"): pki.cert,
                                   _value(args, "--tls-key"): pki.key,
                                   _value(args, "--auth-token-file"): tmp_path / "t"})
    (tmp_path / "t").write_text("a-token\n")
    config = served_config(monkeypatch, here)
    assert config.tls is not None
    assert (config.tls.cert_file, config.tls.key_file) == (pki.cert, pki.key)
    assert config.listen == ("tcps://0.0.0.0:7700", "wss://0.0.0.0:7701/nnrp",
                             "quic://0.0.0.0:7703")


def test_quic_needs_the_tls_secret() -> None:
    message = _render_error(secured({"gateway": {"quicPort": 7702}}))
    assert "gateway.quicPort needs gateway.tls.secretName" in message
    with pytest.raises(helm.HelmError):  # the old value is gone, not silently ignored
        helm.Chart.load(str(CHART)).render(secured({"gateway": {"tlsSecret": "x"}}), name="x")


# --------------------------------------------------------------------------- admin port


@pytest.mark.parametrize("values", [
    {},
    {"gateway": {"metrics": True}},
    {"serviceMonitor": {"enabled": True}, "service": {"type": "LoadBalancer"}},
    fleet(serviceMonitor={"enabled": True}),
], ids=["defaults", "metrics", "service-monitor-load-balancer", "fleet-service-monitor"])
def test_admin_port_is_off_the_clients_service(values: dict[str, Any]) -> None:
    """The Service clients use carries the NNRP ports only; with metrics a ClusterIP
    Service of its own carries the admin port, and the ServiceMonitor selects it alone;
    the probes reach the admin port on the pod."""
    manifests = render_values(values)
    gateway, _ = _gateway(manifests)
    client = _service(manifests, NAME)
    assert {p["name"] for p in client["spec"]["ports"]} <= {"nnrp", "nnrp-ws", "nnrp-quic"}
    assert 9090 not in {p["port"] for p in client["spec"]["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert gateway[probe]["httpGet"]["port"] == "admin"
    assert "admin" in {p["name"] for p in gateway["ports"]}
    metrics = [s for s in manifests["Service"] if s["metadata"]["name"] == f"{NAME}-metrics"]
    if "--metrics" not in gateway["args"]:
        assert not metrics
        return
    (service,) = metrics
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "admin", "port": 9090, "targetPort": "admin",
                                         "protocol": "TCP"}]
    assert service["spec"]["selector"] == client["spec"]["selector"]
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"
    if "ServiceMonitor" in manifests:
        (monitor,) = manifests["ServiceMonitor"]
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        selected = [s["metadata"]["name"] for s in manifests["Service"]
                    if wanted <= s["metadata"]["labels"].items()]
        assert selected == [f"{NAME}-metrics"]
        assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"admin"}


def test_the_old_expose_admin_value_is_gone() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert "exposeAdmin" not in values["service"]
    with pytest.raises(helm.HelmError):
        helm.Chart.load(str(CHART)).render(secured({"service": {"exposeAdmin": True}}),
                                           name="x")


# --------------------------------------------------------------------------- network policy


def test_network_policy_keeps_the_admin_port_to_given_peers_without_fleet() -> None:
    """Without fleet mode the policy renders only when adminFrom gives peers: the admin
    port from them alone, the NNRP ports from every source, nothing else opened."""
    assert "NetworkPolicy" not in render_values({})
    monitoring = [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    manifests = render_values({"networkPolicy": {"adminFrom": monitoring},
                               "gateway": {**TLS, "quicPort": 7703}})
    (policy,) = manifests["NetworkPolicy"]
    rules = policy["spec"]["ingress"]
    (admin_rule,) = [rule for rule in rules if _opens(rule, 9090)]
    assert admin_rule == {"from": monitoring, "ports": [{"port": 9090, "protocol": "TCP"}]}
    open_to_all = [rule for rule in rules if not rule.get("from")]
    for port, protocol in ((7700, "TCP"), (7701, "TCP"), (7703, "UDP")):
        assert any(_opens(rule, port, protocol) for rule in open_to_all)
    assert not any(_opens(rule, 9090) for rule in open_to_all)
    assert all(rule.get("ports") for rule in rules)
    # Turned off, none; with fleet mode the fleet rule stays as it was.
    assert "NetworkPolicy" not in render_values({"networkPolicy": {
        "enabled": False, "adminFrom": monitoring}})
    (policy,) = render_values(fleet(networkPolicy={"adminFrom": monitoring}))["NetworkPolicy"]
    rules = policy["spec"]["ingress"]
    (fleet_rule,) = [rule for rule in rules if _opens(rule, 7702)]
    assert fleet_rule["from"][0]["podSelector"]
    (admin_rule,) = [rule for rule in rules if _opens(rule, 9090)]
    assert admin_rule["from"] == monitoring


# --------------------------------------------------------------------------- vLLM's key


def test_the_upstream_key_reaches_vllm_and_the_gateway() -> None:
    """vLLM checks the key the gateway sends: both read the same Secret's key; vLLM's
    startup probe on /v1 presents it."""
    default = render_values({})
    assert "VLLM_API_KEY" not in {e["name"] for e in _vllm(default).get("env", [])}
    manifests = render_values({"gateway": {"upstreamApiKeySecret": "vllm-key"},
                               "vllm": {"env": [{"name": "HF_HOME", "value": "/cache"}]}})
    gateway, _ = _gateway(manifests)
    vllm = _vllm(manifests)
    by_name = {e["name"]: e for e in vllm["env"]}
    assert by_name["HF_HOME"]["value"] == "/cache"
    gateway_key = next(e for e in gateway["env"] if e["name"] == "NNRP_GATEWAY_UPSTREAM_API_KEY")
    assert by_name["VLLM_API_KEY"]["valueFrom"] == gateway_key["valueFrom"] == {
        "secretKeyRef": {"name": "vllm-key", "key": "api-key"}}
    assert "--api-key" not in vllm["args"]  # the variable keeps it off the command line
    probe = " ".join(vllm["startupProbe"]["exec"]["command"])
    assert "/v1/models" in probe and "os.environ['VLLM_API_KEY']" in probe


# --------------------------------------------------------------------------- image, kube


#: Where the image is built and pushed and the chart installed (the README links it).
DEPLOY_DOC = ROOT / "docs" / "deploy.md"


def _documented_image() -> tuple[str, str]:
    """The name and tag the deploy page's `docker build -t` gives the image."""
    doc = DEPLOY_DOC.read_text()
    (built,) = re.findall(r"^docker build -t (\S+) \.$", doc, re.M)
    name, _, tag = built.partition(":")
    return name, tag or "latest"


def test_the_default_image_tag_is_the_one_the_docs_build_and_push() -> None:
    name, tag = _documented_image()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["gateway"]["image"]["tag"] == tag
    doc = DEPLOY_DOC.read_text()
    (pushed,) = re.findall(r"^docker push (\S+)$", doc, re.M)
    repository, _, pushed_tag = pushed.rpartition(":")
    assert pushed_tag == tag
    assert re.search(rf"^docker tag {re.escape(name)} {re.escape(pushed)}$", doc, re.M)
    # ... and the page's helm install pulls what it pushed, at the default tag.
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", doc, re.S) if "helm install" in b]
    words = shlex.split(block.replace("\\\n", " "))
    sets = dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--set")
    assert sets["gateway.image.repository"] == repository
    assert "gateway.image.tag" not in sets
    gateway, _ = _gateway(render_values({"gateway": {"image": {"repository": repository}}}))
    assert gateway["image"] == f"{repository}:{tag}"
    # Kubernetes' own pull policy for the tag (Always for latest): no stale image.
    assert "imagePullPolicy" not in gateway
    # Still a value: a pinned tag, or "" for the chart's appVersion.
    pinned, _ = _gateway(render_values({"gateway": {"image": {
        "tag": "2026.1", "pullPolicy": "IfNotPresent"}}}))
    assert pinned["image"].endswith(":2026.1") and pinned["imagePullPolicy"] == "IfNotPresent"
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert _gateway(render_values({"gateway": {"image": {"tag": ""}}}))[0]["image"].endswith(
        f":{app_version}")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_kube_version_covers_what_the_templates_use() -> None:
    """The preStop `sleep` action (the gateway's always, vLLM's in container mode) is on by
    default from Kubernetes 1.30, native sidecars from 1.29: the chart's kubeVersion is
    the later, and kubernetes-validate checks the manifests at exactly that version."""
    kube_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    match = re.fullmatch(r">=\s*(\d+\.\d+\.\d+)-0", kube_version)
    assert match, kube_version
    minimum = _version(match.group(1))
    needed = (1, 0, 0)
    for values in ({}, {"sidecarMode": "container"}):
        pod = _pod(render_values(values))
        for container in pod.get("initContainers", []) + pod["containers"]:
            if container.get("restartPolicy") == "Always":
                needed = max(needed, (1, 29, 0))
            if "sleep" in container.get("lifecycle", {}).get("preStop", {}):
                needed = max(needed, (1, 30, 0))
    assert minimum == needed == (1, 30, 0)
    validated = set()
    for test_file in (ROOT / "tests" / "deploy").glob("test_*.py"):
        validated |= set(re.findall(r'"-k",\s*"([\d.]+)"', test_file.read_text()))
    assert {_version(v) for v in validated} == {minimum}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = " ".join(doc.read_text().split())
        assert "Kubernetes 1.29" not in text and "1.29 with the" not in text, doc


# --------------------------------------------------------------------------- NOTES


def test_notes_say_how_to_connect_with_the_token_and_the_ca() -> None:
    notes = _notes(secured({"gateway": {**TLS}}))
    flat = " ".join(notes.split())
    assert ("kubectl -n ml create secret generic nnrp-tokens "
            "--from-literal=tokens=$(openssl rand -hex 32)") in flat
    assert "get secret nnrp-tokens -o jsonpath='{.data.tokens}' | base64 -d > token" in flat
    assert "get secret nnrp-gateway-tls -o jsonpath='{.data.ca\\.crt}' | base64 -d > ca.pem" in flat
    assert "port-forward deploy/test-nnrp-vllm-gateway 7700 9090" in flat
    (chat,) = [line.strip() for line in notes.splitlines()
               if line.strip().startswith("nnrp-gateway chat")]
    words = shlex.split(" ".join(chat.split()))
    assert words[words.index("--endpoint") + 1] == "tcps://localhost:7700"
    assert words[words.index("--auth-token-file") + 1] == "token"
    assert words[words.index("--ca-file") + 1] == "ca.pem"
    options, _ = cli_options("chat")
    assert {w for w in words if w.startswith("--")} <= options
    # Without TLS: plaintext said, no CA; a key with a dot is escaped for jsonpath.
    plain = " ".join(_notes({"gateway": {"auth": {"tokenSecret": {
        "name": "t", "key": "tokens.txt"}}}}).split())
    assert "crosses the network in plaintext" in plain
    assert "--ca-file" not in plain and "tcp://127.0.0.1:7700" in plain
    assert "{.data.tokens\\.txt}" in plain
    assert "port-forward svc/" not in plain  # the admin port is not on the Service


def test_ci_values_cover_auth_and_tls() -> None:
    """Every ci values file renders on its own (so each says what it does about auth), and
    between them they cover tokens, auth off, and TLS with and without QUIC."""
    seen = set()
    for values_file in sorted((CHART / "ci").glob("*-values.yaml")):
        values = yaml.safe_load(values_file.read_text())
        auth = values.get("gateway", {}).get("auth")
        assert auth, values_file.name
        seen.add("off" if auth.get("allowUnauthenticated") else "tokens")
        if values.get("gateway", {}).get("tls"):
            seen.add("tls+quic" if values["gateway"].get("quicPort") else "tls")
        render_values(values, add_auth=False)
    assert seen == {"off", "tokens", "tls", "tls+quic"}
    assert TOKENS == {"gateway": {"auth": {"tokenSecret": {"name": "nnrp-tokens"}}}}
