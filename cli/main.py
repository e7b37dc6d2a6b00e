"""The ``nnrp-gateway`` command line (typer). Thin: parse options, call ``trio.run``.

The gateway's modules are imported inside the commands that use them, so ``health``
(the container health check, run every few seconds), ``version`` and ``--help`` start in
a fraction of the time ``serve`` needs (tests/cli checks what a bare import loads).
Errors, help and ``--debug`` are cli/_app.py's; the configuration file and the checks
before binding are cli/_settings.py's.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

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
from .bench import bench_app
from .conformance import conformance_app
from .ops import chat, check, health, usage_text

if TYPE_CHECKING:
    from collections.abc import Collection

    from gateway.app import FleetConfig, GatewayConfig
    from gateway.server import BoundEndpoint, TokenAuthenticator
    from gateway.transport import TlsConfig

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
        help="Print the version and the vLLM lines served, and exit.")] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", envvar="NNRP_GATEWAY_DEBUG",
        help="Show the Python traceback of an error instead of one line.")] = False,
) -> None:
    """Serve a co-located vLLM OpenAI server over NNRP/1 sessions."""
    from ._settings import warn_unknown_variables

    set_debug(debug)
    warn_unknown_variables(ctx)


VllmUrl = Annotated[str, typer.Option(
    "--vllm-url", envvar="NNRP_GATEWAY_VLLM_URL", metavar="URL",
    help="Base URL of the co-located vLLM OpenAI server (http:// or https://).")]


def version() -> None:
    """Print the gateway's version and the vLLM lines it serves."""
    from gateway.upstream import SUPPORTED_BAND

    typer.echo(f"nnrp-vllm-gateway {gateway.__version__} (serves {SUPPORTED_BAND})")


def _load_config_file(ctx: typer.Context, path: Path | None) -> Path | None:
    """``--config FILE``: defaults below flags and environment (cli/_settings.py)."""
    from ._settings import load_file

    if path is not None:
        ctx.default_map = {**(ctx.default_map or {}), **load_file(ctx, path, serve)}
    return path


class QuicAlpn(StrEnum):
    """ALPN offers a quic:// listener accepts (gateway.server.AlpnPolicy)."""

    none = "none"
    nnrp = "nnrp/1"
    any = "any"


class LoadSource(StrEnum):
    """Where load-aware admission reads vLLM's load (gateway.upstream.LoadMonitor)."""

    metrics = "metrics"
    load = "load"


class ForcedSet(StrEnum):
    """Hand-written scenarios a real vLLM can be forced into (``record_forced``)."""

    tools = "tools"
    reasoning = "reasoning"


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


LISTEN = "Listeners"
VLLM = "vLLM"
LIMITS = "Limits and timeouts"
SECURITY = "TLS and auth"
OBSERVE = "Observability"
WORKERS = "Workers and shutdown"
RESUME = "Resumable sessions"
LOAD = "vLLM's load and refusals"
CONFIG = "Configuration"


def serve(
    ctx: typer.Context,
    # ---- listeners
    listen: Annotated[list[str], typer.Option(
        "--listen", envvar="NNRP_GATEWAY_LISTEN", metavar="URL", rich_help_panel=LISTEN,
        help="NNRP listener: tcp://HOST:PORT, unix:///PATH, ws://HOST:PORT/PATH, or with "
             "TLS tcps://, wss://, quic://HOST:PORT (port 0: any free port).")
    ] = ["tcp://127.0.0.1:7700"],  # noqa: B006
    admin_listen: Annotated[str | None, typer.Option(
        envvar="NNRP_GATEWAY_ADMIN_LISTEN", metavar="HOST:PORT", rich_help_panel=LISTEN,
        help="HTTP listener for /healthz, /readyz, /capabilities and /metrics (off unless "
             "given).")] = None,
    quic_alpn: Annotated[QuicAlpn, typer.Option(
        envvar="NNRP_GATEWAY_QUIC_ALPN", rich_help_panel=LISTEN,
        help="ALPN a quic:// listener accepts: any (the spec's nnrp/1, or none at all as "
             "nnrp-py's native client offers), nnrp/1 only, or none only.")] = QuicAlpn.any,
    quic_idle_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_QUIC_IDLE_TIMEOUT", min=1.0, metavar="SECONDS",
        rich_help_panel=LISTEN,
        help="Silence after which a QUIC client is gone (live ones are pinged); its "
             "resumable sessions then detach.")] = 30.0,
    # ---- vLLM
    vllm_url: Annotated[str, typer.Option(
        "--vllm-url", envvar="NNRP_GATEWAY_VLLM_URL", metavar="URL", rich_help_panel=VLLM,
        help="Base URL of the co-located vLLM OpenAI server (http:// or https://).")
    ] = "http://127.0.0.1:8000",
    upstream_api_key: Annotated[str | None, typer.Option(
        envvar="NNRP_GATEWAY_UPSTREAM_API_KEY", metavar="KEY", rich_help_panel=VLLM,
        help="Bearer token for vLLM's --api-key (never logged or printed).")] = None,
    allow_untested_vllm: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_ALLOW_UNTESTED_VLLM", rich_help_panel=VLLM,
        help="Serve a vLLM outside the tested lines with the nearest binding.")] = False,
    tool_calls: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_TOOL_CALLS", rich_help_panel=VLLM,
        help="vLLM runs with a tool parser: advertise tool_calls.")] = False,
    vllm_priority_scheduling: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_VLLM_PRIORITY_SCHEDULING", rich_help_panel=VLLM,
        help="vLLM runs with --scheduling-policy priority: PRIORITY_UPDATE and session "
             "priority classes set vLLM's request priority.")] = False,
    vllm_session_header: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_VLLM_SESSION_HEADER", rich_help_panel=VLLM,
        help="Session affinity for a router: each session's random id as X-Session-ID.")
    ] = True,
    upstream_pool_size: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_UPSTREAM_POOL_SIZE", min=1, metavar="N", rich_help_panel=VLLM,
        help="HTTP connections to vLLM at most (per worker).")] = 256,
    upstream_queue_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_UPSTREAM_QUEUE_TIMEOUT", min=0.0, metavar="SECONDS",
        rich_help_panel=VLLM,
        help="Wait for a free vLLM connection before the request is refused as overload "
             "(recoverable, with a retry time).")] = 10.0,
    upstream_detached_share: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_UPSTREAM_DETACHED_SHARE", min=0.0, max=1.0, metavar="SHARE",
        rich_help_panel=VLLM,
        help="Share of the vLLM connections detached sessions keep while a request "
             "waits for one.")] = 0.5,
    upstream_connect_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_UPSTREAM_CONNECT_TIMEOUT", min=0.1, metavar="SECONDS",
        rich_help_panel=VLLM, help="Connecting to vLLM.")] = 2.0,
    health_interval: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_HEALTH_INTERVAL", min=0.1, metavar="SECONDS",
        rich_help_panel=VLLM, help="Between vLLM /health checks once it is ready.")] = 5.0,
    health_failure_threshold: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_HEALTH_FAILURE_THRESHOLD", min=1, metavar="N",
        rich_help_panel=VLLM,
        help="Unanswered /health checks in a row (no stream flowing) before vLLM counts "
             "as down; a non-200 answer counts at once.")] = 3,
    # ---- limits and timeouts
    max_connections: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_MAX_CONNECTIONS", min=1, metavar="N", rich_help_panel=LIMITS,
        help="NNRP connections at once (per worker); more are refused SERVER_BUSY.")
    ] = 1024,
    max_sessions_per_connection: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_MAX_SESSIONS_PER_CONNECTION", min=1, metavar="N",
        rich_help_panel=LIMITS, help="Open sessions on one connection.")] = 64,
    max_operations_per_session: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_MAX_OPERATIONS_PER_SESSION", min=1, metavar="N",
        rich_help_panel=LIMITS, help="Operations in flight in one session.")] = 64,
    max_frame_bytes: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_MAX_FRAME_BYTES", min=1024, max=64 * 1024 * 1024,
        metavar="BYTES", rich_help_panel=LIMITS,
        help="Largest NNRP packet accepted (1 KiB to 64 MiB).")] = 16 << 20,
    max_envelope_bytes: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_MAX_ENVELOPE_BYTES", min=64, metavar="BYTES",
        rich_help_panel=LIMITS, help="Largest request envelope (the JSON body).")
    ] = 4 << 20,
    max_event_bytes: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_MAX_EVENT_BYTES", min=1024, metavar="BYTES",
        rich_help_panel=LIMITS, help="Largest single event read from vLLM's stream.")
    ] = 4 << 20,
    handshake_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_HANDSHAKE_TIMEOUT", min=0.1, metavar="SECONDS",
        rich_help_panel=LIMITS, help="From connect to the NNRP HELLO.")] = 10.0,
    connection_idle_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_CONNECTION_IDLE_TIMEOUT", min=0.1, metavar="SECONDS",
        rich_help_panel=LIMITS,
        help="Close a connection with nothing in flight and nothing received this long.")
    ] = 300.0,
    first_chunk_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_FIRST_CHUNK_TIMEOUT", min=0.1, metavar="SECONDS",
        rich_help_panel=LIMITS,
        help="From the request to vLLM's first byte (queueing and prefill).")] = 120.0,
    idle_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_IDLE_TIMEOUT", min=0.1, metavar="SECONDS",
        rich_help_panel=LIMITS, help="Between two chunks of one vLLM stream.")] = 60.0,
    total_timeout: Annotated[float | None, typer.Option(
        envvar="NNRP_GATEWAY_TOTAL_TIMEOUT", min=0.1, metavar="SECONDS",
        rich_help_panel=LIMITS,
        help="A whole operation at most (default: no bound but the client's deadline).")
    ] = None,
    # ---- TLS and auth
    tls_cert: Annotated[Path | None, typer.Option(
        envvar="NNRP_GATEWAY_TLS_CERT", metavar="PEM", rich_help_panel=SECURITY,
        help="Certificate chain for tcps://, wss:// and quic:// (SIGHUP re-reads it).")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(
        envvar="NNRP_GATEWAY_TLS_KEY", metavar="PEM", rich_help_panel=SECURITY,
        help="Private key of --tls-cert (unencrypted).")] = None,
    tls_server_name: Annotated[str | None, typer.Option(
        envvar="NNRP_GATEWAY_TLS_SERVER_NAME", metavar="NAME", rich_help_panel=SECURITY,
        help="The name clients check --tls-cert against, as the target manifest gives it "
             "(default: the listener's host if the certificate holds it, else the "
             "certificate's first name; never a wildcard address).")] = None,
    tls_client_ca: Annotated[Path | None, typer.Option(
        envvar="NNRP_GATEWAY_TLS_CLIENT_CA", metavar="PEM", rich_help_panel=SECURITY,
        help="Require client certificates signed by this CA (mutual TLS).")] = None,
    auth_token: Annotated[list[str] | None, typer.Option(
        envvar="NNRP_GATEWAY_AUTH_TOKEN", metavar="TOKEN", rich_help_panel=SECURITY,
        help="Token a session must present in SESSION_OPEN (never logged).")] = None,
    auth_token_file: Annotated[Path | None, typer.Option(
        envvar="NNRP_GATEWAY_AUTH_TOKEN_FILE", metavar="PATH", rich_help_panel=SECURITY,
        help="File of accepted tokens, one per line (# comments).")] = None,
    # ---- observability
    log_level: Annotated[LogLevel, typer.Option(
        envvar="NNRP_GATEWAY_LOG_LEVEL", rich_help_panel=OBSERVE,
        help="Least severe log line written (JSON lines unless stdout is a terminal).")
    ] = LogLevel.info,
    metrics: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_METRICS", rich_help_panel=OBSERVE,
        help="Serve Prometheus /metrics on --admin-listen.")] = False,
    otel_traces: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_OTEL_TRACES", rich_help_panel=OBSERVE,
        help="Export OpenTelemetry traces (OTLP; needs the otel extra): one span per "
             "operation. Where to and how are the standard OTEL_* variables "
             "(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER...).")
    ] = False,
    target_manifest: Annotated[Path | None, typer.Option(
        envvar="NNRP_GATEWAY_TARGET_MANIFEST", metavar="PATH", rich_help_panel=OBSERVE,
        help="Write the suite's wire target manifest here once all listeners are bound "
             "(with wss or quic, DER copies of the certificate and key, 0600, go to "
             "<manifest>-tls/ beside it).")] = None,
    bench_residence: Annotated[bool, typer.Option(
        hidden=True, help="Benchmarks: record per-event residence time, served at the "
                          "admin listener's /debug/residence.")] = False,
    # ---- workers and shutdown
    workers: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_WORKERS", min=1, max=256, metavar="N", rich_help_panel=WORKERS,
        help="Gateway processes sharing the listeners (1 to 256); limits hold per worker, "
             "and one NNRP connection lives in one worker.")] = 1,
    drain_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_DRAIN_TIMEOUT", min=0.0, metavar="SECONDS",
        rich_help_panel=WORKERS,
        help="After SIGTERM, in-flight operations may finish this long; a second signal "
             "exits at once.")] = 30.0,
    drain_close_grace: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_DRAIN_CLOSE_GRACE", min=0.0, metavar="SECONDS",
        rich_help_panel=WORKERS,
        help="After the drain, time a client has to close its connection before the "
             "gateway does (within --drain-timeout).")] = 5.0,
    # ---- resume
    resume_window: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_RESUME_WINDOW", min=0.0, metavar="SECONDS",
        rich_help_panel=RESUME,
        help="A session whose connection dropped waits this long for its client to "
             "resume it, its operations running on (0: resume off).")] = 120.0,
    resume_max_sessions: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_RESUME_MAX_SESSIONS", min=1, metavar="N",
        rich_help_panel=RESUME,
        help="Resumable sessions per worker, attached or detached; past it sessions open "
             "without resume.")] = 1024,
    resume_session_bytes: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_RESUME_SESSION_BYTES", min=64 * 1024, metavar="BYTES",
        rich_help_panel=RESUME,
        help="Result bytes one resumable session keeps for a replay; a detached session "
             "at this bound pauses its operations.")] = 4 << 20,
    resume_max_bytes: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_RESUME_MAX_BYTES", min=64 * 1024, metavar="BYTES",
        rich_help_panel=RESUME,
        help="Result bytes all resumable sessions of a worker keep together.")
    ] = 256 << 20,
    resume_max_sessions_per_client: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_RESUME_MAX_SESSIONS_PER_CLIENT", min=1, metavar="N",
        rich_help_panel=RESUME,
        help="Resumable sessions per client (auth token, else TLS certificate, else "
             "address).")] = 64,
    resume_client_bytes: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_RESUME_CLIENT_BYTES", min=64 * 1024, metavar="BYTES",
        rich_help_panel=RESUME,
        help="Result bytes one client's resumable sessions keep together.")] = 64 << 20,
    resume_probe_timeout: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_RESUME_PROBE_TIMEOUT", min=0.1, metavar="SECONDS",
        rich_help_panel=RESUME,
        help="A connection still holding a session being resumed is closed when silent "
             "this long after a ping.")] = 2.0,
    fleet_advertise: Annotated[str | None, typer.Option(
        envvar="NNRP_GATEWAY_FLEET_ADVERTISE", metavar="HOST:PORT", rich_help_panel=RESUME,
        help="This pod's address in its fleet: resumes other gateways of the fleet get "
             "for sessions held here are forwarded to it (unset: a single pod).")] = None,
    fleet_key_file: Annotated[Path | None, typer.Option(
        envvar="NNRP_GATEWAY_FLEET_KEY_FILE", metavar="PATH", rich_help_panel=RESUME,
        help="The key the fleet shares (32 bytes or more, re-read on SIGHUP); needed with "
             "--fleet-advertise.")] = None,
    # ---- vLLM's load and refusals
    overload_retry_after_ms: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_OVERLOAD_RETRY_AFTER_MS", min=1, metavar="MS",
        rich_help_panel=LOAD,
        help="Retry time a client is told after vLLM refuses a request for load (its 503), "
             "when vLLM's queue is not sampled.")] = 1000,
    load_aware_admission: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_AWARE_ADMISSION", rich_help_panel=LOAD,
        help="Sample vLLM's load and refuse new operations, with a retry time, past the "
             "--load-max-* thresholds (a failing or stale sample refuses nothing).")
    ] = False,
    load_source: Annotated[LoadSource, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_SOURCE", rich_help_panel=LOAD,
        help="Where vLLM's load is read: metrics (GET /metrics) or load (GET /load, with "
             "vLLM's --enable-server-load-tracking).")] = LoadSource.metrics,
    load_interval: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_INTERVAL", min=0.05, metavar="SECONDS",
        rich_help_panel=LOAD, help="Between two samples of vLLM's load.")] = 1.0,
    load_max_waiting: Annotated[float | None, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_MAX_WAITING", min=0.0, metavar="N", rich_help_panel=LOAD,
        help="Requests waiting in vLLM (vllm:num_requests_waiting, or /load's server_load) "
             "at which new operations are refused (default: no such rule).")] = None,
    load_max_kv_cache_usage: Annotated[float | None, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_MAX_KV_CACHE_USAGE", min=0.0, max=1.0, metavar="FRACTION",
        rich_help_panel=LOAD,
        help="vLLM's KV-cache use, 0 to 1 (vllm:kv_cache_usage_perc), at which new "
             "operations are refused (default: no such rule).")] = None,
    load_stale_after: Annotated[float, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_STALE_AFTER", min=0.0, metavar="SECONDS",
        rich_help_panel=LOAD,
        help="Age past which a load sample is ignored (admit: fail open); 0: three "
             "intervals.")] = 0.0,
    load_retry_after_ms: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_RETRY_AFTER_MS", min=1, metavar="MS", rich_help_panel=LOAD,
        help="Retry time told for an empty queue; one more per request waiting per "
             "running one.")] = 1000,
    load_max_retry_after_ms: Annotated[int, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_MAX_RETRY_AFTER_MS", min=1, metavar="MS",
        rich_help_panel=LOAD, help="The longest retry time told.")] = 30_000,
    load_refuse_sessions: Annotated[bool, typer.Option(
        envvar="NNRP_GATEWAY_LOAD_REFUSE_SESSIONS", rich_help_panel=LOAD,
        help="Past a threshold, refuse new sessions too (SESSION_OPEN_ACK retry_later).")
    ] = False,
    # ---- configuration
    config_file: Annotated[Path | None, typer.Option(
        "--config", envvar="NNRP_GATEWAY_CONFIG", is_eager=True, callback=_load_config_file,
        metavar="TOML", rich_help_panel=CONFIG,
        help="File of settings (keys: option names with underscores; see "
             "deploy/gateway.example.toml). Flags and the environment win over it.")
    ] = None,
    print_config: Annotated[bool, typer.Option(
        rich_help_panel=CONFIG,
        help="Check the configuration, print it as a --config file (secrets left out) "
             "and exit; 2 when it is not valid.")] = False,
) -> None:
    """Serve NNRP, forwarding openai-compatible/1 operations to vLLM."""
    import trio

    from gateway.app import GatewayConfig, LoadSettings
    from gateway.nnrp import ResumePolicy, ServerConfig
    from gateway.pipeline import PipelineLimits
    from gateway.server import ConnectionLimits

    from ._settings import check_output_dir, render, source

    authenticate, tls = _check_serve(ctx, listen, vllm_url, admin_listen, auth_token,
                                     auth_token_file, tls_cert, tls_key, tls_client_ca)
    from gateway.tools.conformance import WILDCARD_HOSTS

    if tls_server_name is not None and tls_server_name.strip() in WILDCARD_HOSTS:
        raise UserError(f"{tls_server_name!r} is a wildcard address, not a name a "
                        "certificate holds", source(ctx, "tls_server_name"))
    if target_manifest is not None:
        if target_manifest.is_dir():
            raise UserError(f"{target_manifest} is a directory (give a file name)",
                            source(ctx, "target_manifest"))
        check_output_dir(target_manifest.parent, source(ctx, "target_manifest"))
    if otel_traces:
        _check_tracing(ctx)
    fleet = _check_fleet(ctx, fleet_advertise, fleet_key_file, resume_window)
    _check_drain(ctx, drain_timeout, drain_close_grace)
    load = LoadSettings(admission=load_aware_admission, source=load_source.value,
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
        resume=ResumePolicy(window=resume_window, max_sessions=resume_max_sessions,
                              max_sessions_per_client=resume_max_sessions_per_client,
                              session_bytes=resume_session_bytes,
                              client_bytes=resume_client_bytes,
                              total_bytes=resume_max_bytes,
                              probe_timeout=resume_probe_timeout),
        fleet=fleet,
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
                                session_header=vllm_session_header,
                                overload_retry_after_ms=overload_retry_after_ms),
        upstream_connect_timeout=upstream_connect_timeout,
        upstream_pool_size=upstream_pool_size, upstream_queue_timeout=upstream_queue_timeout,
        upstream_detached_share=upstream_detached_share,
        health_interval=health_interval,
        health_failure_threshold=health_failure_threshold, admin_listen=admin_listen,
        metrics=metrics, tls=tls, quic_alpn=quic_alpn.value,
        quic_idle_timeout=quic_idle_timeout, bench_residence=bench_residence, load=load,
        otel_traces=otel_traces)
    if print_config:
        typer.echo(render(ctx, ctx.params), nl=False)
        return
    _start_logging(log_level.value, metrics=metrics, admin_listen=admin_listen)
    try:
        if workers == 1:
            trio.run(_serve, config, target_manifest, tls_server_name)
            return
        status = trio.run(_supervise, config, workers, target_manifest, log_level.value,
                          tls_server_name)
    except BaseException as error:  # alone (a supervisor binds before its nursery
        _exit_for_user_error(error)  # opens) or in trio's exception groups
        raise
    if status:
        raise typer.Exit(status)


def _check_serve(ctx: typer.Context, listen: list[str], vllm_url: str,
                 admin_listen: str | None, auth_token: list[str] | None,
                 auth_token_file: Path | None, tls_cert: Path | None, tls_key: Path | None,
                 tls_client_ca: Path | None) -> tuple[TokenAuthenticator | None,
                                                      TlsConfig | None]:
    """Everything that can be checked before binding (``--print-config`` runs it too).

    Usage errors (exit 2) rather than warnings, as every other configuration error: a
    certificate no listener uses (the operator meant TLS: NNRP would go in plaintext), a
    client CA without a certificate. ``_check_drain`` does the same for a close grace
    longer than the drain it ends."""
    from gateway.server import TokenAuthenticator
    from gateway.transport import (
        ListenError,
        TlsConfig,
        TlsFileError,
        parse_endpoint,
        server_context as tls_context,
    )

    from ._settings import check_host_port, check_http_url, source

    if not listen:
        raise UserError("no NNRP listener (give at least one)", source(ctx, "listen"))
    over_tls = False  # a listener uses --tls-cert
    for uri in listen:
        if not uri.strip():
            raise UserError("an empty listener URL", source(ctx, "listen"))
        try:
            endpoint = parse_endpoint(uri)
        except ListenError as exc:
            raise UserError(str(exc), source(ctx, "listen")) from None
        if (endpoint.tls or endpoint.scheme == "quic") and tls_cert is None:
            raise UserError(f"{uri} needs a certificate (--tls-cert and --tls-key)",
                            source(ctx, "listen"))
        if endpoint.scheme == "quic" and tls_client_ca is not None:
            raise UserError(f"{uri}: quic:// does not do mutual TLS (drop --tls-client-ca "
                            "or the quic:// listener)", source(ctx, "tls_client_ca"))
        over_tls = over_tls or endpoint.tls or endpoint.scheme == "quic"
    check_http_url(vllm_url, source(ctx, "vllm_url"))
    if admin_listen is not None:
        check_host_port(admin_listen, source(ctx, "admin_listen"), unix=True)
    if (tls_cert is None) != (tls_key is None):
        given = "tls_cert" if tls_cert is not None else "tls_key"
        raise UserError("--tls-cert and --tls-key go together", source(ctx, given))
    tls = None
    if tls_cert is not None and tls_key is not None:
        tls = TlsConfig(tls_cert, tls_key, tls_client_ca)
        try:
            tls_context(tls)
        except TlsFileError as exc:
            option = {"certificate": "tls_cert", "private key": "tls_key",
                      "client CA": "tls_client_ca"}[exc.role]
            raise UserError(str(exc), source(ctx, option)) from None
        # Files that load but that no listener uses: the operator meant TLS, and NNRP
        # would go in plaintext. As with the auth tokens, a security option that was
        # given never silently does nothing.
        if not over_tls:
            raise UserError("no listener uses the certificate: NNRP would be served "
                            "without TLS (make a listener tcps://, wss:// or quic://, or "
                            "drop the certificate)", source(ctx, "tls_cert"))
    elif tls_client_ca is not None:
        raise UserError("a client CA goes with --tls-cert, --tls-key and a tcps:// or "
                        "wss:// listener", source(ctx, "tls_client_ca"))
    from gateway.server import AuthSourceError

    try:
        authenticate = TokenAuthenticator.from_sources(auth_token or [], auth_token_file)
    except OSError as exc:
        raise UserError(f"cannot read the token file ({exc.strerror})",
                        source(ctx, "auth_token_file")) from None
    except AuthSourceError as exc:
        raise UserError(str(exc), source(ctx, exc.option)) from None
    except ValueError as exc:
        raise UserError(f"auth tokens: {exc}", source(ctx, "auth_token")) from None
    return authenticate, tls


def _check_drain(ctx: typer.Context, drain_timeout: float, close_grace: float) -> None:
    """The close grace is the end of the drain, within ``--drain-timeout``: one given
    longer could never be had. The default (5 s) under a short drain is cut to fit."""
    from ._settings import source

    given = getattr(ctx.get_parameter_source("drain_close_grace"), "name", "DEFAULT")
    if given != "DEFAULT" and close_grace > drain_timeout:
        raise UserError(f"a close grace of {close_grace:g} s does not fit in the drain's "
                        f"{drain_timeout:g} s (--drain-timeout), which it is the end of",
                        source(ctx, "drain_close_grace"))


def _check_fleet(ctx: typer.Context, advertise: str | None, key_file: Path | None,
                 resume_window: float) -> FleetConfig | None:
    """--fleet-advertise and --fleet-key-file: both or neither, a reachable address, a
    key that can be used, and resume on (a fleet forwards resumes)."""
    from gateway.app import FleetConfig, read_fleet_key
    from gateway.nnrp import FleetKeyError
    from gateway.transport import ListenError, fleet_uri

    from ._settings import source

    if advertise is None and key_file is None:
        return None
    if advertise is None:
        raise UserError("--fleet-key-file is the key of a fleet: give --fleet-advertise too",
                        source(ctx, "fleet_key_file"))
    if key_file is None:
        raise UserError("--fleet-advertise needs --fleet-key-file (the key the fleet "
                        "shares: `openssl rand -hex 32`)", source(ctx, "fleet_advertise"))
    try:
        fleet_uri(advertise)
    except ListenError as exc:
        raise UserError(str(exc), source(ctx, "fleet_advertise")) from None
    try:
        read_fleet_key(key_file)
    except FleetKeyError as exc:
        raise UserError(f"fleet key: {exc}", source(ctx, "fleet_key_file")) from None
    if resume_window <= 0:
        raise UserError("a fleet forwards resumes: --resume-window must be above 0",
                        source(ctx, "fleet_advertise"))
    return FleetConfig(advertise, key_file)


def _start_logging(level: str, *, metrics: bool, admin_listen: str | None) -> None:
    import structlog

    from gateway.observe import configure_logging

    configure_logging(level=level)
    if metrics and admin_listen is None:
        structlog.get_logger("gateway").warning(
            "--metrics has no effect without --admin-listen: no /metrics is served")


def _check_tracing(ctx: typer.Context) -> None:
    """``--otel-traces`` where it cannot work (the extra missing, an OTEL_* setting the
    gateway cannot use) is the operator's to fix: one line, exit 2."""
    from gateway.errors import ConfigError
    from gateway.observe import check_tracing

    from ._settings import source

    try:
        check_tracing()
    except ConfigError as exc:
        raise UserError(str(exc), source(ctx, "otel_traces")) from None


def _exit_for_user_error(error: BaseException) -> None:
    """Errors that are the operator's to fix, as ``UserError``: one line, an exit code."""
    from gateway.app import DrainInterrupted
    from gateway.tools.conformance import ManifestError
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
    from gateway.app import Gateway, serve_until_signalled

    gateway_app = Gateway(config)

    async def started(endpoints: list[BoundEndpoint]) -> None:
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

    from gateway.profile import EXTENSIONS
    from gateway.tools.conformance import target_manifest, write_atomically

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

    from ._settings import check_host_port

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

    from ._settings import check_http_url, check_output_dir

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

    from ._settings import check_http_url

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
                        final = json.loads(event.typed_body.frames[0].payload)
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
    from typer.main import get_command

    from ._settings import render

    command = get_command(app).commands["serve"]  # type: ignore[attr-defined]
    ctx = command.make_context("serve", [])
    return render(ctx, ctx.params, explain=True)


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
