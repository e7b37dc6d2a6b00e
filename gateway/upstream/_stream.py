"""One streamed completion as checked chunks: SSE framing, ``[DONE]``, per-read clocks.

    async with client.chunks(body, headers, first_chunk=120, idle=60) as stream:
        async for batch in stream:          # the chunks of one upstream read
            for chunk in batch: ...         # each a checked chat.completion.chunk dict
    # here vLLM said [DONE] and the connection went back to its slot

Time: the first-chunk clock runs from the request until the first body bytes, the idle
clock from one read to the next, and each counts *the read only*. Time the consumer
spends elsewhere (waiting for a slow NNRP reader, say) never counts as vLLM being idle,
so nothing has to stop or restart a clock around backpressure. Both are kept by one
watchdog task per stream (``clocks``), not by a cancel scope per read: a read only
stamps its deadline, which costs far less than entering and leaving a deadline scope
25,000 times a second at 256 streams. The watchdog never sleeps past the
soonest deadline a pending or later read can have (so at most an idle period); a read
still pending at its deadline cancels the stream's scope, and ``clocks`` raises
``UpstreamTimeout``.

Keep-alive comments (vLLM 0.32's ``--sse-keep-alive-interval``) are skipped and do
**not** restart a clock: vLLM's API server writes them on a timer whatever its engine
does (``with_sse_keep_alive`` wraps the response generator, not the engine), so a
comment proves the HTTP frontend alive but nothing about generation. A read that brought
only comments keeps the deadline the read before it had, so a stalled or dead engine
behind a chatty frontend still meets the first-chunk and idle timeouts, and
``first_byte_at`` is the first event's arrival, not the first comment's. (The other
choice, a comment as progress, would let a queued request wait forever.) The client's
liveness pulse (``VllmClient.body_reads``) still counts comments: the frontend is
answering, which is all the health loop asks of it.

An in-stream error that is the stream's first event is marked ``before_output`` (vLLM's
admission refusal after its 200, ``_errors``).

End of stream: ``data: [DONE]`` ends the iteration. A body that ends before it, or a
reset mid-body, is ``UpstreamMalformed``; an SSE or chunk rule broken is too. Leaving the
``chunks`` context before ``[DONE]`` (a cancel, an error) closes the socket, which is
how vLLM learns to abort the request (docs/reference/vllm-http.md section 3).

A read with a fused reader (``fused``) is offered to the reader first. When several
events arrive in one read (a stream that has fallen behind, an instant backend: a
whole answer in one read), the reader can take only a run of them whose kind it knows,
so the read is split, and each piece goes on as a read of its own, with the read's
deadline, and without another read from the socket:

1. What the reader takes is its leading part; the rest is the next piece.
2. Where the reader cannot take a piece, the general path takes the piece's first event
   alone and the rest is the next piece, in three places only: while the parser keeps
   no head, for the stream's first ``LEAD_CHUNKS`` chunks (vLLM's role chunk and first
   delta, after which the reader can start); a fresh read that begins inside an event
   (the read before ended in it; that event completes it), until the reader has
   refused what followed such a split ``WASTED_SPLITS`` times in the stream (a stream
   it never takes: logprobs, several choices, a client that asked for vLLM's chunks);
   and the rest of a run the reader took (a text with an escape ended the run).
   Otherwise the general path takes the whole piece. At most ``LEAD_CHUNKS`` splits a
   read, so a read of many tiny events (blank lines, comments) costs a bounded number
   of copies, not one an event.
3. The SSE decoder gives the same events however its bytes are cut (it is fed reads
   of any size), so a split changes only how many batches the read becomes: the
   chunks, their order and a fault before the end are the same. (Bytes after
   ``[DONE]`` in the same read are not read, split or not; the general path may find
   a malformed line there in a read it took whole.)
4. The clocks see reads, not pieces: a piece that is only comments carries no deadline
   to the next read unless the read's first piece was only comments too (a read that
   brought events restarts the idle clock, however it was cut).
(tests/pipeline/test_plain_delta.py: the same packets with the reader and without it,
whole answers in one read among the cuts; the batches, the bound and the clocks.)
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sized
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

import trio

from ._chunks import ChunkParser
from ._clocks import stream_clocks
from ._errors import UpstreamMalformed, UpstreamTimeout
from ._sse import SSEDecoder, SSEError

Chunk = dict[str, Any]

#: What a fused reader makes of one read; its length is the chunks it stands for.
Fused = TypeVar("Fused", bound=Sized)
#: A fused reader (``ChunkStream.fused``): one read's bytes (or a piece of it: the
#: splitting rules below) and this stream's SSE decoder and chunk parser in; what the
#: chunks of the bytes' leading part became and how many bytes that part is, or None,
#: with nothing changed, for the general path. The part it answers ends where an event
#: ends, holds what the general path would turn into chunks alone (no end, no fault),
#: and leaves decoder and parser as that path would; the rest is read on as a read.
FusedReader: TypeAlias = Callable[[bytes, SSEDecoder, ChunkParser], "tuple[Fused, int] | None"]
#: Splitting rule 2: a stream's first chunks, read one event a piece while its parser
#: keeps no head (vLLM's role chunk, then its first text delta, which gives it one);
#: also the most splits of one read.
LEAD_CHUNKS = 4
#: Splitting rule 2: splits at a read's start the reader then refused, before the
#: stream stops making them.
WASTED_SPLITS = 4
#: What made a piece the rest of a read: the reader's run (rule 1), a split after the
#: event a fresh read completed, or after a piece's first event (rule 2).
_AFTER_RUN, _AFTER_MID_EVENT, _AFTER_EVENT = 1, 2, 3

#: The process's read observer, called by the reading task after each body read: None
#: but under a benchmark (``serve --bench-residence`` installs the residence probe's for
#: its run, ``observe_reads``); off, its cost is this one check per read.
_read_observer: Callable[[], None] | None = None


def observe_reads(observer: Callable[[], None] | None) -> None:
    """Install ``observer`` for this process (None: remove it)."""
    global _read_observer
    _read_observer = observer


class ByteChunks(Protocol):
    """The response body's raw reads (``_reads.BodyChunks``)."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def __anext__(self) -> bytes: ...

    def abort(self) -> bool:
        """Close the connection now, synchronously (False: nothing to close)."""
        ...


class ChunkStream:
    """Checked ``chat.completion.chunk`` dicts, one list per upstream read; iterate it
    inside ``clocks()``, which keeps its deadlines."""

    def __init__(self, body: ByteChunks, *, first_chunk_deadline: float,
                 first_chunk_timeout: float, idle_timeout: float, max_event: int) -> None:
        if idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be positive, not {idle_timeout}")
        self._body = body
        self._first_chunk_timeout = first_chunk_timeout
        self._idle_timeout = idle_timeout
        self._decoder = SSEDecoder(max_event=max_event)
        self._parse = ChunkParser()  # this stream's chunks (their shared head: rule 4)
        self._first_chunk_deadline = first_chunk_deadline
        #: The pending read's deadline (trio clock); inf while nothing is being read.
        self._read_deadline = math.inf
        self._clocked = False  # inside clocks(): without it no deadline would hold
        #: When (trio clock) the first body bytes arrived; None until then.
        self.first_byte_at: float | None = None
        #: vLLM said ``data: [DONE]``: the answer is complete.
        self.done = False
        #: A bad chunk (vLLM's mid-stream error) read together with good ones: raised by
        #: the next ``__anext__``, after the good ones were handed over.
        self._pending: UpstreamMalformed | None = None
        #: The deadline the next read keeps, after a read of keep-alive comments only.
        self._carried_deadline: float | None = None
        #: Chunks delivered so far.
        self.chunks_delivered = 0
        #: What is left of a split read, and that read's deadline (splitting rules).
        self._rest: tuple[bytes, float] | None = None
        self._rest_after = 0  # what made the rest: an _AFTER_ constant (0: nothing)
        self._splits_left = LEAD_CHUNKS  # in the read being split (rule 2's bound)
        self._wasted_splits = 0  # rule 2's mid-event splits the reader then refused
        self._read_carries = False  # the read's first piece was comments only (rule 4)

    def clocks(self) -> AbstractAsyncContextManager[None]:
        """The first-chunk and idle clocks around the consumer's iteration: a read
        pending at its deadline ends the block with ``UpstreamTimeout`` (``_clocks``:
        an async generator, which stays interpreted; gateway/compiled.py rule 1)."""
        return stream_clocks(self)

    def abort(self) -> bool:
        """End the exchange now, from any task (an NNRP cancel): the upstream socket is
        closed at once, so vLLM aborts the request without waiting for the reading task
        to run; that task's pending read then fails or its cancel arrives first."""
        return self._body.abort()

    def __aiter__(self) -> ChunkStream:
        return self

    def fused(self, reader: FusedReader[Fused]) -> FusedChunks[Fused]:
        """This stream's reads, each offered to ``reader`` first: what it makes of a
        read, or the read's chunks as iterating the stream gives them."""
        return FusedChunks(self, reader)

    async def __anext__(self) -> list[Chunk]:
        batch: list[Chunk] | Sized = await self._next(None)
        assert isinstance(batch, list)
        return batch

    async def _next(self, reader: FusedReader[Fused] | None) -> list[Chunk] | Fused:
        error = self._pending
        if error is not None:
            self._pending = None
            try:
                raise error
            finally:
                error = None  # not kept by this frame (as below)
        while not self.done:
            after = 0
            if self._rest is None:
                raw, deadline = await self._read()
                self._splits_left = LEAD_CHUNKS
            else:  # the rest of a read split below (splitting rules 1 and 2)
                raw, deadline = self._rest
                after, self._rest, self._rest_after = self._rest_after, None, 0
            if reader is not None:
                taken = reader(raw, self._decoder, self._parse)
                if taken is not None:  # chunks, as below, and nothing else
                    fused, used = taken
                    if not 0 < used <= len(raw):  # the reader's contract (FusedReader)
                        raise RuntimeError(f"a fused reader took {used} of {len(raw)} bytes")
                    if used < len(raw):
                        self._rest, self._rest_after = (raw[used:], deadline), _AFTER_RUN
                    self._carried_deadline, self._read_carries = None, False
                    if self.first_byte_at is None:
                        self.first_byte_at = trio.current_time()
                    self.chunks_delivered += len(fused)
                    return fused
                if after == _AFTER_MID_EVENT:
                    self._wasted_splits += 1
                raw = self._lead(raw, deadline, after)
            fault: UpstreamMalformed | None = None
            try:
                events = self._decoder.feed(raw)
            except SSEError as exc:
                events, fault = exc.events, UpstreamMalformed(str(exc))
                fault.__cause__ = exc
            if not events and fault is None and not self._decoder.pending:
                # Comments only: no clock restarts (rule 4: unless an earlier piece of
                # the same read brought events).
                if not after:
                    self._read_carries = True
                if self._read_carries:
                    self._carried_deadline = deadline
                continue
            self._read_carries = False
            self._carried_deadline = None
            if self.first_byte_at is None:
                self.first_byte_at = trio.current_time()
            batch: list[Chunk] = []
            for event in events:
                if event.is_done:
                    self.done = True
                    break
                try:
                    batch.append(self._parse(event.data))
                except UpstreamMalformed as bad:  # not exc, an SSEError (compiled.py 4)
                    fault = bad
                    break
            if fault is not None:
                # One read may hold good chunks and then a fault (vLLM's error chunk, a
                # broken line): what came before it is delivered first, as when the
                # reads came apart, and the fault is raised by the next call.
                if not batch:
                    fault.before_output = self.chunks_delivered == 0
                    try:
                        raise fault
                    finally:
                        # Not kept by this frame, which its traceback holds: a cycle
                        # that kept the operation (and its request's body: a 64 MiB
                        # image) until the cyclic collector ran.
                        fault = None
                # Kept for the next call, not by this frame (which its traceback holds).
                self._pending, fault = fault, None
                self.chunks_delivered += len(batch)
                return batch
            if batch:
                self.chunks_delivered += len(batch)
                return batch
        raise StopAsyncIteration

    def _lead(self, raw: bytes, deadline: float, after: int) -> bytes:
        """Splitting rule 2: the piece's first event, where the reader refused the piece
        and may take what follows it (the rest kept for the next pass); else the whole
        piece. ``after``: what made this piece (0: a fresh read)."""
        if self._splits_left <= 0:
            return raw
        if self._parse.kept is None:
            if self.chunks_delivered >= LEAD_CHUNKS:
                return raw
            made = _AFTER_EVENT
        elif not self._decoder.between_events:
            if after or self._wasted_splits >= WASTED_SPLITS:
                return raw
            made = _AFTER_MID_EVENT
        elif after == _AFTER_RUN:
            made = _AFTER_EVENT  # the event that ended the run (an escaped text)
        else:
            return raw
        cut = raw.find(b"\n\n") + 2
        if cut <= 1 or cut >= len(raw):
            return raw  # one event or less: nothing after it to offer the reader
        self._splits_left -= 1
        self._rest, self._rest_after = (raw[cut:], deadline), made
        return raw[:cut]

    async def _read(self) -> tuple[bytes, float]:
        """One read and the deadline it had."""
        if not self._clocked:
            raise RuntimeError("ChunkStream read outside its clocks(): no deadline holds")
        if self._carried_deadline is not None and self.first_byte_at is not None:
            deadline = self._carried_deadline
        elif self.first_byte_at is None:
            deadline = self._first_chunk_deadline
            if deadline <= trio.current_time():
                # An outer deadline past too (the total) is the one that ended it, as
                # the outermost cancelled scope catches a cancel.
                await trio.lowlevel.checkpoint_if_cancelled()
                raise UpstreamTimeout("first_chunk", self._first_chunk_timeout)
        else:
            deadline = trio.current_time() + self._idle_timeout
        self._read_deadline = deadline
        try:
            raw = await self._body.__anext__()
        except StopAsyncIteration:
            raise UpstreamMalformed("vLLM's stream ended before data: [DONE]") from None
        finally:
            self._read_deadline = math.inf
        if _read_observer is not None:
            _read_observer()
        return raw, deadline


class FusedChunks(Generic[Fused]):
    """A ``ChunkStream``'s reads with a fused reader first (``ChunkStream.fused``): each
    read as what the reader made of it, or as its list of chunks. Iterate it inside the
    stream's ``clocks()``, as the stream itself."""

    __slots__ = ("_reader", "_stream")

    def __init__(self, stream: ChunkStream, reader: FusedReader[Fused]) -> None:
        self._stream = stream
        self._reader = reader

    def __aiter__(self) -> FusedChunks[Fused]:
        return self

    async def __anext__(self) -> list[Chunk] | Fused:
        return await self._stream._next(self._reader)
