"""The residence probe (``serve --bench-residence``): every partial of a stream gets one
sample, upstream read -> handed to the socket, read at /debug/residence; off by default,
and attached from outside the write path (the app installs its observers for its run)."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from gateway import residence
from gateway.server import _session
from gateway.server._outbox import Outbox
from gateway.tools.client import connect
from gateway.upstream import _stream
from tests.support.stack import chat, envelope, run_operation, start_stack


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False) as client:
        return await client.get(url)


def installed() -> tuple[object, object]:
    """The engine's partial observer and the upstream's read observer now."""
    return _session._partial_observer, _stream._read_observer


async def test_each_partial_is_one_sample_and_reading_starts_anew(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    stack = await start_stack(nursery, tmp_path, admin_listen="127.0.0.1:0",
                              bench_residence=True)
    probe = stack.gateway.residence
    assert probe is not None and installed() == (probe.queued, probe.read)
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
    assert stack.gateway.residence is None and installed() == (None, None)
    response = await get(f"http://127.0.0.1:{stack.gateway.admin.port}/debug/residence")
    assert response.status_code == 404


async def test_the_app_removes_its_observers_when_its_run_ends(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        await start_stack(nursery, tmp_path, bench_residence=True)
        assert installed() != (None, None)
        nursery.cancel_scope.cancel()
    assert installed() == (None, None)


def test_stamps_follow_their_packets_through_the_outbox() -> None:
    """The probe numbers each partial by the outbox's packets and samples it when the
    outbox tells its hook that packet is written; the owner's hook still hears all."""
    probe = residence.ResidenceProbe()
    told: list[tuple[int, int]] = []
    outbox = Outbox(on_written=lambda nbytes, packets: told.append((nbytes, packets)))

    async def main() -> None:
        outbox.put(b"hello")  # not a partial: no stamp
        probe.queued(outbox)  # nor a partial of a task that never read upstream
        probe.read()
        for packet in (b"partial-1", b"partial-2"):
            outbox.put(packet)
            probe.queued(outbox)
        batch = await outbox.take()
        assert batch == [b"hello", b"partial-1", b"partial-2"]
        outbox.put(b"partial-3")  # queued while the batch is being written
        probe.queued(outbox)
        outbox.written(batch)
        assert len(probe.samples_ns) == 2
        outbox.flush()  # no direct path here: the writer takes it
        outbox.written(await outbox.take())
        outbox.close()
        outbox.put(b"partial-4")  # after the end: never written, never stamped
        probe.queued(outbox)

    trio.run(main)
    assert told == [(23, 3), (9, 1)]
    assert probe.take()["events"] == 3
