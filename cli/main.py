"""The ``nnrp-gateway`` command line (typer). Thin: parse options, call ``trio.run``.

The gateway's modules are imported inside the commands that use them, so ``health``
(the container health check, run every few seconds), ``version`` and ``--help`` start in
a fraction of the time ``serve`` needs (tests/cli checks what a bare import loads).
Errors, help and ``--debug`` are cli/_app.py's; ``serve``'s options are one table,
cli/_options.py's (each option declared once: its flag, variable, file key, help, and the
``GatewayConfig`` field it fills, whose default is the option's); the configuration file,
``--print-config`` and the checks before binding are cli/_settings.py's.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

import gateway

from ._app import (
    EXIT_FAILED,
    EXIT_USAGE,
    GatewayTyper,
    UserError,
    first_of,
    set_debug,
    source,
)
from ._options import SETTINGS, default_of, serve_options
from ._settings import (
    check_host_port,
    check_http_url,
    check_output_dir,
    check_serve,
    load_config_file,
    render,
    warn_unknown_variables,
)
from .bench import bench_app
from .conformance import conformance_app
from .ops import chat, check, health, usage_text

if TYPE_CHECKING:
    from collections.abc import Collection

    from gateway.app import GatewayConfig
    from gateway.server import BoundEndpoint

app = GatewayTyper(name="nnrp-gateway",
                   help="Serve a co-located vLLM OpenAI server over NNRP/1 sessions.")
app.add_typer(bench_app, name="bench")
app.add_typer(conformance_app, name="conformance")


def _print_version(value: bool) -> None:
    if value:
        version()
        raise typer.Exit(0)


@app.callback()
def top(
    ctx: typer.Context,
    show_version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print the version, the vLLM lines served and the build, and exit.")] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", envvar="NNRP_GATEWAY_DEBUG",
        help="Show the Python traceback of an error instead of one line.")] = False,
) -> None:
    """Serve a co-located vLLM OpenAI server over NNRP/1 sessions."""
    set_debug(debug)
    warn_unknown_variables(ctx)


VllmUrl = Annotated[str, typer.Option(
    "--vllm-url", envvar="NNRP_GATEWAY_VLLM_URL", metavar="URL",
    help="Base URL of the co-located vLLM OpenAI server (http:// or https://).")]


def version() -> None:
    """Print the gateway's version, the vLLM lines it serves, and its build (pure Python,
    or compiled: gateway/compiled.py)."""
    from gateway.compiled import described
    from gateway.upstream import SUPPORTED_BAND

    typer.echo(f"nnrp-vllm-gateway {gateway.__version__} (serves {SUPPORTED_BAND})\n"
               f"build: {described()}")


class ForcedSet(StrEnum):
    """Hand-written scenarios a real vLLM can be forced into (``record_forced``)."""

    tools = "tools"
    reasoning = "reasoning"


@serve_options({"config_file": load_config_file})
def serve(ctx: typer.Context, **values: Any) -> None:
    """Serve NNRP, forwarding openai-compatible/1 operations to vLLM."""
    # ``values``: every option by name, as cli/_options.py's SETTINGS declares them.
    import trio

    config = check_serve(ctx, values)
    if values["print_config"]:
        typer.echo(render(values), nl=False)
        return
    log_level: str = values["log_level"].value
    manifest_path: Path | None = values["target_manifest"]
    server_name: str | None = values["tls_server_name"]
    workers: int = values["workers"]
    _start_logging(log_level, metrics=config.metrics, admin_listen=config.admin_listen)
    try:
        if workers == 1:
            trio.run(_serve, config, manifest_path, server_name)
            return
        status = trio.run(_supervise, config, workers, manifest_path, log_level, server_name)
    except BaseException as error:  # alone (a supervisor binds before its nursery
        _exit_for_user_error(error)  # opens) or in trio's exception groups
        raise
    if status:
        raise typer.Exit(status)


def _start_logging(level: str, *, metrics: bool, admin_listen: str | None) -> None:
    import structlog

    from gateway.observe import configure_logging

    configure_logging(level=level)
    if metrics and admin_listen is None:
        structlog.get_logger("gateway").warning(
            "--metrics has no effect without --admin-listen: no /metrics is served")


def _exit_for_user_error(error: BaseException) -> None:
    """Errors that are the operator's to fix, as ``UserError``: one line, an exit code."""
    from gateway.app import DrainInterrupted
    from gateway.manifest import ManifestError
    from gateway.transport import ListenerFailed, ListenError, TlsFileError
    from gateway.upstream import UnsupportedVersion
    from gateway.workers import EXIT_FATAL

    user_errors: tuple[tuple[type[Exception], int, str], ...] = (
        (UnsupportedVersion, EXIT_FATAL, "{}"),
        (ManifestError, EXIT_USAGE, "target manifest: {}"),
        (ListenError, EXIT_USAGE, "{}"),
        (TlsFileError, EXIT_USAGE, "{}"),
        (DrainInterrupted, EXIT_FAILED, "{}"),
        (ListenerFailed, EXIT_FAILED, "{}"),
    )
    for kind, code, template in user_errors:
        found = first_of(error, kind)
        if found is not None:
            raise UserError(template.format(found), code=code) from None


async def _serve(config: GatewayConfig, manifest_path: Path | None,
                 server_name: str | None) -> None:
    from gateway.app import Gateway, serve_until_signalled, settle_startup_heap

    gateway_app = Gateway(config)

    async def started(endpoints: list[BoundEndpoint]) -> None:
        settle_startup_heap()
        await _announce(config, [e.uri for e in endpoints], manifest_path,
                        gateway_app.server.config.runtime_tokens, server_name)

    await serve_until_signalled(gateway_app, started)


async def _supervise(config: GatewayConfig, workers: int, manifest_path: Path | None,
                     log_level: str, server_name: str | None) -> int:
    from gateway.profile import runtime_tokens
    from gateway.workers import Supervisor

    tokens = runtime_tokens(priority_scheduling=config.pipeline.priority_scheduling)

    async def announce(uris: list[str]) -> None:
        await _announce(config, uris, manifest_path, tokens, server_name)

    return await Supervisor(config, workers, log_level=log_level, announce=announce).run()


async def _announce(config: GatewayConfig, uris: list[str], manifest_path: Path | None,
                    runtime_tokens: Collection[str], server_name: str | None = None) -> None:
    """Say where NNRP is served (a log event: JSON lines on a pipe, like every other
    line), and write the target manifest if asked."""
    import structlog
    import trio

    from gateway.manifest import target_manifest, write_atomically
    from gateway.profile import EXTENSIONS

    log = structlog.get_logger("gateway")
    for uri in uris:
        log.info("serving NNRP", endpoint=uri)
    if manifest_path is None:
        return
    tls = config.tls
    manifest = target_manifest(
        uris, target_name="nnrp-vllm-gateway", max_frame_bytes=config.server.max_packet,
        max_in_flight=config.server.max_in_flight, runtime_tokens=runtime_tokens,
        extensions=[extension.name for extension in EXTENSIONS],
        tls_files=(tls.cert_file, tls.key_file) if tls else None,
        security_dir=manifest_path.parent / f"{manifest_path.stem}-tls",
        server_name=server_name)
    await trio.to_thread.run_sync(write_atomically, manifest_path, manifest)
    log.info("target manifest written", path=str(manifest_path),
             as_tcp_provider=[uri for uri in uris if uri.startswith("tcps://")],
             why="the schema's transports have no TLS over TCP: a tcps listener is the tcp "
                 "host-route provider's tls_server_auth mode")


def replay_server(
    listen: Annotated[str, typer.Option(
        metavar="HOST:PORT", help="Where to listen (port 0: any free port).")
    ] = "127.0.0.1:8000",
    vllm_version: Annotated[str, typer.Option(
        metavar="LINE", help="vLLM line to impersonate: 0.18, 0.22, 0.26, 0.32 or 0.33.")
    ] = "0.26",
    speed: Annotated[float, typer.Option(
        min=0.01, metavar="FACTOR", help="Timing scale: 2 plays twice as fast.")] = 1.0,
    api_key: Annotated[str | None, typer.Option(
        metavar="KEY", help="Require this bearer token, as vLLM's --api-key does.")] = None,
    long_answers: Annotated[bool, typer.Option(
        help="A streamed prompt asking for a long answer (the suite's cancellation recipe) "
             "never ends until the client leaves, as a vLLM still generating when a cancel "
             "lands; --no-long-answers answers it as briefly as any prompt, as a fast GPU "
             "vLLM whose model stops early does (with a large --speed: a cancel comes too "
             "late, which 'conformance run' reports inconclusive).")] = True,
) -> None:
    """A loopback fake vLLM that plays recorded transcripts (for tests and demos);
    SIGTERM or Ctrl-C stops it (status 0)."""
    import signal

    import structlog
    import trio

    from gateway.observe import configure_logging
    from gateway.tools.replay import FAMILIES, ReplayServer

    host, port = check_host_port(listen, "--listen")
    if vllm_version not in FAMILIES:
        raise UserError(f"unknown vLLM line {vllm_version!r} (one of {', '.join(FAMILIES)})",
                        "--vllm-version")
    configure_logging()
    server = ReplayServer(family=vllm_version, speed=speed, api_key=api_key,
                          long_answers=long_answers)

    async def run() -> None:
        # SIGTERM (a container's stop; as PID 1 it has no default action) and SIGINT
        # stop it with a line and status 0.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(server.serve, host, port)
                async for signum in signals:
                    structlog.get_logger("gateway.tools.replay").info(
                        "replay vLLM stopping", signal=signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(run)
    except BaseException as error:
        failed_bind = first_of(error, OSError)
        if failed_bind is None:
            raise
        raise UserError(f"cannot listen ({failed_bind.strerror or failed_bind})",
                        listen) from None


def record(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(metavar="DIR", help="Directory for the JSONL files.")],
    vllm_url: VllmUrl = "http://127.0.0.1:8000",
    model: Annotated[str, typer.Option(help="Served model name.")] = "tiny",
    admission: Annotated[bool, typer.Option(
        help="Record the load and refusal scenarios instead (per-request metrics, keep-alive, "
             "admission refusals); vLLM must run with the flags "
             "gateway/tools/replay/_record.py names.")] = False,
    forced: Annotated[ForcedSet | None, typer.Option(
        help="Record the hand-written scenarios a random-weight model can be forced into, "
             "as <scenario>_032: 'tools' (tool calls, n=2, a server-side abort; vLLM with "
             "VLLM_SERVER_DEV_MODE=1) or 'reasoning' (vLLM with --reasoning-parser "
             "deepseek_r1); the flags are named in gateway/tools/replay/_record.py.")
    ] = None,
) -> None:
    """Record transcripts of the standard scenarios from a real vLLM."""
    import functools

    import httpx

    from gateway.tools.replay import record_admission, record_all, record_forced

    check_http_url(vllm_url, source(ctx, "vllm_url"))
    check_output_dir(out, "--out")
    if admission and forced is not None:
        raise UserError("record one set at a time", "--admission and --forced")
    recorder = record_admission if admission else record_all
    if forced is not None:
        recorder = functools.partial(record_forced, reasoning=forced is ForcedSet.reasoning)
    try:
        written = recorder(vllm_url.rstrip("/"), out, model)
    except httpx.HTTPError as exc:
        raise UserError(f"vLLM did not answer ({exc or type(exc).__name__})", vllm_url,
                        code=EXIT_FAILED) from None
    except ValueError as exc:  # /version answered, but not with JSON
        raise UserError(f"not a vLLM ({exc})", vllm_url, code=EXIT_FAILED) from None
    for path in written:
        typer.echo(f"wrote {path}")


def capabilities(
    ctx: typer.Context,
    vllm_url: VllmUrl = "http://127.0.0.1:8000",
    tool_calls: Annotated[bool, typer.Option(help="vLLM runs with a tool parser.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Compact JSON.")] = False,
) -> None:
    """Print the capability document (probing vLLM for its version and models); when the
    probe fails, nothing on stdout and exit 1."""
    import trio

    from gateway.app import Gateway, GatewayConfig
    from gateway.observe import configure_logging

    check_http_url(vllm_url, source(ctx, "vllm_url"))
    configure_logging(level="warning", to_stderr=True)
    config = GatewayConfig(vllm_url=vllm_url, tool_calls=tool_calls)

    async def probe() -> tuple[dict[str, object], str | None]:
        gateway_app = Gateway(config)
        problem = None
        try:
            with trio.move_on_after(PROBE_LIMIT) as waited:
                await gateway_app.probe_once()
            if waited.cancelled_caught:
                problem = f"vLLM did not answer within {PROBE_LIMIT:g} s"
        except Exception as exc:
            problem = f"vLLM probe failed ({exc})"
        finally:
            await gateway_app.client.aclose()
        return gateway_app.capabilities(), problem

    document, problem = trio.run(probe)
    if problem is not None:  # the document would lack vLLM's models: none is printed
        raise UserError(problem, vllm_url, code=EXIT_FAILED)
    typer.echo(json.dumps(document, separators=(",", ":")) if as_json
               else json.dumps(document, indent=2))


#: Seconds ``capabilities`` waits for vLLM's probe.
PROBE_LIMIT = 5.0


DEMO_PROMPT = "Stream a short answer over NNRP, please."


async def _demo() -> int:
    import trio

    from gateway import nnrp
    from gateway.app import Gateway, GatewayConfig
    from gateway.tools.client import connect
    from gateway.tools.replay import ReplayServer

    replay = ReplayServer(speed=1.0)
    async with trio.open_nursery() as nursery:
        vllm_url = await nursery.start(replay.serve)
        typer.echo(f"replay vLLM {replay.version} on {vllm_url}")
        gateway_app = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",), vllm_url=vllm_url))
        (endpoint,) = await nursery.start(gateway_app.run)
        typer.echo(f"gateway serving NNRP on {endpoint.uri}")
        with trio.fail_after(10):
            await gateway_app.probed.wait()
        envelope = {"schema_version": "openai-compatible/1",
                    "operation": "chat.completions.create",
                    "body": {"model": "example-model", "stream": True, "max_tokens": 16,
                             "messages": [{"role": "user", "content": DEMO_PROMPT}],
                             "stream_options": {"include_usage": True}}}
        status = 1
        with trio.fail_after(30):
            async with connect(endpoint.uri) as client:
                session = await client.open_session()
                typer.echo(f"> {DEMO_PROMPT}\n< ", nl=False)
                operation = await session.submit(json.dumps(envelope).encode())
                async for event in operation.events():
                    if isinstance(event, nnrp.PartialReceived):
                        payload = json.loads(event.body)
                        if payload["type"] == "response.output_text.delta":
                            typer.echo(payload["delta"], nl=False)
                        elif payload["type"] == "response.usage":
                            usage = payload["usage"]
                    elif isinstance(event, nnrp.ResultReceived):
                        assert event.typed_body is not None
                        final = json.loads(bytes(event.typed_body.frames[0].payload))
                        typer.echo(f"\n[{final['type']}, status {event.meta.status_code}, "
                                   f"usage: {usage_text(usage)}]")
                        status = 0 if final["type"] == "response.completed" else 1
                await session.close()
        nursery.cancel_scope.cancel()
    return status


def demo() -> None:
    """Replay vLLM + gateway on free ports; stream one chat answer over a real NNRP session."""
    import trio

    from gateway.observe import configure_logging
    from gateway.tools.client import ClientError

    configure_logging(level="warning", to_stderr=True)
    try:
        code = trio.run(_demo)
    except (ClientError, trio.TooSlowError) as exc:
        raise UserError(f"the demo failed ({exc})", code=EXIT_FAILED) from None
    raise typer.Exit(code)


# The order `nnrp-gateway -h` lists them in: what an operator runs most, first.
for command, name in ((serve, None), (chat, None), (check, None), (health, None),
                      (capabilities, None), (demo, None), (replay_server, "replay-server"),
                      (record, None), (version, None)):
    app.command(name)(command)


def example_file() -> str:
    """deploy/gateway.example.toml: every key of ``serve`` at its default, explained.
    Regenerate with ``python -c 'import cli.main as m; print(m.example_file(), end="")'
    > deploy/gateway.example.toml``."""
    return render({setting.name: default_of(setting) for setting in SETTINGS}, explain=True)


def main() -> None:
    app()


def host_route_target_main() -> None:
    """``nnrp-gateway-host-route-target``: the suite's runner runs one executable with
    its own arguments (``wire-run --host-route-target EXE``), so ``conformance
    host-route-target`` is installed under a name of its own too."""
    import sys

    app(["conformance", "host-route-target", *sys.argv[1:]])


if __name__ == "__main__":
    main()
