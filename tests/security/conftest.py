"""A module-wide throwaway PKI (tests.support.tls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tls import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("pki"))
