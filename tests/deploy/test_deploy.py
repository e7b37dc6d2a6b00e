"""Deployment artefacts checked without Docker or a cluster: the chart (lint, render every
ci values file, kubernetes-validate, yamllint, wiring), the compose files against the real
CLI, the Dockerfile (hadolint), and the image's install steps (wheel into a fresh venv)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import (
    BIN,
    CHART,
    CI_VALUES,
    ROOT,
    TOKENS,
    cli_options,
    gateway_container as _gateway,
    helm,
    render,
    render_values,
    secured,
)
from tests.support.cli import served_config

# --------------------------------------------------------------------------- chart


def test_chart_lints_strictly() -> None:
    # values.yaml alone does not render (session auth is required: test_chart_security.py),
    # but Helm's lint mode only logs `fail` and `required`; with the token Secret it renders.
    for values in (None, TOKENS):
        report = helm.lint(str(CHART), values, strict=True)
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []
    for values_file in CI_VALUES:
        values = yaml.safe_load(values_file.read_text())
        report = helm.lint(str(CHART), values, strict=True)
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], values_file.name


@pytest.mark.parametrize("values_file", [None, *CI_VALUES],
                         ids=lambda p: p.name if p else "defaults")
def test_rendered_manifests_validate(values_file: Path | None, tmp_path: Path) -> None:
    manifests = render(values_file)
    assert set(manifests) >= {"Deployment", "Service"}
    for kind, documents in manifests.items():
        for number, document in enumerate(documents):
            path = tmp_path / f"{kind}-{number}.yaml"
            path.write_text(yaml.safe_dump(document))
            result = subprocess.run([str(BIN / "yamllint"), "-d", "relaxed", str(path)],
                                    capture_output=True, text=True)
            assert result.returncode == 0, result.stdout
            if kind in ("ServiceMonitor", "PrometheusRule"):
                continue  # CRDs: no offline schema in kubernetes-validate
            result = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", "--quiet",
                                     "-k", "1.30.0", str(path)],
                                    capture_output=True, text=True)
            assert result.returncode == 0, result.stdout + result.stderr


def test_native_and_container_sidecar_modes() -> None:
    gateway, native = _gateway(render(CHART / "ci" / "native-values.yaml"))
    assert native
    assert gateway["restartPolicy"] == "Always"
    gateway, native = _gateway(render(CHART / "ci" / "container-values.yaml"))
    assert not native
    assert "restartPolicy" not in gateway


@pytest.mark.parametrize("values_file", [None, *CI_VALUES],
                         ids=lambda p: p.name if p else "defaults")
def test_wiring(values_file: Path | None) -> None:
    manifests = render(values_file)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    _merge(values, yaml.safe_load(values_file.read_text()) if values_file else TOKENS)
    gateway, _ = _gateway(manifests)
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports["nnrp"] == values["gateway"]["port"]
    assert ports["admin"] == values["gateway"]["adminPort"]
    # Probes: startup and liveness never depend on vLLM; readiness follows it.
    assert gateway["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Probe timeouts tolerate a saturated event loop (/healthz took up to 2.1 s in a
    # saturating soak); Kubernetes' default 1 s would restart a busy gateway.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert gateway[probe]["timeoutSeconds"] == values["gateway"]["probeTimeoutSeconds"]
        assert gateway[probe]["timeoutSeconds"] >= 5
    # The sidecar's flags are the CLI's.
    options, _ = cli_options("serve")
    assert {a for a in gateway["args"] if a.startswith("--")} <= options
    args = gateway["args"]
    assert args[args.index("--vllm-url") + 1] == f"http://127.0.0.1:{values['vllm']['port']}"
    assert args[args.index("--admin-listen") + 1] == f"0.0.0.0:{values['gateway']['adminPort']}"
    assert ("--metrics" in args) == (values["serviceMonitor"]["enabled"]
                                     or values["gateway"]["metrics"])
    # Hardened container, and a grace period that covers preStop plus the drain.
    security = gateway["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    pod = manifests["Deployment"][0]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= (gateway["lifecycle"]["preStop"]["sleep"]
                                                    ["seconds"]
                                                    + values["gateway"]["drainTimeoutSeconds"])
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    # ... and vLLM's preStop sleep (test_stop_order.py): by default it outlasts the
    # gateway's sleep and drain in container mode; native mode gives vLLM none.
    vllm_sleep = vllm.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    assert pod["terminationGracePeriodSeconds"] >= vllm_sleep + 5
    if values["sidecarMode"] == "container":
        assert vllm_sleep == (values["gateway"]["preStopSleepSeconds"]
                              + values["gateway"]["drainTimeoutSeconds"])
    else:
        assert "lifecycle" not in vllm
    assert "--port" in vllm["args"]
    assert vllm["args"][vllm["args"].index("--port") + 1] == str(values["vllm"]["port"])
    assert vllm["startupProbe"]["failureThreshold"] * vllm["startupProbe"]["periodSeconds"] >= 600
    assert vllm["livenessProbe"]["timeoutSeconds"] == values["vllm"]["probes"]["timeoutSeconds"]
    assert vllm["livenessProbe"]["timeoutSeconds"] >= 5
    # The clients' Service (fleet mode adds a headless one: test_fleet_chart.py).
    name = manifests["Deployment"][0]["metadata"]["name"]
    (client_service,) = [s for s in manifests["Service"] if s["metadata"]["name"] == name]
    service_ports = {p["name"]: p["port"] for p in client_service["spec"]["ports"]}
    assert service_ports["nnrp"] == values["gateway"]["port"]
    # Without fleet mode a resuming client lands on its session's pod only with ClientIP
    # affinity; with it the chart never sets ClientIP (test_fleet_chart.py).
    assert args[args.index("--resume-window") + 1] == str(values["gateway"]["resumeWindowSeconds"])
    service = client_service["spec"]
    assert service["sessionAffinity"] == values["service"]["sessionAffinity"]
    if service["sessionAffinity"] == "ClientIP":
        assert service["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] == (
            values["service"]["sessionAffinityTimeoutSeconds"])
        assert (values["service"]["sessionAffinityTimeoutSeconds"]
                >= values["gateway"]["resumeWindowSeconds"])
    # The admin port is never on the clients' Service; the metrics-only one carries it.
    assert set(service_ports) <= {"nnrp", "nnrp-ws", "nnrp-quic"}
    metrics_services = [s for s in manifests["Service"]
                        if s["metadata"]["name"] == f"{name}-metrics"]
    assert bool(metrics_services) == ("--metrics" in args)
    assert ("ServiceMonitor" in manifests) == values["serviceMonitor"]["enabled"]
    if "ServiceMonitor" in manifests:
        endpoint = manifests["ServiceMonitor"][0]["spec"]["endpoints"][0]
        assert endpoint == {"port": "admin", "path": "/metrics", "interval": "30s",
                            "scrapeTimeout": "25s",
                            "relabelings": [{"targetLabel": "job", "replacement": name}]}
        (metrics_service,) = metrics_services
        assert {p["name"] for p in metrics_service["spec"]["ports"]} == {"admin"}
    labels = manifests["Deployment"][0]["metadata"]["labels"]
    assert {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by", "helm.sh/chart"} <= set(labels)


def test_quic_port_renders_as_udp_with_its_certificate() -> None:
    """Off by default: no UDP port anywhere. On: the container's and the Service's QUIC
    ports are UDP, the listener and the certificate files are in the args, and the files
    are the TLS secret's, mounted read-only. Without a secret the chart refuses."""
    def protocols(manifests: dict[str, list[dict[str, Any]]]) -> set[str]:
        gateway, _ = _gateway(manifests)
        ports = gateway["ports"] + manifests["Service"][0]["spec"]["ports"]
        return {port["protocol"] for port in ports}

    defaults = render(None)
    assert protocols(defaults) == {"TCP"}
    assert not [a for a in _gateway(defaults)[0]["args"] if a.startswith("quic://")]

    manifests = render(CHART / "ci" / "quic-values.yaml")
    gateway, _ = _gateway(manifests)
    (container_port,) = [p for p in gateway["ports"] if p["name"] == "nnrp-quic"]
    assert (container_port["containerPort"], container_port["protocol"]) == (7702, "UDP")
    (service_port,) = [p for p in manifests["Service"][0]["spec"]["ports"]
                       if p["name"] == "nnrp-quic"]
    assert (service_port["port"], service_port["targetPort"], service_port["protocol"]) == (
        7702, "nnrp-quic", "UDP")
    assert protocols(manifests) == {"TCP", "UDP"}
    args = gateway["args"]
    assert "quic://0.0.0.0:7702" in [args[i + 1] for i, a in enumerate(args) if a == "--listen"]
    assert args[args.index("--quic-alpn") + 1] == "any"
    (mount,) = [m for m in gateway["volumeMounts"] if m["name"] == "tls"]
    assert mount["readOnly"] is True
    for flag, name in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")):
        assert args[args.index(flag) + 1] == f"{mount['mountPath']}/{name}"
    pod = manifests["Deployment"][0]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "nnrp-gateway-tls"

    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmError, match=r"quicPort needs gateway\.tls\.secretName"):
        chart.render(secured({"gateway": {"quicPort": 7702}}), name="x")


def test_workers_size_the_cpu_request() -> None:
    """One worker: no flag, a quarter core. N workers: --workers N, N cores requested,
    memory per worker; what values set explicitly stays as given."""
    def gateway_of(values: dict[str, Any]) -> dict[str, Any]:
        return _gateway(render_values(values))[0]

    one = gateway_of({})
    assert "--workers" not in one["args"]
    assert one["resources"] == {"requests": {"cpu": "250m", "memory": "128Mi"},
                                "limits": {"memory": "512Mi"}}
    four = gateway_of(yaml.safe_load((CHART / "ci" / "workers-values.yaml").read_text()))
    assert four["args"][four["args"].index("--workers") + 1] == "4"
    assert four["resources"] == {"requests": {"cpu": "4", "memory": "512Mi"},
                                 "limits": {"memory": "2048Mi"}}
    given = gateway_of({"gateway": {"workers": 2, "resources": {
        "requests": {"cpu": "1500m"}, "limits": {"cpu": "2", "memory": "1Gi"}}}})
    assert given["resources"] == {"requests": {"cpu": "1500m", "memory": "256Mi"},
                                  "limits": {"cpu": "2", "memory": "1Gi"}}
    options, _ = cli_options("serve")
    assert "--workers" in options


def test_the_documented_helm_example_gives_vllm_a_gpu() -> None:
    """docs/deploy.md's `helm install` line, its --set flags parsed by Helm's own parser:
    the chart accepts them and the vLLM container, not the gateway, asks for the GPU."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", doc, re.S) if "helm install" in b]
    words = shlex.split(block.replace("\\\n", " "))
    sets = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    assert sets, block
    values: dict[str, Any] = {}
    for expression in sets:
        _merge(values, helm.parse_set_string(expression))
    manifests = render_values(values, add_auth=False)  # the page's values alone
    pod = manifests["Deployment"][0]["spec"]["template"]["spec"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert vllm["image"].endswith(":v0.26.0")
    gateway, _ = _gateway(manifests)
    assert "nvidia.com/gpu" not in gateway["resources"].get("limits", {})


def _merge(base: dict[str, Any], override: dict[str, Any]) -> None:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def test_values_schema_in_sync_with_values() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if isinstance(value, dict) and "properties" in node:
            assert set(value) == set(node["properties"]), f"{path}: keys drifted"
            for key, item in value.items():
                walk(item, node["properties"][key], f"{path}.{key}")
        elif value is None:  # null: a value the chart computes (vllm.preStopSleepSeconds)
            assert isinstance(node.get("type"), list) and "null" in node["type"], path
        else:
            expected = {bool: "boolean", int: "integer", float: "number", str: "string",
                        list: "array", dict: "object"}[type(value)]
            types = node.get("type")
            assert types == expected or (isinstance(types, list) and expected in types), (
                f"{path}: {types} != {expected}")

    walk(values, schema, "values")
    documented = re.findall(r"^\s*# -- ", (CHART / "values.yaml").read_text(), re.M)
    assert len(documented) >= 40  # every key carries a helm-docs comment


def test_schema_rejects_bad_values() -> None:
    chart = helm.Chart.load(str(CHART))
    for bad in ({"sidecarMode": "maybe"}, {"gateway": {"port": 70000}},
                {"gateway": {"unknown": 1}}, {"gateway": {"quicAlpn": "h3"}}):
        with pytest.raises(helm.HelmError):
            chart.render(bad, name="x")
    with pytest.raises(helm.HelmError, match="terminationGracePeriodSeconds"):
        chart.render({"terminationGracePeriodSeconds": 10}, name="x")


# --------------------------------------------------------------------------- compose


def _published(ports: list[str]) -> list[tuple[str, str, str]]:
    """Compose's short port syntax as (host address, host port, container port/protocol);
    no address: every interface ("")."""
    out = []
    for entry in ports:
        *host, container = entry.split(":")
        address, port = (["", *host] if len(host) == 1 else host)
        out.append((address, port, container))
    return out


@pytest.mark.parametrize("name", ["docker-compose.yml", "compose.replay.yml"])
def test_compose_files_match_the_cli(name: str) -> None:
    document = yaml.safe_load((ROOT / "deploy" / name).read_text())
    services = document["services"]
    gateway = services["gateway"]
    assert gateway["network_mode"] == "service:vllm"
    assert "ports" not in gateway  # published on the vllm service, Docker requires it
    assert set(gateway["depends_on"]) <= set(services)
    assert gateway["depends_on"]["vllm"]["condition"] == "service_healthy"
    assert "start_period" in services["vllm"]["healthcheck"]
    options, envvars = cli_options("serve")
    assert {a for a in gateway["command"] if a.startswith("--")} <= options
    assert set(gateway["environment"]) <= envvars
    assert gateway["environment"]["NNRP_GATEWAY_VLLM_URL"].startswith("http://127.0.0.1:")
    published = {port for _, port, _ in _published(services["vllm"]["ports"])}
    listens = [gateway["command"][i + 1] for i, a in enumerate(gateway["command"])
               if a == "--listen"]
    assert {re.search(r":(\d+)", uri).group(1) for uri in listens} <= published  # type: ignore[union-attr]
    assert gateway["environment"]["NNRP_GATEWAY_ADMIN_LISTEN"].split(":")[1] in published
    drain = float(gateway["environment"]["NNRP_GATEWAY_DRAIN_TIMEOUT"])
    assert float(gateway["stop_grace_period"].rstrip("s")) > drain
    if name == "compose.replay.yml":
        assert "NNRP_GATEWAY_UPSTREAM_API_KEY" not in gateway["environment"]
        replay_options, _ = cli_options("replay-server")
        vllm = services["vllm"]
        assert vllm["entrypoint"] == ["nnrp-gateway", "replay-server"]
        assert {a for a in vllm["command"] if a.startswith("--")} <= replay_options


@pytest.mark.parametrize("name", ["docker-compose.yml", "compose.replay.yml"])
def test_compose_quic_override_publishes_a_udp_port(name: str) -> None:
    """compose.quic.yml over either file, merged as compose merges (a command is replaced,
    environment entries by key, ports and volumes appended): every listener of the base
    file is still there, the QUIC one's port is published as UDP, and the certificate
    files are in the mounted folder."""
    base = yaml.safe_load((ROOT / "deploy" / name).read_text())["services"]
    override = yaml.safe_load((ROOT / "deploy" / "compose.quic.yml").read_text())["services"]
    gateway = {**base["gateway"], "command": override["gateway"]["command"],
               "environment": {**base["gateway"]["environment"],
                               **override["gateway"]["environment"]},
               "volumes": base["gateway"].get("volumes", []) + override["gateway"]["volumes"]}
    published = [f"{port}:{container}"
                 for _, port, container in _published(base["vllm"]["ports"]
                                                      + override["vllm"]["ports"])]

    def listens(command: list[str]) -> list[str]:
        return [command[i + 1] for i, a in enumerate(command) if a == "--listen"]

    assert set(listens(base["gateway"]["command"])) < set(listens(gateway["command"]))
    assert set(base["gateway"]["command"]) <= set(gateway["command"])  # no flag dropped
    (quic,) = [uri for uri in listens(gateway["command"]) if uri.startswith("quic://")]
    port = quic.rpartition(":")[2]
    assert f"{port}:{port}/udp" in published
    assert f"{port}:{port}" not in published  # UDP only: QUIC has no TCP side
    options, envvars = cli_options("serve")
    assert {a for a in gateway["command"] if a.startswith("--")} <= options
    assert set(gateway["environment"]) <= envvars
    (mount,) = [v.rsplit(":", 2)[1] for v in gateway["volumes"]]
    for variable in ("NNRP_GATEWAY_TLS_CERT", "NNRP_GATEWAY_TLS_KEY"):
        assert gateway["environment"][variable].startswith(mount + "/")


@pytest.mark.parametrize("name", ["docker-compose.yml", "compose.replay.yml",
                                  "compose.quic.yml"])
def test_compose_ports_are_published_on_loopback_only(name: str) -> None:
    """NNRP there is plaintext and unauthenticated, the admin port has vLLM's metrics:
    nothing is published on every interface of the host."""
    services = yaml.safe_load((ROOT / "deploy" / name).read_text())["services"]
    entries = [entry for service in services.values() for entry in service.get("ports", [])]
    assert entries
    for address, _, _ in _published(entries):
        assert address == "127.0.0.1", entries


def test_compose_vllm_checks_the_key_the_gateway_sends() -> None:
    """One variable on both sides: the gateway sends VLLM_API_KEY, and vLLM, given the
    same variable as its own VLLM_API_KEY (what --api-key sets), checks it; unset, neither
    has a key."""
    services = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())["services"]
    sent = services["gateway"]["environment"]["NNRP_GATEWAY_UPSTREAM_API_KEY"]
    assert sent == "${VLLM_API_KEY:-}"
    assert services["vllm"]["environment"]["VLLM_API_KEY"] == sent
    assert "--api-key" not in services["vllm"]["command"]  # one source only


# --------------------------------------------------------------------------- image


def test_dockerfile_is_hadolint_clean() -> None:
    result = subprocess.run([str(BIN / "hadolint"), str(ROOT / "Dockerfile")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["nnrp-gateway", "serve"\]$', text, re.M)
    assert re.search(r"^USER 10001", text, re.M)
    assert 'HEALTHCHECK' in text and '"nnrp-gateway", "health"' in text


@pytest.mark.slow
def test_image_install_steps(tmp_path: Path) -> None:
    """What the Dockerfile's builder does: build the wheel, install it into a fresh venv.
    Without NNRP_GATEWAY_COMPILE the wheel is pure: no compiled file (gateway/compiled.py),
    whatever a compiled build left on this machine, and it says so."""
    pure = {k: v for k, v in os.environ.items() if k != "NNRP_GATEWAY_COMPILE"}
    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir",
                            str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True,
                           env=pure)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert [n for n in archive.namelist() if n.endswith((".so", ".pyd", ".c"))] == []
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    pip = subprocess.run([str(env_dir / "bin" / "pip"), "install", "--quiet", str(wheel)],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-2000:]
    exe = str(env_dir / "bin" / "nnrp-gateway")
    # The installed wheel alone: a PYTHONPATH pointing at a checkout would be imported first.
    installed = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    version = subprocess.run([exe, "version"], capture_output=True, text=True, cwd=tmp_path,
                             env=installed)
    assert version.returncode == 0
    assert "nnrp-vllm-gateway 0.1.0" in version.stdout
    assert "build: pure Python" in version.stdout
    health = subprocess.run([exe, "health", "--help"], capture_output=True, text=True,
                            env=installed)
    assert health.returncode == 0
    # The wheel carries the recipes and transcripts the conformance and replay commands use.
    listing = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                              "from gateway.tools.conformance import recipes_root; "
                              "from gateway.tools.replay import bundled_transcripts; "
                              "print(recipes_root(), len(bundled_transcripts()))"],
                             capture_output=True, text=True, cwd=tmp_path, env=installed)
    assert "site-packages/gateway/tools/conformance/recipes" in listing.stdout
    assert int(listing.stdout.split()[-1]) >= 30
    assert shutil.which("nnrp-gateway", path=str(env_dir / "bin"))


def test_the_smokes_conformance_step_runs_as_written(tmp_path: Path) -> None:
    """deploy/conformance-smoke.sh, as smoke.sh runs it in the container: here the "real"
    vLLM is a replay one, and the two recipes it must not be asked go to the scripted
    gateway the script starts itself (the run against the CPU vLLM build is in
    docs/smoke/)."""
    from tests.support.processes import ReplayThread, free_port, wait_ready

    port, admin = free_port(), free_port()
    with ReplayThread(speed=20.0) as replay:
        gateway = subprocess.Popen(
            [str(BIN / "nnrp-gateway"), "serve", "--listen", f"tcp://127.0.0.1:{port}",
             "--vllm-url", replay.url, "--tool-calls", "--admin-listen",
             f"127.0.0.1:{admin}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(f"http://127.0.0.1:{admin}")
            done = subprocess.run(
                ["bash", str(ROOT / "deploy" / "conformance-smoke.sh"),
                 f"tcp://127.0.0.1:{port}", str(tmp_path)], env={"BIN": str(BIN),
                                                               "PATH": "/usr/bin:/bin"},
                capture_output=True, text=True, timeout=300, check=False)
        finally:
            gateway.terminate()
            gateway.wait(10)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "passed  openai-compatible.chat.backend-error  [scripted backend:" in done.stdout
    results = json.loads((tmp_path / "conformance" / "results.json").read_text())
    backends = {r["id"]: r["diagnostics"]["backend"] for r in results["results"]}
    assert backends["openai-compatible.chat.backend-error"] == "scripted"
    assert backends["openai-compatible.chat.streaming-text"] == "main"


def test_load_aware_admission_values_become_serve_flags(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23: the chart's admission values are serve's flags, off by default."""
    default, _ = _gateway(render(None))
    assert "--load-aware-admission" not in default["args"]
    args = default["args"]
    assert args[args.index("--overload-retry-after-ms") + 1] == "1000"
    gateway, _ = _gateway(render(CHART / "ci" / "admission-values.yaml"))
    args = gateway["args"]

    def value(flag: str) -> str:
        return str(args[args.index(flag) + 1])

    assert "--load-aware-admission" in args and "--load-refuse-sessions" in args
    assert (value("--load-source"), value("--load-interval"), value("--load-max-waiting"),
            value("--load-max-kv-cache-usage"), value("--overload-retry-after-ms")) == (
        "metrics", "0.5", "8", "0.9", "2000")
    load = served_config(monkeypatch, [a for a in args if a not in (
        "--admin-listen", "--auth-token-file") and not a.startswith(("0.0.0.0:", "/etc/"))]
    ).load
    assert (load.admission, load.max_waiting, load.refuse_sessions) == (True, 8.0, True)


def test_tracing_values_become_the_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: the chart's tracing values are serve's switch and OpenTelemetry's own
    variables, which the gateway's tracer reads as the chart means them; off by default."""
    default, _ = _gateway(render(None))
    names = {entry["name"] for entry in default["env"]}
    assert not {name for name in names if name.startswith(("OTEL_", "NNRP_GATEWAY_OTEL"))}
    gateway, _ = _gateway(render(CHART / "ci" / "tracing-values.yaml"))
    env = gateway["env"]
    order = [entry["name"] for entry in env]
    # Kubernetes expands $(VAR) only from entries listed before it.
    assert order.index("POD_NAME") < order.index("OTEL_RESOURCE_ATTRIBUTES")
    assert order.index("POD_NAMESPACE") < order.index("OTEL_RESOURCE_ATTRIBUTES")
    by_name = {entry["name"]: entry for entry in env}
    assert by_name["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {
        "name": "tracing-backend", "key": "headers"}
    _, serve_envvars = cli_options("serve")
    assert "NNRP_GATEWAY_OTEL_TRACES" in serve_envvars
    pod = {"POD_NAME": "test-gw-0", "POD_NAMESPACE": "ml"}
    for name, entry in by_name.items():
        if "value" in entry:
            value = re.sub(r"\$\((\w+)\)", lambda m: pod[m.group(1)], entry["value"])
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=from-the-secret")
    assert served_config(monkeypatch, ["--vllm-url", "http://127.0.0.1:8000"]).otel_traces
    pytest.importorskip("opentelemetry.sdk")
    from gateway.observe._otel import OtelTracer

    tracer = OtelTracer.from_environment(vllm_url="http://127.0.0.1:8000",
                                         dropped=lambda reason, count: None,
                                         exported=lambda count: None)
    try:
        attributes = tracer.resource.attributes
        assert attributes["service.name"] == "test-nnrp-vllm-gateway"
        assert (attributes["k8s.namespace.name"], attributes["k8s.pod.name"]) == (
            "ml", "test-gw-0")
        # The chart's base URL (OTEL_EXPORTER_OTLP_ENDPOINT), with the path OTLP/HTTP adds.
        assert tracer.failures.endpoint == (
            "http://otel-collector.observability:4318/v1/traces")
        assert "TraceIdRatioBased{0.1}" in tracer.sampler.get_description()
    finally:
        tracer.queue.exporter.shutdown()
