"""The project's scripts delete only what they made, inside the checkout: never a
directory named by a variable the caller's environment may hold (``OUT`` is a common
name; `.ci/conformance` once deleted a caller's ``$OUT``)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / ".ci").iterdir())
#: Names a caller's environment commonly holds.
INHERITED = ("OUT", "OUTPUT", "TMP", "TMPDIR", "DIR", "DEST", "BUILD", "LOG", "LOGS",
             "RESULTS", "VENV", "BIN", "HOME")


def test_every_deleted_variable_is_assigned_in_the_script_not_inherited() -> None:
    for script in SCRIPTS:
        text = script.read_text()
        for name in re.findall(r'rm -r[f]* "?\$\{?(\w+)', text):
            assigned = re.search(rf"^\s*{name}=(.*)$", text, re.MULTILINE)
            assert assigned is not None, f"{script.name} deletes ${name}, never assigned"
            assert "${" + name not in assigned.group(1), (
                f"{script.name} deletes ${name}, which the caller's environment may set")


def test_conformance_leaves_a_callers_out_directory_alone(tmp_path: Path) -> None:
    sentinel = tmp_path / "keep-me"
    sentinel.mkdir()
    (sentinel / "precious").write_text("x")
    env = {**os.environ, **dict.fromkeys(INHERITED, str(sentinel)),
           "BIN": str(tmp_path / "no-such-bin")}  # stops the script right after its set-up
    subprocess.run(["bash", str(ROOT / ".ci" / "conformance")], env=env, cwd=ROOT,
                   capture_output=True, timeout=60, check=False)
    assert (sentinel / "precious").read_text() == "x"


def test_make_deletes_nothing_a_variable_names() -> None:
    env = {**os.environ, "OUT": "/sentinel-out", "VENV": "/sentinel-venv"}
    dry = subprocess.run(["make", "-n", "test", "clean"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False).stdout
    assert "/sentinel" not in dry
