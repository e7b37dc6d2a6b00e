"""Suite-wide fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import structlog
from hypothesis import settings

from tests.support.tiers import QUICK

if QUICK:  # `make check`: property tests without their own count run a quick pass too
    settings.register_profile("check", max_examples=10)
    settings.load_profile("check")

#: Shared fixtures live in tests/support, like every other shared helper.
pytest_plugins = ["tests.support.fixtures"]


@pytest.fixture(autouse=True)
def fresh_logging_configuration() -> Iterator[None]:
    """Each test starts from structlog's defaults. A CLI command run in-process (CliRunner:
    bench, conformance, chat) calls configure_logging(level="warning"); left in place, its
    level filter drops the info lines (the canonical ``operation`` line) that a later
    test's structlog.testing.capture_logs() waits for, which keeps only the processors."""
    yield
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def environment_left_as_found() -> Iterator[None]:
    """No test changes the process's environment for the tests after it (monkeypatch
    undoes its own). A leaked ``OTEL_TRACES_EXPORTER=none`` once made a later test's
    gateway, which inherits the environment, trace and export nothing, so that test
    failed far from the cause and only in the whole suite."""
    before = dict(os.environ)
    yield
    changed = sorted(name for name in before.keys() | os.environ.keys()
                     if before.get(name) != os.environ.get(name)
                     and name != "PYTEST_CURRENT_TEST")  # pytest's own, per phase
    if changed:
        for name in changed:
            if name in before:
                os.environ[name] = before[name]
            else:
                del os.environ[name]
        pytest.fail(f"the test changed the environment: {', '.join(changed)}")
