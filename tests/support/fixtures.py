"""Fixtures every test package may use (registered by tests/conftest.py): a short
temporary directory for unix sockets, and a real GatewayServer (tests.support.servers)
on free ports."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.servers import RunningServer, start_server

if TYPE_CHECKING:
    import trio


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Under /tmp, not pytest's tmp_path: a unix socket path must stay under 108 bytes.
    with tempfile.TemporaryDirectory(prefix="nnrp-") as path:
        yield Path(path)


@pytest.fixture
async def running(nursery: trio.Nursery, socket_dir: Path) -> RunningServer:
    return await start_server(nursery, socket_dir)
