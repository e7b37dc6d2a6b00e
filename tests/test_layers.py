"""The import rules of docs/architecture.md ("Layers"), read from the source itself.

* ``gateway.nnrp``, ``gateway.profile`` and the upstream's HTTP/1.1 and SSE readers are
  sans-IO: no trio, no httpx, no I/O layer.
* ``gateway.upstream`` knows vLLM, not NNRP's I/O: no ``gateway.server`` or pipeline.
* The serving core never imports the tools (``gateway.tools``): they are apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parent.parent / "gateway"
CORE = ("nnrp", "profile", "upstream", "pipeline", "server", "observe", "app.py",
        "transport.py", "_quic_client.py", "errors.py")


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, type-checking-only imports included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def files_of(part: str) -> list[Path]:
    path = GATEWAY / part
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def offenders(part: str, forbidden: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(GATEWAY)} imports {module}"
            for path in files_of(part) for module in sorted(imports_of(path))
            if any(module == f or module.startswith(f"{f}.") for f in forbidden)]


@pytest.mark.parametrize("part", ["nnrp", "profile", "upstream/_http1.py",
                                  "upstream/_sse.py"])
def test_sans_io_layers_import_no_io(part: str) -> None:
    assert offenders(part, ("trio", "httpx", "h11", "trio_websocket", "gateway.server",
                            "gateway.upstream", "gateway.pipeline", "gateway.transport",
                            "gateway.observe", "gateway.tools")) == []


def test_upstream_knows_nothing_of_the_nnrp_io() -> None:
    assert offenders("upstream", ("gateway.server", "gateway.pipeline", "gateway.transport",
                                  "gateway.tools")) == []


@pytest.mark.parametrize("part", CORE)
def test_the_serving_core_never_imports_the_tools(part: str) -> None:
    assert offenders(part, ("gateway.tools",)) == []


def test_the_rules_see_real_imports() -> None:
    # The scan itself must find what is there, or every rule above passes vacuously.
    assert "trio" in imports_of(GATEWAY / "server" / "_connection.py")
    assert "gateway.tools.client" in imports_of(GATEWAY / "tools" / "conformance" / "_run.py")
