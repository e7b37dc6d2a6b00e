"""The error tree drawn in ``gateway.errors`` is the tree the code defines (conventions.md,
style principle 7: one tree, drawn once)."""

from __future__ import annotations

import importlib

import gateway.errors
from gateway.errors import GatewayError

#: Every package that defines a branch of the tree.
BRANCHES = ("gateway.nnrp", "gateway.profile", "gateway.upstream", "gateway.transport",
            "gateway.app")


def drawn() -> set[tuple[str, str]]:
    """(parent, child) for every edge of the drawing in the module docstring."""
    doc = gateway.errors.__doc__
    assert doc is not None
    lines = doc[doc.index("    GatewayError"):].split("\n\n")[0].splitlines()
    parents = ["GatewayError"]  # by depth: the last name drawn at each
    edges = set()
    for line in lines[1:]:
        if "── " not in line:
            continue  # a description carried over to the next line
        depth = (line.index("── ") - len("    ├")) // 4  # 0: a child of the root
        name = line.split("── ")[1].split()[0]
        edges.add((parents[depth], name))
        del parents[depth + 1:]
        parents.append(name)
    return edges


def defined() -> set[tuple[str, str]]:
    for package in BRANCHES:
        importlib.import_module(package)
    edges = set()
    pending = [GatewayError]
    while pending:
        parent = pending.pop()
        for child in parent.__subclasses__():
            if child.__module__.startswith("gateway."):
                edges.add((parent.__name__, child.__name__))
                pending.append(child)
    return edges


def test_the_drawing_is_the_tree() -> None:
    assert drawn() == defined()


def test_the_drawing_is_read_whole() -> None:
    # The reading must see the tree's depth, or the comparison proves little.
    assert {("GatewayError", "UpstreamError"), ("UpstreamError", "UpstreamOverloaded"),
            ("RemoteProtocolError", "TypedBodyError"), ("ConfigError", "ListenError")
            } <= drawn()
