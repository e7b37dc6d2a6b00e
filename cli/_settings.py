"""``serve``'s settings as an operator writes them: the TOML file, ``--print-config``, and
the checks that run before anything binds.

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

__all__ = ["check_host_port", "check_http_url", "check_output_dir", "known_variables",
           "load_file", "render", "source", "unknown_variables", "warn_unknown_variables"]

import difflib
import json
import os
import tomllib
import typing
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import typer

from ._app import DEBUG_ENV, UserError, clean_message, source

#: ``serve`` parameters that are not settings a file may hold.
NOT_IN_FILE = frozenset({"ctx", "config_file", "print_config", "return"})
#: Printed only as "set": a comment, never the value.
SECRETS = frozenset({"upstream_api_key", "auth_token"})


# ------------------------------------------------------------------------------ the file

def load_file(ctx: typer.Context, path: Path, command: typing.Callable[..., Any]
              ) -> dict[str, object]:
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
    hints = {name: hint for name, hint in typing.get_type_hints(command).items()
             if name not in NOT_IN_FILE}
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


def render(ctx: typer.Context, values: dict[str, Any], *, explain: bool = False) -> str:
    """Rule 4: the effective settings as a file ``--config`` reads back. ``explain``: each
    key with its help, flag and variable above it (deploy/gateway.example.toml)."""
    lines = list(_EXAMPLE if explain else _PRINTED)
    panel = None
    for param in ctx.command.params:
        name = param.name
        if name is None or name in NOT_IN_FILE or getattr(param, "hidden", False):
            continue
        this_panel = getattr(param, "rich_help_panel", None)
        if this_panel != panel:
            panel = this_panel
            lines += ["", f"# ---- {panel or 'Options'}"]
        if explain:
            lines += ["", *_comment(f"{getattr(param, 'help', '')} ({param.opts[0]}, "
                                    f"{getattr(param, 'envvar', '')})")]
        value = values.get(name)
        if name in SECRETS:
            if value:
                flag = param.opts[0]
                lines.append(f"# {name}: set (not printed): give it again with {flag} or "
                             f"{getattr(param, 'envvar', '')}")
            elif explain:
                lines.append(f"# {name} = {_toml_value(_SECRET_EXAMPLES[name])}")
            continue
        if (value is None or value == []) and explain and name in _UNSET_EXAMPLES:
            lines.append(f"# {name} = {_toml_value(_UNSET_EXAMPLES[name])}")
            continue
        if value is None or value == []:
            lines.append(f"# {name} is not set")
            continue
        lines.append(f"{name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


_SECRET_EXAMPLES: dict[str, object] = {"upstream_api_key": "sk-...",
                                       "auth_token": ["a-long-random-token"]}
#: What an unset option looks like when set, for the example file.
_UNSET_EXAMPLES: dict[str, object] = {
    "admin_listen": "0.0.0.0:9090", "total_timeout": 600.0,
    "tls_cert": "/etc/nnrp-gateway/tls/tls.crt", "tls_key": "/etc/nnrp-gateway/tls/tls.key",
    "tls_client_ca": "/etc/nnrp-gateway/tls/client-ca.crt", "tls_server_name": "gateway.example",
    "auth_token_file": "/etc/nnrp-gateway/tokens", "target_manifest": "/tmp/manifest.json",
    "load_max_waiting": 8.0, "load_max_kv_cache_usage": 0.9,
    "fleet_advertise": "10.0.0.7:7702", "fleet_key_file": "/etc/nnrp-fleet/key"}


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



# ------------------------------------------------------------------------------ environment

#: The prefix of the gateway's own variables (rule 5).
ENV_PREFIX = "NNRP_GATEWAY_"
#: Variables read by the code itself, not (only) through an option's ``envvar``: cli/_app.py
#: reads DEBUG_ENV before any option is parsed; ``health`` reads serve's admin listener.
READ_DIRECTLY = frozenset({DEBUG_ENV, "NNRP_GATEWAY_ADMIN_LISTEN"})


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
