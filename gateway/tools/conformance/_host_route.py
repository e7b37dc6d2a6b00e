"""The host-route target: the gateway's own listener set through the suite's server-role
host-route scenarios (nnrp-rs runner: ``wire-run --host-route-target EXE``).

The runner's contract (nnrp-conformance ``host_route.rs``; nnrp-py's
``nnrp-wire-host-route-target`` takes the same arguments): per scenario it writes the
scenario and a *resolved* copy (each ``suite://allocate/...`` locator replaced by an
address to bind: ``tcp://127.0.0.1:0``, ``quic://127.0.0.1:0``, ``unix:///tmp/...``,
``ws://localhost:0/nnrp``) and, for a TLS route, its own self-signed certificate for
``localhost`` (``server.der``, ``server-key.der`` in the artifacts folder), then runs
the target. A scenario expecting success waits for the ready report (every bound
listener), opens one session on each and closes them; the target reports which it
accepted. A scenario expecting an error waits for the target to exit and then checks
that nothing of the set still accepts. The target exits 0 whenever it wrote a result.

Scenarios (``SCENARIOS``: the steps the suite names, and what the gateway does):

| step                  | scenario                          | the gateway's listener set  |
|-----------------------|-----------------------------------|-----------------------------|
| connect_each_listener | server.multi-listener (tcp, ipc); | binds every route, serves a |
|                       | native.security-matrix (tcps with | session on each, reports    |
|                       | the route's certificate, quic)    | each accepted               |
| bind_routes           | server.atomic-bind-rollback       | a bind fails: the listeners |
|                       |                                   | bound before it are closed  |
| fail_listener         | server.terminal-listener-failure  | one listener fails after    |
|                       |                                   | bind: the whole set closes, |
|                       |                                   | readiness fails             |

How a route becomes a ``--listen`` URI (``listener_uri``): tcp plain is ``tcp://``, tcp
``tls_server_auth`` is ``tcps://``; quic, ipc (``unix://``) and websocket (``ws://``,
``wss://``) keep the resolved locator. The ready report names a tcps listener
``tcp://host:port``: the runner strips ``tcp://`` and chooses TLS by the route's
security mode, not by a scheme.

Injected failures are real failures of the gateway's own code, never a simulated result:

* ``bind_failure``: the route's address is taken first (a listening socket on a port of
  its own for tcp and websocket, a bound UDP socket for quic, a regular file at a unix
  path), so the gateway's bind fails as an operator's would.
* ``terminal_listener_failure``: once the set serves, the route's listening socket is
  shut down (shutdown(2) on the bound socket: accept() fails with EINVAL from then on),
  which the server's accept loop finds terminal (``transport.ACCEPT_FAILURES``).

The evidence is what was observed, and checked before it is reported passed: every
listener a rollback or a failure closed is connected to again and must refuse.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import trio

from gateway.app import Gateway, GatewayConfig
from gateway.manifest import PROVIDERS, SECURITY_MODES, SUITE_VERSION, write_atomically
from gateway.transport import ListenError, TlsConfig, parse_endpoint

PROTOCOL_VERSION = "nnrp-1-preview4"
#: What each step of a server scenario is, and the terminal it ends with (module table).
SCENARIOS = {"connect_each_listener": "success", "bind_routes": "error",
             "fail_listener": "error"}
#: Slack on top of the scenario's step timeout the runner allows the whole case.
RUNNER_SLACK_S = 5.0


class ScenarioRefused(Exception):
    """The scenario is not one this target runs as given; the message says why."""


@attrs.frozen
class Route:
    transport: str
    provider_id: str
    locator: str  # as the scenario names it (suite://allocate/...): the evidence's key
    resolved: str  # the address the runner resolved it to
    security: str
    failures: frozenset[str]

    @property
    def secure(self) -> bool:
        return self.security != "plain"


def routes_of(scenario: dict[str, Any], resolved: dict[str, Any]) -> list[Route]:
    """The scenario's routes beside their resolved locators (same providers, same order)."""
    if scenario.get("id") != resolved.get("id"):
        raise ScenarioRefused("the resolved scenario is another scenario")
    fixture, resolved_fixture = scenario.get("host_route"), resolved.get("host_route")
    if not isinstance(fixture, dict) or not isinstance(resolved_fixture, dict):
        raise ScenarioRefused("not a host-route scenario (no host_route)")
    if fixture.get("role") != "server":
        raise ScenarioRefused("the gateway is a server: client-role host-route scenarios are "
                              "not claimed (its manifest declares suite_as_client only)")
    pairs = list(zip(fixture["routes"], resolved_fixture["routes"], strict=True))
    routes = []
    for route, resolved_route in pairs:
        transport = route["transport"]
        if (resolved_route["transport"], resolved_route["provider_id"]) != (
                transport, route["provider_id"]):
            raise ScenarioRefused("the resolved scenario changes a route's provider")
        if PROVIDERS.get(transport) != route["provider_id"]:
            raise ScenarioRefused(f"provider {route['provider_id']} is not one the gateway "
                                  "declares")
        security = route["security"]["mode"]
        if security not in SECURITY_MODES[transport]:
            raise ScenarioRefused(f"{transport} routes do not serve {security} security")
        routes.append(Route(transport, route["provider_id"], route["locator"],
                            resolved_route["locator"], security,
                            frozenset(route.get("injected_failures", ()))))
    return routes


def listener_uri(route: Route) -> str:
    """The gateway's ``--listen`` URI for a route (module docstring)."""
    if route.transport == "tcp":
        address = route.resolved.removeprefix("tcp://")
        return f"tcps://{address}" if route.secure else f"tcp://{address}"
    return route.resolved


def ready_endpoint(uri: str) -> str:
    """A bound listener as the runner dials it (a tcps listener is ``tcp://``)."""
    return "tcp://" + uri.removeprefix("tcps://") if uri.startswith("tcps://") else uri


def tls_from_artifacts(artifacts: Path) -> TlsConfig:
    """The runner's DER certificate and PKCS#8 key as the PEM files the gateway serves."""
    certificate = (artifacts / "server.der").read_bytes()
    key = base64.encodebytes((artifacts / "server-key.der").read_bytes()).decode()
    folder = artifacts / "gateway-tls"
    folder.mkdir(exist_ok=True)
    files = {"server.pem": ssl.DER_cert_to_PEM_cert(certificate),
             "server.key": f"-----BEGIN PRIVATE KEY-----\n{key}-----END PRIVATE KEY-----\n"}
    for name, text in files.items():
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
    return TlsConfig(folder / "server.pem", folder / "server.key")


# --------------------------------------------------------------------------- injections


@contextlib.contextmanager
def address_taken(uri: str) -> Iterator[str]:
    """``bind_failure``: hold the address a listener is about to bind, and yield the URI
    that now cannot be bound (port 0 gets a port of its own first)."""
    spec = parse_endpoint(uri)
    if spec.scheme == "unix":
        Path(spec.path).write_text("not a socket: taken by the bind_failure injection\n")
        try:
            yield uri
        finally:
            with contextlib.suppress(OSError):
                os.unlink(spec.path)
        return
    kind = socket.SOCK_DGRAM if spec.scheme == "quic" else socket.SOCK_STREAM
    family = socket.AF_INET6 if ":" in spec.host else socket.AF_INET
    with socket.socket(family, kind) as holder:
        holder.bind((spec.host if spec.host != "localhost" else "127.0.0.1", spec.port))
        if kind == socket.SOCK_STREAM:
            holder.listen()
        port = holder.getsockname()[1]
        yield uri.replace(f":{spec.port}", f":{port}", 1)


@contextlib.contextmanager
def no_upstream() -> Iterator[str]:
    """A vLLM URL that refuses every connection and reaches nothing: a loopback port this
    process holds bound without listening, for as long as the scenario runs (no other
    process can listen there meanwhile)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{holder.getsockname()[1]}"


def break_listener(port: int) -> int:
    """``terminal_listener_failure``: shut down this process's listening TCP socket on
    ``port`` (shutdown(2) acts on the socket, whoever's descriptor it is through), so its
    accept() fails with EINVAL from now on. Returns how many sockets it broke."""
    broken = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue  # not a socket (or gone since the listing)
        with sock:
            try:
                listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                address = sock.getsockname()
            except OSError:
                continue
            if (sock.type == socket.SOCK_STREAM and listening and isinstance(address, tuple)
                    and address[1] == port):
                sock.shutdown(socket.SHUT_RDWR)
                broken += 1
    return broken


#: Seconds a QUIC probe waits for its handshake: a listener that stopped accepting drops
#: a new Initial without a word (its socket may stay open for the sessions it still
#: serves), so silence for this long is the refusal; on loopback a handshake takes ms.
QUIC_PROBE_S = 2.0


async def refuses(uri: str) -> bool:
    """Whether nothing accepts a connection at a listener any more (stream listeners:
    the connect is refused; a unix path is refused or gone; quic: a real handshake
    does not complete within ``QUIC_PROBE_S``, as a TCP connect to a UDP port proves
    nothing)."""
    spec = parse_endpoint(uri)
    if spec.scheme == "quic":
        return not await _quic_handshake_completes(spec.host, spec.port)
    try:
        with trio.fail_after(2):
            if spec.scheme == "unix":
                stream: trio.abc.Stream = await trio.open_unix_socket(spec.path)
            else:
                stream = await trio.open_tcp_stream(spec.host, spec.port)
    except (OSError, trio.TooSlowError):
        return True
    await stream.aclose()
    return False


async def _quic_handshake_completes(host: str, port: int) -> bool:
    from gateway.transport import QuicClientOptions, connect

    # The question is whether the listener accepts, not whether its certificate is
    # trusted: the probe checks no certificate and offers no ALPN (which the listener's
    # default policy accepts), so only a listener that is not accepting fails it.
    unchecked = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    unchecked.check_hostname = False
    unchecked.verify_mode = ssl.CERT_NONE
    failed = False
    with trio.move_on_after(QUIC_PROBE_S) as waited:
        try:
            async with trio.open_nursery() as nursery:
                transport = await connect(f"quic://{host}:{port}", nursery, unchecked,
                                          quic=QuicClientOptions(idle_timeout=QUIC_PROBE_S))
                await transport.aclose()
        except* OSError:  # QuicConnectError, or an ICMP refusal: the socket is gone
            failed = True
    return not failed and not waited.cancelled_caught


# --------------------------------------------------------------------------- the scenario


def _candidates(routes: list[Route]) -> list[dict[str, Any]]:
    # A server listens on every route it is given: none is "selected" (a client's word).
    return [{"transport": r.transport, "provider_id": r.provider_id,
             "requested_locator": r.locator, "locator_resolved": True,
             "security_satisfied": True, "selected": False} for r in routes]


def _evidence(fixture: dict[str, Any], routes: list[Route], listeners: list[dict[str, Any]],
              accepted: list[str], *, atomic_rollback: bool = False,
              logical_set_closed: bool = False,
              terminal_failure: str | None = None) -> dict[str, Any]:
    evidence: dict[str, Any] = {
        "application_endpoint": fixture["application_endpoint"],
        "candidates": _candidates(routes), "listeners": listeners,
        "accepted_sessions": [{"transport": t, "provider_id": PROVIDERS[t],
                               "active_transport": t} for t in accepted],
        "atomic_rollback": atomic_rollback, "logical_set_closed": logical_set_closed}
    if terminal_failure is not None:
        evidence["terminal_failure"] = terminal_failure
    return evidence


def _result(scenario: dict[str, Any], terminal: str, evidence: dict[str, Any] | None,
            problem: str | None, message: str) -> dict[str, Any]:
    result: dict[str, Any] = {"id": scenario["id"],
                              "outcome": "passed" if problem is None else "failed",
                              "terminal": terminal if problem is None else "error",
                              "observed_frames": [], "message": problem or message,
                              "evidence_paths": []}
    if evidence is not None:
        result["route_evidence"] = evidence
    return result


async def run_host_route(scenario: dict[str, Any], resolved: dict[str, Any], *,
                       artifacts: Path, ready_output: Path,
                       vllm_url: str | None = None) -> dict[str, Any]:
    """Run one server-role scenario against a real ``Gateway``; its case result. The
    scenarios only open and close sessions: without ``vllm_url`` the gateway's upstream
    is ``no_upstream()``, so nothing real (a vLLM on :8000) is ever probed."""
    try:
        routes = routes_of(scenario, resolved)
        (step,) = {s["action"] for s in scenario["steps"]}
        if step not in SCENARIOS:
            raise ScenarioRefused(f"no server-role step {step!r}")
    except (ScenarioRefused, KeyError, TypeError, ValueError) as exc:
        return _result(scenario, "error", None, f"not run: {exc}", "")
    step_s = max(s.get("timeout_ms", 1000) for s in scenario["steps"]) / 1000
    tls = tls_from_artifacts(artifacts) if any(r.secure for r in routes) else None
    with contextlib.ExitStack() as held:
        if vllm_url is None:
            vllm_url = held.enter_context(no_upstream())
        uris = [held.enter_context(address_taken(listener_uri(r)))
                if "bind_failure" in r.failures else listener_uri(r) for r in routes]
        config = GatewayConfig(listen=tuple(uris), vllm_url=vllm_url, tls=tls,
                               drain_timeout=1.0, drain_close_grace=0.5)
        gateway = Gateway(config)
        async with trio.open_nursery() as nursery:
            try:
                result = await _run_step(step, scenario, routes, uris, gateway, nursery,
                                         ready_output, step_s)
            finally:
                nursery.cancel_scope.cancel()
    return result


async def _run_step(step: str, scenario: dict[str, Any], routes: list[Route], uris: list[str],
                    gateway: Gateway, nursery: trio.Nursery, ready_output: Path,
                    step_s: float) -> dict[str, Any]:
    fixture = scenario["host_route"]
    rollback: BaseExceptionGroup[ListenError] | None = None
    try:
        endpoints = await nursery.start(gateway.run)
    except* ListenError as failures:
        rollback = failures
    if rollback is not None:
        return await _rolled_back(scenario, routes, uris, gateway, rollback)
    if step == "bind_routes":
        return _result(scenario, "success", None,
                       "every listener bound although a bind failure was injected", "")
    bound = [ready_endpoint(e.uri) for e in endpoints]
    write_atomically(ready_output, {
        "$schema": "../schemas/wire-host-route-ready.schema.json",
        "protocol_version": PROTOCOL_VERSION, "scenario_id": scenario["id"],
        "listeners": [{"transport": r.transport, "provider_id": r.provider_id,
                       "bound_endpoint": uri} for r, uri in zip(routes, bound, strict=True)]})
    if step == "fail_listener":
        return await _failed_listener(scenario, routes, endpoints, gateway, step_s)
    stats = gateway.server.stats
    wanted = {r.transport for r in routes}
    # Every route's session opened, then closed by the runner (it closes them all): the
    # server counts sessions and signals nothing, so the counters are read every 10 ms.
    with trio.move_on_after(step_s + RUNNER_SLACK_S - 1):
        while True:
            if wanted <= stats.sessions_by_transport.keys() and stats.sessions_active == 0:
                break
            await trio.sleep(0.01)
    accepted = [t for t in dict.fromkeys(r.transport for r in routes)
                if stats.sessions_by_transport.get(t)]
    listeners = [{"transport": r.transport, "provider_id": r.provider_id,
                  "requested_locator": r.locator, "bound_endpoint": uri,
                  "state": "accepted" if r.transport in accepted else "opened"}
                 for r, uri in zip(routes, bound, strict=True)]
    missing = sorted(wanted - set(accepted))
    problem = (f"no session arrived on {', '.join(missing)} within the step's "
               f"{step_s * 1000:.0f} ms" if missing else None)
    return _result(scenario, "success", _evidence(fixture, routes, listeners, accepted),
                   problem, "the gateway's listener set served a session on every route")


async def _rolled_back(scenario: dict[str, Any], routes: list[Route], uris: list[str],
                       gateway: Gateway, failures: BaseExceptionGroup[ListenError]
                       ) -> dict[str, Any]:
    error = failures.exceptions[0]
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    opened = [e.uri for e in gateway.server.endpoints]
    failed = [r for r, uri in zip(routes, uris, strict=True) if uri in str(error)]
    problems = []
    if [r for r in failed if "bind_failure" not in r.failures] or not failed:
        problems.append(f"a bind failed that was not injected: {error}")
    still = [uri for uri in opened if not await refuses(uri)]
    problems += [f"{uri} still accepts after the rollback" for uri in still]
    listeners = []
    for route, uri in zip(routes, uris, strict=True):
        bound = next((e for e in opened if _same_listener(e, uri)), None)
        if route in failed:
            listeners.append({"transport": route.transport, "provider_id": route.provider_id,
                              "requested_locator": route.locator, "state": "failed"})
        elif bound is not None:
            listeners.append({"transport": route.transport, "provider_id": route.provider_id,
                              "requested_locator": route.locator,
                              "bound_endpoint": ready_endpoint(bound), "state": "rolled_back"})
    evidence = _evidence(scenario["host_route"], routes, listeners, [],
                         atomic_rollback=bool(opened) and not still,
                         logical_set_closed=not still)
    return _result(scenario, "error", evidence, "; ".join(problems) or None,
                   f"{error}; the {len(opened)} listener(s) bound before it were closed "
                   "and refuse connections")


def _same_listener(bound_uri: str, configured: str) -> bool:
    spec, wanted = parse_endpoint(bound_uri), parse_endpoint(configured)
    if spec.scheme == "unix":
        return spec.path == wanted.path
    return spec.scheme == wanted.scheme and (wanted.port in (0, spec.port))


async def _failed_listener(scenario: dict[str, Any], routes: list[Route], endpoints: list[Any],
                           gateway: Gateway, step_s: float) -> dict[str, Any]:
    (target,) = [i for i, r in enumerate(routes) if "terminal_listener_failure" in r.failures]
    victim = endpoints[target]
    problems = []
    if victim.spec.scheme not in ("tcp", "tcps", "ws", "wss") or not break_listener(victim.port):
        problems.append(f"could not break {victim.uri}'s socket")
    with trio.move_on_after(step_s):
        await gateway.server.listener_set_failed.wait()
    failure = gateway.server.listener_failure
    if failure is None:
        problems.append(f"the listener set did not close within {step_s * 1000:.0f} ms")
    elif failure.uri != victim.uri:
        problems.append(f"{failure.uri} failed, not {victim.uri}")
    still = [e.uri for e in endpoints if not await refuses(e.uri)]
    problems += [f"{uri} still accepts after the set closed" for uri in still]
    readiness = gateway.readiness()
    if failure is not None and str(failure) not in readiness:
        problems.append(f"readiness does not report the failure: {readiness}")
    listeners = [{"transport": r.transport, "provider_id": r.provider_id,
                  "requested_locator": r.locator, "bound_endpoint": ready_endpoint(e.uri),
                  "state": "failed" if i == target else "closed"}
                 for i, (r, e) in enumerate(zip(routes, endpoints, strict=True))]
    evidence = _evidence(scenario["host_route"], routes, listeners, [],
                         logical_set_closed=failure is not None and not still,
                         terminal_failure=routes[target].provider_id if failure else None)
    return _result(scenario, "error", evidence, "; ".join(problems) or None,
                   # Readiness's own reasons about the upstream say nothing of the
                   # listener set (the target's gateway forwards to no real vLLM).
                   f"{failure}; readiness fails with it")


def host_route_report(result: dict[str, Any], *, suite_version: str = SUITE_VERSION,
           target_name: str = "nnrp-vllm-gateway") -> dict[str, Any]:
    """The one-result ``wire-conformance-case-results`` document the runner reads."""
    return {"$schema": "../schemas/wire-conformance-case-results.schema.json",
            "protocol_version": PROTOCOL_VERSION, "suite_version": suite_version,
            "target_name": target_name, "results": [result]}


def load_scenario(path: Path) -> dict[str, Any]:
    document = json.loads(path.read_text())
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a JSON object")
    return document
