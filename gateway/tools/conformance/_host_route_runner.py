"""The suite runner's side of the host-route server scenarios, where the Rust runner
cannot run (``conformance host-routes``): select, resolve, run the target, connect,
validate, as nnrp-conformance's ``host_route.rs`` and ``validate-wire-results`` do.

Per scenario (``run_case``), as the runner does:

1. **Select** (``select``): a scenario whose mode the target manifest declares, whose
   every route's (transport, provider) is in its ``host_route_providers``, and whose
   required capabilities it claims (``host.routes``); each route's security mode must be
   one its provider declares.
2. **Resolve**: every ``suite://allocate/...`` locator becomes an address to bind
   (``tcp://127.0.0.1:0``, ``quic://127.0.0.1:0``, a fresh ``unix://`` path,
   ``ws[s]://localhost:0/nnrp``); a TLS route gets a fresh self-signed certificate for
   ``localhost`` (``server.der``, ``server-key.der``) that the client trusts alone.
3. **Run the target** with the runner's arguments. For a scenario expecting success,
   wait for its ready report, open one session on every listener with nnrp-py's native
   client (the suite's own Rust client, nnrp-rs, through nnrp-py: an outside referee),
   then close them all.
4. **Judge**: the target's exit status (0), its one result, the route evidence against
   ``expect.route`` (``validate_route``: the runner's rules), the accepted sessions
   against the connections made; for an error scenario, every listener of the ready
   report (or of the resolved routes) that was not the injected one must refuse a
   connection after the target is gone.

Everything here is blocking (subprocesses, nnrp-py's native client): run it in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import secrets
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ._host_route import PROTOCOL_VERSION
from ._suite import load_json, suite_dir

CASE_FILE = "host-route-e2e.json"


class CaseError(Exception):
    """The runner would reject this case; the message says why."""


def host_route_scenarios() -> list[dict[str, Any]]:
    path = suite_dir() / "wire-conformance" / "nnrp-1-preview4" / "cases" / CASE_FILE
    scenarios: list[dict[str, Any]] = load_json(path)["scenarios"]
    return scenarios


def select_host_routes(target: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The host-route scenarios the runner's ``wire-plan`` selects for ``target`` (a
    target manifest), and the ids it leaves out."""
    wire = target["wire_conformance"]
    modes, capabilities = set(wire["modes"]), set(wire["capabilities"])
    providers = {(p["transport"], p["provider_id"]): p
                 for p in wire.get("host_route_providers", ())}
    selected, left_out = [], []
    for scenario in host_route_scenarios():
        routes = scenario["host_route"]["routes"]
        if (scenario["mode"] in modes
                and all((r["transport"], r["provider_id"]) in providers for r in routes)
                and set(scenario["required_capabilities"]) <= capabilities):
            for route in routes:
                provider = providers[(route["transport"], route["provider_id"])]
                if route["security"]["mode"] not in provider["security_modes"]:
                    raise CaseError(f"{scenario['id']}: provider {route['provider_id']} "
                                    f"does not declare {route['security']['mode']}")
            selected.append(scenario)
        else:
            left_out.append(scenario["id"])
    return selected, left_out


def resolve(scenario: dict[str, Any], case_root: Path) -> dict[str, Any]:
    """The scenario with every locator an address to bind (the runner's
    ``allocate_server_locator``)."""
    resolved: dict[str, Any] = json.loads(json.dumps(scenario))
    for route in resolved["host_route"]["routes"]:
        transport, mode = route["transport"], route["security"]["mode"]
        if transport == "ipc":
            # Short: a unix socket path has about 100 bytes.
            route["locator"] = (f"unix://{tempfile.gettempdir()}/nnrp-host-route-"
                                f"{secrets.token_hex(6)}.sock")
        elif transport == "websocket":
            route["locator"] = f"{'ws' if mode == 'plain' else 'wss'}://localhost:0/nnrp"
        else:
            route["locator"] = f"{transport}://127.0.0.1:0"
    return resolved


def make_certificate(case_root: Path) -> bytes:
    """A self-signed certificate for ``localhost`` (the runner's
    ``self_signed_localhost``): ``server.der`` and ``server-key.der``; returns the DER."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from .._selfsigned import self_signed

    certificate, key = self_signed("localhost", [x509.DNSName("localhost")],
                                   datetime.timedelta(hours=1))
    der = certificate.public_bytes(serialization.Encoding.DER)
    (case_root / "server.der").write_bytes(der)
    (case_root / "server-key.der").write_bytes(key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return der


def _step_s(scenario: dict[str, Any]) -> float:
    return float(max(step.get("timeout_ms", 1000) for step in scenario["steps"])) / 1000


def _native_options(route: dict[str, Any], locator: str, trusted: bytes | None) -> Any:
    """nnrp-py's native client forced onto one route (the runner's ``wire_endpoint``:
    TLS by the route's security mode, the server name ``localhost``)."""
    from nnrp.client.native import NativeClientOptions, NativeClientProviderRoute
    from nnrp.core.messages import TransportPolicy
    from nnrp.native import NativeTransportClientSecurity

    transport = route["transport"]
    secure = route["security"]["mode"] != "plain"
    security = (NativeTransportClientSecurity("localhost", trusted)
                if secure and trusted is not None else None)
    policy = {"tcp": TransportPolicy.FORCE_TCP, "quic": TransportPolicy.FORCE_QUIC,
              "ipc": TransportPolicy.FORCE_IPC,
              "websocket": TransportPolicy.FORCE_WEBSOCKET}[transport]
    return NativeClientOptions(
        f"nnrp{'s' if secure else ''}://host-route.test",
        provider_routes={transport: NativeClientProviderRoute(provider_endpoint=locator,
                                                              security=security)},
        transport_policy=policy)


def _connect_each(routes: list[dict[str, Any]], trusted: bytes | None,
                  deadline: float) -> list[tuple[str, str]]:
    """Open a session on every listener (retrying until ``deadline``, as the runner's
    ``connect_with_retry``), then close them all: the (transport, provider) of each
    session opened."""
    from nnrp.client.native import NativeClientSessionOptions, connect_native_client_connection

    opened: list[tuple[str, str]] = []
    with contextlib.ExitStack() as connections:
        sessions = []
        for route in routes:
            options = _native_options(route, route["locator"], trusted)
            while True:
                try:
                    scope = connect_native_client_connection(options)
                    connection = scope.__enter__()
                    break
                except Exception:  # nnrp-py raises its own errors; the runner retries all
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.025)  # the runner's retry interval
            connections.callback(_leave, scope)
            sessions.append(asyncio.run(connection.open_session(NativeClientSessionOptions())))
            opened.append((route["transport"], route["provider_id"]))
        for session in sessions:
            session.close()
    return opened


def _leave(scope: Any) -> None:
    with contextlib.suppress(Exception):  # nnrp-py may raise closing a closed connection
        scope.__exit__(None, None, None)


def _ready_routes(path: Path, scenario: dict[str, Any]) -> list[dict[str, Any]]:
    report = json.loads(path.read_text())
    if report.get("protocol_version") != PROTOCOL_VERSION or \
            report.get("scenario_id") != scenario["id"]:
        raise CaseError("the ready report is for another scenario")
    routes = []
    for route in scenario["host_route"]["routes"]:
        listener = next((item for item in report["listeners"]
                         if (item["transport"], item["provider_id"])
                         == (route["transport"], route["provider_id"])), None)
        if listener is None:
            raise CaseError(f"the ready report omits {route['provider_id']}")
        routes.append({**route, "locator": listener["bound_endpoint"]})
    if len(report["listeners"]) != len(routes):
        raise CaseError("the ready report has listeners outside the scenario")
    return routes


def _refuses(locator: str) -> bool:
    """Nothing accepts at a stream listener's address any more (quic: not probed here,
    UDP has no refusal to observe)."""
    scheme, rest = locator.split("://", 1)
    try:
        if scheme == "unix":
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(2)
                sock.connect(rest)
        elif scheme in ("tcp", "ws", "wss"):
            host_port = rest.split("/", 1)[0]
            host, port = host_port.rsplit(":", 1)
            if port == "0":
                return True
            socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
        else:
            return True
    except OSError:
        return True
    return False


def validate_route(scenario: dict[str, Any], result: dict[str, Any],
                   providers: list[dict[str, Any]]) -> list[str]:
    """The runner's route-evidence rules for one passed result (nnrp-conformance
    ``validate-wire-results``, host-route part)."""
    expect = scenario["expect"]
    route_expect = expect["route"]
    routes = scenario["host_route"]["routes"]
    problems = []
    if result.get("terminal") != expect["terminal"]:
        problems.append(f"terminal {result.get('terminal')}, expected {expect['terminal']}")
    evidence = result.get("route_evidence")
    if evidence is None:
        return [*problems, "no route evidence"]
    identities = {(r["transport"], r["provider_id"], r["locator"]) for r in routes}
    candidates = {(c["transport"], c["provider_id"], c["requested_locator"])
                  for c in evidence["candidates"]}
    if candidates != identities or len(candidates) != len(evidence["candidates"]):
        problems.append("candidate identities do not match the suite-owned route set")
    declared = {(p["transport"], p["provider_id"]) for p in providers}
    for candidate in evidence["candidates"]:
        if (candidate["transport"], candidate["provider_id"]) not in declared:
            problems.append(f"undeclared provider {candidate['provider_id']}")
        if candidate["selected"] and ("rejection_reason" in candidate or
                                      not candidate["locator_resolved"]
                                      or not candidate["security_satisfied"]):
            problems.append(f"selected {candidate['transport']} route is rejected")
    for listener in evidence["listeners"]:
        if (listener["transport"], listener["provider_id"],
                listener["requested_locator"]) not in identities:
            problems.append("listener evidence outside the suite-owned route set")
    bound = {item["transport"] for item in evidence["listeners"] if "bound_endpoint" in item}
    problems += [f"missing bound {t} listener" for t in route_expect.get("bound_transports", ())
                 if t not in bound]
    sessions = evidence["accepted_sessions"]
    for session in sessions:
        if session["transport"] != session["active_transport"]:
            problems.append("an accepted session reports another active transport")
        if (session["transport"], session["provider_id"]) not in {
                (r["transport"], r["provider_id"]) for r in routes}:
            problems.append("an accepted session outside the suite-owned route set")
    if len({(s["transport"], s["provider_id"]) for s in sessions}) != len(sessions):
        problems.append("duplicate accepted-session evidence")
    accepted = {s["active_transport"] for s in sessions}
    problems += [f"missing accepted {t} session"
                 for t in route_expect.get("accepted_transports", ()) if t not in accepted]
    for field in ("atomic_rollback", "logical_set_closed"):
        if field in route_expect and route_expect[field] != evidence[field]:
            problems.append(f"{field} is {evidence[field]}, expected {route_expect[field]}")
    if "terminal_failure" in route_expect and \
            route_expect["terminal_failure"] != evidence.get("terminal_failure"):
        problems.append(f"terminal_failure is {evidence.get('terminal_failure')}, expected "
                        f"{route_expect['terminal_failure']}")
    return problems


def compile_imported_modules() -> int:
    """Write bytecode for every module this process has imported, where imports look for
    it; returns how many were (re)compiled. The target is another process importing the
    same modules (the gateway, the CLI): without bytecode (a fresh venv, or
    PYTHONDONTWRITEBYTECODE, which ``compileall`` does not obey) it compiles some 460 of
    them from source inside the runner's budget, its step's timeout + 5 s. Fresh
    bytecode is left alone, and so is the interpreter's own library (the standard
    library ships compiled); a source that cannot be written beside is passed over."""
    import compileall
    import sys

    compiled = 0
    for module in list(sys.modules.values()):
        source = getattr(module, "__file__", None) or ""
        installed_with_python = (source.startswith(sys.base_prefix)
                                 and not source.startswith(sys.prefix))
        if source.endswith(".py") and not installed_with_python:
            with contextlib.suppress(OSError):
                compiled += bool(compileall.compile_file(source, quiet=2))
    return compiled


def run_host_route_case(scenario: dict[str, Any], target: list[str], case_root: Path,
             providers: list[dict[str, Any]], *, suite_version: str = "0.1.0",
             target_name: str = "nnrp-vllm-gateway") -> dict[str, Any]:
    """One scenario, end to end (module steps 2 to 4); its case result, with the
    runner's verdict folded in (``outcome`` failed and ``message`` saying why)."""
    case_root.mkdir(parents=True, exist_ok=True)
    needs_tls = any(r["security"]["mode"] != "plain" for r in scenario["host_route"]["routes"])
    trusted = make_certificate(case_root) if needs_tls else None
    resolved = resolve(scenario, case_root)
    paths = {name: case_root / f"{name}.json"
             for name in ("scenario", "resolved-scenario", "target-result", "target-ready")}
    paths["scenario"].write_text(json.dumps(scenario, indent=2))
    paths["resolved-scenario"].write_text(json.dumps(resolved, indent=2))
    # The runner's wire_timeout, given afresh to each phase (ready, connect, exit).
    budget = _step_s(scenario) + 5.0
    started = time.monotonic()
    observed: list[tuple[str, str]] = []
    problems: list[str] = []
    with (case_root / "target.stderr.log").open("wb") as stderr:
        child = subprocess.Popen(
            [*target, "--scenario", str(paths["scenario"]), "--resolved-scenario",
             str(paths["resolved-scenario"]), "--output", str(paths["target-result"]),
             "--ready-output", str(paths["target-ready"]), "--artifacts", str(case_root),
             "--suite-version", suite_version, "--target-name", target_name],
            stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            if scenario["expect"]["terminal"] == "success":
                while not paths["target-ready"].is_file():
                    if child.poll() is not None or time.monotonic() - started > budget:
                        break
                    time.sleep(0.02)  # the runner polls for the file every 20 ms
                if paths["target-ready"].is_file():
                    routes = _ready_routes(paths["target-ready"], scenario)
                    observed = _connect_each(routes, trusted, time.monotonic() + budget)
            status = child.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            problems.append("the target exceeded the scenario's time")
            status = None
        except CaseError as exc:
            problems.append(str(exc))
            status = child.wait(timeout=budget)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    if status not in (0, None):
        problems.append(f"the target exited with status {status}: "
                        f"{(case_root / 'target.stderr.log').read_text()[-2000:]}")
    result: dict[str, Any] = {"id": scenario["id"], "outcome": "failed", "terminal": "error",
                              "observed_frames": []}
    if paths["target-result"].is_file():
        report = json.loads(paths["target-result"].read_text())
        if (report.get("protocol_version"), report.get("suite_version"),
                report.get("target_name")) != (PROTOCOL_VERSION, suite_version, target_name):
            problems.append("the target's report identity does not match")
        elif len(report.get("results", ())) != 1 or report["results"][0]["id"] != scenario["id"]:
            problems.append("the target must report exactly the requested scenario")
        else:
            result = report["results"][0]
    elif not problems:
        problems.append("the target wrote no result")
    if result.get("outcome") == "passed":
        problems += validate_route(scenario, result, providers)
        if scenario["expect"]["terminal"] == "success":
            reported = {(s["transport"], s["provider_id"])
                        for s in result["route_evidence"]["accepted_sessions"]}
            if reported != set(observed):
                problems.append(f"accepted-session evidence {sorted(reported)} does not "
                                f"match the suite's connections {sorted(observed)}")
        else:
            closure = (_ready_routes(paths["target-ready"], scenario)
                       if paths["target-ready"].is_file() else resolved["host_route"]["routes"])
            for route in closure:
                injected = set(route.get("injected_failures", ())) & {
                    "bind_failure", "terminal_listener_failure"}
                if not injected and not _refuses(route["locator"]):
                    problems.append(f"{route['locator']} accepts after the target reported "
                                    "rollback or closure")
    elif result.get("outcome") != "passed" and not problems:
        problems.append(result.get("message", "the target reported a failure"))
    if problems:
        result = {**result, "outcome": "failed",
                  "message": "; ".join(dict.fromkeys(problems))}
    result["evidence_paths"] = [str(case_root)]
    return result
