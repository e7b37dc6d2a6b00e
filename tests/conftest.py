"""Suite-wide fixtures."""

from __future__ import annotations

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
