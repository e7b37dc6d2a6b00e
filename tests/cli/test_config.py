"""The configuration file and the help a person reads (issue 22, items 3 and 4)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from cli.main import app, example_file

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "gateway.example.toml"


def print_config(*args: str) -> str:
    result = runner.invoke(app, ["serve", *args, "--print-config"])
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_the_example_file_is_current_and_loads_to_the_defaults() -> None:
    assert EXAMPLE.read_text() == example_file(), (
        "regenerate: python -c 'import cli.main as m; print(m.example_file(), end=\"\")' "
        "> deploy/gateway.example.toml")
    assert print_config("--config", str(EXAMPLE)) == print_config()


def test_the_example_file_has_every_key() -> None:
    serve = get_command(app).commands["serve"]  # type: ignore[attr-defined]
    settable = {p.name for p in serve.params
                if p.name not in ("config_file", "print_config") and not p.hidden}
    text = EXAMPLE.read_text()
    written = {line.lstrip("# ").split(" = ")[0] for line in text.splitlines()
               if " = " in line}
    assert settable <= written, settable - written


def test_print_config_round_trips(tmp_path: Path) -> None:
    printed = print_config(
        "--listen", "tcp://0.0.0.0:7700", "--listen", "unix:///run/nnrp.sock",
        "--vllm-url", "https://vllm.internal:8443", "--quic-alpn", "nnrp/1", "--metrics",
        "--admin-listen", "0.0.0.0:9090", "--total-timeout", "600", "--log-level", "debug",
        "--resume-window", "0", "--workers", "3", "--tool-calls")
    written = tmp_path / "gateway.toml"
    written.write_text(printed)
    assert print_config("--config", str(written)) == printed
    settings = tomllib.loads(printed)
    assert settings["listen"] == ["tcp://0.0.0.0:7700", "unix:///run/nnrp.sock"]
    assert (settings["quic_alpn"], settings["total_timeout"], settings["workers"]) == (
        "nnrp/1", 600.0, 3)  # not the default (any), so the file must carry it


def test_secrets_are_said_to_be_set_and_never_printed(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("file-token\n")
    printed = print_config("--upstream-api-key", "sk-secret", "--auth-token", "t-secret",
                           "--auth-token-file", str(tokens))
    assert "sk-secret" not in printed and "t-secret" not in printed
    assert "# upstream_api_key: set (not printed)" in printed
    assert "# auth_token: set (not printed)" in printed
    assert f'auth_token_file = "{tokens}"' in printed  # a path is not the secret


@pytest.mark.parametrize(("document", "says"), [
    ('listen = "tcp://127.0.0.1:7700"', 'expected a list, got a string (write ["..."]), '
                                        "key listen"),
    ("max_connections = 7.5", "expected an integer, got a float, key max_connections"),
    ("metrics = 1", "expected true or false, got an integer, key metrics"),
    ("drain_timeout = -1", "key drain_timeout"),
    ("[serve]\nvllm_url = 'nope'", "got 'nope', key vllm_url in"),
    ("serve = 3", "[serve] must be a table"),
    ("max-connections = 3", "unknown key 'max-connections' (did you mean max_connections?)"),
    ("listen = []", "no NNRP listener (give at least one), key listen in"),
])
def test_a_file_error_names_the_file_and_the_key(tmp_path: Path, document: str,
                                                 says: str) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(document + "\n")
    result = runner.invoke(app, ["serve", "--config", str(config), "--print-config"])
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and says in line and str(config) in line, line


def test_a_float_option_takes_an_integer(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("drain_timeout = 2\n")
    assert tomllib.loads(print_config("--config", str(config)))["drain_timeout"] == 2.0


def test_flags_and_environment_win_over_the_file(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("max_connections = 7\nidle_timeout = 11.0\n")
    printed = runner.invoke(app, ["serve", "--config", str(config), "--idle-timeout", "12",
                                  "--print-config"],
                            env={"NNRP_GATEWAY_MAX_CONNECTIONS": "8"}).stdout
    settings = tomllib.loads(printed)
    assert (settings["max_connections"], settings["idle_timeout"]) == (8, 12.0)


def _all_commands(group: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in getattr(group, "commands", {}).items():
        if getattr(command, "hidden", False):
            continue
        found.append((*path, name))
        found += _all_commands(command, (*path, name))
    return found


@pytest.mark.parametrize("command", _all_commands(get_command(app)), ids=" ".join)
def test_every_command_has_short_help_and_every_option_a_line(command: tuple[str, ...]
                                                             ) -> None:
    result = runner.invoke(app, [*command, "-h"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.stderr
    assert "╭" not in result.stdout  # plain help: no boxes that cut names short
    node = get_command(app)
    for name in command:
        node = node.commands[name]  # type: ignore[attr-defined]
    for param in node.params:
        if param.param_type_name == "option" and not getattr(param, "hidden", False):
            assert getattr(param, "help", None), f"{' '.join(command)} {param.opts[0]}"
            assert param.opts[0] in result.stdout or (
                getattr(param, "secondary_opts", None)
                and param.secondary_opts[0] in result.stdout)


def test_serve_help_groups_its_options_and_shows_flags_without_values() -> None:
    text = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "80"}).stdout
    panels = ["Listeners:", "vLLM:", "Limits and timeouts:", "TLS and auth:",
              "Observability:", "Workers and shutdown:", "Resumable sessions:",
              "Configuration:"]
    assert [text.index(panel) for panel in panels] == sorted(
        text.index(panel) for panel in panels)
    assert "--metrics " in text and "--no-metrics" not in text and "<bool>" not in text
    assert "--log-level {debug|info|warning|error}" in text
    assert "[default: 67108864]" in text  # every default shown
    assert len(text.splitlines()) < 210  # 89 options, most on two lines


def test_a_flag_that_is_on_shows_both_forms_with_its_help() -> None:
    text = runner.invoke(app, ["chat", "-h"], env={"COLUMNS": "80"}).stdout
    assert "--usage / --no-usage" in text and "[default: on]" in text
    text = runner.invoke(app, ["conformance", "run", "-h"], env={"COLUMNS": "80"}).stdout
    assert "--check-without-extensions / --no-check-without-extensions" in text


def test_version_flag() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith("nnrp-vllm-gateway ")


# ------------------------------------------------------------------ NNRP_GATEWAY_* variables

def test_a_misspelt_variable_is_a_warning_naming_the_nearest_setting() -> None:
    """Issue 37: NNRP_GATEWAY_VLLM_URLL was ignored without a word (the gateway then
    dialled the default vLLM). A warning, not an error: the environment is shared (rule 5
    of cli/_settings.py), where the file is the gateway's own."""
    result = runner.invoke(app, ["serve", "--print-config"],
                           env={"NNRP_GATEWAY_VLLM_URLL": "http://10.0.0.9:8000",
                                "NNRP_GATEWAY_NOT_OURS": "1"})
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines() == [
        "warning: NNRP_GATEWAY_NOT_OURS is not a setting; it is ignored",
        "warning: NNRP_GATEWAY_VLLM_URLL is not a setting; did you mean "
        "NNRP_GATEWAY_VLLM_URL?"]
    assert 'vllm_url = "http://127.0.0.1:8000"' in result.stdout


def test_every_command_warns_and_a_setting_of_another_command_is_no_mistake() -> None:
    # A container's environment serves several commands: chat's endpoint beside serve's.
    env = {"NNRP_GATEWAY_ENDPOINT": "tcp://127.0.0.1:7700", "NNRP_GATEWAY_DEBUG": "0",
           "NNRP_GATEWAY_ADMIN_LISTEN": "127.0.0.1:9090", "NNRP_GATEWAY_LOGLEVEL": "debug"}
    for argv in (["version"], ["serve", "--print-config"], ["conformance", "validate", "-h"]):
        result = runner.invoke(app, argv, env=env)
        assert result.stderr.splitlines() == [
            "warning: NNRP_GATEWAY_LOGLEVEL is not a setting; did you mean "
            "NNRP_GATEWAY_LOG_LEVEL?"], argv


def test_the_known_names_are_every_name_the_source_reads() -> None:
    """The known names come from the options' declarations; a variable the code reads
    itself (a string literal naming it) must be in READ_DIRECTLY, or its users would be
    warned that it is no setting."""
    import re

    from cli._settings import known_variables

    known = known_variables(get_command(app))
    literal = re.compile(r"[\"'](NNRP_GATEWAY_[A-Z0-9_]*[A-Z0-9])[\"']")
    named = {name for top in ("cli", "gateway") for path in (ROOT / top).rglob("*.py")
             for name in literal.findall(path.read_text())}
    assert "NNRP_GATEWAY_ADMIN_LISTEN" in named  # cli/ops.py's, read by health
    assert named - known == set()
    assert {"NNRP_GATEWAY_VLLM_URL", "NNRP_GATEWAY_ENDPOINT", "NNRP_GATEWAY_CLIENT_AUTH_TOKEN",
            "NNRP_GATEWAY_DEBUG"} <= known
