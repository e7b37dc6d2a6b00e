"""Plan selection, the validator's rules, the target manifest, and a wire probe that fails."""

from __future__ import annotations

import base64
import copy
import json
import ssl
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway import nnrp
from gateway.profile import EndCause, runtime_tokens
from gateway.profile._capabilities import capability_document
from gateway.server import GatewayServer, Operation
from gateway.tools.client import Trust
from gateway.tools.conformance import (
    ManifestError,
    build_plan,
    check_case,
    probe,
    run_plan,
    run_wire_probe,
    runner_token_submit,
    scenarios_for,
    schema_errors,
    target_manifest,
    validate_results,
    validate_wire_case,
    write_atomically,
)
from gateway.tools.conformance._suite import capability_tokens, suite_recipes
from gateway.tools.conformance._wire import scenarios
from gateway.transport import TlsConfig
from tests.support.stack import Stack, start_stack
from tests.support.tls import make_pki


def caps(tool_calls: bool = True, extensions: bool = True) -> dict[str, Any]:
    document = capability_document(adapter="t", models=("m",), tool_calls=tool_calls)
    if not extensions:
        document["extensions"] = []
    return document


def test_tokens_and_selection() -> None:
    tokens = capability_tokens(caps())
    assert {"api.level1", "api.chat.completions.create", "api.streaming", "api.non_streaming",
            "api.tool_calls", "api.cancellation", "api.extension.vllm.reasoning"} <= tokens
    plan, not_claimed = build_plan(caps(tool_calls=False), include_project=False)
    assert "openai-compatible.chat.tool-call-delta" in not_claimed
    assert len(plan["cases"]) == len(suite_recipes()) - 1
    assert plan["cases"][0]["request"]["body"]["model"] == "example-model"  # ${MODEL_ID}
    assert schema_errors(plan, "api-profile-execution-plan.schema.json") == []
    replay_plan, replay_not_claimed = build_plan(caps(), replay_backend=True)
    assert not replay_not_claimed
    plain_plan, plain_not_claimed = build_plan(caps())
    assert "gateway.chat.request-timeout" in plain_not_claimed  # needs the replay backend
    assert len(replay_plan["cases"]) > len(plain_plan["cases"])


def test_project_recipes_are_schema_valid() -> None:
    recipes = sorted((Path(__file__).parents[2] / "recipes" / "gateway").glob("*.json"))
    assert len(recipes) >= 12
    for path in recipes:
        assert schema_errors(json.loads(path.read_text()), "api-profile-recipe.schema.json") == []


EXPECT = {"events": [{"type": "a", "optional": True}, {"type": "b", "min_count": 2},
                     {"type": "c", "fields": {"x": {"y": 1}}}], "terminal": "success"}


@pytest.mark.parametrize(("events", "terminal", "problem"), [
    ([{"type": "b"}, {"type": "b"}, {"type": "c", "x": {"y": 1, "z": 2}}], "success", None),
    ([{"type": "a"}, {"type": "b"}, {"type": "b"}, {"type": "c", "x": {"y": 1}}], "success", None),
    ([{"type": "b"}, {"type": "c", "x": {"y": 1}}], "success", "at least 2 b"),
    ([{"type": "c", "x": {"y": 1}}, {"type": "b"}, {"type": "b"}], "success", "c event"),
    ([{"type": "b"}, {"type": "b"}, {"type": "c", "x": {"y": 2}}], "success", "matching"),
    ([{"type": "b"}, {"type": "b"}, {"type": "c", "x": {"y": 1}}], "error", "terminal is error"),
])
def test_check_case_rules(events: list[dict[str, Any]], terminal: str,
                          problem: str | None) -> None:
    result = check_case(EXPECT, terminal, events)
    assert result is None if problem is None else problem in (result or "")


def test_error_terminal_needs_error_event() -> None:
    expect = {"events": [], "terminal": "error"}
    assert check_case(expect, "error", []) is not None
    assert check_case(expect, "error", [{"type": "response.error"}]) is None


def _results(plan: dict[str, Any]) -> dict[str, Any]:
    return {"profile": "openai-compatible", "schema_version": "openai-compatible/1",
            "adapter": "t", "results": [
                {"id": c["id"], "outcome": "passed", "terminal": c["expect"]["terminal"],
                 "events": [{"type": e["type"], **e.get("fields", {})}
                            for e in c["expect"]["events"] for _ in range(e.get("min_count", 1))]
                 + ([{"type": {"error": "response.error", "cancelled": "response.cancelled"}[
                     c["expect"]["terminal"]]}] if c["expect"]["terminal"] != "success" else [])}
                for c in plan["cases"]]}


def test_validate_is_strict() -> None:
    plan, _ = build_plan(caps(), include_project=False)
    good = _results(plan)
    assert validate_results(plan, good).ok
    # A self-reported pass whose events do not satisfy the recipe is a failure.
    lying = copy.deepcopy(good)
    lying["results"][0]["events"] = []
    report = validate_results(plan, lying)
    assert not report.ok
    assert report.failed
    missing = copy.deepcopy(good)
    missing["results"].pop()
    assert any("no result for" in e for e in validate_results(plan, missing).errors)
    duplicated = copy.deepcopy(good)
    duplicated["results"].append(duplicated["results"][0])
    assert any("duplicate" in e for e in validate_results(plan, duplicated).errors)
    unknown = copy.deepcopy(good)
    unknown["results"][0]["id"] = "nope"
    assert any("unknown case" in e for e in validate_results(plan, unknown).errors)
    broken = copy.deepcopy(good)
    broken["results"][0]["outcome"] = "maybe"
    assert any("api-profile-case-results" in e for e in validate_results(plan, broken).errors)


def test_target_manifest_is_schema_valid(tmp_path: Path) -> None:
    manifest = target_manifest(["tcp://127.0.0.1:7700", "unix:///run/g.sock",
                                "ws://127.0.0.1:7701/nnrp"], target_name="g",
                               max_frame_bytes=1 << 24, max_in_flight=64)
    assert schema_errors(manifest, "wire-conformance-target.schema.json") == []
    path = tmp_path / "ready" / "target.json"
    write_atomically(path, manifest)
    assert json.loads(path.read_text()) == manifest
    assert [p.name for p in path.parent.iterdir()] == ["target.json"]  # no temp file left


async def test_wire_probe_fails_a_target_that_breaks_the_mapping(nursery: trio.Nursery) -> None:
    async def sse_framed(op: Operation) -> None:
        await op.emit(b'data: {"type":"response.output_text.delta","index":0,"delta":"x"}')
        await op.close(EndCause.COMPLETED, b'{"type":"response.completed","body":{}}')

    server = GatewayServer(sse_framed)
    (endpoint,) = await nursery.start(server.serve, ["tcp://127.0.0.1:0"])
    with trio.fail_after(10):
        result = await probe(endpoint.uri)
    assert result["outcome"] == "failed"
    assert "PARTIAL_RESULT (received) body_framing is 'sse', expected 'raw'" in \
        result["message"]


# --------------------------------------------------------------------------- wire scenarios

#: The Rust runner's frames as nnrp-py 1.0.0rc4.post20's codecs encode them (session 1):
#: header, metadata, body.
RUNNER_BYTES = {
    "submit_101": (
        "4e4e52500100102800000000480000004d0000000100000001000000000000000000000000000000",
        "000000000000000000000000000001001900000000000000000000000000000000000000000000006500"
        "000000000000000000000000000000000000000000000200000001000000",
        "00000000000000001800000015000000000000000000000000000000000000000200020201100000030"
        "00000020000000000000015000000776972652d65787465726e616c2d72657175657374"),
    "cancel_101": (
        "4e4e5250010030280000000020000000000000000100000001000000000000000000000000000000",
        "6500000000000000650000000000000001000101000000000000000000000000", ""),
    "deadline_151": (
        "4e4e5250010033280000000020000000000000000100000001000000000000000000000000000000",
        "970000000000000001000000000000000000000000409452a303000000000000", ""),
    "close_101": (
        "4e4e5250010009280000000018000000000000000100000000000000000000000000000000000000",
        "010000000000000065000000000000000000000001000000", ""),
}


def test_probe_sends_the_runners_bytes() -> None:
    client, server = nnrp.ClientConnection(), nnrp.ServerConnection(nnrp.ServerConfig())

    def exchange(data: bytes) -> None:
        for event in server.receive_data(data):
            if isinstance(event, nnrp.SendBytes):
                client.receive_data(event.data)

    exchange(client.hello())
    exchange(client.open_session())
    meta, body = runner_token_submit(101)
    expected = {name: "".join(parts) for name, parts in RUNNER_BYTES.items()}
    assert client.submit_frame(1, 1, meta, body).hex() == expected["submit_101"]
    assert client.cancel(1, 101, frame_id=1, control_sequence=101, reason=1).hex() == \
        expected["cancel_101"]
    assert client.deadline(1, 151, 4_000_000_000_000, frame_id=1).hex() == \
        expected["deadline_151"]
    assert client.close_session(1, drain_timeout_ms=0, close_tag=1).hex() == \
        expected["close_101"]


def _observed(*frames: tuple[str, str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"direction": d, "frame": f, "payload": p, "timestamp_us": i}
            for i, (d, f, p) in enumerate(frames)]


def test_validate_is_as_strict_as_the_runner() -> None:
    cancel = next(s for s in scenarios_for("tcp://h:1")
                  if s["id"] == "wire.control.cancel-abort.client")
    good = _observed(("sent", "REQUEST", {}), ("sent", "CANCEL", {}),
                     ("received", "TRACE_CONTEXT", {"frame_id": 0}),
                     ("received", "RESULT_DROP_REASON", {"drop_reason_code": 3}))
    assert validate_wire_case(cancel, "cancelled", good) == []
    assert validate_wire_case(cancel, "success", good) == [
        "terminal success, expected cancelled"]
    swapped = [good[0], good[1], good[3], good[2]]
    assert "do not contain" in validate_wire_case(cancel, "cancelled", swapped)[0]
    traced_on_frame = copy.deepcopy(good)
    traced_on_frame[2]["payload"]["frame_id"] = 1
    assert validate_wire_case(cancel, "cancelled", traced_on_frame) == [
        "TRACE_CONTEXT (received) frame_id is 1, expected 0"]
    wrong_code = copy.deepcopy(good)
    wrong_code[3]["payload"]["drop_reason_code"] = 1
    assert validate_wire_case(cancel, "cancelled", wrong_code) == [
        "drop reason codes [1], expected 3"]
    extra = good + _observed(("received", "PROGRESS", {}))
    assert validate_wire_case(cancel, "cancelled", extra) == ["frame PROGRESS is not allowed"]
    level1 = next(s for s in scenarios_for("tcp://h:1")
                  if s["id"] == "wire.profile.openai-compatible.level1")
    # Every PARTIAL_RESULT must be a raw output_text.delta, not only the first.
    later = _observed(("sent", "REQUEST", {}), ("received", "PARTIAL_RESULT", {
        "event_type": "response.output_text.delta"}), ("received", "PARTIAL_RESULT", {
            "event_type": "response.created"}), ("received", "RESULT_PUSH", {}))
    problems = validate_wire_case(level1, "success", later)
    assert any("event_type is 'response.created'" in p for p in problems)


def test_scenarios_per_transport() -> None:
    ids = {name: [s["id"] for s in scenarios_for(uri)] for name, uri in (
        ("tcp", "tcp://h:1"), ("ipc", "unix:///s"), ("ws", "ws://h:1/n"), ("wss", "wss://h:1"))}
    assert sorted(ids["tcp"]) == ["wire.control.cancel-abort.client",
                                  "wire.control.deadline-before-submit.client",
                                  "wire.profile.openai-compatible.level1"]
    assert sorted(ids["ipc"]) == ["wire.control.cancel-abort.ipc-client",
                                  "wire.profile.openai-compatible.level1.ipc"]
    assert ids["ws"] == ids["wss"] == ["wire.profile.openai-compatible.level1.websocket"]
    # No TLS-over-TCP transport in the suite: the TCP cases under the project's ids.
    assert sorted(s["id"] for s in scenarios_for("tcps://h:1")) == [
        "gateway.wire.tcps.cancel-abort", "gateway.wire.tcps.deadline-before-submit",
        "gateway.wire.tcps.openai-compatible.level1"]
    # QUIC: the TCP cases under the project's ids, never a suite id (module docstring).
    quic = {s["id"]: s for s in scenarios_for("quic://h:1")}
    assert sorted(quic) == ["gateway.wire.quic.cancel-abort",
                            "gateway.wire.quic.deadline-before-submit",
                            "gateway.wire.quic.openai-compatible.level1"]
    tcp = {s["id"]: s for s in scenarios_for("tcp://h:1")}
    for scenario in quic.values():
        original = tcp[scenario["adapted_from"]]
        assert scenario["expect"] == original["expect"]
        assert scenario["steps"] == original["steps"]


def test_the_suites_quic_scenarios_are_not_claimed(tmp_path: Path) -> None:
    """A manifest that lists quic must not select the suite's QUIC scenarios, which the
    gateway cannot pass (a fixed result body; the suite as proxy): by mode or by the
    capability tokens, even with priority scheduling."""
    pki = make_pki(tmp_path)
    tokens = runtime_tokens(priority_scheduling=True)
    manifest = target_manifest(["quic://127.0.0.1:7704"], target_name="g",
                               max_frame_bytes=1 << 24, max_in_flight=64,
                               runtime_tokens=tokens,
                               tls_files=(pki["server"], pki["server_key"]),
                               security_dir=tmp_path / "sec")
    claims = manifest["wire_conformance"]
    suite_quic = [s for s in scenarios().values()
                  if s["transport"] == "quic" and "adapted_from" not in s]
    assert len(suite_quic) == 2
    selected = [s["id"] for s in suite_quic if s["mode"] in claims["modes"]
                and set(s["required_capabilities"]) <= set(claims["capabilities"])]
    assert selected == []


def test_manifest_for_tls_listeners(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    manifest = target_manifest(
        ["tcps://127.0.0.1:7702", "wss://127.0.0.1:7703/nnrp", "tcp://127.0.0.1:7700"],
        target_name="g", max_frame_bytes=1 << 24, max_in_flight=64,
        runtime_tokens={"control.cancel_abort", "control.trace_context"},
        tls_files=(pki["server"], pki["server_key"]), security_dir=tmp_path / "sec")
    assert schema_errors(manifest, "wire-conformance-target.schema.json") == []
    wss, tcp = manifest["wire_conformance"]["transports"]  # tcps has no schema form
    assert (wss["name"], wss["tls"], tcp["tls"]) == ("websocket", True, False)
    security = wss["security"]
    assert security["server_name"] == "127.0.0.1"
    leaf = Path(security["certificate_der_path"]).read_bytes()
    assert leaf == ssl.PEM_cert_to_DER_cert(pki["server"].read_text())
    key = Path(security["private_key_pkcs8_der_path"])
    assert key.stat().st_mode & 0o077 == 0
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # the DER pair loads
    der_pem = tmp_path / "roundtrip.pem"
    der_pem.write_text(ssl.DER_cert_to_PEM_cert(leaf) + "-----BEGIN PRIVATE KEY-----\n"
                       + base64.encodebytes(key.read_bytes()).decode()
                       + "-----END PRIVATE KEY-----\n")
    context.load_cert_chain(der_pem)
    assert manifest["wire_conformance"]["capabilities"] == [
        "profile.openai-compatible.level1.wire", "control.cancel_abort",
        "control.trace_context", "host.routes"]  # test_host_routes.py: the server side
    with pytest.raises(ManifestError, match="needs its certificate"):
        target_manifest(["wss://127.0.0.1:1/n"], target_name="g", max_frame_bytes=1,
                        max_in_flight=1)
    with pytest.raises(ManifestError, match="needs its certificate"):
        target_manifest(["quic://127.0.0.1:1"], target_name="g", max_frame_bytes=1,
                        max_in_flight=1)
    legacy = tmp_path / "legacy.key"
    legacy.write_text("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n")
    with pytest.raises(ManifestError, match="PKCS#8"):
        target_manifest(["wss://127.0.0.1:1/n"], target_name="g", max_frame_bytes=1,
                        max_in_flight=1, tls_files=(pki["server"], legacy),
                        security_dir=tmp_path / "sec2")


def hold_the_cancelled_completion(stack: Stack) -> None:
    """The cancel-abort scenarios' request (the runner's operation 101, a text completion
    of 64 tokens: 13 ms at the stack's speed) is still being generated when their CANCEL,
    written right after it, lands: the replay holds it until the gateway aborts it (if
    the CANCEL did not stop it before it was sent). The deadline scenario's identical
    request (operation 151) is answered."""
    stack.replay.hold(lambda request: request.path == "/v1/completions"
                      and request.headers.get("x-request-id", "").endswith("-101"))


async def test_wire_probe_passes_every_scenario_on_every_transport(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    stack = await start_stack(nursery, tmp_path)
    hold_the_cancelled_completion(stack)
    endpoints = [stack.uri(t) for t in ("tcp", "ipc", "websocket")]
    with trio.fail_after(60):
        report = await run_wire_probe(endpoints, target_name="g")
    assert schema_errors(report, "wire-conformance-case-results.schema.json") == []
    outcomes = {r["id"]: (r["outcome"], r.get("message")) for r in report["results"]}
    assert len(outcomes) == 6
    assert all(outcome == "passed" for outcome, _ in outcomes.values()), outcomes
    # The runner's request is a real generation (token profile: a text completion), so
    # the CANCEL, written right after it, meets it running every time.
    with trio.fail_after(60):
        for _ in range(20):
            result = await probe(stack.uri("tcp"), "wire.control.cancel-abort.client")
            assert result["outcome"] == "passed", result
    # None of them was answered (the CANCEL met each held, or before it was sent).
    assert not [r for r in stack.replay.completed if r.endswith("-101")]


def test_manifest_lists_a_quic_listener_with_its_security(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    manifest = target_manifest(["tcp://127.0.0.1:7700", "quic://127.0.0.1:7704"],
                               target_name="g", max_frame_bytes=1 << 24, max_in_flight=64,
                               tls_files=(pki["server"], pki["server_key"]),
                               security_dir=tmp_path / "sec")
    assert schema_errors(manifest, "wire-conformance-target.schema.json") == []
    tcp, quic = manifest["wire_conformance"]["transports"]
    assert (tcp["name"], tcp["tls"], "security" in tcp) == ("tcp", False, False)
    assert (quic["name"], quic["endpoint"], quic["tls"]) == ("quic", "127.0.0.1:7704", True)
    security = quic["security"]
    assert security["server_name"] == "127.0.0.1"
    assert Path(security["certificate_der_path"]).read_bytes() == \
        ssl.PEM_cert_to_DER_cert(pki["server"].read_text())
    # The chain's last certificate is the anchor the runner trusts (here the leaf: the
    # PEM file holds the leaf only).
    assert Path(security["trusted_certificate_der_path"]).read_bytes() == \
        Path(security["certificate_der_path"]).read_bytes()


async def test_wire_probe_over_quic(nursery: trio.Nursery, tmp_path: Path) -> None:
    paths = make_pki(tmp_path)
    stack = await start_stack(nursery, tmp_path, extra_listen=("quic://127.0.0.1:0",),
                              tls=TlsConfig(paths["server"], paths["server_key"]))
    hold_the_cancelled_completion(stack)
    with trio.fail_after(60):
        report = await run_wire_probe([stack.uri("quic")], target_name="g",
                                      trust=Trust(paths["ca"]))
    assert schema_errors(report, "wire-conformance-case-results.schema.json") == []
    outcomes = {r["id"]: (r["outcome"], r["message"]) for r in report["results"]}
    assert sorted(outcomes) == ["gateway.wire.quic.cancel-abort",
                                "gateway.wire.quic.deadline-before-submit",
                                "gateway.wire.quic.openai-compatible.level1"]
    assert all(outcome == "passed" for outcome, _ in outcomes.values()), outcomes
    assert all(message.startswith("not a suite scenario") for _, message in outcomes.values())
    # Untrusted, the same probe fails every case at the handshake, and says so.
    other = tmp_path / "other"
    other.mkdir()
    with trio.fail_after(60):
        untrusted = await run_wire_probe([stack.uri("quic")], target_name="g",
                                         trust=Trust(make_pki(other)["ca"]))
    assert {r["outcome"] for r in untrusted["results"]} == {"failed"}
    assert all("QuicConnectError" in r["message"] for r in untrusted["results"])


@pytest.mark.interop
@pytest.mark.parametrize("client", ["native", "builtin"])
@pytest.mark.parametrize("scheme", ["quic", "tcps", "wss"])
async def test_run_plan_over_tls(nursery: trio.Nursery, tmp_path: Path, client: str,
                                 scheme: str) -> None:
    """The suite's recipes over every TLS listener with nnrp-py's native client (forced
    onto the transport under nnrps://, trusting the CA's DER; issue 26: it crashed on
    tcps and wss with route-unresolved and security-unsatisfied) and with the project's
    client."""
    if client == "native":
        pytest.importorskip("nnrp.client.native")
    paths = make_pki(tmp_path)
    # The cancel recipe asks for a long answer, which the replay streams until the
    # client leaves (choose_scenario): its CANCEL lands mid-stream at any speed.
    stack = await start_stack(nursery, tmp_path, extra_listen=(
        "quic://127.0.0.1:0", "tcps://127.0.0.1:0", "wss://127.0.0.1:0/nnrp"),
        tls=TlsConfig(paths["server"], paths["server_key"]))
    (endpoint,) = [e.uri for e in stack.gateway.endpoints if e.uri.startswith(f"{scheme}:")]
    plan, _ = build_plan(caps(), include_project=False)
    with trio.fail_after(120):
        results = await run_plan(plan, endpoint, client=client, trust=Trust(paths["ca"]))
    failed = [(r["id"], r.get("message")) for r in results["results"]
              if r["outcome"] != "passed"]
    assert results["results"] and not failed
    assert {r["diagnostics"]["endpoint"] for r in results["results"]} == {endpoint}
    if scheme == "quic":
        assert stack.gateway.server.quic_listeners[0].stats.connections_total >= 1


async def test_wire_probe_over_tcps(nursery: trio.Nursery, tmp_path: Path) -> None:
    """Issue 26: the probe ran nothing on tcps (results: [], which the schema refuses);
    the TCP cases run there under the project's ids, over TLS checked with --ca-file."""
    paths = make_pki(tmp_path)
    stack = await start_stack(nursery, tmp_path, extra_listen=("tcps://127.0.0.1:0",),
                              tls=TlsConfig(paths["server"], paths["server_key"]))
    hold_the_cancelled_completion(stack)
    (endpoint,) = [e.uri for e in stack.gateway.endpoints if e.uri.startswith("tcps:")]
    with trio.fail_after(60):
        report = await run_wire_probe([endpoint], target_name="g", trust=Trust(paths["ca"]))
    assert schema_errors(report, "wire-conformance-case-results.schema.json") == []
    outcomes = {r["id"]: (r["outcome"], r["message"]) for r in report["results"]}
    assert sorted(outcomes) == ["gateway.wire.tcps.cancel-abort",
                                "gateway.wire.tcps.deadline-before-submit",
                                "gateway.wire.tcps.openai-compatible.level1"]
    assert all(outcome == "passed" for outcome, _ in outcomes.values()), outcomes
    assert all("run over tcps" in message for _, message in outcomes.values())
    with trio.fail_after(60):
        untrusted = await run_wire_probe([endpoint], target_name="g")  # the system store
    assert {r["outcome"] for r in untrusted["results"]} == {"failed"}
    assert all("CERTIFICATE_VERIFY_FAILED" in r["message"] for r in untrusted["results"])
    with pytest.raises(ValueError, match="unknown listener scheme 'http'"):
        await run_wire_probe(["tcp://127.0.0.1:1", "http://127.0.0.1:1"], target_name="g")


async def test_wire_probe_from_another_process(nursery: trio.Nursery, tmp_path: Path) -> None:
    """The probe as its own process (as the suite's runner is): no shared event loop
    decides who goes first, only the wire. Every claimed case passes, each of several
    times."""
    stack = await start_stack(nursery, tmp_path)
    hold_the_cancelled_completion(stack)
    endpoints = [stack.uri("tcp"), stack.uri("ipc")]
    args = [sys.executable, "-m", "cli.main", "conformance", "wire-probe",
            "--out", str(tmp_path / "wire.json")]
    for endpoint in endpoints * 3:
        args += ["--endpoint", endpoint]
    with trio.fail_after(120):
        done = await trio.run_process(args, capture_stdout=True, capture_stderr=True,
                                      check=False, cwd=str(Path(__file__).parents[2]))
    report = json.loads((tmp_path / "wire.json").read_text())
    failed = [r for r in report["results"] if r["outcome"] != "passed"]
    assert done.returncode == 0 and not failed, (done.stdout, failed)
    assert len(report["results"]) == 15


@pytest.mark.parametrize("endpoint", ["quic://127.0.0.1:1", "tcps://127.0.0.1:1",
                                      "wss://127.0.0.1:1/nnrp"])
def test_native_client_over_tls_needs_a_ca_file(tmp_path: Path, endpoint: str) -> None:
    pytest.importorskip("nnrp.client.native")
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["conformance", "run", "--endpoint", endpoint,
                                      "--client", "native", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--ca-file" in result.output
