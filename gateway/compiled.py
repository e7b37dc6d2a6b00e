"""The compiled build: the modules mypyc compiles, and whether this install runs them so.

An install is pure Python unless it was built with ``NNRP_GATEWAY_COMPILE=1``
(``hatch_build.py``): then each module of ``COMPILED_MODULES`` is also a C extension
beside its source, which Python imports first. The modules are the path one streamed
event takes, from vLLM's socket to the client's: what runs once per read or per event.
The same source is both builds: the published wheel is pure, and a test keeps every
module below compilable (tests/test_compiled.py, without building; the compiled leg
builds and runs the tests on it: ``make compiled``).

What compiling asks of these modules, each rule free for pure Python:

1. No async generator: mypyc cannot compile one. ``ChunkStream.clocks`` (an
   ``asynccontextmanager``) lives in ``gateway/upstream/_clocks.py``, which stays
   interpreted; it runs once per stream.
2. No lone surrogate in a string literal (mypyc refuses one): built with ``chr()``.
3. An ``attrs.field(factory=...)`` names a factory typed ``Callable[[], Any]``. Compiled,
   a class-body default is checked against the field's type when the class is made, and
   attrs' field marker is no list: the import failed.
4. One name is bound by ``except ... as`` clauses of one exception type only: compiled, a
   name has one type, and binding it to another raised TypeError.
5. ``Final`` on module constants read per event is welcome (compiled, a ``Final`` is
   inlined; otherwise a read is a lookup in the module's dict), never required.
6. No ``continue`` or ``break`` leaves a ``try`` that has a ``finally`` (mypyc: not
   implemented); an ``if``/``else`` says the same.
7. No class of these modules that mypyc makes native (undecorated, with builtin or
   native bases) is subclassed by a Python class: mypyc refuses an interpreted subclass
   at run time and an attrs one at build time. So ``_layout`` (``WireMessage``, the attrs
   messages' base) and ``_server_outputs`` (``ServerConnection``'s mixin) are not in the
   table. ``_client`` is not either (its ``asynccontextmanager``, rule 1); its step per
   read is ``_reads``'.
8. A test that replaces a function of these modules (a compiled caller calls it
   directly) or reads their frames (py-spy sees none) skips on a compiled build, and
   says so (``tests/support/build.py``).
9. The same build also compiles the C-API extensions of ``NATIVE_MODULES`` (hand-written
   C, each with a pure function beside it that is used where it is not built:
   ``gateway/pipeline/_plain_delta.py`` rule 7). A compiled build has them all; one
   without them is ``mixed``.

Stdlib only, and nothing here imports the modules it names: ``--version`` reads the
files beside them (an extension module is imported before a source of the same name).
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

#: The per-event path, in the order an event takes it.
COMPILED_MODULES: tuple[str, ...] = (
    "gateway._sockio",  # the socket reads and writes
    "gateway.upstream._transport",  # the response body, read by read
    "gateway.upstream._reads",  # the stream's step per read
    "gateway.upstream._http1",  # the response body's framing
    "gateway.upstream._sse",  # SSE lines to events
    "gateway.upstream._chunks",  # an event's JSON to a checked chunk
    "gateway.upstream._errors",  # what the three above raise
    "gateway.upstream._stream",  # one read's chunks, and its clocks' deadlines
    "gateway.pipeline._plain_delta",  # the plain text delta's read, fused
    "gateway.pipeline._translate",  # chunk to profile events, encoded
    "gateway.pipeline._handler",  # the operation's read loop
    "gateway.profile._events",  # profile events to JSON bytes
    "gateway.server._operation",  # Operation.emit
    "gateway.server._session",  # the operation's port to its session
    "gateway.server._outbox",  # the connection's queued writes
    "gateway.nnrp._server_session",  # the session's PARTIAL_RESULT and journal
    "gateway.nnrp._server_operation",  # its operations' states
    "gateway.nnrp._flow",  # the client's windows
    "gateway.nnrp._codec",  # the frame's bytes
    "gateway.nnrp._messages",  # the frame's metadata
    "gateway.nnrp._body",  # the event frame's shape
    "gateway.nnrp._constants",  # the registries they read
    "gateway.nnrp._errors",  # what the engine raises
    # Under a benchmark only (``serve --bench-residence``), once per read and per event:
    # compiled, a compiled build's measured CPU carries less of its own probe.
    "gateway.residence",
)

#: Rule 9: the C-API extensions, each module's name and its C source's path from the
#: project's root (hatch_build.py builds them), and what ``--version`` calls it.
NATIVE_MODULES: tuple[tuple[str, str, str], ...] = (
    ("gateway.pipeline._plain_delta_native", "gateway/pipeline/_plain_delta_native.c",
     "the plain text delta in C"),
)

#: What each build is called in ``--version``, the capability document and the benches.
PURE, COMPILED, MIXED = "pure", "compiled", "mixed"

_ROOT = Path(__file__).resolve().parent.parent


def compiled_file(module: str) -> Path | None:
    """The extension ``module`` is imported from in this install, or None (its source)."""
    *package, name = module.split(".")
    folder = _ROOT.joinpath(*package)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (folder / f"{name}{suffix}").is_file():
            return folder / f"{name}{suffix}"
    return None


def _extensions() -> list[str]:
    """Every module of both tables, mypyc's and the C ones (rule 9)."""
    return [*COMPILED_MODULES, *(module for module, _, _ in NATIVE_MODULES)]


def build() -> str:
    """``compiled`` when every module of both tables is an extension here, ``pure`` when
    none is, ``mixed`` otherwise (an install that lost some: never built so)."""
    modules = _extensions()
    found = sum(compiled_file(module) is not None for module in modules)
    return PURE if found == 0 else COMPILED if found == len(modules) else MIXED


def described() -> str:
    """One line for people: the build, and what was compiled by what."""
    kind = build()
    if kind == PURE:
        return "pure Python"
    found = sum(compiled_file(module) is not None for module in COMPILED_MODULES)
    native = [f"{what}{'' if compiled_file(module) is not None else ': not built'}"
              for module, _, what in NATIVE_MODULES]
    return ", ".join([f"{kind}: {found} of {len(COMPILED_MODULES)} per-event modules by mypyc",
                      *native])
