"""What every command shares: one error path, readable help, ``-h``, ``--debug``.

The error rules, in the order ``GatewayGroup.main`` applies them:

1. A usage mistake (an unknown option, a value of the wrong type or out of range, a
   missing file for a ``--flag PATH``) is one line on stderr, exit 2.
2. ``UserError``: the operator's to fix (a configuration, a busy port, an unreachable
   peer), or a run that failed. One line ``error: <what>, <where>``; its exit code (2 for
   usage and configuration, 1 for a failed run).
3. Ctrl-C exits 130 (typer turns ``KeyboardInterrupt`` into that exit; one that reaches
   us inside an exception group says "error: interrupted"). ``serve`` is the exception:
   SIGINT there is a drain, and a drain that completes exits 0.
4. An ``OSError`` nobody named (a file a command reads, a socket) is one line with its
   ``strerror`` and file name, exit 1.
5. Anything else is a bug: one line that says so and how to see the traceback, exit 1.
6. ``--debug`` (or ``NNRP_GATEWAY_DEBUG=1``) lets rules 2-5 raise instead: the traceback.

A check that runs to its end (``conformance run``, ``validate``, ``wire-probe``,
``host-routes``) exits 0 when every case was proven to pass, 1 when one failed, and
``EXIT_INCONCLUSIVE`` (4) when none failed but some case proved nothing either way (its
timing precondition did not happen: a backend faster than a cancel). 4, not 3: ``serve``
exits 3 for a vLLM outside the tested versions.

Trio wraps what a task raised in exception groups; the leaf is what is reported.

Help is click's plain layout (no boxes, names never cut): options in the panels their
declaration names (``rich_help_panel``), each with its default; the environment
variables are described once, below the options.
"""

from __future__ import annotations

import os
import sys
import typing
from collections.abc import Callable, Sequence
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

if typing.TYPE_CHECKING:
    from typer.models import CommandFunctionType

EXIT_FAILED = 1
EXIT_USAGE = 2
#: Nothing failed, but some case proved nothing either way (see above).
EXIT_INCONCLUSIVE = 4
EXIT_INTERRUPTED = 130

DEBUG_ENV = "NNRP_GATEWAY_DEBUG"

E = typing.TypeVar("E", bound=BaseException)


class UserError(Exception):
    """A mistake the operator can fix, or a run that failed: one line, no traceback.

    ``where`` names the thing: the listener URL, the file and key, the endpoint."""

    def __init__(self, what: str, where: str | None = None, *,
                 code: int = EXIT_USAGE) -> None:
        super().__init__(what if where is None else f"{what}, {where}")
        self.code = code


class _Debug:
    """Set by the top command's ``--debug``; read when an error is reported."""

    requested = False

    @classmethod
    def on(cls) -> bool:
        return cls.requested or os.environ.get(DEBUG_ENV, "").lower() in {"1", "true", "yes"}


def set_debug(value: bool) -> None:
    _Debug.requested = value


def _leaf(error: BaseException) -> BaseException:
    """The exception a trio exception group carries (the first that is not a cancel)."""
    while isinstance(error, BaseExceptionGroup):
        inner = [e for e in error.exceptions if not _is_cancelled(e)]
        error = (inner or list(error.exceptions))[0]
    return error


def first_of(error: BaseException, kind: type[E]) -> E | None:
    """The first ``kind`` in ``error`` or, for an exception group, among its leaves."""
    if isinstance(error, BaseExceptionGroup):
        matched, _ = error.split(kind)
        return None if matched is None else typing.cast(E, _leaf(matched))
    return error if isinstance(error, kind) else None


def _is_cancelled(error: BaseException) -> bool:
    trio = sys.modules.get("trio")
    return trio is not None and isinstance(error, trio.Cancelled)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def source(ctx: typer.Context, name: str) -> str:
    """Where the value of parameter ``name`` came from, as the operator would say it."""
    param = next(p for p in ctx.command.params if p.name == name)
    origin = ctx.get_parameter_source(name)
    origin_name = getattr(origin, "name", "")
    if origin_name == "ENVIRONMENT" and getattr(param, "envvar", None):
        return f"environment variable {param.envvar}"
    if origin_name == "DEFAULT_MAP":
        return f"key {name} in {ctx.meta.get('config_path', 'the --config file')}"
    if origin_name == "DEFAULT":
        return f"the default of {param.opts[0]}"
    return param.opts[0]


def clean_message(text: str) -> str:
    """A converter's message as part of our line: "value error, " and the capital go."""
    text = text.strip()
    for prefix in ("Value error, ", "value error, "):
        text = text.removeprefix(prefix)
    return _lower_first(text.rstrip("."))


def describe_os_error(error: OSError) -> str:
    """``No such file or directory, /etc/x.pem``: what the system said, and about what."""
    what = error.strerror or str(error) or type(error).__name__
    where = error.filename if error.filename is not None else None
    return _lower_first(what) + (f", {where}" if where is not None else "")


def _report(error: BaseException, command_path: str) -> int:
    """Rules 1-5: the line to print and the exit code."""
    if isinstance(error, typer.Exit):
        return error.exit_code
    if isinstance(error, KeyboardInterrupt):
        typer.echo("error: interrupted", err=True)
        return EXIT_INTERRUPTED
    if type(error).__name__ == "NoArgsIsHelpError":  # a bare group: its help, as asked
        typer.echo(error.format_message())  # type: ignore[attr-defined]
        return 0
    if isinstance(error, typer.TyperException):  # click's usage errors (rule 1)
        ctx = getattr(error, "ctx", None)
        help_hint = f"(see '{ctx.command_path if ctx is not None else command_path} -h')"
        param = getattr(error, "param", None)
        if ctx is not None and param is not None and getattr(param, "name", None) and (
                type(error).__name__ == "BadParameter"):
            line = (f"invalid value ({clean_message(error.message)}), "
                    f"{source(ctx, param.name)}")
        else:
            line = clean_message(error.format_message())
        typer.echo(f"error: {line} {help_hint}", err=True)
        return getattr(error, "exit_code", EXIT_USAGE)
    if isinstance(error, typer.Abort):
        typer.echo("error: aborted", err=True)
        return EXIT_FAILED
    if isinstance(error, UserError):
        typer.echo(f"error: {error}", err=True)
        return error.code
    if isinstance(error, OSError):
        typer.echo(f"error: {describe_os_error(error)}", err=True)
        return EXIT_FAILED
    typer.echo(f"error: unexpected {type(error).__name__}: {error} (run with --debug or "
               f"{DEBUG_ENV}=1 for the traceback, and please report it)", err=True)
    return EXIT_FAILED


class GatewayGroup(TyperGroup):
    """The top command: every command's errors end here (the rules above)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        set_debug(False)
        prog_name = prog_name or "nnrp-gateway"
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False,
                                  windows_expand_args=windows_expand_args, **extra)
        except BaseException as raised:
            error = _leaf(raised)
            if isinstance(error, SystemExit):
                raise
            if _Debug.on() and not isinstance(error, (typer.Exit, typer.TyperException)):
                raise
            code = _report(error, prog_name)
        else:
            code = result if isinstance(result, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)


# ------------------------------------------------------------------------------ help

def _metavar(param: Any) -> str:
    if getattr(param, "metavar", None):
        return str(param.metavar)
    described = getattr(param, "type_descriptor", None)
    if described is not None and described.is_choice:
        return "{" + "|".join(str(getattr(c, "value", c)) for c in described.choices) + "}"
    if described is not None and described.is_path:
        return "PATH"
    annotation = getattr(described, "annotation", str)
    if typing.get_origin(annotation) is list:
        (annotation,) = typing.get_args(annotation)
    return {int: "N", float: "NUMBER"}.get(annotation, "TEXT")


def _default(param: Any, ctx: Any) -> Any:
    """The default the option has now: ``serve``'s are read lazily from the gateway's
    config classes (cli/_options.py), so a callable default is called."""
    return param.get_default(ctx, call=True)


def _default_text(param: Any, ctx: Any) -> str | None:
    default = _default(param, ctx)
    if param.is_flag or (param.multiple and not default):
        return None
    if default is None or default == "":
        return None
    if isinstance(default, (list, tuple)):
        return ", ".join(str(getattr(d, "value", d)) for d in default)
    return str(getattr(default, "value", default))


def _option_record(param: Any, ctx: Any) -> tuple[str, str] | None:
    """``--name METAVAR`` and its help with the default: one entry of the option list.

    An on/off flag is shown without a value: ``--metrics`` for one that is off, and
    ``--usage / --no-usage`` for one that is on (its help says what "on" does)."""
    if param.hidden or param.param_type_name != "option":
        return None
    if param.is_flag and param.secondary_opts and _default(param, ctx):
        names = f"{', '.join(param.opts)} / {', '.join(param.secondary_opts)}"
    else:
        names = ", ".join(sorted(param.opts, key=len))
        if not param.is_flag:
            names += f" {_metavar(param)}"
    extra = []
    default = _default_text(param, ctx)
    if default is not None:
        extra.append(f"default: {default}")
    elif param.is_flag and _default(param, ctx):
        extra.append("default: on")
    if param.required:
        extra.append("required")
    if param.multiple:
        extra.append("repeatable")
    text = (param.help or "").strip()
    if extra:
        text += f" [{'; '.join(extra)}]"
    return names, text


class GatewayCommand(TyperCommand):
    """Plain help, options in their panels, each with its default."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        panels: dict[str, list[tuple[str, str]]] = {}
        arguments = []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                record = param.get_help_record(ctx)
                if record is not None:
                    arguments.append(record)
                continue
            record = _option_record(param, ctx)
            if record is not None:
                panel = getattr(param, "rich_help_panel", None) or "Options"
                panels.setdefault(panel, []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        for panel, records in panels.items():
            with formatter.section(panel):
                formatter.write_dl(records)
        options = [p for p in self.get_params(ctx) if p.param_type_name == "option"
                   and not getattr(p, "hidden", False) and p.name != "help"]
        with_env = [p for p in options if getattr(p, "envvar", None)]
        if with_env:
            without = [p.opts[0] for p in options if not getattr(p, "envvar", None)]
            which = ("Every option" if not without
                     else f"Every option but {', '.join(without)}")
            usual = [p for p in with_env if p.envvar == _usual_envvar(p)]
            odd = [f"{p.opts[0]}: {p.envvar}" for p in with_env if p.envvar != _usual_envvar(p)]
            # The example shows the naming rule, so it is one that follows it; where none
            # does, the odd names are all there is to say.
            rule = ("" if not usual else
                    f"NNRP_GATEWAY_ and the option's name in capitals, dashes as underscores "
                    f"({usual[0].opts[0]}: {usual[0].envvar})"
                    + (f", except {'; '.join(odd)}" if odd else ""))
            formatter.write_paragraph()
            formatter.write_text(
                f"{which} can also be set in the environment: {rule or '; '.join(odd)}. "
                "A flag on the command line wins over the environment.")


def _usual_envvar(param: Any) -> str:
    return "NNRP_GATEWAY_" + str(param.opts[0]).lstrip("-").replace("-", "_").upper()


class GatewayTyper(typer.Typer):
    """A Typer whose commands use GatewayCommand and whose groups report errors once."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", GatewayGroup)
        kwargs.setdefault("rich_markup_mode", None)
        kwargs.setdefault("pretty_exceptions_enable", False)
        kwargs.setdefault("add_completion", False)
        kwargs.setdefault("no_args_is_help", True)
        settings = kwargs.setdefault("context_settings", {})
        settings.setdefault("help_option_names", ["-h", "--help"])
        settings.setdefault("max_content_width", 100)
        super().__init__(**kwargs)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None,
                **kwargs: Any) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(name, cls=cls or GatewayCommand, **kwargs)
