"""Streams whose connections are cut and resumed: ``bench run``'s ``resume`` scenario and
``bench soak --cut-every``.

Each stream is a client connection of its own, through a cut proxy of its own
(``gateway.tools.cut``: a cut resets that connection both ways, as a NAT that forgot the
flow does), with one resumable session; the client resumes by itself
(``connect(uri, resume=True)``: it reconnects, resumes the session and resubmits the
operation declaring what it holds). Each operation is a timestamped replay stream: every
token's text is the backend's send time, so each token is unique and in increasing order.

What is measured and checked, per operation:

* **resume latency**: from the cut to the first result the client receives of the
  resubmitted operation (a result after the sequence the resubmission declared held,
  received once the session was resumed: it came on the new connection, not out of the
  old socket's buffer). When that result is a token the backend wrote after the cut
  (nothing was in flight), part of the wait was for the backend's next token: the
  latency less that part (arrival - max(cut, the token's write)) is kept beside it;
* **lost**: tokens that never arrived (the replay wrote ``tokens``); **duplicated**:
  tokens that arrived twice, plus results the gateway sent again that the client held
  already (``NnrpClient.repeats``: the resubmission declared them, so none should come);
  **reordered**: a token older than the one before it;
* **whole**: all of the above 0, a 200 ``response.completed`` whose text is the tokens
  received, in order;
* and no reconnection the cuts do not explain (a gap in the sequence would make the
  client reconnect and hide it: ``unexpected_reconnects``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections.abc import Callable

import attrs
import httpx
import trio

from gateway import nnrp
from gateway.tools.client import ClientError, ClientOperation, ClientSession, NnrpClient, connect
from gateway.tools.cut import StreamCutProxy

from .stats import percentile

#: What the gateway's /metrics calls the resume gauges (``--metrics``).
HELD_BYTES = "nnrp_gateway_resume_held_bytes"
DETACHED = 'nnrp_gateway_resume_sessions{state="detached"}'


@attrs.define
class CutTimes:
    """Resume latencies (ms): cut -> the first result after the resume, and the same less
    the time the backend had not yet written that result (the token interval's share)."""

    total_ms: list[float] = attrs.field(factory=list)
    unpaced_ms: list[float] = attrs.field(factory=list)

    def summary(self) -> dict[str, float] | None:
        if not self.total_ms:
            return None
        return {"p50": round(percentile(self.total_ms, 0.5), 2),
                "p99": round(percentile(self.total_ms, 0.99), 2),
                "max": round(max(self.total_ms), 2),
                "unpaced_p50": round(percentile(self.unpaced_ms, 0.5), 2),
                "unpaced_p99": round(percentile(self.unpaced_ms, 0.99), 2),
                "n": len(self.total_ms)}


@attrs.define
class CutTally:
    """What the streams of one run saw, together."""

    operations: int = 0
    #: Operations that ended whole (see the module's docstring).
    whole: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    #: Operations that did not end in a 200 ``response.completed`` carrying their tokens.
    incomplete: int = 0
    cuts: int = 0
    #: Connections the clients recovered (reconnected and resumed): one per cut; and
    #: the attempts that took (more when the gateway said to retry later).
    resumes: int = 0
    attempts: int = 0
    #: Cuts whose resume could not be timed (the operation ended first).
    untimed: int = 0
    times: CutTimes = attrs.field(factory=CutTimes)
    #: Each distinct failure once (bounded).
    failures: list[str] = attrs.field(factory=list)

    @property
    def unexpected_reconnects(self) -> int:
        return max(0, self.resumes - self.cuts)

    @property
    def cuts_not_resumed(self) -> int:
        return max(0, self.cuts - self.resumes)

    @property
    def ok(self) -> bool:
        return (self.operations > 0 and self.whole == self.operations and not self.lost
                and not self.duplicated and not self.reordered and not self.incomplete
                and self.unexpected_reconnects == 0 and self.cuts_not_resumed == 0)

    def failure(self, message: str) -> None:
        if message not in self.failures and len(self.failures) < 20:
            self.failures.append(message)

    def count(self, streams: list[CutStream]) -> None:
        """Add the clients' recoveries, once the streams are done."""
        self.resumes += sum(stream.client.recoveries for stream in streams)
        self.attempts += sum(stream.client.recovery_attempts for stream in streams)

    def as_dict(self) -> dict[str, object]:
        document = attrs.asdict(self, filter=lambda field, _: field.name != "times")
        document.update(unexpected_reconnects=self.unexpected_reconnects,
                        cuts_not_resumed=self.cuts_not_resumed, ok=self.ok,
                        resume_latency_ms=self.times.summary())
        return document


class CutStream:
    """One client connection through its own cut proxy (holding every byte ``delay``
    seconds each way: a WAN), one resumable session on it."""

    def __init__(self, target: tuple[str, int], tally: CutTally, *, delay: float = 0.0
                 ) -> None:
        self.proxy = StreamCutProxy(target, delay=delay)
        self.tally = tally
        self._client: NnrpClient | None = None
        self._session: ClientSession | None = None
        self.operation: ClientOperation | None = None
        self.tokens = 0
        #: Partial results of the operation in flight received so far.
        self.received = 0
        self._cut_at: float | None = None
        self._cut_ns = 0
        self._resumes_at_cut = 0
        self._times = tally.times
        self._timed = trio.Event()
        self._timed.set()

    @property
    def client(self) -> NnrpClient:
        assert self._client is not None, "CutStream.open() first"
        return self._client

    @property
    def session(self) -> ClientSession:
        assert self._session is not None, "CutStream.open() first"
        return self._session

    async def open(self, nursery: trio.Nursery, exits: contextlib.AsyncExitStack, *,
                   reconnect: bool = True) -> None:
        """Start the proxy (in ``nursery``), connect through it (closed by ``exits``) and
        open a resumable session. ``reconnect``: the client resumes by itself after a cut
        (else a cut leaves the session detached on the gateway)."""
        uri = "tcp://" + await nursery.start(self.proxy.serve)
        self._client = await exits.enter_async_context(connect(uri, resume=reconnect))
        self._session = await self._client.open_session(resume=True)
        if self._session.ticket is None:
            raise ClientError("the gateway did not grant resume (is --resume-window 0, or "
                              "this client at --resume-max-sessions-per-client?)")

    def cuttable(self, margin: int) -> bool:
        """Mid-stream, past its first result and ``margin`` results before its last, with
        no cut of its own still being resumed."""
        return (self.operation is not None and self._cut_at is None
                and 1 <= self.received <= self.tokens - margin)

    def cut(self, into: CutTimes | None = None) -> None:
        """Reset the connection now; the resume's latency goes to ``into`` (default: the
        tally's)."""
        self._cut_at = time.perf_counter()
        self._cut_ns = time.monotonic_ns()  # the replay's clock, for its tokens' times
        self._resumes_at_cut = self.session.resumes
        self._times = self.tally.times if into is None else into
        self._timed = trio.Event()
        self.tally.cuts += 1
        self.proxy.cut()

    async def resumed(self) -> None:
        """Until the last cut's resume was timed (or could not be)."""
        await self._timed.wait()

    def _note(self, event: nnrp.PartialReceived) -> None:
        """A partial result arrived: the first after the resubmission times the resume."""
        operation = self.operation
        if (self._cut_at is None or operation is None
                or self.session.resumes <= self._resumes_at_cut
                or operation.resubmitted_after is None
                or event.sequence <= operation.resubmitted_after):
            return
        total = (time.perf_counter() - self._cut_at) * 1e3
        written = _token_time(event.body)
        unwritten = 0.0 if written is None else max(0.0, (written - self._cut_ns) / 1e6)
        self._times.total_ms.append(total)
        self._times.unpaced_ms.append(max(0.0, total - unwritten))
        self._cut_at = None
        self._timed.set()

    async def run(self, payload: bytes, tokens: int, *,
                  sample: Callable[[nnrp.PartialReceived], None] | None = None) -> bool:
        """Submit ``payload`` (a timestamped replay stream of ``tokens`` tokens), read it
        to its terminal (``sample`` sees each partial result), check it; True when it
        ended whole."""
        repeats = self.client.repeats
        self.tokens, self.received = tokens, 0
        partials: list[nnrp.PartialReceived] = []
        terminal: nnrp.ResultReceived | nnrp.DropReceived | None = None
        try:
            self.operation = await self.session.submit(payload)
            async for event in self.operation.events():
                if isinstance(event, nnrp.PartialReceived):
                    partials.append(event)
                    self.received = len(partials)
                    self._note(event)
                    if sample is not None:
                        sample(event)
                else:
                    terminal = event
        except ClientError as exc:
            self.tally.failure(f"ClientError: {exc}")
        finally:
            self.operation = None
            if self._cut_at is not None:  # it ended before a result came after the cut
                self.tally.untimed += 1
                self._cut_at = None
                self._timed.set()
        return check_operation(self.tally, partials, terminal, tokens,
                               self.client.repeats - repeats)


def check_operation(tally: CutTally, partials: list[nnrp.PartialReceived],
                    terminal: nnrp.ResultReceived | nnrp.DropReceived | None, tokens: int,
                    repeats: int) -> bool:
    """Count one operation of a timestamped stream of ``tokens`` tokens into ``tally``
    (``repeats``: results the client dropped as held already); True when it was whole."""
    tally.operations += 1
    stamps: list[str] = []
    gaps = sum(1 for index, partial in enumerate(partials, start=1)
               if partial.sequence != index)
    for partial in partials:
        event = json.loads(partial.body)
        if event.get("type") == "response.output_text.delta":
            stamps.append(event["delta"])
    distinct = len(set(stamps))
    lost = max(0, tokens - distinct) + gaps
    duplicated = len(stamps) - distinct + repeats
    reordered = sum(1 for a, b in itertools.pairwise(stamps) if int(b) < int(a))
    text = _completed_text(terminal)
    complete = text is not None and text == "".join(stamps)
    tally.lost += lost
    tally.duplicated += duplicated
    tally.reordered += reordered
    if not complete:
        tally.incomplete += 1
        tally.failure(f"terminal {type(terminal).__name__}: not a 200 response.completed "
                      "carrying the tokens received" if text is None else
                      "response.completed's text is not the tokens received")
    if lost or duplicated or reordered:
        tally.failure(f"{tokens} tokens: {lost} lost, {duplicated} duplicated "
                      f"({repeats} sent again on the wire), {reordered} reordered")
    whole = complete and not (lost or duplicated or reordered)
    tally.whole += whole
    return whole


def _token_time(body: bytes) -> int | None:
    """When the replay wrote a token (its text: ``time.monotonic_ns()``); None: not a
    token."""
    try:
        event = json.loads(body)
        return int(event["delta"]) if event.get("type") == "response.output_text.delta" \
            else None
    except (ValueError, KeyError, TypeError):
        return None


def _completed_text(terminal: nnrp.ResultReceived | nnrp.DropReceived | None) -> str | None:
    """The text of a 200 ``response.completed`` (None: another terminal)."""
    if (not isinstance(terminal, nnrp.ResultReceived) or terminal.meta.status_code != 200
            or terminal.typed_body is None or not terminal.typed_body.frames):
        return None
    try:
        document = json.loads(bytes(terminal.typed_body.frames[0].payload))
        if document.get("type") != "response.completed":
            return None
        content = document["body"]["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None


async def resume_metrics(admin_url: str) -> dict[str, float]:
    """The gateway's ``nnrp_gateway_resume_*`` samples (its admin /metrics)."""
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.get(f"{admin_url}/metrics", timeout=5)
    response.raise_for_status()
    samples = {}
    for line in response.text.splitlines():
        if line.startswith("nnrp_gateway_resume_"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


async def released(admin_url: str) -> None:
    """Until no session is detached and no result bytes are held (every window passed):
    bound it with a cancel scope."""
    while True:
        samples = await resume_metrics(admin_url)
        if samples.get(DETACHED) == 0 and samples.get(HELD_BYTES) == 0:
            return
        await trio.sleep(0.1)
