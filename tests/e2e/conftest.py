"""The whole stack (tests.support.stack) on loopback, per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gateway.pipeline import PipelineLimits
from gateway.tools.client import ClientSession, connect
from tests.support.stack import Stack, start_stack

if TYPE_CHECKING:
    import trio


@pytest.fixture
async def stack(nursery: trio.Nursery, socket_dir: Path) -> Stack:
    # The recorded logprobs exchange took 21 s to its first chunk (0.42 s at speed 50).
    return await start_stack(nursery, socket_dir,
                             pipeline=PipelineLimits(first_chunk_timeout=3.0, idle_timeout=2.0))


@pytest.fixture
async def session(stack: Stack) -> AsyncIterator[ClientSession]:
    async with connect(stack.uri()) as client:
        yield await client.open_session()
