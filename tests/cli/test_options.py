"""``serve``'s options have one source, cli/_options.py's table: the typer options, the
file's keys, ``--print-config``, the example file and the ``GatewayConfig`` are all built
from it, and an option's default is its config field's."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
import tomllib
import typing
from enum import Enum
from pathlib import Path
from typing import Any

import attrs
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from cli._options import SETTINGS, Setting, build_config, default_of
from cli.main import app, example_file
from gateway.app import GatewayConfig
from tests.support.cli import served_config

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
FIELDS = [setting for setting in SETTINGS if setting.field is not None]


def at(config: object, path: str) -> Any:
    return functools.reduce(getattr, path.split("."), config)


def with_field(config: Any, path: str, value: object) -> Any:
    """``config`` with the field at the dotted ``path`` set to ``value``."""
    head, _, rest = path.partition(".")
    inner = with_field(getattr(config, head), rest, value) if rest else value
    return attrs.evolve(config, **{head: inner})


def comparable(config: GatewayConfig) -> GatewayConfig:
    """``config`` without what no two instances share (the resubmission rule, a plain
    object without equality)."""
    return attrs.evolve(config, server=attrs.evolve(config.server, resubmission=None))


def field_value(value: object, kind: object = None) -> object:
    """What an option's value is in its field: an enum's value, a list as a tuple, a
    path option's text as a Path."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, str) and Path in typing.get_args(kind):
        return Path(value)
    return tuple(value) if isinstance(value, list) else value


# ------------------------------------------------------------------ one declaration each

def test_every_option_of_serve_is_a_row_of_the_table() -> None:
    command = get_command(app).commands["serve"]  # type: ignore[attr-defined]
    params = [param for param in command.params if param.name != "help"]
    assert [param.name for param in params] == [setting.name for setting in SETTINGS]
    ctx = command.make_context("serve", [])
    for param, setting in zip(params, SETTINGS, strict=True):
        assert (param.opts[0], param.envvar, param.metavar, param.help,
                param.rich_help_panel, param.hidden, param.min, param.max) == (
            setting.option, setting.envvar, setting.unit, setting.help, setting.panel,
            setting.hidden, setting.min, setting.max), setting.name
        assert param.get_default(ctx, call=True) == default_of(setting), setting.name


def test_the_names_users_rely_on_follow_one_rule() -> None:
    """Flag ``--`` and the name with dashes, variable ``NNRP_GATEWAY_`` and the flag in
    capitals, file key the name: ``--config`` (NNRP_GATEWAY_CONFIG) is the one other flag."""
    for setting in SETTINGS:
        if setting.name == "config_file":
            assert (setting.option, setting.envvar) == ("--config", "NNRP_GATEWAY_CONFIG")
            continue
        assert setting.option == "--" + setting.name.replace("_", "-")
        if setting.envvar is not None:
            assert setting.envvar == "NNRP_GATEWAY_" + setting.name.upper()
    assert {s.name for s in SETTINGS if s.envvar is None} == {"bench_residence",
                                                              "print_config"}


def test_every_key_of_the_example_and_of_print_config_is_a_row() -> None:
    in_file = {setting.name for setting in SETTINGS if setting.in_file and not setting.hidden}

    def keys(text: str) -> set[str]:
        return {line.lstrip("# ").split(" ")[0].rstrip(":") for line in text.splitlines()
                if " = " in line or line.endswith(" is not set") or ": set (not" in line}

    assert keys(example_file()) == in_file
    printed = runner.invoke(app, ["serve", "--print-config", "--upstream-api-key", "k",
                                  "--auth-token", "t" * 32])
    assert printed.exit_code == 0, printed.stderr
    assert keys(printed.stdout) == in_file
    assert set(tomllib.loads(printed.stdout)) <= in_file


def test_each_field_is_filled_by_one_option_at_most() -> None:
    filled = [setting.field for setting in FIELDS]
    assert len(filled) == len(set(filled))
    assert {s.feeds for s in SETTINGS if s.feeds} == {"tls", "server.authenticate", "fleet"}


# ------------------------------------------------------------------ defaults: the classes'

def test_the_defaults_are_the_config_classes() -> None:
    default = GatewayConfig()
    for setting in FIELDS:
        assert field_value(default_of(setting)) == at(default, setting.field), setting.name
    values = {setting.name: default_of(setting) for setting in SETTINGS}
    assert comparable(build_config(values)) == comparable(default)


def test_serve_without_options_serves_the_default_config(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    assert comparable(served_config(monkeypatch, [])) == comparable(GatewayConfig())


# ------------------------------------------------------------------ flag, variable, file

#: A value other than the default, for the options whose type says too little.
OTHER: dict[str, object] = {
    "listen": ["tcp://127.0.0.1:0", "ws://127.0.0.1:0/nnrp"],
    "vllm_url": "https://vllm.internal:8443",
    "max_frame_bytes": 1 << 20,  # the default is the protocol's largest
    "media_dir": "/tmp",  # a directory that is there to be checked
}


def other_value(setting: Setting) -> object:
    """A valid value that is not the default."""
    default = default_of(setting)
    if setting.name in OTHER:
        return OTHER[setting.name]
    if default is None:
        assert setting.example is not None, setting.name
        return setting.example
    if isinstance(default, bool):
        return not default
    if isinstance(default, Enum):
        return next(member for member in type(default) if member != default)
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        value = default + 0.25
        assert setting.max is None or value <= setting.max, setting.name
        return value
    raise AssertionError(f"{setting.name}: give OTHER a value")


def as_flag(setting: Setting, value: object) -> list[str]:
    if isinstance(value, bool):
        return [setting.option if value else setting.option.replace("--", "--no-", 1)]
    if isinstance(value, list):
        return [part for one in value for part in (setting.option, str(one))]
    return [setting.option, str(getattr(value, "value", value))]


def as_variable(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return " ".join(value)  # click splits a repeatable option's variable on spaces
    return str(getattr(value, "value", value))


def as_toml(name: str, value: object) -> str:
    value = getattr(value, "value", value)
    text = json.dumps(value)  # a JSON string, number, boolean or list is TOML's too
    return f"{name} = {text}\n"


@pytest.mark.parametrize("setting", FIELDS, ids=lambda setting: setting.name)
def test_a_value_reaches_its_field_alike_by_flag_variable_and_file(
        setting: Setting, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    value = other_value(setting)
    assert field_value(value, setting.kind) != at(GatewayConfig(), setting.field)
    # That field, and only it, differs from the default config.
    expected = comparable(with_field(GatewayConfig(), setting.field,
                                     field_value(value, setting.kind)))
    file = tmp_path / "gateway.toml"
    file.write_text(as_toml(setting.name, value))
    sources: dict[str, tuple[list[str], dict[str, str | None]]] = {
        "flag": (as_flag(setting, value), {}),
        "file": (["--config", str(file)], {}),
    }
    if setting.envvar is not None:
        sources["variable"] = ([], {setting.envvar: as_variable(value)})
    for source, (args, env) in sources.items():
        config = served_config(monkeypatch, args, env)
        assert comparable(config) == expected, (setting.name, source)


# ------------------------------------------------------------------ what serve loads

def test_building_the_command_line_reads_no_default() -> None:
    """The defaults come from the gateway's config classes, read when ``serve`` runs or
    shows its help: the other commands and ``-h`` never load the gateway for them."""
    code = ("import sys; from typer.main import get_command; from typer.testing import "
            "CliRunner; import cli.main; get_command(cli.main.app); "
            "assert CliRunner().invoke(cli.main.app, ['-h']).exit_code == 0; "
            "print(sorted(m for m in sys.modules if m in ('trio', 'attrs', 'gateway.app')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"


#: The code ``serve`` runs: these modules whole, and these functions of cli/main.py.
SERVE_MODULES = ("cli/_options.py", "cli/_settings.py", "cli/_app.py")
SERVE_FUNCTIONS = {"serve", "_start_logging", "_exit_for_user_error", "_serve", "_supervise",
                   "_announce", "top"}


def imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_serve_imports_nothing_from_the_tools() -> None:
    main = ast.parse((ROOT / "cli" / "main.py").read_text())
    functions = [node for node in main.body if isinstance(
        node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in SERVE_FUNCTIONS]
    assert {function.name for function in functions} == SERVE_FUNCTIONS
    trees = [*functions, *(ast.parse((ROOT / path).read_text()) for path in SERVE_MODULES)]
    found = {name for tree in trees for name in imported(tree)}
    assert "gateway.manifest" in found  # the scan sees the function-level imports
    assert {name for name in found if name.startswith("gateway.tools")} == set()
