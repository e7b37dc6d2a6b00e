"""The residence probe (``serve --bench-residence``): every partial of a stream gets one
sample, upstream read -> handed to the socket, read at /debug/residence; off by default."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from gateway import residence
from gateway.server._outbox import Outbox
from gateway.tools.client import connect
from tests.support.stack import chat, envelope, run_operation, start_stack


@pytest.fixture
def probe_off_afterwards() -> Iterator[None]:
    yield
    residence.disable()


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False) as client:
        return await client.get(url)


async def test_each_partial_is_one_sample_and_reading_starts_anew(
        nursery: trio.Nursery, tmp_path: Path, probe_off_afterwards: None) -> None:
    stack = await start_stack(nursery, tmp_path, admin_listen="127.0.0.1:0",
                              bench_residence=True)
    admin = f"http://127.0.0.1:{stack.gateway.admin.port}/debug/residence"
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(chat(stream=True, max_tokens=12)))
    figures = (await get(admin)).json()
    assert figures["events"] == len(outcome.partials) > 0
    assert figures["reads"] >= 1
    assert 0 < figures["p50_us"] <= figures["p99_us"] <= figures["max_us"]
    again = (await get(admin)).json()
    assert (again["events"], again["reads"], again["p50_us"]) == (0, 0, None)


async def test_off_unless_asked(nursery: trio.Nursery, tmp_path: Path) -> None:
    stack = await start_stack(nursery, tmp_path, admin_listen="127.0.0.1:0")
    assert residence.PROBE is None
    response = await get(f"http://127.0.0.1:{stack.gateway.admin.port}/debug/residence")
    assert response.status_code == 404


def test_stamps_follow_their_packets_through_the_outbox(probe_off_afterwards: None) -> None:
    probe = residence.enable()
    outbox = Outbox()
    outbox.put(b"hello")  # not a partial: no stamp
    outbox.put(b"partial-1", read_at=1)
    outbox.put(b"partial-2", read_at=2)

    async def write_once() -> None:
        batch = await outbox.take()
        assert batch == [b"hello", b"partial-1", b"partial-2"]
        outbox.put(b"partial-3", read_at=3)  # queued while the batch is being written
        outbox.written(batch)

    trio.run(write_once)
    assert len(probe.samples_ns) == 2
    assert probe.take()["events"] == 2
