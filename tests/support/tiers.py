"""Test tiers. `make check` (lint, types, the sans-IO and unit tests: a minute) sets
``NNRP_TESTS_TIER=check``: the property tests then run a tenth of their examples, enough
to catch a broken rule at once; `make test` (CI) runs them whole."""

from __future__ import annotations

import os

QUICK = os.environ.get("NNRP_TESTS_TIER") == "check"


def examples(full: int) -> int:
    """A property test's examples in this tier."""
    return max(10, full // 10) if QUICK else full
