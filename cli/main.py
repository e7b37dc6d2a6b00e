"""The ``nnrp-gateway`` command line (typer). Thin: parse options, call ``trio.run``.

The gateway's modules are imported inside the commands that use them, so ``health``
(the container health check, run every few seconds), ``version`` and ``--help`` start in
a fraction of the time ``serve`` needs (tests/cli checks what a bare import loads).
"""

from __future__ import annotations

import contextlib
import json
import tomllib
import typing
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

import gateway

from .bench import bench_app
from .conformance import conformance_app
from .ops import chat, check, health

if TYPE_CHECKING:
    from collections.abc import Collection

    from gateway.app import GatewayConfig
    from gateway.server import BoundEndpoint

app = typer.Typer(name="nnrp-gateway", no_args_is_help=True, add_completion=False,
                  help="Serve a co-located vLLM OpenAI server over NNRP/1 sessions.")
app.add_typer(bench_app, name="bench")
app.add_typer(conformance_app, name="conformance")
app.command()(health)
app.command()(check)
app.command()(chat)

Listen = Annotated[list[str], typer.Option(
    "--listen", envvar="NNRP_GATEWAY_LISTEN",
    help="NNRP listener: tcp://host:port, unix:///path, ws://host:port/path, or with TLS "
         "tcps://, wss://, quic://host:port (repeatable).")]
VllmUrl = Annotated[str, typer.Option("--vllm-url", envvar="NNRP_GATEWAY_VLLM_URL",
                                      help="Base URL of the co-located vLLM OpenAI server.")]


@app.command()
def version() -> None:
    """Print the gateway's version."""
    from gateway.upstream import SUPPORTED_BAND

    typer.echo(f"nnrp-vllm-gateway {gateway.__version__} (serves {SUPPORTED_BAND})")


def _load_config_file(ctx: typer.Context, path: Path | None) -> Path | None:
    """``--config FILE`` (TOML): defaults below flags and environment (click's default_map).

    Keys are ``serve``'s option names with underscores, at top level or in a ``[serve]``
    table. The file is structured by cattrs against a schema derived from ``serve``'s own
    signature (one declaration per option): an unknown key or a value of the wrong TOML
    type is refused with the key's name, never ignored."""
    if path is None:
        return None
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc}") from None
    section = {**{k: v for k, v in document.items() if not isinstance(v, dict)},
               **document.get("serve", {})}
    ctx.default_map = {**(ctx.default_map or {}), **_structure_config(section, path)}
    return path


#: ``serve`` parameters that are not settings a file may hold.
_NOT_IN_FILE = frozenset({"ctx", "config_file", "print_config"})


def _structure_config(section: dict[str, object], path: Path) -> dict[str, object]:
    import attrs
    import cattrs

    hints = typing.get_type_hints(serve)
    schema = attrs.make_class("ServeFile", {
        name: attrs.field(type=hint | None, default=None)
        for name, hint in hints.items() if name not in _NOT_IN_FILE and name != "return"})
    converter = cattrs.Converter(forbid_extra_keys=True)
    for kind in (int, float, str, bool):
        converter.register_structure_hook(kind, _strict_toml(kind))
    converter.register_structure_hook(Path, lambda value, _: Path(str(_strict_toml(str)(
        value, str))))
    try:
        structured: attrs.AttrsInstance = converter.structure(section, schema)
    except cattrs.ClassValidationError as exc:
        problems = "; ".join(cattrs.transform_error(exc, path="config"))
        raise typer.BadParameter(f"{path}: {problems}") from None
    return {key: value for key, value in attrs.asdict(structured).items()
            if key in section}


def _strict_toml(kind: type) -> typing.Callable[[object, type], object]:
    """TOML has real types: 7 is not "7", true is not 1 (a float option takes an integer)."""

    def structure(value: object, _: type) -> object:
        allowed = (int, float) if kind is float else (kind,)
        if isinstance(value, bool) is not (kind is bool) or not isinstance(value, allowed):
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return kind(value)

    return structure


def _mask(config: GatewayConfig) -> dict[str, object]:
    import attrs

    document = attrs.asdict(config, recurse=True, filter=lambda a, v: not callable(v))
    if document.get("upstream_api_key"):
        document["upstream_api_key"] = "***"
    server = document.get("server")
    if isinstance(server, dict):
        server["authenticate"] = ("tokens configured" if config.server.authenticate
                                  else "off")
    return document


Seconds = Annotated[float, typer.Option(min=0.0)]


class QuicAlpn(StrEnum):
    """ALPN offers a quic:// listener accepts (gateway.server.AlpnPolicy)."""

    none = "none"
    nnrp = "nnrp/1"
    any = "any"


@app.command()
def serve(
    ctx: typer.Context,
    config_file: Annotated[Path | None, typer.Option(
        "--config", envvar="NNRP_GATEWAY_CONFIG", is_eager=True, callback=_load_config_file,
        help="TOML file of defaults (flags > NNRP_GATEWAY_* env > file > built-in).")] = None,
    listen: Listen = ["tcp://127.0.0.1:7700"],  # noqa: B006
    vllm_url: VllmUrl = "http://127.0.0.1:8000",
    upstream_api_key: Annotated[str | None, typer.Option(
        envvar="NNRP_GATEWAY_UPSTREAM_API_KEY",
        help="Bearer token for vLLM's --api-key (never logged).")] = None,
    allow_untested_vllm: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_ALLOW_UNTESTED_VLLM",
        help="Serve a vLLM outside the tested families with the nearest binding.")] = False,
    tool_calls: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_TOOL_CALLS",
        help="Declare that vLLM runs with a tool parser (advertises tool_calls).")] = False,
    vllm_priority_scheduling: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_VLLM_PRIORITY_SCHEDULING",
        help="Declare that vLLM runs with --scheduling-policy priority: PRIORITY_UPDATE and "
             "session priority classes then set vLLM's request priority.")] = False,
    admin_listen: Annotated[str | None, typer.Option(
        envvar="NNRP_GATEWAY_ADMIN_LISTEN",
        help="host:port for /healthz, /readyz, /capabilities (off unless given).")] = None,
    metrics: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_METRICS", help="Serve /metrics on the admin listener.")] = False,
    drain_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_DRAIN_TIMEOUT", min=0.0,
        help="Seconds in-flight operations may finish after SIGTERM.")] = 30.0,
    drain_close_grace: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_DRAIN_CLOSE_GRACE", min=0.0,
        help="After the drain, seconds a connection is left for its client to close "
             "before the gateway closes it (within --drain-timeout).")] = 5.0,
    max_connections: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_MAX_CONNECTIONS", min=1)] = 1024,
    resume_window: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_RESUME_WINDOW", min=0.0,
        help="Seconds a session whose connection dropped waits for its client to resume "
             "it, its operations running on (0 turns resume off).")] = 120.0,
    resume_max_sessions: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_RESUME_MAX_SESSIONS", min=1,
        help="Resumable sessions per worker, attached or detached; past it sessions open "
             "without resume.")] = 1024,
    resume_session_bytes: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_RESUME_SESSION_BYTES", min=64 * 1024,
        help="Result bytes one resumable session keeps for a replay; a detached session "
             "at this bound pauses its operations (vLLM is not read).")] = 4 << 20,
    resume_max_bytes: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_RESUME_MAX_BYTES", min=64 * 1024,
        help="Result bytes all resumable sessions of a worker keep together.")] = 256 << 20,
    max_sessions_per_connection: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_MAX_SESSIONS_PER_CONNECTION", min=1)] = 64,
    max_operations_per_session: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_MAX_OPERATIONS_PER_SESSION", min=1)] = 64,
    max_frame_bytes: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_MAX_FRAME_BYTES", min=1024, max=64 * 1024 * 1024)] = 16 << 20,
    max_envelope_bytes: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_MAX_ENVELOPE_BYTES", min=64)] = 4 << 20,
    max_event_bytes: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_MAX_EVENT_BYTES", min=1024)] = 4 << 20,
    handshake_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_HANDSHAKE_TIMEOUT", min=0.1)] = 10.0,
    connection_idle_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_CONNECTION_IDLE_TIMEOUT", min=0.1,
        help="Close connections with nothing in flight and nothing received this long.")
    ] = 300.0,
    upstream_connect_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_UPSTREAM_CONNECT_TIMEOUT", min=0.1)] = 2.0,
    first_chunk_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_FIRST_CHUNK_TIMEOUT", min=0.1)] = 120.0,
    idle_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_IDLE_TIMEOUT", min=0.1)] = 60.0,
    total_timeout: Annotated[float | None, typer.Option(
        envvar="NNRP_GATEWAY_TOTAL_TIMEOUT", min=0.1)] = None,
    upstream_pool_size: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_UPSTREAM_POOL_SIZE", min=1)] = 256,
    upstream_queue_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_UPSTREAM_QUEUE_TIMEOUT", min=0.0,
        help="Seconds a request waits for a free upstream connection before it is "
             "refused as overload (recoverable, with a retry time).")] = 10.0,
    health_interval: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_HEALTH_INTERVAL", min=0.1,
        help="Seconds between vLLM /health checks once it is ready.")] = 5.0,
    health_failure_threshold: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_HEALTH_FAILURE_THRESHOLD", min=1,
        help="Unanswered /health checks in a row (with no stream flowing) before vLLM "
             "counts as down; a non-200 answer counts at once.")] = 3,
    log_level: Annotated[str, typer.Option(envvar="NNRP_GATEWAY_LOG_LEVEL")] = "info",
    tls_cert: Annotated[Path | None, typer.Option(
        envvar="NNRP_GATEWAY_TLS_CERT",
        help="PEM certificate chain for tcps://, wss:// and quic://.")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(
        envvar="NNRP_GATEWAY_TLS_KEY", help="PEM private key for the certificate.")] = None,
    tls_client_ca: Annotated[Path | None, typer.Option(
        envvar="NNRP_GATEWAY_TLS_CLIENT_CA",
        help="Require client certificates signed by this CA (mutual TLS).")] = None,
    quic_alpn: Annotated[QuicAlpn, typer.Option(
        envvar="NNRP_GATEWAY_QUIC_ALPN",
        help="ALPN for quic://: none (nnrp-py's native client offers none), nnrp/1 (older "
             "SDKs), or any (either).")] = QuicAlpn.none,
    quic_idle_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_QUIC_IDLE_TIMEOUT", min=1.0,
        help="Seconds of silence after which a QUIC client is gone (the gateway pings "
             "live ones); its resumable sessions then detach.")] = 30.0,
    auth_token: Annotated[list[str] | None, typer.Option(
        envvar="NNRP_GATEWAY_AUTH_TOKEN",
        help="Bearer token sessions must present in SESSION_OPEN (repeatable).")] = None,
    auth_token_file: Annotated[Path | None, typer.Option(
        envvar="NNRP_GATEWAY_AUTH_TOKEN_FILE", help="File of tokens, one per line.")] = None,
    workers: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_WORKERS", min=1, max=256,
        help="Gateway processes sharing the listeners, for more than one core's worth of "
             "streams; limits such as --max-connections hold per worker. One NNRP "
             "connection lives in one worker.")] = 1,
    # -- vLLM as deployed today (issue 23): its refusals, its load ---------------------
    overload_retry_after_ms: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_OVERLOAD_RETRY_AFTER_MS", min=1,
        help="Milliseconds a client is told to wait after vLLM refuses a request for load "
             "(its 503), when vLLM's queue is not sampled. Default 1000.")] = 1000,
    load_aware_admission: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_AWARE_ADMISSION",
        help="Sample vLLM's load (GET /metrics or /load) and refuse new operations with "
             "a retry time past the --load-max-* thresholds. Default off.")] = False,
    load_source: Annotated[str, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_SOURCE",
        help="Where vLLM's load is read: metrics (GET /metrics) or load (GET /load, "
             "vLLM's --enable-server-load-tracking). Default metrics.")] = "metrics",
    load_interval: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_INTERVAL", min=0.05,
        help="Seconds between samples of vLLM's load. Default 1.0.")] = 1.0,
    load_max_waiting: Annotated[float | None, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_MAX_WAITING", min=0.0,
        help="Requests waiting in vLLM (vllm:num_requests_waiting, or /load's "
             "server_load) at which new operations are refused. Default none (no rule).")
    ] = None,
    load_max_kv_cache_usage: Annotated[float | None, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_MAX_KV_CACHE_USAGE", min=0.0, max=1.0,
        help="vLLM's KV-cache use, a fraction 0..1 (vllm:kv_cache_usage_perc), at which "
             "new operations are refused. Default none (no rule).")] = None,
    load_stale_after: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_STALE_AFTER", min=0.0,
        help="Seconds after which a load sample is ignored (admit: fail open). Default 0: "
             "three intervals.")] = 0.0,
    load_retry_after_ms: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_RETRY_AFTER_MS", min=1,
        help="Milliseconds of the retry time for an empty queue; one more per request "
             "waiting per running one. Default 1000.")] = 1000,
    load_max_retry_after_ms: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_MAX_RETRY_AFTER_MS", min=1,
        help="Milliseconds: the longest retry time told. Default 30000.")] = 30_000,
    load_refuse_sessions: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_REFUSE_SESSIONS",
        help="Past a threshold, refuse new sessions too (SESSION_OPEN_ACK retry_later). "
             "Default off.")] = False,
    print_config: Annotated[bool, typer.Option(
        help="Print the effective configuration (secrets masked) and exit.")] = False,
    bench_residence: Annotated[bool, typer.Option(
        hidden=True, help="Benchmarks: record per-event residence time, served at the "
                          "admin listener's /debug/residence.")] = False,
    target_manifest: Annotated[Path | None, typer.Option(
        envvar="NNRP_GATEWAY_TARGET_MANIFEST",
        help="Write the suite's wire target manifest here once all listeners are bound. "
             "With wss or quic listeners, DER copies of the certificate and key (0600) go "
             "to <manifest>-tls/ beside it, as the suite's schema requires.")
    ] = None,
) -> None:
    """Serve NNRP, forwarding openai-compatible/1 operations to vLLM."""
    import trio

    from gateway.app import GatewayConfig, LoadSettings
    from gateway.nnrp import ServerConfig
    from gateway.observe import configure_logging
    from gateway.pipeline import PipelineLimits
    from gateway.server import ConnectionLimits, ResumeSettings, TokenAuthenticator
    from gateway.transport import ListenError, TlsConfig, parse_endpoint

    for uri in listen:
        try:
            parse_endpoint(uri)
        except ListenError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    if (tls_cert is None) != (tls_key is None):
        typer.echo("error: --tls-cert and --tls-key go together", err=True)
        raise typer.Exit(2)
    try:
        authenticate = TokenAuthenticator.from_sources(auth_token or [], auth_token_file)
    except (OSError, ValueError) as exc:
        typer.echo(f"error: auth tokens: {exc}", err=True)
        raise typer.Exit(2) from None
    tls = (TlsConfig(tls_cert, tls_key, tls_client_ca)
           if tls_cert is not None and tls_key is not None else None)
    if load_source not in ("metrics", "load"):
        typer.echo(f"error: --load-source is metrics or load, not {load_source!r}", err=True)
        raise typer.Exit(2)
    load = LoadSettings(admission=load_aware_admission, source=load_source,
                        interval=load_interval, max_waiting=load_max_waiting,
                        max_kv_cache_usage=load_max_kv_cache_usage,
                        stale_after=load_stale_after, retry_after_ms=load_retry_after_ms,
                        max_retry_after_ms=load_max_retry_after_ms,
                        refuse_sessions=load_refuse_sessions)
    config = GatewayConfig(
        listen=tuple(listen), vllm_url=vllm_url, upstream_api_key=upstream_api_key,
        allow_untested_vllm=allow_untested_vllm, tool_calls=tool_calls,
        drain_timeout=drain_timeout, drain_close_grace=drain_close_grace,
        max_connections=max_connections,
        resume=ResumeSettings(window=resume_window, max_sessions=resume_max_sessions,
                              session_bytes=resume_session_bytes,
                              total_bytes=resume_max_bytes),
        server=ServerConfig(max_packet=max_frame_bytes,
                            max_sessions=max_sessions_per_connection,
                            max_in_flight=max_operations_per_session,
                            authenticate=authenticate),
        connection=ConnectionLimits(handshake_timeout=handshake_timeout,
                                    idle_timeout=connection_idle_timeout),
        pipeline=PipelineLimits(first_chunk_timeout=first_chunk_timeout,
                                idle_timeout=idle_timeout, total_timeout=total_timeout,
                                max_envelope_bytes=max_envelope_bytes,
                                max_event_bytes=max_event_bytes,
                                priority_scheduling=vllm_priority_scheduling,
                                overload_retry_after_ms=overload_retry_after_ms),
        upstream_connect_timeout=upstream_connect_timeout,
        upstream_pool_size=upstream_pool_size, upstream_queue_timeout=upstream_queue_timeout,
        health_interval=health_interval,
        health_failure_threshold=health_failure_threshold, admin_listen=admin_listen,
        metrics=metrics, tls=tls, quic_alpn=quic_alpn.value,
        quic_idle_timeout=quic_idle_timeout, bench_residence=bench_residence, load=load)
    if print_config:
        typer.echo(json.dumps({**_mask(config), "workers": workers}, indent=2, default=str))
        return
    configure_logging(level=log_level)
    try:
        if workers == 1:
            trio.run(_serve, config, target_manifest)
            return
        status = trio.run(_supervise, config, workers, target_manifest, log_level)
    except BaseExceptionGroup as group:
        _exit_for_user_error(group)
        raise
    except (ListenError, OSError) as exc:  # a supervisor binds before its nursery opens
        prefix = "" if isinstance(exc, ListenError) else "cannot listen: "
        typer.echo(f"error: {prefix}{exc}", err=True)
        raise typer.Exit(2) from None
    if status:
        raise typer.Exit(status)


def _exit_for_user_error(group: BaseExceptionGroup) -> None:
    """Errors that are the operator's to fix: one line and an exit code, no traceback."""
    from gateway.tools.conformance import ManifestError
    from gateway.transport import ListenError
    from gateway.upstream import UnsupportedVersion
    from gateway.workers import EXIT_FATAL

    user_errors: tuple[tuple[type[Exception], int, str], ...] = (
        (UnsupportedVersion, EXIT_FATAL, "error: {}"),
        (ManifestError, 2, "error: target manifest: {}"),
        (ListenError, 2, "error: {}"),
        (OSError, 2, "error: cannot listen: {}"),
    )
    for kind, code, template in user_errors:
        matched, _ = group.split(kind)
        if matched is not None:
            leaf: BaseException = matched
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            typer.echo(template.format(leaf), err=True)
            raise typer.Exit(code) from None


async def _serve(config: GatewayConfig, manifest_path: Path | None) -> None:
    from gateway.app import Gateway, serve_until_signalled

    gateway_app = Gateway(config)

    async def started(endpoints: list[BoundEndpoint]) -> None:
        await _announce(config, [e.uri for e in endpoints], manifest_path,
                        gateway_app.server.config.runtime_tokens)

    await serve_until_signalled(gateway_app, started)


async def _supervise(config: GatewayConfig, workers: int, manifest_path: Path | None,
                     log_level: str) -> int:
    from gateway.profile import runtime_tokens
    from gateway.workers import Supervisor

    tokens = runtime_tokens(priority_scheduling=config.pipeline.priority_scheduling)

    async def announce(uris: list[str]) -> None:
        await _announce(config, uris, manifest_path, tokens)

    return await Supervisor(config, workers, log_level=log_level, announce=announce).run()


async def _announce(config: GatewayConfig, uris: list[str], manifest_path: Path | None,
                    runtime_tokens: Collection[str]) -> None:
    """Say where NNRP is served, and write the target manifest if asked."""
    import trio

    from gateway.profile import EXTENSIONS
    from gateway.tools.conformance import target_manifest, write_atomically

    for uri in uris:
        typer.echo(f"serving NNRP on {uri}")
    if manifest_path is None:
        return
    tls = config.tls
    manifest = target_manifest(
        uris, target_name="nnrp-vllm-gateway", max_frame_bytes=config.server.max_packet,
        max_in_flight=config.server.max_in_flight, runtime_tokens=runtime_tokens,
        extensions=[extension.name for extension in EXTENSIONS],
        tls_files=(tls.cert_file, tls.key_file) if tls else None,
        security_dir=manifest_path.parent / f"{manifest_path.stem}-tls")
    await trio.to_thread.run_sync(write_atomically, manifest_path, manifest)
    for uri in uris:
        if uri.startswith("tcps://"):
            typer.echo(f"target manifest: {uri} left out (the wire suite has no TLS over "
                       "plain TCP)", err=True)


@app.command("replay-server")
def replay_server(
    listen: Annotated[str, typer.Option(help="HOST:PORT to listen on.")] = "127.0.0.1:8000",
    vllm_version: Annotated[str, typer.Option(help="Family to impersonate: 0.18, 0.22, 0.26, 0.32."
                                              )] = "0.26",
    speed: Annotated[float, typer.Option(help="Timing scale: 2 plays twice as fast.")] = 1.0,
    api_key: Annotated[str | None, typer.Option(help="Require this bearer token.")] = None,
) -> None:
    """A loopback fake vLLM that plays recorded transcripts (for tests and demos)."""
    import trio

    from gateway.observe import configure_logging
    from gateway.tools.replay import ReplayServer

    configure_logging()
    host, _, port = listen.rpartition(":")
    server = ReplayServer(family=vllm_version, speed=speed, api_key=api_key)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(server.serve, host or "127.0.0.1", int(port))
            typer.echo(f"replay vLLM {server.version} on {url}")

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run)


@app.command()
def record(vllm_url: VllmUrl, out: Annotated[Path, typer.Option(help="Directory for JSONL.")],
           model: Annotated[str, typer.Option(help="Served model name.")] = "tiny",
           admission: Annotated[bool, typer.Option(
               help="Record issue 23's scenarios instead (per-request metrics, keep-alive, "
                    "admission refusals); vLLM must run with the flags "
                    "gateway/tools/replay/_record.py names.")] = False) -> None:
    """Record transcripts of the standard scenarios from a real vLLM."""
    from gateway.tools.replay import record_admission, record_all

    for path in (record_admission if admission else record_all)(vllm_url, out, model):
        typer.echo(f"wrote {path}")


@app.command()
def capabilities(
    vllm_url: VllmUrl = "http://127.0.0.1:8000",
    tool_calls: Annotated[bool, typer.Option(help="vLLM runs with a tool parser.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Compact JSON.")] = False,
) -> None:
    """Print the capability document (probing vLLM for its version and models)."""
    import trio

    from gateway.app import Gateway, GatewayConfig
    from gateway.observe import configure_logging

    configure_logging(to_stderr=True)
    config = GatewayConfig(vllm_url=vllm_url, tool_calls=tool_calls)

    async def probe() -> dict[str, object]:
        gateway_app = Gateway(config)
        try:
            with trio.move_on_after(5):
                await gateway_app.probe_once()
        except Exception as exc:
            typer.echo(f"warning: vLLM probe failed: {exc}", err=True)
        finally:
            await gateway_app.client.aclose()
        return gateway_app.capabilities()

    document = trio.run(probe)
    typer.echo(json.dumps(document, separators=(",", ":")) if as_json
               else json.dumps(document, indent=2))


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
                        final = json.loads(event.typed_body.frames[0].payload)
                        typer.echo(f"\n[{final['type']}, status {event.meta.status_code}, "
                                   f"usage {usage}]")
                        status = 0 if final["type"] == "response.completed" else 1
                await session.close()
        nursery.cancel_scope.cancel()
    return status


@app.command()
def demo() -> None:
    """Replay vLLM + gateway on free ports; stream one chat answer over a real NNRP session."""
    import trio

    from gateway.observe import configure_logging
    from gateway.tools.client import ClientError

    configure_logging(level="warning", to_stderr=True)
    try:
        code = trio.run(_demo)
    except (ClientError, trio.TooSlowError) as exc:
        typer.echo(f"demo failed: {exc}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
