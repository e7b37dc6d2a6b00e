"""``nnrp-gateway conformance``: plan, run, validate, wire-probe (imports inside the
commands: see cli/main.py).

Against a deployment::

    nnrp-gateway conformance run --endpoint tcp://host:port --out DIR
    nnrp-gateway conformance validate --results DIR/results.json

TLS endpoints (tcps://, wss://, quic://) are checked against ``--ca-file`` (the server's
certificate or its CA, PEM; default: the system's store). nnrp-py's native client needs it
for quic://. A gateway that requires session tokens takes ``--auth-token`` (or
``--auth-token-file``); nnrp-py's native client cannot present one, so the built-in client
runs then.

Exit codes of ``run``, ``validate``, ``wire-probe`` and ``host-routes``: 0 when every
selected case passed; 1 when one failed (or the results are not valid); 4
(``EXIT_INCONCLUSIVE``) when none failed but some case was inconclusive: its timing
precondition did not happen (a cancel recipe whose stream ended before its CANCEL could
reach the gateway, against a backend faster than a cancel), so it proved nothing either
way. Such a case is printed ``inconclusive`` with its reason, and the run goes on; the
summary line counts them. 2 is a usage error.
"""


from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._app import EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_USAGE, GatewayTyper, UserError, source
from ._settings import check_http_url, check_output_dir
from .ops import (
    AuthToken,
    AuthTokenFile,
    CaFile,
    check_endpoint,
    connection_failure,
    quiet_quic_logs,
)

if TYPE_CHECKING:
    from gateway.tools.client import Trust

conformance_app = GatewayTyper(help="The openai-compatible/1 suite and the wire scenario.")

Endpoint = Annotated[str, typer.Option(
    "--endpoint", metavar="URL",
    help="The gateway: tcp://, unix://, ws:// (or tcps://, wss://, quic://) URL.")]
Capabilities = Annotated[Path | None, typer.Option(
    metavar="JSON", exists=True, dir_okay=False,
    help="Capability document (default: fetched live from --endpoint over NNRP).")]
BackendLog = Annotated[str | None, typer.Option(
    metavar="URL",
    help="URL of the replay backend behind the gateway: enables the replay-backed project "
         "recipes and records upstream evidence.")]
NoProject = Annotated[bool, typer.Option("--suite-only", help="Only the suite's recipes.")]


def _trust(ca_file: Path | None, auth_token: str | None, auth_token_file: Path | None,
           ctx: typer.Context) -> Trust:
    import attrs

    from .ops import read_auth_token, trust_for

    return attrs.evolve(trust_for(ca_file),
                        auth=read_auth_token(auth_token, auth_token_file, ctx))


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"cannot read the {what} ({exc.strerror})", str(path)) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"the {what} is not JSON ({exc})", str(path)) from None


async def fetch_capabilities(endpoint: str, trust: Trust | None = None) -> dict[str, Any]:
    """The gateway's own capability document, over NNRP (operation gateway.capabilities)."""
    from gateway.tools.client import ClientError, Trust, connect

    trust = trust or Trust()
    async with connect(endpoint, ssl_context=trust.ssl_context(), quic=trust.quic()) as client:
        session = await client.open_session(auth=trust.auth)
        operation = await session.submit(json.dumps({
            "schema_version": "openai-compatible/1",
            "operation": "gateway.capabilities"}).encode())
        document: dict[str, Any] | None = None
        async for event in operation.events():
            typed = getattr(event, "typed_body", None)
            if typed is not None:
                final = json.loads(typed.frames[0].payload)
                if final.get("type") == "response.completed":
                    document = final["body"]
        await session.close()
    if document is None:
        raise ClientError("the endpoint did not answer gateway.capabilities")
    return document


def _capabilities(endpoint: str | None, path: Path | None, without_extensions: bool,
                  trust: Trust) -> dict[str, Any]:
    import trio

    from gateway.tools.client import ClientError
    from gateway.tools.conformance import schema_errors, suite_capabilities

    if path is not None:
        document: dict[str, Any] = _read_json(path, "capability document")
    elif endpoint is not None:
        try:
            document = trio.run(fetch_capabilities, endpoint, trust)
        except (ClientError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            raise connection_failure(exc, endpoint, ca_file=trust.ca_file,
                                     auth=trust.auth) from None
    else:
        raise UserError("give --capabilities or --endpoint", code=EXIT_USAGE)
    document = suite_capabilities(document)
    errors = schema_errors(document, "api-profile-capabilities.schema.json")
    if errors:
        raise UserError(f"the capability document is not valid ({'; '.join(errors)})",
                        str(path) if path is not None else endpoint,
                        code=EXIT_USAGE if path is not None else EXIT_FAILED)
    if without_extensions:
        document["extensions"] = []
    return document


@conformance_app.command()
def plan(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(metavar="JSON",
                                      help="Where to write the execution plan.")],
    endpoint: Annotated[str | None, typer.Option(
        metavar="URL", help="Fetch the capabilities live from this gateway.")] = None,
    capabilities: Capabilities = None,
    ca_file: CaFile = None,
    auth_token: AuthToken = None,
    auth_token_file: AuthTokenFile = None,
    replay_backend: Annotated[bool, typer.Option(
        help="The backend is the replay server (claims gateway.tools.replay-backend).")] = False,
    suite_only: NoProject = False,
    without_extensions: Annotated[bool, typer.Option(help="Plan as if no extensions.")] = False,
) -> None:
    """Select recipes from the capability document, as the suite's runner does."""
    from gateway.observe import configure_logging
    from gateway.tools.conformance import build_plan

    configure_logging(level="warning", to_stderr=True)
    quiet_quic_logs()
    if out.is_dir():
        raise UserError(f"{out} is a directory (give a file name)", "--out")
    check_output_dir(out.parent, "--out")
    if endpoint is not None:
        check_endpoint(endpoint, source(ctx, "endpoint"))
    trust = _trust(ca_file, auth_token, auth_token_file, ctx)
    document = _capabilities(endpoint, capabilities, without_extensions, trust)
    execution_plan, not_claimed = build_plan(document, include_project=not suite_only,
                                             replay_backend=replay_backend)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(execution_plan, indent=2) + "\n")
    for case in execution_plan["cases"]:
        typer.echo(f"selected     {case['id']} ({case['status']})")
    for case_id in not_claimed:
        typer.echo(f"not_claimed  {case_id}")


def _run_once(endpoint: str, output: Path, client: str, document: dict[str, Any],
              backend_log: str | None, suite_only: bool, trust: Trust,
              scripted_endpoint: str | None = None) -> dict[str, Any]:
    import trio

    from gateway.tools.conformance import build_plan, run_plan

    execution_plan, not_claimed = build_plan(
        document, include_project=not suite_only, replay_backend=backend_log is not None,
        results_path=str(output / "results.json"), evidence_dir=str(output / "evidence"))
    output.mkdir(parents=True, exist_ok=True)
    (output / "plan.json").write_text(json.dumps(execution_plan, indent=2) + "\n")
    results = trio.run(lambda: run_plan(execution_plan, endpoint, client=client,
                                        evidence_dir=output / "evidence",
                                        backend_log=backend_log,
                                        adapter=document.get("adapter", "nnrp-vllm-gateway"),
                                        scripted_endpoint=scripted_endpoint,
                                        trust=trust))
    (output / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    for result in results["results"]:
        typer.echo(_result_line(result, result["diagnostics"].get("inconclusive"))
                   + (f"  [scripted backend: {result['diagnostics']['endpoint']}]"
                      if result["diagnostics"].get("backend") == "scripted" else ""))
    for case_id in not_claimed:
        typer.echo(f"{'n/a':<7} {case_id} (not_claimed)")
    return results


def _result_line(result: dict[str, Any], reason: str | None = None) -> str:
    """``passed  ID``, ``failed  ID  (why)``, ``inconclusive ID  (why)``."""
    from gateway.tools.conformance import INCONCLUSIVE, result_status

    status = result_status(result)
    message = result.get("message")
    if status == "inconclusive":
        message = reason or str(message)[len(INCONCLUSIVE):]
    return f"{status:<7} {result['id']}" + (f"  ({message})" if message else "")


def _counts(results: list[dict[str, Any]]) -> dict[str, Any]:
    """passed, inconclusive ids and failed ids of a results list (``result_status``)."""
    from gateway.tools.conformance import result_status

    statuses = {r["id"]: result_status(r) for r in results}
    return {"passed": sum(s == "passed" for s in statuses.values()),
            "inconclusive": [i for i, s in statuses.items() if s == "inconclusive"],
            "failed": [i for i, s in statuses.items() if s not in ("passed", "inconclusive")],
            "selected": len(statuses)}


def _verdict(failed: bool, inconclusive: bool) -> tuple[str, int]:
    """The verdict word and the exit code (module docstring)."""
    if failed:
        return "failed", EXIT_FAILED
    if inconclusive:
        return "inconclusive", EXIT_INCONCLUSIVE
    return "passed", 0


def _anchor_is_self_signed_ca(trust: Trust) -> bool:
    """Whether --ca-file's first certificate is self-signed with CA:TRUE (one a malformed
    file is left to the TLS layer to name)."""
    from gateway.tools.conformance import self_signed_ca

    try:
        anchor = trust.certificate_der()
        return anchor is not None and self_signed_ca(anchor)
    except ValueError:
        return False


class Client(StrEnum):
    native = "native"
    builtin = "builtin"


@conformance_app.command()
def run(
    ctx: typer.Context,
    endpoint: Endpoint,
    out: Annotated[Path, typer.Option(
        metavar="DIR", help="Directory for plan, results and evidence.")],
    client: Annotated[Client | None, typer.Option(
        help="native (nnrp-py's Rust-backed client; the default when installed, no auth "
             "token is given and a TLS endpoint has a --ca-file that is not a self-signed "
             "CA:TRUE certificate, which its rustls refuses as the server's own) or "
             "builtin.")] = None,
    capabilities: Capabilities = None,
    backend_log: BackendLog = None,
    suite_only: NoProject = False,
    scripted_endpoint: Annotated[str | None, typer.Option(
        metavar="URL",
        help="A gateway in front of the replay vLLM: the recipes a real vLLM cannot answer "
             "as written (a backend failing on demand, automatic tool choice) run there.")
    ] = None,
    check_without_extensions: Annotated[bool, typer.Option(
        help="Also run with extensions removed; the passed cases must be the same.")] = True,
    ca_file: CaFile = None,
    auth_token: AuthToken = None,
    auth_token_file: AuthTokenFile = None,
) -> None:
    """Run every selected case over a real NNRP session; write results and evidence."""
    import trio

    from gateway.observe import configure_logging
    from gateway.tools.client import ClientError
    from gateway.tools.conformance import CA_ANCHOR_REFUSED, native_available

    configure_logging(level="warning", to_stderr=True)
    quiet_quic_logs()
    check_endpoint(endpoint, source(ctx, "endpoint"))
    if scripted_endpoint is not None:
        check_endpoint(scripted_endpoint, source(ctx, "scripted_endpoint"))
    if backend_log is not None:
        check_http_url(backend_log, source(ctx, "backend_log"))
    trust = _trust(ca_file, auth_token, auth_token_file, ctx)
    check_output_dir(out, "--out")  # last: a refused run leaves no empty directory
    tls = endpoint.split("://", 1)[0] in ("tcps", "wss", "quic")
    # The native client cannot present a token, trusts only --ca-file (no store), and
    # refuses a self-signed CA:TRUE certificate as the server's own (CA_ANCHOR_REFUSED).
    chosen = (client.value if client is not None
              else "native" if native_available() and not trust.auth
              and (not tls or (ca_file is not None and not _anchor_is_self_signed_ca(trust)))
              else "builtin")
    if chosen == "native" and not native_available():
        raise UserError("--client native needs nnrp-py (pip install nnrp-py)")
    if chosen == "native" and trust.auth:
        token_option = "auth_token" if auth_token is not None else "auth_token_file"
        raise UserError("nnrp-py's native client (--client native) cannot present a "
                        "session auth token (use --client builtin)",
                        source(ctx, token_option))
    if chosen == "native" and tls and ca_file is None:
        raise UserError("the native client over TLS needs --ca-file (it trusts one "
                        "certificate, not the system's store)", endpoint)
    try:
        document = _capabilities(endpoint, capabilities, False, trust)
        results = _run_once(endpoint, out, chosen, document, backend_log, suite_only,
                            trust, scripted_endpoint)
        first = _counts(results["results"])
        summary: dict[str, Any] = {"client": chosen, "endpoint": endpoint, **first}
        failed, inconclusive = bool(first["failed"]), bool(first["inconclusive"])
        if check_without_extensions:
            bare = dict(document, extensions=[])
            typer.echo("-- again, with extensions removed --")
            again = _run_once(endpoint, out / "without-extensions", chosen, bare,
                              backend_log, suite_only, trust, scripted_endpoint)
            second = _counts(again["results"])
            # The same passes, among the cases both runs proved either way.
            unproven = set(first["inconclusive"]) | set(second["inconclusive"])
            judged = {r["id"] for r in again["results"]} - unproven
            passed = {r["id"] for r in results["results"] if r["outcome"] == "passed"}
            passed_bare = {r["id"] for r in again["results"] if r["outcome"] == "passed"}
            same = passed & judged == passed_bare & judged
            summary["without_extensions"] = {**second, "same_passes": same}
            failed = failed or bool(second["failed"]) or not same
            inconclusive = inconclusive or bool(second["inconclusive"])
    except (ClientError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
        if isinstance(exc, ClientError) and str(exc) == CA_ANCHOR_REFUSED:
            raise UserError(CA_ANCHOR_REFUSED, f"--ca-file {ca_file}",
                            code=EXIT_FAILED) from None
        raise connection_failure(exc, endpoint, ca_file=ca_file, auth=trust.auth) from None
    verdict, code = _verdict(failed, inconclusive)
    summary["verdict"] = verdict
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    line = f"{summary['passed']}/{summary['selected']} passed"
    if summary["inconclusive"]:
        line += f", {len(summary['inconclusive'])} inconclusive"
    line += f" with the {chosen} client"
    bare_summary = summary.get("without_extensions")
    if bare_summary is not None and (bare_summary["passed"] != bare_summary["selected"]
                                     or not bare_summary["same_passes"]):
        line += (f"; without extensions {bare_summary['passed']}/"
                 f"{bare_summary['selected']} passed")
        if bare_summary["inconclusive"]:
            line += f", {len(bare_summary['inconclusive'])} inconclusive"
        if not bare_summary["same_passes"]:
            line += ", not the same cases"
    if verdict == "inconclusive":
        line += " - INCONCLUSIVE: nothing failed, but not every case could be proven"
    typer.echo(line)
    raise typer.Exit(code)


@conformance_app.command()
def validate(
    results: Annotated[Path, typer.Option(
        metavar="JSON", exists=True, dir_okay=False, help="results.json written by 'run'.")],
    plan_path: Annotated[Path | None, typer.Option(
        "--plan", metavar="JSON", exists=True, dir_okay=False,
        help="Execution plan [default: plan.json beside the results].")] = None,
) -> None:
    """Apply the suite's validation rules strictly: exit non-zero unless passed == selected."""
    from gateway.tools.conformance import validate_results

    plan_file = plan_path or results.parent / "plan.json"
    plan_document, results_document = (_read_json(plan_file, "execution plan"),
                                       _read_json(results, "results"))
    try:
        report = validate_results(plan_document, results_document)
    except (KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"not an execution plan and its results ({type(exc).__name__}: "
                        f"{exc})", f"{plan_file}, {results}") from None
    for error in report.errors:
        typer.echo(f"error   {error}")
    for failure in report.failed:
        typer.echo(f"failed  {failure}")
    for unproven in report.inconclusive:
        typer.echo(f"inconclusive {unproven}")
    verdict = report.verdict
    typer.echo(f"{report.passed}/{report.selected} passed"
               + (f", {len(report.inconclusive)} inconclusive" if report.inconclusive else "")
               + {"passed": "", "failed": " - NOT CONFORMANT",
                  "inconclusive": " - INCONCLUSIVE: nothing failed, but not every case "
                                  "could be proven"}[verdict])
    raise typer.Exit(_verdict(verdict == "failed", verdict == "inconclusive")[1])


@conformance_app.command("wire-probe")
def wire_probe(
    ctx: typer.Context,
    endpoint: Annotated[list[str], typer.Option(
        "--endpoint", metavar="URL", help="Endpoint per transport to probe.")],
    out: Annotated[Path, typer.Option(
        metavar="JSON", help="Where to write the wire-conformance-case-results.")],
    target_name: Annotated[str, typer.Option(help="Name in the report.")] = "nnrp-vllm-gateway",
    ca_file: CaFile = None,
    auth_token: AuthToken = None,
    auth_token_file: AuthTokenFile = None,
) -> None:
    """The suite-as-client wire scenarios (openai-compatible level 1, cancel-abort,
    deadline-before-submit) on each given endpoint's transport. The suite has none for
    quic://: there the same cases run under the project's ids (gateway.wire.quic.*)."""
    import trio

    from gateway.observe import configure_logging
    from gateway.tools.conformance import run_wire_probe, schema_errors

    configure_logging(level="warning", to_stderr=True)
    quiet_quic_logs()
    for one in endpoint:
        check_endpoint(one, source(ctx, "endpoint"))
    if out.is_dir():
        raise UserError(f"{out} is a directory (give a file name)", "--out")
    check_output_dir(out.parent, "--out")
    trust = _trust(ca_file, auth_token, auth_token_file, ctx)
    report = trio.run(lambda: run_wire_probe(endpoint, target_name=target_name, trust=trust))
    errors = schema_errors(report, "wire-conformance-case-results.schema.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for result in report["results"]:
        typer.echo(_result_line(result))
    for error in errors:
        typer.echo(f"error   {error}")
    counts = _counts(report["results"])
    code = _verdict(bool(errors or counts["failed"]), bool(counts["inconclusive"]))[1]
    typer.echo(f"{counts['passed']}/{counts['selected']} wire scenarios passed"
               + (f", {len(counts['inconclusive'])} inconclusive"
                  if counts["inconclusive"] else ""))
    raise typer.Exit(code)


@conformance_app.command("host-route-target")
def host_route_target(
    scenario: Annotated[Path, typer.Option(
        metavar="JSON", exists=True, dir_okay=False,
        help="The host-route scenario, as the suite's case file has it.")],
    resolved_scenario: Annotated[Path, typer.Option(
        metavar="JSON", exists=True, dir_okay=False,
        help="The same scenario with each locator resolved to an address to bind.")],
    output: Annotated[Path, typer.Option(
        metavar="JSON", help="Where to write the case result (wire-conformance-case-results).")],
    ready_output: Annotated[Path, typer.Option(
        metavar="JSON", help="Where to write the ready report once every listener is bound.")],
    artifacts: Annotated[Path, typer.Option(
        metavar="DIR", exists=True, file_okay=False,
        help="The runner's case folder (server.der, server-key.der for TLS routes).")],
    suite_version: Annotated[str, typer.Option(help="Echoed in the report.")] = "0.1.0",
    target_name: Annotated[str, typer.Option(help="Echoed in the report.")] = "nnrp-vllm-gateway",
    vllm_url: Annotated[str | None, typer.Option(
        "--vllm-url", envvar="NNRP_GATEWAY_VLLM_URL", metavar="URL",
        help="The vLLM the gateway under test forwards to (the server scenarios only open "
             "and close sessions) [default: none: a loopback port held bound and not "
             "listening, so no real vLLM is ever probed].")] = None,
) -> None:
    """The suite's host-route target for the server scenarios (the Rust runner's
    ``wire-run --host-route-target``; installed as ``nnrp-gateway-host-route-target``):
    the gateway's real listener set binds the scenario's routes, serves, rolls back or
    closes as the scenario asks, and the case result says what was observed."""
    import trio

    from gateway.observe import configure_logging
    from gateway.tools.conformance import host_route_report, load_scenario, run_host_route

    configure_logging(level="error", to_stderr=True)
    quiet_quic_logs()
    if vllm_url is not None:
        check_http_url(vllm_url, "--vllm-url")
    for path, option in ((output, "--output"), (ready_output, "--ready-output")):
        if path.is_dir():
            raise UserError(f"{path} is a directory (give a file name)", option)
        check_output_dir(path.parent, option)
    documents = []
    for path, option in ((scenario, "--scenario"), (resolved_scenario, "--resolved-scenario")):
        try:
            documents.append(load_scenario(path))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise UserError(f"not a scenario ({exc})", f"{option} {path}") from None
    result = trio.run(lambda: run_host_route(documents[0], documents[1], artifacts=artifacts,
                                             ready_output=ready_output, vllm_url=vllm_url))
    output.write_text(json.dumps(host_route_report(
        result, suite_version=suite_version, target_name=target_name), indent=2) + "\n")
    typer.echo(f"{result['outcome']:<7} {result['id']} ({result['terminal']}): "
               f"{result['message']}")
    # The runner reads the outcome from the report; a non-zero exit would say the target
    # itself broke (nnrp-conformance host_route.rs, wait_for_child).


@conformance_app.command("host-routes")
def host_routes(
    out: Annotated[Path, typer.Option(
        metavar="DIR", help="Directory for results.json and each case's files.")],
    target_manifest: Annotated[Path | None, typer.Option(
        metavar="JSON", exists=True, dir_okay=False,
        help="The target manifest to select scenarios from, as the runner does (serve "
             "--target-manifest) [default: the gateway's own claims].")] = None,
    target: Annotated[str | None, typer.Option(
        metavar="PATH",
        help="The host-route target executable [default: nnrp-gateway-host-route-target "
             "beside this Python].")] = None,
) -> None:
    """The suite's server-role host-route scenarios, run as the Rust runner runs them
    (wire-run --host-route-target) where it cannot run: the target as a process, a
    session per listener with nnrp-py's native client, the runner's route rules, and the
    closure probed after an error. Exit 1 unless every selected scenario passed."""
    import os
    import shutil
    import sys

    from gateway.observe import configure_logging
    from gateway.tools.conformance import (
        compile_imported_modules,
        host_route_providers,
        native_available,
        run_host_route_case,
        schema_errors,
        select_host_routes,
        target_manifest as build_manifest,
    )

    configure_logging(level="warning", to_stderr=True)
    if not native_available():
        raise UserError("the runner's client is nnrp-py's native client: pip install nnrp-py")
    executable = target or str(Path(sys.executable).parent / "nnrp-gateway-host-route-target")
    found = shutil.which(executable)
    if found is None or not os.access(found, os.X_OK):
        raise UserError("not an executable", f"--target {executable}")
    if target_manifest is not None:
        manifest = _read_json(target_manifest, "target manifest")
        errors = schema_errors(manifest, "wire-conformance-target.schema.json")
        if errors:
            raise UserError(f"not a target manifest ({'; '.join(errors)})",
                            f"--target-manifest {target_manifest}")
    else:
        manifest = build_manifest([], target_name="nnrp-vllm-gateway", max_frame_bytes=1,
                                  max_in_flight=1)
    check_output_dir(out, "--out")
    selected, left_out = select_host_routes(manifest)
    # This process has imported what the target imports: its bytecode keeps the
    # target's start inside the runner's budget (compile_imported_modules).
    compile_imported_modules()
    providers = manifest["wire_conformance"].get("host_route_providers") or \
        host_route_providers()
    results = []
    for scenario in selected:
        case_root = out / scenario["id"].replace(".", "-")
        result = run_host_route_case(scenario, [found], case_root, providers,
                                     target_name=manifest["target_name"])
        results.append(result)
        typer.echo(_result_line(result))
    for scenario_id in left_out:
        typer.echo(f"{'n/a':<7} {scenario_id} (not selected by the manifest)")
    report = {"$schema": "../schemas/wire-conformance-case-results.schema.json",
              "protocol_version": "nnrp-1-preview4", "suite_version": "0.1.0",
              "target_name": manifest["target_name"], "results": results}
    errors = schema_errors(report, "wire-conformance-case-results.schema.json")
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    for error in errors:
        typer.echo(f"error   {error}")
    counts = _counts(results)
    code = _verdict(bool(errors or counts["failed"] or not results),
                    bool(counts["inconclusive"]))[1]
    typer.echo(f"{counts['passed']}/{counts['selected']} host-route scenarios passed"
               + (f", {len(counts['inconclusive'])} inconclusive"
                  if counts["inconclusive"] else ""))
    raise typer.Exit(code)
