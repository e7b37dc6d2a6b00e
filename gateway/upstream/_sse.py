"""A sans-IO Server-Sent Events decoder for vLLM's ``text/event-stream``.

Bytes in, events out; any chunking of the byte stream gives the same events.

Lines end with LF, CRLF or CR and nothing else (WHATWG SSE "Parsing an event
stream"). ``str.splitlines`` must not be used: it also splits on U+2028, U+0085, \\x1c
and friends, which occur raw inside JSON token text (docs/reference/conventions.md A4, the bug
httpx-sse fixed in 0.4.2). Decoding works on bytes, so a multi-byte UTF-8 sequence
split across reads is never a problem: only complete lines are decoded.

vLLM sends ``data: <json>\\n\\n`` per event and ends with ``data: [DONE]\\n\\n``, after an
error too (docs/reference/vllm-http.md); comments, ``event:``, ``id:`` and ``retry:`` fields are
parsed
per the spec and ignored here. vLLM 0.32's ``--sse-keep-alive-interval`` writes
``: keep-alive\\n\\n`` comments while a stream is idle (queued, in prefill, between
tokens; ``vllm/entrypoints/serve/utils/sse_keep_alive.py``): ``pending`` lets the
stream tell such a read (no event, nothing of one begun) from one that carried tokens.

End of stream: there is nothing to flush. An event is dispatched by its blank line,
and the spec discards an event the stream ends inside ("Once the end of the file is
reached, any pending data must be discarded"), so the decoder is simply dropped; a
body that ends before ``[DONE]``'s blank line is a body cut short (``_stream``).
"""

from __future__ import annotations

from typing import NamedTuple

#: Longest line accepted: one token chunk is well under 4 KiB; a logprobs chunk with
#: many alternatives stays under 256 KiB.
DEFAULT_MAX_LINE = 1 << 20
DEFAULT_MAX_EVENT = 4 << 20


class SSEError(Exception):
    """The stream broke an SSE rule or a size cap (the operation fails with backend_error).

    ``events``: the whole events the same ``feed`` decoded before the fault, so that
    what came before it is still delivered."""

    def __init__(self, message: str, events: list[SSEEvent] | None = None) -> None:
        super().__init__(message)
        self.events = events or []


class SSEEvent(NamedTuple):
    """One event. A NamedTuple rather than a frozen attrs class, as ``nnrp.Packet`` is:
    one is made per event of every stream, and attrs' frozen ``__init__`` (interpreted
    Python even in the compiled build) was a tenth of the gateway's CPU at 256
    coalesced streams (``bench profile``)."""

    data: str
    event: str = "message"

    @property
    def is_done(self) -> bool:
        """vLLM's end-of-stream sentinel."""
        return self.data == "[DONE]"


class SSEDecoder:
    """Incremental decoder: ``feed(bytes) -> list[SSEEvent]``."""

    def __init__(self, max_line: int = DEFAULT_MAX_LINE, max_event: int = DEFAULT_MAX_EVENT
                 ) -> None:
        self.max_line = max_line
        self.max_event = max_event
        self._buffer = bytearray()
        self._data: list[str] = []
        self._data_size = 0
        self._event_type = ""
        self._pending_cr = False  # a CR ended the last chunk: a following LF belongs to it

    @property
    def pending(self) -> bool:
        """Part of an event is held: a line without its end, or data lines without the
        blank line that dispatches them. False after a read of comments only."""
        return bool(self._buffer or self._data or self._event_type)

    @property
    def between_events(self) -> bool:
        """Nothing held back and no CR waiting for its LF: a read of whole one-line
        ``data:`` events, ending with a blank line and holding no CR, is then read as
        those events alone and leaves this state as it was (``_feed_whole_events``)."""
        return not self._buffer and not self._data and not self._pending_cr

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        if not chunk:
            return events
        if (not self._buffer and not self._data and not self._pending_cr
                and chunk.endswith(b"\n\n") and b"\r" not in chunk):
            fast = self._feed_whole_events(chunk)
            if fast is not None:
                return fast
        if self._pending_cr:
            self._pending_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buffer = self._buffer
        buffer += chunk
        try:
            start = self._lines(buffer, events)
        except SSEError as exc:
            exc.events = events
            raise
        del buffer[:start]
        if len(buffer) > self.max_line:
            raise SSEError(f"SSE line of over {self.max_line} bytes without an end", events)
        return events

    def _lines(self, buffer: bytearray, events: list[SSEEvent]) -> int:
        """Every complete line of ``buffer`` into ``events``; where the rest starts."""
        start = 0
        length = len(buffer)
        while True:
            lf = buffer.find(b"\n", start)
            cr = buffer.find(b"\r", start, lf if lf >= 0 else length)
            if cr >= 0:
                end, after = cr, cr + 1
                if after < length and buffer[after] == 0x0A:
                    after += 1
                elif after == length:
                    self._pending_cr = True  # CRLF may be split across chunks
            elif lf >= 0:
                end, after = lf, lf + 1
            else:
                break
            if end - start > self.max_line:
                raise SSEError(f"SSE line of {end - start} bytes exceeds {self.max_line}")
            self._line(bytes(buffer[start:end]), events)
            start = after
        return start

    def _feed_whole_events(self, chunk: bytes) -> list[SSEEvent] | None:
        """The usual case: whole ``data: <json>\\n\\n`` events, one line each (vLLM writes
        exactly this). None means "not that shape": the general parser takes over."""
        events = []
        for block in chunk[:-2].split(b"\n\n"):
            if not block.startswith(b"data: ") or b"\n" in block or len(block) > self.max_line:
                return None
            try:
                events.append(SSEEvent(block[6:].decode("utf-8")))
            except UnicodeDecodeError:
                return None
        return events

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        if not raw:
            if self._data:
                events.append(SSEEvent("\n".join(self._data), self._event_type or "message"))
            self._data = []
            self._data_size = 0
            self._event_type = ""
            return
        if raw[:1] == b":":
            return  # comment
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SSEError(f"SSE line is not valid UTF-8: {exc}") from exc
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data_size += len(value)
            if self._data_size > self.max_event:
                raise SSEError(f"SSE event exceeds {self.max_event} bytes")
            self._data.append(value)
        elif name == "event":
            self._event_type = value
        # "id" and "retry" and unknown fields: ignored (vLLM sends none).
