"""The README is a way in: its table of contents leads to every section, every
`nnrp-gateway` command in its shell blocks (the quick start's among them) exists with the
options it is given, as `nnrp-gateway COMMAND --help` lists them, the quick start's
commands point at each other, and the user-facing pages carry no internal words (issue
numbers, "the VM": the history is in CHANGELOG.md)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import attrs
import pytest
import typer
from typer.testing import CliRunner

from cli.main import app
from tests.support.docs import anchors, links

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
#: The pages the README's reference table leads to that were written for users (the
#: benchmarks are a lab notebook and keep their machines and history).
USER_PAGES = [README, *(ROOT / "docs" / f"{name}.md" for name in (
    "configuration", "operations", "observability", "deploy", "resume", "quic", "protocol"))]

runner = CliRunner()

_SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)
_HEADING2 = re.compile(r"^## (.+?)\s*$", re.M)


@attrs.frozen
class Call:
    """One `nnrp-gateway` call in a shell block."""

    line: str
    path: tuple[str, ...]  # the command and subcommand names; () for the root
    options: tuple[tuple[str, str | None], ...]  # each long option with its value

    def value(self, option: str) -> str | None:
        (found,) = [value for name, value in self.options if name == option]
        return found


def section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def _option(command: Any, name: str) -> Any:
    return next((param for param in command.params
                 if name in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ()))),
                None)


def calls(text: str) -> list[Call]:
    """Every `nnrp-gateway ...` in the text's ```sh blocks, read as the shell reads it: a
    line continued by a backslash is one line, and a call ends at a shell operator."""
    root: Any = typer.main.get_command(app)
    found = []
    for block in _SH_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            tokens = list(lexer)
            for start, token in enumerate(tokens):
                if Path(token).name != "nnrp-gateway":
                    continue
                command, path, options = root, [], []
                args = iter(tokens[start + 1:])
                for arg in args:
                    if set(arg) <= set("();<>|&"):
                        break  # a shell operator ends the call
                    if arg.startswith("-"):
                        name, _, given = arg.partition("=")
                        param = _option(command, name)
                        takes = param is not None and getattr(param, "is_flag", True) is False
                        value = given or (next(args, None) if takes else None)
                        options.append((name, value))
                    elif arg in getattr(command, "commands", {}):
                        command = command.commands[arg]
                        path.append(arg)
                found.append(Call(line.strip(), tuple(path), tuple(options)))
    return found


README_CALLS = calls(README.read_text())


def test_the_readme_has_shell_blocks_with_calls() -> None:
    # The parser sees the README's real commands (a pattern matching nothing passes all).
    assert {call.path for call in README_CALLS} >= {
        (), ("replay-server",), ("serve",), ("chat",), ("health",), ("check",)}


def problems(call: Call) -> list[str]:
    """What is wrong with a call: a command that does not exist, or an option that
    `nnrp-gateway COMMAND --help` does not list."""
    command: Any = typer.main.get_command(app)
    for name in call.path:
        command = command.commands[name]
    if call.path and hasattr(command, "commands"):
        return [f"{call.line}: no subcommand of {' '.join(call.path)} named"]
    if not call.path and any(name not in ("--help", "--version", "--debug")
                             for name, _ in call.options):
        return [f"{call.line}: no command named"]
    result = runner.invoke(app, [*call.path, "--help"])
    if result.exit_code != 0:
        return [f"{call.line}: --help exits {result.exit_code}"]
    return [f"`nnrp-gateway {' '.join(call.path)} --help` does not list {name}"
            for name, _ in call.options
            if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", result.output)
            or (name not in ("--help", "-h") and _option(command, name) is None)]


@pytest.mark.parametrize("call", README_CALLS, ids=lambda call: call.line[:60])
def test_each_readme_command_exists_with_its_options(call: Call) -> None:
    assert problems(call) == []


def test_the_command_check_catches_what_it_looks_for() -> None:
    text = ("```sh\n.venv/bin/nnrp-gateway chat hi --endpont tcp://h:1 --model m &\n"
            "nnrp-gateway serve \\\n  --listen tcp://h:1 --admin-listen h:2 > log &\n"
            "nnrp-gateway conformance\nnnrp-gateway frobnicate --x\n"
            "until nnrp-gateway health --ready -q; do sleep 1; done\n```\n"
            "```text\nnrp-gateway serve --not-a-block\n```\n")
    chat, serve, conformance, unknown, health = calls(text)
    assert chat.path == ("chat",) and chat.options == (("--endpont", None), ("--model", "m"))
    assert problems(chat) == ["`nnrp-gateway chat --help` does not list --endpont"]
    assert serve.options == (("--listen", "tcp://h:1"), ("--admin-listen", "h:2"))
    assert problems(serve) == []
    assert problems(conformance) == ["nnrp-gateway conformance: no subcommand of "
                                     "conformance named"]
    assert problems(unknown) == ["nnrp-gateway frobnicate --x: no command named"]
    assert health.options == (("--ready", None), ("-q", None)) and problems(health) == []


def test_the_quick_start_runs_replay_server_serve_and_chat_against_each_other() -> None:
    quick = calls(section(README.read_text(), "Quick start by hand"))
    by_command = {call.path: call for call in quick}
    assert [call.path for call in quick] == [
        ("replay-server",), ("serve",), ("health",), ("chat",)]
    replay, serve, health, chat = (by_command[(name,)] for name in (
        "replay-server", "serve", "health", "chat"))
    assert all(line.startswith(".venv/bin/") or line.startswith("until .venv/bin/")
               for line in (call.line for call in quick)), "the tools are in .venv/bin"
    assert serve.value("--vllm-url") == f"http://{replay.value('--listen')}"
    assert chat.value("--endpoint") == serve.value("--listen")
    assert health.value("--admin-url") == f"http://{serve.value('--admin-listen')}"
    assert ("--ready", None) in health.options


def test_the_table_of_contents_lists_every_section_in_order() -> None:
    text = README.read_text()
    contents = section(text, "Contents")
    targets = links(contents)
    assert targets and all(target.startswith("#") for target in targets), targets
    ids = anchors(text)
    assert [target for target in targets if target[1:] not in ids] == []
    headings = [h for h in _HEADING2.findall(re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))
                if h != "Contents"]
    assert [target[1:] for target in targets] == [
        re.sub(r"[^\w\- ]", "", h.lower().replace("`", "")).replace(" ", "-") for h in headings]


def test_the_readme_links_the_reference_pages_and_the_changelog() -> None:
    targets = {target.partition("#")[0] for target in links(README.read_text())}
    pages = {str(page.relative_to(ROOT)) for page in USER_PAGES[1:]}
    assert pages | {"docs/architecture.md", "docs/benchmarks.md", "docs/fleet.md",
                    "docs/runtime-controls.md", "CHANGELOG.md"} <= targets


def test_the_changelog_keeps_a_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "https://keepachangelog.com/en/1.1.0/" in text
    versions = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert versions[0] == "Unreleased"
    kinds = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    assert set(re.findall(r"^### (\w+)", text, re.M)) <= kinds


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_pages_carry_no_internal_words(page: Path) -> None:
    prose = re.sub(r"\]\([^)]*\)", "]", page.read_text())  # link targets aside (anchors)
    found = re.findall(r"(?i)\bissues? \d+|\bissue-\d+|\bthe (?:2-core )?VM\b|\bthis VM\b",
                       prose)
    assert found == []
