"""host.routes, server side (issue 26): the target manifest claims the four server-role
scenarios, and each is driven as the suite's runner drives it: the target executable
run with the runner's arguments, its listeners bound for real, nnrp-py's native client
(nnrp-rs underneath: the runner's own client) opening a session on each, the route
evidence judged by the runner's rules, and the closure probed after an error.

The target manifest's TLS server name comes from the certificate, never from a wildcard
bind address."""

from __future__ import annotations

import datetime
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.profile import runtime_tokens
from gateway.tools.conformance import (
    ManifestError,
    compile_imported_modules,
    host_route_providers,
    host_route_scenarios,
    run_host_route_case,
    schema_errors,
    select_host_routes,
    target_manifest,
    validate_route,
)
from gateway.tools.conformance._host_route import no_upstream
from tests.support.quic import make_pki

SERVER_SCENARIOS = ["wire.host-route.server.multi-listener",
                    "wire.host-route.server.atomic-bind-rollback",
                    "wire.host-route.server.terminal-listener-failure",
                    "wire.host-route.native.security-matrix"]
TARGET = [str(Path(sys.executable).parent / "nnrp-gateway-host-route-target")]


def manifest(tmp_path: Path, *uris: str, **kw: Any) -> dict[str, Any]:
    pki = make_pki(tmp_path / "pki")
    return target_manifest(list(uris), target_name="g", max_frame_bytes=1 << 24,
                           max_in_flight=64, runtime_tokens=runtime_tokens(priority_scheduling=False),
                           tls_files=(pki.cert, pki.key), security_dir=tmp_path / "sec", **kw)


def test_the_manifest_claims_exactly_the_server_role_scenarios(tmp_path: Path) -> None:
    claims = manifest(tmp_path, "tcp://127.0.0.1:7700", "tcps://127.0.0.1:7702")
    assert schema_errors(claims, "wire-conformance-target.schema.json") == []
    wire = claims["wire_conformance"]
    assert "host.routes" in wire["capabilities"]
    # The runner refuses host.routes without providers, and a transport declared twice.
    providers = wire["host_route_providers"]
    assert len({p["transport"] for p in providers}) == len(providers) == 4
    # tcps is listed as the schema allows: the tcp provider's tls_server_auth mode.
    (tcp,) = [p for p in providers if p["transport"] == "tcp"]
    assert tcp["security_modes"] == ["plain", "tls_server_auth"]
    assert [t["name"] for t in wire["transports"]] == ["tcp"]
    selected, left_out = select_host_routes(claims)
    assert [s["id"] for s in selected] == SERVER_SCENARIOS
    # The client-role ones need suite_as_server, which the gateway does not declare.
    assert len(left_out) == 8
    assert all(s["mode"] == "suite_as_server" for s in host_route_scenarios()
               if s["id"] in left_out)


@pytest.mark.parametrize(("listen", "given", "expected", "endpoint"), [
    # docs/protocol.md's example: never 0.0.0.0, as the name checked nor as the address dialled
    ("quic://0.0.0.0:7704", None, "localhost", "localhost:7704"),
    ("wss://[::]:7703/nnrp", None, "localhost", "wss://localhost:7703/nnrp"),
    # the host, since the cert holds it
    ("quic://127.0.0.1:7704", None, "127.0.0.1", "127.0.0.1:7704"),
    ("quic://localhost:7704", None, "localhost", "localhost:7704"),
    # a host the cert does not hold: dialled as bound, checked by the cert's name
    ("quic://10.1.2.3:7704", None, "localhost", "10.1.2.3:7704"),
    ("quic://0.0.0.0:7704", "gateway.example", "gateway.example", "gateway.example:7704"),
    ("quic://[::]:7704", "::1", "::1", "[::1]:7704"),
])
def test_the_tls_server_name_is_a_name_the_certificate_holds(
        tmp_path: Path, listen: str, given: str | None, expected: str, endpoint: str) -> None:
    claims = manifest(tmp_path, listen, server_name=given)
    assert schema_errors(claims, "wire-conformance-target.schema.json") == []
    (transport,) = claims["wire_conformance"]["transports"]
    assert transport["security"]["server_name"] == expected
    assert transport["endpoint"] == endpoint


def test_a_certificate_without_names_needs_the_option(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "no host here")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "c.pem", tmp_path / "k.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    arguments: dict[str, Any] = {"target_name": "g", "max_frame_bytes": 1, "max_in_flight": 1,
                                 "tls_files": (cert_path, key_path),
                                 "security_dir": tmp_path / "sec"}
    with pytest.raises(ManifestError, match="give --tls-server-name"):
        target_manifest(["quic://0.0.0.0:1"], **arguments)
    with pytest.raises(ManifestError, match="wildcard address"):
        target_manifest(["quic://0.0.0.0:1"], server_name="0.0.0.0", **arguments)
    named = target_manifest(["quic://0.0.0.0:1"], server_name="gw.example", **arguments)
    assert named["wire_conformance"]["transports"][0]["security"]["server_name"] == \
        "gw.example"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each server-role scenario, run once as the runner runs it (the target as a process:
    the executable the runner is given)."""
    pytest.importorskip("nnrp.client.native")
    import cli.main  # noqa: F401  (what the target imports, for its bytecode)

    compile_imported_modules()  # as `conformance host-routes` does
    root = tmp_path_factory.mktemp("host-routes")
    scenarios = {s["id"]: s for s in host_route_scenarios()}
    return {sid: run_host_route_case(scenarios[sid], TARGET, root / sid.rsplit(".", 1)[1],
                                     host_route_providers())
            for sid in SERVER_SCENARIOS}


@pytest.mark.interop
@pytest.mark.parametrize("scenario_id", SERVER_SCENARIOS)
def test_each_server_scenario_passes_as_the_runner_judges_it(
        results: dict[str, dict[str, Any]], scenario_id: str) -> None:
    result = results[scenario_id]
    assert result["outcome"] == "passed", result.get("message")
    report = {"protocol_version": "nnrp-1-preview4", "suite_version": "0.1.0",
              "target_name": "g", "results": [result]}
    assert schema_errors(report, "wire-conformance-case-results.schema.json") == []


@pytest.mark.interop
def test_the_evidence_says_what_happened(results: dict[str, dict[str, Any]]) -> None:
    multi = results["wire.host-route.server.multi-listener"]["route_evidence"]
    assert {(s["transport"], s["active_transport"]) for s in multi["accepted_sessions"]} == {
        ("tcp", "tcp"), ("ipc", "ipc")}
    assert [item["state"] for item in multi["listeners"]] == ["accepted", "accepted"]
    secure = results["wire.host-route.native.security-matrix"]["route_evidence"]
    assert {s["transport"] for s in secure["accepted_sessions"]} == {"tcp", "quic"}
    rollback = results["wire.host-route.server.atomic-bind-rollback"]
    assert "address already in use" in rollback["message"]
    assert [item["state"] for item in rollback["route_evidence"]["listeners"]] == \
        ["rolled_back", "failed"]
    failure = results["wire.host-route.server.terminal-listener-failure"]
    assert failure["route_evidence"]["terminal_failure"] == "nnrp.transport.tcp.native"
    assert failure["message"].startswith("listener tcp://")
    # The target's gateway has no vLLM (NNRP_GATEWAY_VLLM_URL unset): nothing is said of it.
    assert failure["message"].endswith("; readiness fails with it")
    assert "vLLM" not in failure["message"]
    assert [item["state"] for item in failure["route_evidence"]["listeners"]] == \
        ["closed", "failed"]


@pytest.mark.interop
def test_the_runners_rules_catch_wrong_evidence(results: dict[str, dict[str, Any]]) -> None:
    """validate_route is the runner's judge: evidence that misreports fails it."""
    scenarios = {s["id"]: s for s in host_route_scenarios()}
    providers = host_route_providers()
    failure_id = "wire.host-route.server.terminal-listener-failure"
    good = results[failure_id]
    assert validate_route(scenarios[failure_id], good, providers) == []
    shrunk = json.loads(json.dumps(good))
    shrunk["route_evidence"]["logical_set_closed"] = False  # "silently shrinking"
    assert validate_route(scenarios[failure_id], shrunk, providers) == [
        "logical_set_closed is False, expected True"]
    multi_id = "wire.host-route.server.multi-listener"
    half = json.loads(json.dumps(results[multi_id]))
    half["route_evidence"]["accepted_sessions"].pop()
    assert validate_route(scenarios[multi_id], half, providers) == [
        "missing accepted ipc session"]
    undeclared = [p for p in providers if p["transport"] != "ipc"]
    assert "undeclared provider nnrp.transport.ipc.native" in validate_route(
        scenarios[multi_id], results[multi_id], undeclared)


def test_the_targets_default_upstream_reaches_nothing() -> None:
    """Without NNRP_GATEWAY_VLLM_URL the target's gateway forwards to a loopback port
    held bound and not listening: every probe is refused, nothing real on :8000 is asked."""
    with no_upstream() as url:
        port = int(url.rsplit(":", 1)[1])
        assert url == f"http://127.0.0.1:{port}" and port != 8000
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2)
