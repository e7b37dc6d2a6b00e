"""The opt-in compiled build: ``NNRP_GATEWAY_COMPILE=1 pip install .`` compiles the
per-event modules (``gateway/compiled.py``'s table) with mypyc into the wheel, and the
C-API extensions of its ``NATIVE_MODULES`` beside them (their ``.c`` sources never go
into a wheel: ``exclude`` in pyproject.toml).

Unset, or ``0`` (the default, and the published wheel), this hook does nothing and asks
for nothing: the wheel is pure Python and carries no compiled file (tests/deploy checks
the built wheel's list). Set, the build needs gcc and installs mypy at the one version
below into its own build environment, with the dependencies mypy reads the modules'
types from; it takes a minute or two.

Rules:

1. mypy is pinned exactly: mypyc's generated C and its runtime library change between
   releases, and the wheel carries the runtime it was built with.
2. Nothing is written into the source tree: mypyc and setuptools run in a temporary
   folder, and the extensions go into the wheel from there. (An in-place build would
   leave extensions beside the sources, which a checkout's editable install and a later
   pure build would then pick up.)
3. An editable install is refused with the switch on: it runs the sources in place, so
   nothing compiled would be used.
"""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SWITCH = "NNRP_GATEWAY_COMPILE"
#: Rule 1; `make compiled` and the Dockerfile build with this same version.
MYPY = "mypy==2.4.1"
#: Build-time only, besides mypy: setuptools runs the compiler (mypyc's build API), the
#: stubs are what `mypy --strict` reads for jsonschema.
BUILD_TOOLS = ("setuptools>=70", "types-jsonschema")

_SETUP = """\
from setuptools import Extension, setup
from mypyc.build import mypycify

setup(name="nnrp-vllm-gateway-compiled",
      ext_modules=[*mypycify({args!r}, opt_level="3", debug_level="0",
                             group_name="nnrp_gateway"),
                   *(Extension(name, [source]) for name, source in {native!r})])
"""


def switched_on() -> bool:
    return os.environ.get(SWITCH, "") not in ("", "0")


class CompiledBuild(BuildHookInterface):  # type: ignore[type-arg]
    """The wheel's mypyc extensions, when ``NNRP_GATEWAY_COMPILE`` is set."""

    PLUGIN_NAME = "nnrp-compiled"

    def dependencies(self) -> list[str]:
        if not switched_on():
            return []
        # What mypy reads the modules' types from: the runtime dependencies and the otel
        # extra's (the handler imports the tracer, which imports OpenTelemetry lazily).
        core = self.metadata.core
        return [MYPY, *BUILD_TOOLS, *core.dependencies, *core.optional_dependencies["otel"]]

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or not switched_on():
            return
        if version == "editable":  # rule 3
            raise RuntimeError(f"{SWITCH}=1 builds a regular wheel (pip install ., not -e): "
                               "an editable install runs the sources in place")
        root = Path(self.root)
        tables = runpy.run_path(str(root / "gateway" / "compiled.py"))
        sources = [str(root.joinpath(*module.split(".")).with_suffix(".py"))
                   for module in tables["COMPILED_MODULES"]]
        native = [(module, str(root / source)) for module, source, _ in tables["NATIVE_MODULES"]]
        self._work = Path(tempfile.mkdtemp(prefix="nnrp-mypyc-"))  # rule 2
        (self._work / "setup.py").write_text(_SETUP.format(
            args=[*sources, "--config-file", str(root / "pyproject.toml")], native=native))
        built = self._work / "lib"
        self.app.display_info(f"mypyc: compiling {len(sources)} modules, and "
                              f"{len(native)} C extension(s)")
        done = subprocess.run(
            [sys.executable, "setup.py", "build_ext", "--build-lib", str(built),
             "--build-temp", str(self._work / "tmp"), f"--parallel={os.cpu_count() or 1}"],
            cwd=self._work, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"mypyc failed:\n{done.stdout[-6000:]}{done.stderr[-6000:]}")
        for extension in sorted(built.rglob("*.so")) + sorted(built.rglob("*.pyd")):
            build_data["force_include"][str(extension)] = str(extension.relative_to(built))
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        work = getattr(self, "_work", None)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
