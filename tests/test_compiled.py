"""The per-event modules stay compilable by mypyc (gateway/compiled.py's rules), read
from their source without building: a change that breaks a rule fails here in the unit
tier, not only in the compiled leg (``make compiled``) that builds them."""

from __future__ import annotations

import ast
import functools
import importlib
import os
import sys
from pathlib import Path

import pytest

from gateway.compiled import (
    COMPILED,
    COMPILED_MODULES,
    MIXED,
    NATIVE_MODULES,
    PURE,
    build,
    compiled_file,
    described,
)

ROOT = Path(__file__).resolve().parent.parent


def source(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


@functools.cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def functions(node: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(node) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def own_nodes(function: ast.AST) -> list[ast.AST]:
    """The nodes of ``function``'s own body, nested functions and classes left out."""
    found: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        found.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                          | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))
    return found


def test_the_table_names_modules_that_exist() -> None:
    assert len(set(COMPILED_MODULES)) == len(COMPILED_MODULES)
    assert [m for m in COMPILED_MODULES if not source(m).is_file()] == []
    # Rule 9: each C extension has its source, a stub for mypy, and no Python source of
    # its name (which an install without the extension would import instead).
    for module, c_source, _ in NATIVE_MODULES:
        assert (ROOT / c_source).is_file() and c_source.endswith(".c")
        assert source(module).with_suffix(".pyi").is_file()
        assert not source(module).is_file()


@pytest.mark.parametrize("module", COMPILED_MODULES)
def test_no_async_generator(module: str) -> None:
    """Rule 1: mypyc cannot compile an async generator (an asynccontextmanager is one)."""
    found = [f"{f.name} (line {f.lineno})" for f in functions(tree(source(module)))
             if isinstance(f, ast.AsyncFunctionDef)
             and any(isinstance(n, ast.Yield | ast.YieldFrom) for n in own_nodes(f))]
    assert found == []


@pytest.mark.parametrize("module", COMPILED_MODULES)
def test_no_surrogate_in_a_literal(module: str) -> None:
    """Rule 2."""
    found = [node.lineno for node in ast.walk(tree(source(module)))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and any(0xD800 <= ord(c) <= 0xDFFF for c in node.value)]
    assert found == []


def _any_factories(module: ast.Module) -> set[str]:
    """Module-level names annotated ``Callable[[], Any]`` (rule 3's factories)."""
    return {node.target.id for node in module.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and ast.unparse(node.annotation) == "Callable[[], Any]"}


@pytest.mark.parametrize("module", COMPILED_MODULES)
def test_attrs_factories_are_typed_any(module: str) -> None:
    """Rule 3: ``attrs.field(factory=f)`` with ``f: Callable[[], Any]``; no
    ``attrs.Factory`` default (typed as what it makes, like a factory of that type)."""
    parsed = tree(source(module))
    allowed = _any_factories(parsed)
    found = []
    for node in ast.walk(parsed):
        if not isinstance(node, ast.Call):
            continue
        callee = ast.unparse(node.func)
        if callee in ("attrs.Factory", "attr.Factory", "Factory"):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if callee in ("attrs.field", "attr.ib", "field"):
            for keyword in node.keywords:
                if keyword.arg == "factory" and not (isinstance(keyword.value, ast.Name)
                                                     and keyword.value.id in allowed):
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert found == []


@pytest.mark.parametrize("module", COMPILED_MODULES)
def test_an_except_name_has_one_type(module: str) -> None:
    """Rule 4: a name bound by ``except T as name`` clauses of one function, one T."""
    found = []
    for function in functions(tree(source(module))):
        bound: dict[str, set[str]] = {}
        for node in own_nodes(function):
            if isinstance(node, ast.ExceptHandler) and node.name and node.type is not None:
                bound.setdefault(node.name, set()).add(ast.unparse(node.type))
        found += [f"{function.name}: {name} as {sorted(types)}"
                  for name, types in bound.items() if len(types) > 1]
    assert found == []


@pytest.mark.parametrize("module", COMPILED_MODULES)
def test_no_loop_jump_out_of_a_finally_block(module: str) -> None:
    """Rule 6: no ``continue`` or ``break`` leaves a ``try`` that has a ``finally``
    (mypyc: "continue inside try/finally block is unimplemented")."""
    found = []
    for node in ast.walk(tree(source(module))):
        if isinstance(node, ast.Try | ast.TryStar) and node.finalbody:
            for part in (*node.body, *node.handlers, *node.orelse):
                found += [f"line {jump.lineno}" for jump in _jumps_out(part)]
    assert found == []


def _jumps_out(node: ast.AST) -> list[ast.stmt]:
    """``continue`` and ``break`` under ``node`` that leave it (none of a loop inside)."""
    if isinstance(node, ast.Continue | ast.Break):
        return [node]
    if isinstance(node, ast.For | ast.AsyncFor | ast.While):
        return [j for part in node.orelse for j in _jumps_out(part)]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
        return []
    return [j for child in ast.iter_child_nodes(node) for j in _jumps_out(child)]


# --------------------------------------------------------------------------- rule 7


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _python_files() -> dict[str, Path]:
    return {_module_of(p): p for top in ("gateway", "cli", "tests")
            for p in sorted((ROOT / top).rglob("*.py"))}


@functools.cache
def _imported_names(module: str) -> dict[str, str]:
    """What each name a module imports stands for: ``name`` -> ``module.Name`` (or a
    module's name for ``import x`` and ``from pkg import module``)."""
    path = _python_files()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: dict[str, str] = {}
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.ImportFrom):
            base = (".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                             + ([node.module] if node.module else []))
                    if node.level else node.module or "")
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.partition(".")[0]] = (
                    alias.name if alias.asname else alias.name.partition(".")[0])
    return names


def _origin(qualified: str, depth: int = 0) -> str:
    """Where ``module.Name`` is defined, following re-exports through packages."""
    module, _, name = qualified.rpartition(".")
    if depth > 8 or module not in _python_files() or qualified in _python_files():
        return qualified
    target = _imported_names(module).get(name)
    return qualified if target is None else _origin(target, depth + 1)


def _resolve(expression: ast.expr, module: str) -> str | None:
    """The class a base expression names, as ``module.Name``; None for a builtin."""
    if isinstance(expression, ast.Subscript):  # Generic[T], a parametrised base
        return _resolve(expression.value, module)
    head, _, rest = ast.unparse(expression).partition(".")
    imported = _imported_names(module).get(head)
    if imported is not None:
        return _origin(f"{imported}.{rest}" if rest else imported)
    defined = any(isinstance(node, ast.ClassDef) and node.name == head
                  for node in tree(_python_files()[module]).body)
    return f"{module}.{head}" if defined else None


@functools.cache
def _native_classes() -> frozenset[str]:
    """The classes mypyc makes native in the table's modules: undecorated, with builtin
    or native bases only (an enum, a protocol, a class of an interpreted module's
    making, such as an error under ``GatewayError``, makes a Python class; so does
    attrs)."""
    candidates = {f"{module}.{node.name}": (module, node) for module in COMPILED_MODULES
                  for node in tree(source(module)).body
                  if isinstance(node, ast.ClassDef) and not node.decorator_list}
    native: set[str] = set()
    changed = True
    while changed:  # a base is native once its own bases are found so
        changed = False
        for name, (module, node) in candidates.items():
            bases = [_resolve(base, module) for base in node.bases]
            if name not in native and all(b is None or b in native for b in bases):
                native.add(name)
                changed = True
    return frozenset(native)


def _natives_subclassed() -> list[str]:
    """Every class of gateway/, cli/ and tests/ that subclasses a class of the table and
    is either outside the table or, inside it, not native while its base is."""
    native, table = _native_classes(), set(COMPILED_MODULES)
    # Checked by their exact type: the table's classes that are not native and have no
    # base of an interpreted module's (an error under GatewayError is checked as Python).
    ours = set()
    for module in COMPILED_MODULES:
        for node in tree(source(module)).body:
            bases = [_resolve(base, module) for base in node.bases] if isinstance(
                node, ast.ClassDef) else [""]
            if all(b is None or b.rpartition(".")[0] in table
                   or b.rpartition(".")[0] not in _python_files() for b in bases):
                ours.add(f"{module}.{getattr(node, 'name', '')}")
    found = []
    for module, path in _python_files().items():
        for node in ast.walk(tree(path)):
            if not isinstance(node, ast.ClassDef) or f"{module}.{node.name}" in native:
                continue
            found += [f"{module}.{node.name} ({origin})" for base in node.bases
                      if (origin := _resolve(base, module)) in native
                      or (origin in ours and module not in table)]
    return found


def test_no_class_of_the_table_is_subclassed_by_a_python_one() -> None:
    """Rule 7: mypyc refuses an interpreted subclass of a native class at run time, and
    an attrs one of the table at build time; and compiled code checks an instance of a
    class the group never subclasses by its exact type, so a subclass of an attrs class
    from outside is refused where it is passed (``OperationNotes``: in ``_notes``)."""
    assert _natives_subclassed() == []


def test_the_subclass_check_finds_the_classes_left_out(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """The check above can fail: with ``_layout`` and ``_server_outputs`` in the table,
    the attrs messages and ``ServerConnection`` (through a re-export) are found."""
    import tests.test_compiled as this

    monkeypatch.setattr(this, "COMPILED_MODULES", (*COMPILED_MODULES, "gateway.nnrp._layout",
                                                   "gateway.nnrp._server_outputs"))
    _native_classes.cache_clear()
    try:
        found = _natives_subclassed()
    finally:
        _native_classes.cache_clear()
    assert ("gateway.nnrp._server.ServerConnection "
            "(gateway.nnrp._server_outputs.SessionOutputs)") in found
    assert "gateway.nnrp._messages.PartialResult (gateway.nnrp._layout.WireMessage)" in found
    assert _origin("gateway.nnrp.ServerSession") == "gateway.nnrp._server_session.ServerSession"


# --------------------------------------------------------------------------- the build


def test_this_build_is_reported_as_what_it_is() -> None:
    """An install is pure or compiled, never mixed; each module's file says which (the
    compiled leg runs this test on its build: NNRP_TESTS_COMPILED=1)."""
    expected = COMPILED if os.environ.get("NNRP_TESTS_COMPILED") == "1" else PURE
    assert build() == expected != MIXED
    loaded = [m for m in COMPILED_MODULES if m in sys.modules]
    assert loaded  # the suite imported some: each from the file build() read
    for module in loaded:
        extension = compiled_file(module)
        file = sys.modules[module].__file__
        assert file == (str(extension) if extension is not None else str(source(module)))
    for module, _, _ in NATIVE_MODULES:  # rule 9: built, and imported from that file
        extension = compiled_file(module)
        assert (extension is not None) == (expected == COMPILED)
        if extension is not None:
            assert importlib.import_module(module).__file__ == str(extension)


def test_version_and_the_capability_document_say_the_build() -> None:
    from typer.testing import CliRunner

    from cli.main import app
    from gateway.profile import capability_document

    printed = CliRunner().invoke(app, ["--version"]).output.splitlines()
    assert printed[1] == f"build: {described()}"
    assert described() == ("pure Python" if build() == PURE else
                           f"compiled: {len(COMPILED_MODULES)} of {len(COMPILED_MODULES)} "
                           "per-event modules by mypyc, the plain text delta in C")
    document = capability_document(adapter="a", models=(), tool_calls=False)
    assert document["build"] == build()
