"""``serve``'s settings as an operator writes them: the TOML file, ``--print-config``, and
the checks that run before anything binds. Which settings there are, their types, flags,
variables and defaults, is cli/_options.py's table (``SETTINGS``); this module reads it.

The file's rules (deploy/gateway.example.toml shows every key):

1. Keys are ``serve``'s option names with underscores (``vllm_url`` for ``--vllm-url``),
   at top level or in a ``[serve]`` table. An unknown key is an error that names the file
   and the key, with the nearest known name when there is one.
2. Values have TOML's own types: 7 is not "7", true is not 1, a list option takes a list
   (``listen = "tcp://..."`` is refused, not split into characters); a float option
   takes an integer. Ranges and choices are the flags' own (click's converters).
3. Precedence: flags > NNRP_GATEWAY_* environment > file > built-in defaults (the file
   is click's ``default_map``).
4. ``--print-config`` writes the effective settings in this format, so its output is a
   file ``--config`` reads back to the same output. Secrets (the vLLM API key, session
   tokens) are never printed: a comment says that one is set.

An error names where the bad value came from: the flag, the environment variable, or
the file and key (``source``), never a flag the operator did not use.

5. An ``NNRP_GATEWAY_*`` variable that is no setting (``NNRP_GATEWAY_VLLM_URLL``) is a
   one-line warning on stderr naming the nearest known one, for every command; not an
   error, as an unknown key of the file is. The file is the gateway's own and read by
   it alone; the environment is shared: by a pod's other containers and scripts, by a
   ConfigMap that a newer or older gateway reads too (a rollback must not stop on a
   setting the older one lacks). The known names are the options' own variables, of
   every command (``known_variables``), and those the code reads itself
   (``READ_DIRECTLY``; tests/cli/test_config.py checks that the source names no other).
"""

from __future__ import annotations

__all__ = ["check_host_port", "check_http_url", "check_output_dir", "check_serve",
           "known_variables", "load_config_file", "load_file", "render", "source",
           "unknown_variables", "warn_unknown_variables"]

import difflib
import json
import os
import tomllib
import typing
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import typer

from ._app import DEBUG_ENV, UserError, clean_message, source
from ._options import ENV_PREFIX, SETTINGS, build_config, fill

if typing.TYPE_CHECKING:
    from gateway.app import FleetConfig, GatewayConfig
    from gateway.server import TokenAuthenticator
    from gateway.transport import TlsConfig


# ------------------------------------------------------------------------------ the file

def load_config_file(ctx: typer.Context, path: Path | None) -> Path | None:
    """``--config FILE`` (its option's callback): defaults below flags and environment."""
    if path is not None:
        ctx.default_map = {**(ctx.default_map or {}), **load_file(ctx, path)}
    return path


def load_file(ctx: typer.Context, path: Path) -> dict[str, object]:
    """Rules 1-2: the file's settings, checked key by key, for click's ``default_map``."""
    try:
        document = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"cannot read the configuration file ({exc.strerror})",
                        str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"not valid TOML ({exc})", str(path)) from None
    except UnicodeDecodeError:
        raise UserError("not a UTF-8 text file", str(path)) from None
    table = document.get("serve", {})
    if not isinstance(table, dict):
        raise UserError("[serve] must be a table", str(path))
    section = {**{k: v for k, v in document.items() if k != "serve"}, **table}
    hints = {setting.name: setting.kind for setting in SETTINGS if setting.in_file}
    params = {p.name: p for p in ctx.command.params}
    settings: dict[str, object] = {}
    for key, value in section.items():
        if key not in hints:
            near = difflib.get_close_matches(key.replace("-", "_"), list(hints), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise UserError(f"unknown key {key!r}{hint}", str(path))
        where = f"key {key} in {path}"
        try:
            structured = _converter().structure(value, hints[key])
        except (TypeError, ValueError) as exc:
            raise UserError(str(exc), where) from None
        param = params[key]
        try:  # the flag's own range or choice (rule 2)
            param.process_value(ctx, structured)
        except typer.BadParameter as exc:
            raise UserError(clean_message(exc.message), where) from None
        settings[key] = structured
    ctx.meta["config_path"] = str(path)
    return settings


def _converter() -> Any:
    import cattrs

    converter = cattrs.Converter()
    for kind in (int, float, str, bool):
        converter.register_structure_hook(kind, _strict(kind))
    converter.register_structure_hook(
        Path, lambda value, _: Path(typing.cast(str, _strict(str)(value, str))))

    def strict_list(value: object, hint: Any) -> list[Any]:
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {_toml_type(value)} (write [\"...\"])")
        (item,) = typing.get_args(hint)
        return [converter.structure(one, item) for one in value]

    def is_list(hint: Any) -> bool:
        return typing.get_origin(hint) is list

    converter.register_structure_hook_func(is_list, strict_list)
    converter.register_structure_hook_func(
        lambda hint: isinstance(hint, type) and issubclass(hint, Enum),
        lambda value, hint: hint(_strict(str)(value, str)))
    return converter


def _strict(kind: type) -> typing.Callable[[object, type], object]:
    """Rule 2: TOML has real types: 7 is not "7", true is not 1."""

    def structure(value: object, _: type) -> object:
        allowed = (int, float) if kind is float else (kind,)
        if isinstance(value, bool) is not (kind is bool) or not isinstance(value, allowed):
            raise TypeError(f"expected {_TOML_NAMES[kind]}, got {_toml_type(value)}")
        return kind(value)

    return structure


_TOML_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _toml_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    for kind, name in ((int, "an integer"), (float, "a float"), (str, "a string"),
                       (list, "a list"), (dict, "a table")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


# ------------------------------------------------------------------------------ printing

_PRINTED = ("# nnrp-gateway serve: effective configuration (serve --print-config).",
            "# Read back with: nnrp-gateway serve --config FILE")
_EXAMPLE = ("# nnrp-gateway serve --config FILE: every key, at its default.",
            "# Keys are serve's option names with underscores, at top level or under [serve];",
            "# TOML types are checked (a list is a list). Flags and NNRP_GATEWAY_* variables",
            "# win over the file. `serve --config FILE --print-config` checks a file.",
            "# Generated by cli.main.example_file (tests/cli/test_config.py checks it).")


def render(values: Mapping[str, Any], *, explain: bool = False) -> str:
    """Rule 4: the effective settings (``serve``'s option values by name) as a file
    ``--config`` reads back. ``explain``: each key with its help, flag and variable above
    it, and what an unset one looks like set (deploy/gateway.example.toml)."""
    lines = list(_EXAMPLE if explain else _PRINTED)
    panel = None
    for setting in SETTINGS:
        name = setting.name
        if not setting.in_file or setting.hidden:
            continue
        if setting.panel != panel:
            panel = setting.panel
            lines += ["", f"# ---- {panel}"]
        if explain:
            lines += ["", *_comment(f"{setting.help} ({setting.option}, {setting.envvar})")]
        value = values.get(name)
        if setting.secret:
            if value:
                lines.append(f"# {name}: set (not printed): give it again with "
                             f"{setting.option} or {setting.envvar}")
            elif explain:
                lines.append(f"# {name} = {_toml_value(setting.example)}")
            continue
        if value is None or value == []:
            lines.append(f"# {name} = {_toml_value(setting.example)}"
                         if explain and setting.example is not None else
                         f"# {name} is not set")
            continue
        lines.append(f"{name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _comment(text: str, width: int = 88) -> list[str]:
    import textwrap

    return [f"# {line}" for line in textwrap.wrap(" ".join(text.split()), width - 2,
                                                  break_on_hyphens=False)]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(one) for one in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


# ------------------------------------------------------------------------------ checks

def check_http_url(url: str, where: str) -> None:
    """An upstream URL the HTTP client can use: http or https, a host, a valid port."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UserError(f"not a URL ({exc}): {url!r}", where) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"expected an http:// or https:// URL with a host, got {url!r}",
                        where)
    if port == 0:
        raise UserError(f"port 0 in {url!r}", where)


def check_host_port(address: str, where: str, *, unix: bool = False) -> tuple[str, int]:
    """``host:port`` (``[::1]:port`` for IPv6), or ``unix:PATH`` where ``unix`` allows."""
    if unix and address.startswith("unix:") and address.removeprefix("unix:"):
        return address, 0
    host, colon, port = address.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if (not colon or not port.isdigit() or not 0 <= int(port) <= 65535
            or "/" in host or (":" in host and not bracketed)):
        shape = "host:port or unix:PATH" if unix else "host:port"
        raise UserError(f"expected {shape} (no scheme), got {address!r}", where)
    return host.strip("[]") or "127.0.0.1", int(port)


def check_output_dir(path: Path, where: str) -> None:
    """A directory a command will write into: made now, so a bad path fails before the
    work (a benchmark, a suite run) rather than after it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the output directory ({exc.strerror})",
                        f"{where} {path}") from None


# ------------------------------------------------------------------------------ serve's checks

def check_serve(ctx: typer.Context, values: Mapping[str, Any]) -> GatewayConfig:
    """``serve``'s configuration from its option values (by name), after everything that
    can be checked before binding (``--print-config`` runs it too).

    The config is built first (cli/_options.py); the checks read it, and what they build
    from several options (the TLS files, the token check, the fleet) fills it. Usage
    errors (exit 2) rather than warnings, as every other configuration error: a
    certificate no listener uses (the operator meant TLS: NNRP would go in plaintext), a
    client CA without a certificate, a close grace longer than the drain it ends."""
    config = build_config(values)
    tls = _check_listeners(ctx, config, values["tls_cert"], values["tls_key"],
                           values["tls_client_ca"])
    authenticate = _check_tokens(ctx, values["auth_token"], values["auth_token_file"])
    _check_manifest(ctx, values["tls_server_name"], values["target_manifest"])
    if config.otel_traces:
        _check_tracing(ctx)
    fleet = _check_fleet(ctx, config, values["fleet_advertise"], values["fleet_key_file"])
    _check_drain(ctx, config)
    _check_media_dir(ctx, config)
    _check_plain_delta()
    return fill(config, {"tls": tls, "server.authenticate": authenticate, "fleet": fleet})


def _check_listeners(ctx: typer.Context, config: GatewayConfig, tls_cert: Path | None,
                     tls_key: Path | None, tls_client_ca: Path | None) -> TlsConfig | None:
    """The listeners, vLLM's URL, the admin listener, and the TLS files the listeners
    need (and use: a security option that was given never silently does nothing)."""
    from gateway.transport import (
        ListenError,
        TlsConfig,
        TlsFileError,
        parse_endpoint,
        server_context as tls_context,
    )

    if not config.listen:
        raise UserError("no NNRP listener (give at least one)", source(ctx, "listen"))
    over_tls = False  # a listener uses --tls-cert
    for uri in config.listen:
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
    check_http_url(config.vllm_url, source(ctx, "vllm_url"))
    if config.admin_listen is not None:
        check_host_port(config.admin_listen, source(ctx, "admin_listen"), unix=True)
    if (tls_cert is None) != (tls_key is None):
        given = "tls_cert" if tls_cert is not None else "tls_key"
        raise UserError("--tls-cert and --tls-key go together", source(ctx, given))
    if tls_cert is None or tls_key is None:
        if tls_client_ca is not None:
            raise UserError("a client CA goes with --tls-cert, --tls-key and a tcps:// or "
                            "wss:// listener", source(ctx, "tls_client_ca"))
        return None
    tls = TlsConfig(tls_cert, tls_key, tls_client_ca)
    try:
        tls_context(tls)
    except TlsFileError as exc:
        option = {"certificate": "tls_cert", "private key": "tls_key",
                  "client CA": "tls_client_ca"}[exc.role]
        raise UserError(str(exc), source(ctx, option)) from None
    # Files that load but that no listener uses: the operator meant TLS, and NNRP would
    # go in plaintext. As with the auth tokens, a security option that was given never
    # silently does nothing.
    if not over_tls:
        raise UserError("no listener uses the certificate: NNRP would be served without "
                        "TLS (make a listener tcps://, wss:// or quic://, or drop the "
                        "certificate)", source(ctx, "tls_cert"))
    return tls


def _check_tokens(ctx: typer.Context, tokens: list[str] | None,
                  token_file: Path | None) -> TokenAuthenticator | None:
    from gateway.server import AuthSourceError, TokenAuthenticator

    try:
        return TokenAuthenticator.from_sources(tokens or [], token_file)
    except OSError as exc:
        raise UserError(f"cannot read the token file ({exc.strerror})",
                        source(ctx, "auth_token_file")) from None
    except AuthSourceError as exc:
        raise UserError(str(exc), source(ctx, exc.option)) from None
    except ValueError as exc:
        raise UserError(f"auth tokens: {exc}", source(ctx, "auth_token")) from None


def _check_manifest(ctx: typer.Context, server_name: str | None,
                    manifest: Path | None) -> None:
    from gateway.manifest import WILDCARD_HOSTS

    if server_name is not None and server_name.strip() in WILDCARD_HOSTS:
        raise UserError(f"{server_name!r} is a wildcard address, not a name a certificate "
                        "holds", source(ctx, "tls_server_name"))
    if manifest is not None:
        if manifest.is_dir():
            raise UserError(f"{manifest} is a directory (give a file name)",
                            source(ctx, "target_manifest"))
        check_output_dir(manifest.parent, source(ctx, "target_manifest"))


def _check_tracing(ctx: typer.Context) -> None:
    """``--otel-traces`` where it cannot work (the extra missing, an OTEL_* setting the
    gateway cannot use) is the operator's to fix: one line, exit 2."""
    from gateway.errors import ConfigError
    from gateway.observe import check_tracing

    try:
        check_tracing()
    except ConfigError as exc:
        raise UserError(str(exc), source(ctx, "otel_traces")) from None


def _check_fleet(ctx: typer.Context, config: GatewayConfig, advertise: str | None,
                 key_file: Path | None) -> FleetConfig | None:
    """--fleet-advertise and --fleet-key-file: both or neither, a reachable address, a
    key that can be used, and resume on (a fleet forwards resumes)."""
    from gateway.app import FleetConfig, read_fleet_key
    from gateway.nnrp import FleetKeyError
    from gateway.transport import ListenError, fleet_uri

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
    if config.resume.window <= 0:
        raise UserError("a fleet forwards resumes: --resume-window must be above 0",
                        source(ctx, "fleet_advertise"))
    return FleetConfig(advertise, key_file)


def _check_media_dir(ctx: typer.Context, config: GatewayConfig) -> None:
    """--media-dir: a directory the gateway can write in (vLLM reading it is vLLM's
    --allowed-local-media-path, which a sidecar cannot see)."""
    if config.media_dir is None:
        return
    from gateway.errors import ConfigError
    from gateway.pipeline import MediaDirectory

    try:
        MediaDirectory(config.media_dir).check()
    except ConfigError as exc:
        raise UserError(str(exc).removeprefix("--media-dir "),
                        source(ctx, "media_dir")) from None


def _check_plain_delta() -> None:
    """The plain text delta's switch, which the pipeline reads itself (``READ_DIRECTLY``):
    a value it cannot use is the operator's to fix, before anything binds."""
    from gateway.errors import ConfigError
    from gateway.pipeline import plain_delta_mode

    try:
        plain_delta_mode()
    except ConfigError as exc:
        raise UserError(str(exc)) from None  # it names the variable


def _check_drain(ctx: typer.Context, config: GatewayConfig) -> None:
    """The close grace is the end of the drain, within ``--drain-timeout``: one given
    longer could never be had. The default (5 s) under a short drain is cut to fit."""
    given = getattr(ctx.get_parameter_source("drain_close_grace"), "name", "DEFAULT")
    if given != "DEFAULT" and config.drain_close_grace > config.drain_timeout:
        raise UserError(f"a close grace of {config.drain_close_grace:g} s does not fit in "
                        f"the drain's {config.drain_timeout:g} s (--drain-timeout), which "
                        "it is the end of", source(ctx, "drain_close_grace"))


# ------------------------------------------------------------------------------ environment

#: Variables read by the code itself, not (only) through an option's ``envvar``: cli/_app.py
#: reads DEBUG_ENV before any option is parsed; ``health`` reads serve's admin listener;
#: the pipeline reads the plain text delta's switch (``gateway.pipeline._plain_delta``).
READ_DIRECTLY = frozenset({DEBUG_ENV, "NNRP_GATEWAY_ADMIN_LISTEN", "NNRP_GATEWAY_PLAIN_DELTA"})


def known_variables(command: Any) -> frozenset[str]:
    """Every variable an option of ``command`` or of its subcommands, at any depth, reads,
    and ``READ_DIRECTLY``."""
    names = set(READ_DIRECTLY)
    pending = [command]
    while pending:
        current = pending.pop()
        for param in getattr(current, "params", []):
            envvar = getattr(param, "envvar", None)
            names.update([envvar] if isinstance(envvar, str) else envvar or [])
        pending.extend(getattr(current, "commands", {}).values())
    return frozenset(names)


def unknown_variables(environ: typing.Mapping[str, str], known: frozenset[str]) -> list[str]:
    """Rule 5's warnings: one line per ``NNRP_GATEWAY_*`` variable that is no setting."""
    # Compared without the prefix every name shares: it would make any two alike.
    suffixes = {name.removeprefix(ENV_PREFIX): name for name in known}
    lines = []
    for name in sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in known):
        near = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), sorted(suffixes), n=1)
        lines.append(f"warning: {name} is not a setting; "
                     + (f"did you mean {suffixes[near[0]]}?" if near else "it is ignored"))
    return lines


def warn_unknown_variables(ctx: typer.Context) -> None:
    """Rule 5, for the command line being run (from the top command's callback)."""
    for line in unknown_variables(os.environ, known_variables(ctx.find_root().command)):
        typer.echo(line, err=True)
