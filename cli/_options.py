"""``serve``'s options, one declaration each (``SETTINGS``), and what is built from them.

A declaration (``Setting``) says everything about one option: its name (the Python
parameter, and the key of the ``--config`` file), its type, its help and the panel the
help lists it in, its unit or shape (the help's metavar), its bounds, its environment
variable (derived, as the help says: ``NNRP_GATEWAY_`` and the flag in capitals), and the
field of ``gateway.app.GatewayConfig`` it fills (``field``, a dotted path such as
``resume.window``). Built from the table:

* the typer options of ``serve`` (``serve_options``: the command's ``__signature__``);
* the ``GatewayConfig`` it serves (``build_config``, then ``fill`` with what the checks
  build from several options: the TLS files, the fleet, the session tokens);
* the file: its keys and their TOML types (cli/_settings.py ``load_file``), the example
  file and ``--print-config`` (cli/_settings.py ``render``).

Defaults have one place: the config classes. An option that fills a field has no default
of its own; its default is read from ``GatewayConfig()`` (``default_of``), so a test, a
library user and the command line get the same gateway. Only an option that fills no
field (the log level, the worker count, the files a check reads) declares its default
here. The config classes import trio, attrs and the whole gateway, which ``health``,
``version`` and ``-h`` must not load (tests/cli/test_cli.py), so the defaults are read
lazily: click asks for them (typer's ``default_factory``) only when ``serve`` runs or
prints its help (which so loads the gateway: about 0.8 s more on the 2-core VM).
"""

from __future__ import annotations

__all__ = ["ENV_PREFIX", "SETTINGS", "LoadSource", "LogLevel", "QuicAlpn", "Setting",
           "build_config", "default_of", "fill", "serve_options"]

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from enum import Enum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from gateway.app import GatewayConfig

F = TypeVar("F", bound=Callable[..., Any])

#: The prefix of the gateway's own variables.
ENV_PREFIX = "NNRP_GATEWAY_"


class QuicAlpn(StrEnum):
    """ALPN offers a quic:// listener accepts (gateway.server.AlpnPolicy)."""

    none = "none"
    nnrp = "nnrp/1"
    any = "any"


class LoadSource(StrEnum):
    """Where load-aware admission reads vLLM's load (gateway.upstream.LoadMonitor)."""

    metrics = "metrics"
    load = "load"


class LogLevel(StrEnum):
    """The least severe log line written (gateway.observe.configure_logging)."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class _FromField:
    """The default of an option that fills a field: the field's own."""

    def __repr__(self) -> str:
        return "FROM_FIELD"


FROM_FIELD: Any = _FromField()


@dataclasses.dataclass(frozen=True)
class Setting:
    """One option of ``serve``."""

    #: The parameter's name, and the key of the ``--config`` file.
    name: str
    #: The option's type, as typer reads it (``float | None``, ``list[str]``, an enum).
    kind: Any
    #: The help's panel (also the example file's section).
    panel: str
    #: What the value is counted in (SECONDS, BYTES, MS) or looks like (URL, HOST:PORT):
    #: the help's metavar. None for a flag or a choice (the help lists the choices).
    unit: str | None
    help: str
    #: The ``GatewayConfig`` field the value fills, as a dotted path; its default is
    #: the option's (an enum option fills the value, a list option a tuple).
    field: str | None = None
    #: The ``GatewayConfig`` field a check builds from this option and others (``fill``).
    feeds: str | None = None
    #: The default of an option that fills no field (one that does has its field's).
    default: Any = FROM_FIELD
    min: float | None = None
    max: float | None = None
    #: The flag, where it is not ``--`` and the name with dashes.
    flag: str | None = None
    #: Read from the environment too (``envvar``).
    env: bool = True
    hidden: bool = False
    #: Printed only as "set" (a comment), never its value.
    secret: bool = False
    #: For the example file: what a value looks like, for an option unset by default.
    example: Any = None
    #: A key the ``--config`` file may hold (not ``--config`` itself).
    in_file: bool = True
    #: Parsed before the others (``--config``: it sets their defaults).
    eager: bool = False

    def __post_init__(self) -> None:
        if (self.field is None) == (self.default is FROM_FIELD):
            raise TypeError(f"{self.name}: an option either fills a field (and has its "
                            "default) or declares a default")

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def envvar(self) -> str | None:
        return (ENV_PREFIX + self.option.lstrip("-").replace("-", "_").upper()
                if self.env else None)


LISTEN = "Listeners"
VLLM = "vLLM"
LIMITS = "Limits and timeouts"
SECURITY = "TLS and auth"
OBSERVE = "Observability"
WORKERS = "Workers and shutdown"
RESUME = "Resumable sessions"
LOAD = "vLLM's load and refusals"
CONFIG = "Configuration"

# --------------------------------------------------------------------------- the table
# In the order of the help, of the example file and of --print-config.

SETTINGS: tuple[Setting, ...] = (
    # ---- listeners
    Setting("listen", list[str], LISTEN, "URL", field="listen",
            help="NNRP listener: tcp://HOST:PORT, unix:///PATH, ws://HOST:PORT/PATH, or "
                 "with TLS tcps://, wss://, quic://HOST:PORT (port 0: any free port)."),
    Setting("admin_listen", str | None, LISTEN, "HOST:PORT", field="admin_listen",
            example="0.0.0.0:9090",
            help="HTTP listener for /healthz, /readyz, /capabilities and /metrics (off "
                 "unless given)."),
    Setting("quic_alpn", QuicAlpn, LISTEN, None, field="quic_alpn",
            help="ALPN a quic:// listener accepts: any (the spec's nnrp/1, or none at all "
                 "as nnrp-py's native client offers), nnrp/1 only, or none only."),
    Setting("quic_idle_timeout", float, LISTEN, "SECONDS", field="quic_idle_timeout",
            min=1.0,
            help="Silence after which a QUIC client is gone (live ones are pinged); its "
                 "resumable sessions then detach."),
    # ---- vLLM
    Setting("vllm_url", str, VLLM, "URL", field="vllm_url",
            help="Base URL of the co-located vLLM OpenAI server (http:// or https://)."),
    Setting("upstream_api_key", str | None, VLLM, "KEY", field="upstream_api_key",
            secret=True, example="sk-...",
            help="Bearer token for vLLM's --api-key (never logged or printed)."),
    Setting("allow_untested_vllm", bool, VLLM, None, field="allow_untested_vllm",
            help="Serve a vLLM outside the tested lines with the nearest binding."),
    Setting("tool_calls", bool, VLLM, None, field="tool_calls",
            help="vLLM runs with a tool parser: advertise tool_calls."),
    Setting("vllm_priority_scheduling", bool, VLLM, None,
            field="pipeline.priority_scheduling",
            help="vLLM runs with --scheduling-policy priority: PRIORITY_UPDATE and session "
                 "priority classes set vLLM's request priority."),
    Setting("vllm_session_header", bool, VLLM, None, field="pipeline.session_header",
            help="Session affinity for a router: each session's random id as "
                 "X-Session-ID."),
    Setting("media_dir", Path | None, VLLM, "PATH", field="media_dir",
            example="/var/run/nnrp-media",
            help="Media frames to vLLM as files here (docs/media.md)."),
    Setting("media_dir_bytes", int, VLLM, "BYTES", field="media_dir_bytes", min=1,
            help="Bytes a process may hold in --media-dir at once."),
    Setting("upstream_pool_size", int, VLLM, "N", field="upstream_pool_size", min=1,
            help="HTTP connections to vLLM at most (per worker)."),
    Setting("upstream_queue_timeout", float, VLLM, "SECONDS",
            field="upstream_queue_timeout", min=0.0,
            help="Wait for a free vLLM connection before the request is refused as "
                 "overload (recoverable, with a retry time)."),
    Setting("upstream_detached_share", float, VLLM, "SHARE",
            field="upstream_detached_share", min=0.0, max=1.0,
            help="Share of the vLLM connections detached sessions keep while a request "
                 "waits for one."),
    Setting("upstream_connect_timeout", float, VLLM, "SECONDS",
            field="upstream_connect_timeout", min=0.1, help="Connecting to vLLM."),
    Setting("health_interval", float, VLLM, "SECONDS", field="health_interval", min=0.1,
            help="Between vLLM /health checks once it is ready."),
    Setting("health_failure_threshold", int, VLLM, "N", field="health_failure_threshold",
            min=1,
            help="Unanswered /health checks in a row (no stream flowing) before vLLM "
                 "counts as down; a non-200 answer counts at once."),
    # ---- limits and timeouts
    Setting("max_connections", int, LIMITS, "N", field="max_connections", min=1,
            help="NNRP connections at once (per worker); more are refused SERVER_BUSY."),
    Setting("max_sessions_per_connection", int, LIMITS, "N", field="server.max_sessions",
            min=1, help="Open sessions on one connection."),
    Setting("max_operations_per_session", int, LIMITS, "N", field="server.max_in_flight",
            min=1, help="Operations in flight in one session."),
    Setting("max_frame_bytes", int, LIMITS, "BYTES", field="server.max_packet",
            min=1024, max=64 * 1024 * 1024,
            help="Largest NNRP packet accepted (1 KiB to 64 MiB)."),
    Setting("max_envelope_bytes", int, LIMITS, "BYTES",
            field="pipeline.max_envelope_bytes", min=64,
            help="Largest request envelope (the JSON body)."),
    Setting("max_media_bytes", int, LIMITS, "BYTES", field="pipeline.max_media_bytes",
            min=0, help="A request's media frames, together."),
    Setting("max_event_bytes", int, LIMITS, "BYTES", field="pipeline.max_event_bytes",
            min=1024, help="Largest single event read from vLLM's stream."),
    Setting("handshake_timeout", float, LIMITS, "SECONDS",
            field="connection.handshake_timeout", min=0.1,
            help="From connect to the NNRP HELLO."),
    Setting("connection_idle_timeout", float, LIMITS, "SECONDS",
            field="connection.idle_timeout", min=0.1,
            help="Close a connection with nothing in flight and nothing received this "
                 "long."),
    Setting("first_chunk_timeout", float, LIMITS, "SECONDS",
            field="pipeline.first_chunk_timeout", min=0.1,
            help="From the request to vLLM's first byte (queueing and prefill)."),
    Setting("idle_timeout", float, LIMITS, "SECONDS", field="pipeline.idle_timeout",
            min=0.1, help="Between two chunks of one vLLM stream."),
    Setting("total_timeout", float | None, LIMITS, "SECONDS",
            field="pipeline.total_timeout", min=0.1, example=600.0,
            help="A whole operation at most (default: no bound but the client's "
                 "deadline)."),
    # ---- TLS and auth
    Setting("tls_cert", Path | None, SECURITY, "PEM", feeds="tls", default=None,
            example="/etc/nnrp-gateway/tls/tls.crt",
            help="Certificate chain for tcps://, wss:// and quic:// (SIGHUP re-reads "
                 "it)."),
    Setting("tls_key", Path | None, SECURITY, "PEM", feeds="tls", default=None,
            example="/etc/nnrp-gateway/tls/tls.key",
            help="Private key of --tls-cert (unencrypted)."),
    Setting("tls_server_name", str | None, SECURITY, "NAME", default=None,
            example="gateway.example",
            help="The name clients check --tls-cert against, as the target manifest gives "
                 "it (default: the listener's host if the certificate holds it, else the "
                 "certificate's first name; never a wildcard address)."),
    Setting("tls_client_ca", Path | None, SECURITY, "PEM", feeds="tls", default=None,
            example="/etc/nnrp-gateway/tls/client-ca.crt",
            help="Require client certificates signed by this CA (mutual TLS)."),
    Setting("auth_token", list[str] | None, SECURITY, "TOKEN",
            feeds="server.authenticate", default=None, secret=True,
            example=["a-long-random-token"],
            help="Token a session must present in SESSION_OPEN (never logged)."),
    Setting("auth_token_file", Path | None, SECURITY, "PATH", feeds="server.authenticate",
            default=None, example="/etc/nnrp-gateway/tokens",
            help="File of accepted tokens, one per line (# comments)."),
    # ---- observability
    Setting("log_level", LogLevel, OBSERVE, None, default=LogLevel.info,
            help="Least severe log line written (JSON lines unless stdout is a "
                 "terminal)."),
    Setting("metrics", bool, OBSERVE, None, field="metrics",
            help="Serve Prometheus /metrics on --admin-listen."),
    Setting("otel_traces", bool, OBSERVE, None, field="otel_traces",
            help="Export OpenTelemetry traces (OTLP; needs the otel extra): one span per "
                 "operation. Where to and how are the standard OTEL_* variables "
                 "(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, "
                 "OTEL_TRACES_SAMPLER...)."),
    Setting("target_manifest", Path | None, OBSERVE, "PATH", default=None,
            example="/tmp/manifest.json",
            help="Write the suite's wire target manifest here once all listeners are "
                 "bound (with wss or quic, DER copies of the certificate and key, 0600, "
                 "go to <manifest>-tls/ beside it)."),
    Setting("bench_residence", bool, OBSERVE, None, field="bench_residence", hidden=True,
            env=False,
            help="Benchmarks: record per-event residence time, served at the admin "
                 "listener's /debug/residence."),
    # ---- workers and shutdown
    Setting("workers", int, WORKERS, "N", default=1, min=1, max=256,
            help="Gateway processes sharing the listeners (1 to 256); limits hold per "
                 "worker, and one NNRP connection lives in one worker."),
    Setting("drain_timeout", float, WORKERS, "SECONDS", field="drain_timeout", min=0.0,
            help="After SIGTERM, in-flight operations may finish this long; a second "
                 "signal exits at once."),
    Setting("drain_close_grace", float, WORKERS, "SECONDS", field="drain_close_grace",
            min=0.0,
            help="After the drain, time a client has to close its connection before the "
                 "gateway does (within --drain-timeout)."),
    # ---- resume
    Setting("resume_window", float, RESUME, "SECONDS", field="resume.window", min=0.0,
            help="A session whose connection dropped waits this long for its client to "
                 "resume it, its operations running on (0: resume off)."),
    Setting("resume_max_sessions", int, RESUME, "N", field="resume.max_sessions", min=1,
            help="Resumable sessions per worker, attached or detached; past it sessions "
                 "open without resume."),
    Setting("resume_session_bytes", int, RESUME, "BYTES", field="resume.session_bytes",
            min=64 * 1024,
            help="Result bytes one resumable session keeps for a replay; a detached "
                 "session at this bound pauses its operations."),
    Setting("resume_max_bytes", int, RESUME, "BYTES", field="resume.total_bytes",
            min=64 * 1024,
            help="Result bytes all resumable sessions of a worker keep together."),
    Setting("resume_max_sessions_per_client", int, RESUME, "N",
            field="resume.max_sessions_per_client", min=1,
            help="Resumable sessions per client (auth token, else TLS certificate, else "
                 "address)."),
    Setting("resume_client_bytes", int, RESUME, "BYTES", field="resume.client_bytes",
            min=64 * 1024,
            help="Result bytes one client's resumable sessions keep together."),
    Setting("resume_probe_timeout", float, RESUME, "SECONDS", field="resume.probe_timeout",
            min=0.1,
            help="A connection still holding a session being resumed is closed when "
                 "silent this long after a ping."),
    Setting("fleet_advertise", str | None, RESUME, "HOST:PORT", feeds="fleet", default=None,
            example="10.0.0.7:7702",
            help="This pod's address in its fleet: resumes other gateways of the fleet get "
                 "for sessions held here are forwarded to it (unset: a single pod)."),
    Setting("fleet_key_file", Path | None, RESUME, "PATH", feeds="fleet", default=None,
            example="/etc/nnrp-fleet/key",
            help="The key the fleet shares (32 bytes or more, re-read on SIGHUP); needed "
                 "with --fleet-advertise."),
    # ---- vLLM's load and refusals
    Setting("overload_retry_after_ms", int, LOAD, "MS",
            field="pipeline.overload_retry_after_ms", min=1,
            help="Retry time a client is told after vLLM refuses a request for load (its "
                 "503), when vLLM's queue is not sampled."),
    Setting("load_aware_admission", bool, LOAD, None, field="load.admission",
            help="Sample vLLM's load and refuse new operations, with a retry time, past "
                 "the --load-max-* thresholds (a failing or stale sample refuses "
                 "nothing)."),
    Setting("load_source", LoadSource, LOAD, None, field="load.source",
            help="Where vLLM's load is read: metrics (GET /metrics) or load (GET /load, "
                 "with vLLM's --enable-server-load-tracking)."),
    Setting("load_interval", float, LOAD, "SECONDS", field="load.interval", min=0.05,
            help="Between two samples of vLLM's load."),
    Setting("load_max_waiting", float | None, LOAD, "N", field="load.max_waiting",
            min=0.0, example=8.0,
            help="Requests waiting in vLLM (vllm:num_requests_waiting, or /load's "
                 "server_load) at which new operations are refused (default: no such "
                 "rule)."),
    Setting("load_max_kv_cache_usage", float | None, LOAD, "FRACTION",
            field="load.max_kv_cache_usage", min=0.0, max=1.0, example=0.9,
            help="vLLM's KV-cache use, 0 to 1 (vllm:kv_cache_usage_perc), at which new "
                 "operations are refused (default: no such rule)."),
    Setting("load_stale_after", float, LOAD, "SECONDS", field="load.stale_after", min=0.0,
            help="Age past which a load sample is ignored (admit: fail open); 0: three "
                 "intervals."),
    Setting("load_retry_after_ms", int, LOAD, "MS", field="load.retry_after_ms", min=1,
            help="Retry time told for an empty queue; one more per request waiting per "
                 "running one."),
    Setting("load_max_retry_after_ms", int, LOAD, "MS", field="load.max_retry_after_ms",
            min=1, help="The longest retry time told."),
    Setting("load_refuse_sessions", bool, LOAD, None, field="load.refuse_sessions",
            help="Past a threshold, refuse new sessions too (SESSION_OPEN_ACK "
                 "retry_later)."),
    # ---- configuration
    Setting("config_file", Path | None, CONFIG, "TOML", default=None, flag="--config",
            in_file=False, eager=True,
            help="File of settings (keys: option names with underscores; see "
                 "deploy/gateway.example.toml). Flags and the environment win over it."),
    Setting("print_config", bool, CONFIG, None, default=False, env=False, in_file=False,
            help="Check the configuration, print it as a --config file (secrets left out) "
                 "and exit; 2 when it is not valid."),
)

# --------------------------------------------------------------------------- defaults

@functools.cache
def _default_config() -> GatewayConfig:
    from gateway.app import GatewayConfig

    return GatewayConfig()


def _at(config: object, path: str) -> Any:
    return functools.reduce(getattr, path.split("."), config)


def default_of(setting: Setting) -> Any:
    """The option's default: its field's in ``GatewayConfig()``, as the option takes it
    (a list for a tuple, the enum for its value), or the one it declares."""
    if setting.field is None:
        return setting.default
    return _option_value(setting, _at(_default_config(), setting.field))


def _enum_of(setting: Setting) -> type[Enum] | None:
    kind = setting.kind
    return kind if isinstance(kind, type) and issubclass(kind, Enum) else None


def _option_value(setting: Setting, value: object) -> Any:
    enum = _enum_of(setting)
    if enum is not None and value is not None:
        return enum(value)
    return list(value) if isinstance(value, tuple) else value


def _field_value(value: object) -> Any:
    if isinstance(value, Enum):
        return value.value
    return tuple(value) if isinstance(value, list) else value


# --------------------------------------------------------------------------- the command

def serve_options(callbacks: Mapping[str, Callable[..., Any]]) -> Callable[[F], F]:
    """A decorator giving ``serve(ctx, **values)`` the table's options (typer reads the
    ``__signature__``). ``callbacks``: the options' callbacks by name (``--config``'s,
    which reads the file: cli/_settings.py, which reads this table)."""
    parameter = inspect.Parameter
    parameters = [parameter("ctx", parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    for setting in SETTINGS:
        option = typer.Option(
            *([setting.flag] if setting.flag else []), envvar=setting.envvar,
            metavar=setting.unit, rich_help_panel=setting.panel, help=setting.help,
            min=setting.min, max=setting.max, hidden=setting.hidden, is_eager=setting.eager,
            callback=callbacks.get(setting.name),
            default_factory=(functools.partial(default_of, setting)
                             if setting.field is not None else None))
        annotated = typing.cast(Any, Annotated)[setting.kind, option]
        parameters.append(parameter(
            setting.name, parameter.KEYWORD_ONLY, annotation=annotated,
            default=parameter.empty if setting.field is not None else setting.default))
    signature = inspect.Signature(parameters, return_annotation=None)

    def decorate(command: F) -> F:
        vars(command)["__signature__"] = signature
        return command

    return decorate


# --------------------------------------------------------------------------- the config

def build_config(values: Mapping[str, Any]) -> GatewayConfig:
    """The ``GatewayConfig`` of ``serve``'s option values (by name): every field an
    option fills, the others at their defaults. What a check builds from several options
    comes after (``fill``)."""
    from gateway.app import GatewayConfig

    return typing.cast("GatewayConfig", _evolve(GatewayConfig(), {
        setting.field: _field_value(values[setting.name])
        for setting in SETTINGS if setting.field is not None}))


def fill(config: GatewayConfig, built: Mapping[str, object]) -> GatewayConfig:
    """``config`` with the fields the checks build (``Setting.feeds``: the TLS files,
    the fleet, the token check), by dotted path."""
    fed = {setting.feeds for setting in SETTINGS if setting.feeds is not None}
    if set(built) != fed:
        raise ValueError(f"the checks built {sorted(built)}, the table feeds {sorted(fed)}")
    return typing.cast("GatewayConfig", _evolve(config, built))


def _evolve(instance: Any, changes: Mapping[str, object]) -> Any:
    import attrs

    own: dict[str, object] = {}
    nested: dict[str, dict[str, object]] = {}
    for path, value in changes.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            own[head] = value
    for head, inner in nested.items():
        own[head] = _evolve(getattr(instance, head), inner)
    return attrs.evolve(instance, **own)
