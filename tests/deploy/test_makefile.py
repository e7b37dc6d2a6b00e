"""The Makefile's contract (README, "Two commands"): `make demo` and `make test` each
make .venv on a fresh machine; demo installs only the runtime dependencies; test after
demo adds only the test extra; demo after test installs nothing; `make` lists the
targets. Checked with `make -n` (what make would run) on a copy of the Makefile and
pyproject.toml whose stamps are set by hand, so nothing is installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")

RUNTIME = ".venv/.installed-runtime"
TEST = ".venv/.installed-test"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    os.utime(tmp_path / "pyproject.toml", (1_000_000, 1_000_000))
    return tmp_path


def stamp(project: Path, name: str, mtime: int) -> None:
    path = project / name
    path.parent.mkdir(exist_ok=True)
    path.touch()
    os.utime(path, (mtime, mtime))


def would_run(project: Path, goal: str) -> str:
    """``make -n GOAL`` as a person would type it: not as a sub-make of ``make test``
    (which passes MAKELEVEL and MAKEFLAGS down and makes make print its directory)."""
    assert MAKE is not None
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
    return subprocess.run([MAKE, "--no-print-directory", "-n", *([goal] if goal else [])],
                          cwd=project, capture_output=True, text=True, check=True,
                          env=env).stdout


def installs(commands: str) -> dict[str, bool]:
    """Which install steps make would run (the runtime step makes .venv when it has none)."""
    return {"runtime": re.search(r" -e \.; fi$", commands, re.M) is not None,
            "test": "-e '.[test]'" in commands}


def test_fresh_machine_demo_installs_the_runtime_only(project: Path) -> None:
    commands = would_run(project, "demo")
    assert installs(commands) == {"runtime": True, "test": False}
    assert "-m venv --without-pip .venv" in commands
    assert "pip --python .venv/bin/python install --quiet uv" in commands
    assert commands.rstrip().endswith(".venv/bin/nnrp-gateway demo")


def test_fresh_machine_test_installs_everything(project: Path) -> None:
    for goal in ("test", "lint", "unit"):
        assert installs(would_run(project, goal)) == {"runtime": True, "test": True}


def test_test_after_demo_adds_only_the_extra(project: Path) -> None:
    stamp(project, RUNTIME, 2_000_000)
    assert installs(would_run(project, "lint")) == {"runtime": False, "test": True}
    assert would_run(project, "demo") == ".venv/bin/nnrp-gateway demo\n"


def test_demo_after_test_installs_nothing(project: Path) -> None:
    stamp(project, RUNTIME, 2_000_000)
    stamp(project, TEST, 2_000_001)
    assert would_run(project, "demo") == ".venv/bin/nnrp-gateway demo\n"
    assert would_run(project, "lint") == ".venv/bin/ruff check gateway cli tests\n"


def test_otel_adds_the_tracing_extra_to_the_venv(project: Path) -> None:
    # docs/observability.md, "Traces": a checkout's way to the extra (its .venv has uv, not pip).
    assert installs(would_run(project, "otel")) == {"runtime": True, "test": False}
    stamp(project, RUNTIME, 2_000_000)
    assert would_run(project, "otel") == (
        "if [ -x .venv/bin/uv ]; then .venv/bin/uv pip install --quiet --python "
        ".venv/bin/python -e '.[otel]'; else .venv/bin/python -m pip install --quiet "
        "--no-compile -e '.[otel]'; fi\n")


def test_an_edited_pyproject_reinstalls_both(project: Path) -> None:
    stamp(project, RUNTIME, 500_000)
    stamp(project, TEST, 500_001)
    assert installs(would_run(project, "demo")) == {"runtime": True, "test": False}
    assert installs(would_run(project, "lint")) == {"runtime": True, "test": True}


def test_make_alone_lists_every_target(project: Path) -> None:
    assert MAKE is not None
    assert "pip" not in would_run(project, "")  # the default goal is the list
    listing = subprocess.run([MAKE, "help"], cwd=project, capture_output=True, text=True,
                             check=True).stdout
    listed = re.findall(r"^  make (\S+) +\S", listing, re.M)
    text = (project / "Makefile").read_text()
    (phony,) = re.findall(r"^\.PHONY:(.*)$", text, re.M)
    assert listed and sorted(listed) == sorted(phony.split())
    documented = re.findall(r"^([a-z][a-z-]*):.*## ", text, re.M)
    assert listed == documented
    assert not (project / ".venv").exists()


def _fake_tools(bin_dir: Path, log: Path) -> None:
    """A root shell whose apt has stale lists: ``apt-get download`` fails (the 404 of a
    version the mirror dropped) until ``apt-get update`` has run; dpkg-deb unpacks a
    promtool. Nothing else is on the PATH but the few tools the recipe uses."""
    bin_dir.mkdir()
    for tool in ("mktemp", "chmod", "cp", "rm", "mkdir", "touch", "cat"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    scripts = {
        "id": 'echo 0',
        "ls": 'exit 0',  # the lists are there (stale)
        "apt-get": f'echo "apt-get $*" >> {log}\n'
                   f'case "$1" in update) touch {log}.updated ;;\n'
                   f'  download) [ -e {log}.updated ] || exit 100\n'
                   '    touch prometheus_2.0_amd64.deb ;; esac',
        "dpkg-deb": 'mkdir -p "$3/usr/bin" && printf "#!/bin/sh\\n" > "$3/usr/bin/promtool"'
                    ' && chmod +x "$3/usr/bin/promtool"',
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)


def test_promtool_is_fetched_again_after_a_stale_download(project: Path) -> None:
    """As root, a failed download refreshes apt's lists and tries once more, so stale
    lists do not leave the promtool tests to skip."""
    assert MAKE is not None
    stamp(project, RUNTIME, 2_000_000)
    (project / ".venv" / "bin").mkdir()
    log = project / "apt.log"
    _fake_tools(project / "fakebin", log)
    done = subprocess.run([MAKE, "--no-print-directory", ".venv/bin/promtool"], cwd=project,
                          capture_output=True, text=True, check=False,
                          env={"PATH": str(project / "fakebin"), "HOME": str(project)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert log.read_text().splitlines() == ["apt-get download -qq prometheus",
                                            "apt-get update -qq",
                                            "apt-get download -qq prometheus"]
    assert os.access(project / ".venv" / "bin" / "promtool", os.X_OK)


def test_ci_requires_promtool() -> None:
    """CI's entry point makes the promtool tests fail rather than skip
    (tests/deploy/test_observability.py::promtool_verdict)."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "export NNRP_REQUIRE_PROMTOOL=1" in lines
    assert lines.index("export NNRP_REQUIRE_PROMTOOL=1") < lines.index("make test")
