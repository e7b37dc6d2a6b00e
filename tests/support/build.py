"""The build the tests run on (gateway/compiled.py): pure Python, or the per-event
modules compiled by mypyc (``make compiled``). A test that cannot hold on the compiled
build skips there and says why (gateway/compiled.py rule 8)."""

from __future__ import annotations

import pytest

from gateway.compiled import PURE, build

#: The per-event modules run compiled in this test process (and the processes it starts).
COMPILED = build() != PURE


def pure_only(why: str) -> pytest.MarkDecorator:
    """Skip on the compiled build, for ``why``."""
    return pytest.mark.skipif(COMPILED, reason=f"compiled build: {why}")
