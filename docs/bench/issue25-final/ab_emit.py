"""Run from the repository: ``.venv/bin/python docs/bench/issue25-final/ab_emit.py``.

Issue 25: one PARTIAL_RESULT through ``Operation.emit`` and the session's real port (the
protocol state, the codec and the outbox of a real ``ServerConnection``), the way before
``OperationPort.ready`` (the waits ``_sendable`` -> ``room`` -> ``wait_for_room`` and
``credit``, each a coroutine that returns at once) against today's ``emit``, in one
process, alternating batches of 2,000 events 40 times; min and median of the batch means.
"""
import statistics
import sys
import time

import trio

sys.path.insert(0, ".")
from gateway import nnrp  # noqa: E402
from gateway.server._operation import Operation  # noqa: E402
from gateway.server._outbox import Outbox  # noqa: E402
from gateway.server._session import Session  # noqa: E402
from gateway.server._stats import ServerStats  # noqa: E402
from tests.nnrp.test_runtime_controls import connected, submit  # noqa: E402

BODY = b'{"delta":"12345678901234567","type":"response.output_text.delta"}'


class Link:
    def __init__(self, protocol: nnrp.ServerConnection) -> None:
        self.outbox = Outbox(high_water=1 << 30)
        self.protocol = protocol
        self.flow_changed = trio.Event()
        self.operations = 1

    def count_operations(self, change: int) -> None:
        pass


async def before(op: Operation) -> None:
    """``emit`` as it was (commit beb7fb1), less nothing."""
    await op._sendable()
    await op._port.credit()
    op._stop_if_superseded()
    if op.end_cause is not None or op.superseded:
        await trio.lowlevel.checkpoint()
    op._port.send_partial(BODY, defer=True)
    now = trio.current_time()
    if op.first_event_at is None:
        op.first_event_at = now
    elif op.last_event_at is not None:
        op.max_gap = max(op.max_gap, now - op.last_event_at)
    op.last_event_at = now
    op.events_sent += 1
    op.bytes_sent += len(BODY)


async def after(op: Operation) -> None:
    await op.emit(BODY, flush=False)


async def main() -> None:
    protocol = connected(max_in_flight=8)
    protocol.receive_data(submit(1, 1))
    async with trio.open_nursery() as nursery:
        server_session = protocol.session(1)
        assert server_session is not None
        session = Session(server_session, nursery, None, None, ServerStats())  # type: ignore[arg-type]
        link = Link(protocol)
        session.attach(link)
        op = Operation(session.port(1), connection_id=1, transport="tcp", session_id=1,
                       operation_id=1, frame_id=1, typed_body=None, body_error=None,
                       header_trace_id=0, trace=None, deadline_unix_ms=None,
                       deadline_drop_reason=0)
        await after(op)  # past the first event's stage change
        n, rounds = 2000, 40
        runs: dict[str, list[float]] = {"before": [], "after": []}
        for i in range(rounds):
            for name, fn in (("before", before), ("after", after))[:: 1 if i % 2 else -1]:
                start = time.perf_counter()
                for _ in range(n):
                    await fn(op)
                runs[name].append((time.perf_counter() - start) / n * 1e6)
                await link.outbox.take()  # drop what was queued
        b, a = runs["before"], runs["after"]
        paired = statistics.median(x / y for x, y in zip(a, b))
        print(f"emit through the real port, us an event: before min {min(b):.2f} median "
              f"{statistics.median(b):.2f}; after min {min(a):.2f} median "
              f"{statistics.median(a):.2f}; after / before (paired median) {paired:.2f}")


trio.run(main)
