"""``bench journal``: what resume's memory costs.

Two measurements, each in a process of its own so that nothing else moves its RSS:

* **RSS per held byte**: a child process opens resumable sessions on the sans-IO layer
  (``SessionBook``, ``ServerSession``: what the gateway runs), streams PARTIAL_RESULTs of
  a realistic size into them while they are detached (nothing trimmed), and compares
  its RSS growth with the bytes the journals count (``_journal`` rule J4: each packet's
  bytes, ``PACKET_COST`` for its index entries, ``RECORD_COST`` per operation). Near 1:
  the bounds hold what they say.
* **Requests on one session**: a gateway process (replay vLLM behind it) and one
  resumable session that sends ``requests`` requests of ``request_mib`` MiB each, one
  after another; the gateway's RSS and its ``nnrp_gateway_resume_held_bytes`` before and
  after. A journal that kept request bodies grew by the sum of them; one that keeps a
  key per request stays within ``--resume-session-bytes``.
* **A big request's key** (``gateway.profile._resubmission``; ``_server_session`` rule
  5c): a chat request with a ``key_mib`` MiB base64 image in its envelope, as the
  server reads it (a view of the packet), keyed three ways while a trio task ticks: as
  the key was before (``_former_key``: the whole envelope parsed and written back, on
  the event loop, which stalls for all of it), the same in a worker thread (``json``
  holds the GIL: hardly better), and the key as it is now, in a worker thread: its
  time, and the loop's longest gap (beside that of a thread that only sleeps as long:
  the host's own noise).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

from gateway import nnrp
from gateway.profile import EnvelopeResubmission
from gateway.tools.client import connect

from ._procs import process_rss
from ._resumable import HELD_BYTES, resume_metrics
from ._stack import Stack

#: A PARTIAL_RESULT's payload as vLLM's plain text delta makes it (about one token).
EVENT_BODY = (b'{"type":"response.output_text.delta","output_index":0,"content_index":0,'
              b'"delta":" word","sequence_number":1}')


@attrs.define
class JournalReport:
    sessions: int
    events: int
    held_bytes: int = 0
    payload_bytes: int = 0
    rss_growth_bytes: int = 0
    requests: int = 0
    request_mib: float = 0.0
    session_bytes: int = 0
    gateway_rss_before_mib: float = 0.0
    gateway_rss_after_mib: float = 0.0
    gateway_held_bytes: float = 0.0
    key_mib: float = 0.0
    #: The key as it was before, on the event loop (``_former_key``).
    key_whole_on_loop_s: float = 0.0
    #: The same in a worker thread: the loop's longest gap meanwhile.
    key_whole_in_thread_gap_s: float = 0.0
    #: The key now, in a worker thread: its time, and the loop's longest gap meanwhile.
    key_s: float = 0.0
    key_gap_s: float = 0.0
    #: A thread that only sleeps as long: the loop's longest gap then (this host's noise).
    key_idle_gap_s: float = 0.0

    @property
    def rss_per_held_byte(self) -> float:
        return self.rss_growth_bytes / self.held_bytes if self.held_bytes else 0.0

    def as_dict(self) -> dict[str, Any]:
        document = attrs.asdict(self)
        document["rss_per_held_byte"] = round(self.rss_per_held_byte, 3)
        return document


def _held_in_this_process(sessions: int, events: int) -> dict[str, int]:
    """The child's side of the first measurement (run with ``python -m``)."""
    clock = [0.0]
    book = nnrp.SessionBook(nnrp.ResumePolicy(session_bytes=1 << 40, client_bytes=1 << 40,
                                              total_bytes=1 << 40,
                                              max_sessions_per_client=sessions),
                            clock=lambda: clock[0])
    hello = nnrp.encode(nnrp.Packet(nnrp.ClientHello(profile_bitmap=0b11)))
    open_request = nnrp.encode(nnrp.Packet(nnrp.SessionOpen(
        profile_id=2, schema_id=nnrp.TOKEN_SCHEMA_ID, schema_version=nnrp.TOKEN_SCHEMA_VERSION,
        max_in_flight=4, session_flags=nnrp.SessionFlag.ALLOW_RESUME)))
    held: list[nnrp.ServerSession] = []
    for _ in range(sessions):
        connection = nnrp.ServerConnection(clock=lambda: clock[0], book=book)
        connection.receive_data(hello + open_request)
        session = connection.sessions[0]
        submit = nnrp.encode(nnrp.Packet(
            nnrp.FrameSubmit(operation_id=1, payload_kind_bitmap=0x10, payload_frame_count=1),
            session_id=session.session_id, frame_id=1,
            body=nnrp.pack_single_frame(b'{"operation":"chat.completions.create"}')))
        connection.receive_data(submit)
        connection.connection_lost()  # detached: nothing is trimmed
        held.append(session)
    before = process_rss(os.getpid())
    payload = 0
    for session in held:
        for _ in range(events):
            packet = session.send_partial(1, EVENT_BODY)
            assert packet is None  # detached: to the journal only
        payload += events * len(EVENT_BODY)
    after = process_rss(os.getpid())
    return {"held_bytes": book.total.held, "payload_bytes": payload,
            "rss_growth_bytes": after - before}


async def journal(sessions: int = 64, events: int = 20_000, *, requests: int = 160,
                  request_mib: float = 1.0, session_bytes: int = 4 << 20,
                  key_mib: float = 48.0) -> JournalReport:
    report = JournalReport(sessions, events, requests=requests, request_mib=request_mib,
                           session_bytes=session_bytes, key_mib=key_mib)
    if key_mib:
        await _key_cost(report)
    child = await trio.run_process(
        [sys.executable, "-m", "gateway.tools.bench.journal", str(sessions), str(events)],
        capture_stdout=True, check=True)
    figures = json.loads(child.stdout)
    report.held_bytes = figures["held_bytes"]
    report.payload_bytes = figures["payload_bytes"]
    report.rss_growth_bytes = figures["rss_growth_bytes"]
    if requests:
        await _requests(report)
    return report


async def _requests(report: JournalReport) -> None:
    """The second measurement: ``requests`` big requests on one resumable session."""
    content = "x" * int(report.request_mib * 2**20)
    async with Stack(gateway_args=("--metrics", "--resume-session-bytes",
                                   str(report.session_bytes),
                                   "--max-envelope-bytes", str(64 << 20),
                                   "--max-frame-bytes", str(64 << 20)),
                     residence=False) as stack:
        pid = stack.gateway_pid
        async with connect(stack.endpoint) as client:
            session = await client.open_session(resume=True)
            payload = _request(0, "warm-up")
            operation = await session.submit(payload)
            [_ async for _ in operation.events()]
            report.gateway_rss_before_mib = round(process_rss(pid) / 2**20, 2)
            for number in range(report.requests):
                operation = await session.submit(_request(number, content))
                events = [event async for event in operation.events()]
                if not isinstance(events[-1], nnrp.ResultReceived):
                    raise RuntimeError(f"request {number} did not complete: {events[-1]}")
            report.gateway_rss_after_mib = round(process_rss(pid) / 2**20, 2)
            report.gateway_held_bytes = (await resume_metrics(stack.admin_url)).get(
                HELD_BYTES, 0.0)


async def _key_cost(report: JournalReport) -> None:
    """The third measurement: one big request's key, before and now."""
    image = base64.b64encode(os.urandom(int(report.key_mib * 2**20 * 3 / 4))).decode()
    envelope = json.dumps({
        "schema_version": "openai-compatible/1", "operation": "chat.completions.create",
        "body": {"model": "example-model", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}]}]},
    }).encode()
    del image
    body = nnrp.parse_typed_body(memoryview(nnrp.pack_single_frame(envelope)),
                                 payload_kind_bitmap=0x10, payload_frame_count=1)
    whole, now = EnvelopeResubmission(cut_threshold=1 << 62), EnvelopeResubmission()
    if whole.read(body).key != now.read(body).key:
        raise RuntimeError("the key cut and the key parsed whole differ")
    started = time.perf_counter()
    _former_key(body)
    report.key_whole_on_loop_s = round(time.perf_counter() - started, 4)
    report.key_whole_in_thread_gap_s, _ = await _in_thread(lambda: _former_key(body))
    report.key_gap_s, report.key_s = await _in_thread(lambda: now.read(body))
    report.key_idle_gap_s, _ = await _in_thread(lambda: time.sleep(report.key_s))


def _former_key(body: nnrp.TypedBody) -> bytes:
    """The key as it was computed before (when its operation ended, on the event loop):
    the frames joined, parsed whole, written back in one order, hashed."""
    payload = b"".join(frame.payload for frame in body.frames)
    document = json.loads(payload.decode("utf-8"))
    canonical = json.dumps(document, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).digest()


async def _in_thread(work: Callable[[], object]) -> tuple[float, float]:
    """``work`` in a worker thread while a task ticks: the longest gap between its ticks
    (how long the loop could not run), and how long ``work`` took."""
    done = False
    longest = 0.0

    async def tick() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done:
            await trio.lowlevel.checkpoint()
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        await trio.to_thread.run_sync(work)
        took = time.perf_counter() - started
        done = True
    return round(longest, 4), round(took, 4)


def _request(number: int, content: str) -> bytes:
    return json.dumps({"schema_version": "openai-compatible/1",
                       "operation": "chat.completions.create",
                       "body": {"model": "example-model", "stream": True, "max_tokens": 4,
                                "messages": [{"role": "user", "content": content}]},
                       "request_id": f"journal-{number}"}).encode()


if __name__ == "__main__":
    print(json.dumps(_held_in_this_process(int(sys.argv[1]), int(sys.argv[2]))))

