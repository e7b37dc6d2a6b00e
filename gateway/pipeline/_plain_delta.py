"""The plain text delta fused: an upstream read in, its events' PARTIAL_RESULT bodies out.

Most reads of a stream hold one event, vLLM's plain text delta: ``data: `` and the chunk
(``upstream._chunks`` rule 1's shape) and a blank line. The general path decodes the
SSE line, reads the chunk by its kept head into a dict (``_chunks`` rule 4), counts its
token, translates it (``Translator.feed_encoded``'s short way) and encodes the event.
``PlainDelta`` goes from the read's bytes to the event's bytes without any of the
objects between, under these rules:

1. Where: exactly where ``_chunks`` rule 4 applies to every event of the read. The
   stream's chunk parser has kept a head and a tail; the SSE decoder holds nothing
   (``SSEDecoder.between_events``); the read is one or more blocks, each
   ``data: `` + head + text + tail + a blank line, the text holding no quote, backslash
   or control byte and being UTF-8. Those bytes are exactly what the SSE decoder's
   whole-events way reads as one event each (no CR or LF but the blank lines: the head
   and tail hold none, the text neither), leaving its state as it was, and what the
   kept head reads as a chunk with that text as its content (a UTF-8 byte below 0x80 is
   always its own character, so a byte test is the text's test). A block longer than
   the decoder's line cap goes the general way, which refuses it.
2. Then the translator: the short way of ``feed_encoded`` applies to such a chunk when
   its choice has been seen and the client did not ask for ``include_openai_chunk``
   (``Translator.take_plain``); its only effect is the text kept for the completed
   body, and the chunk count. The token count is one per chunk with text (no token ids,
   no logprobs: ``token_count``).
3. The event: a text with no quote, backslash or control character is its own JSON
   string (the profile's encoder escapes nothing else, ``ensure_ascii`` off), so the
   body is ``{"delta":"`` + the text's bytes as vLLM sent them + ``","index":N,"type":
   "response.output_text.delta"}``: ``encode_text_delta``'s bytes. An empty text makes
   no event (``_translate`` rule 1), only the chunk.
4. All or nothing: a read that breaks any rule above in any block goes the general way
   whole, and nothing here has changed anything then (the translator is asked last).
5. What happens after the body is the general path's own: the handler spends the
   token (``Operation.spend_tokens``) and emits the body (``Operation.emit``), which
   gives it its result_sequence, journal entry, flow credit, notes and observers, and
   the session encodes the PARTIAL_RESULT. Nothing per event depends on a mode
   (tracing, resumable sessions, flow control, progress): the span, the journal and the
   windows are the session's and the operation's, reached the same way either way.
6. The switch: ``NNRP_GATEWAY_PLAIN_DELTA`` is ``fused`` (the default: the C function
   where it is built, else the pure one), ``python`` (the pure function, built or not)
   or ``general`` (every read the general way), read when the pipeline is made
   (``plain_delta_mode``, then ``plain_blocks_of``); ``serve`` refuses any other value
   before it binds (cli/_settings.py).
7. The byte work (rules 1, 3 and 4 on one read, the translator left out) is one
   function of the read and the kept bytes, ``plain_blocks``; the compiled build
   (``NNRP_GATEWAY_COMPILE=1``) also builds it in C, ``_plain_delta_native.c``, which
   gives the same answer for every input (its rules). Where that extension is not
   built, ``NATIVE_BLOCKS`` is None and ``fused`` is the pure function.

8. A read's run: the reader answers the read up to the end of its last block that ends
   with the kept tail and a blank line, all or nothing as above (rule 4), and the
   stream reads what follows it the general way (``upstream._stream``'s splitting
   rules: with them, a whole answer read at once is its first chunks the general way,
   its text deltas here, and its finish, usage and ``[DONE]`` the general way again).
   A tail cannot be inside a text (it holds a quote), so the run ends where a block
   does. Where the run is refused and holds a backslash (a text with an escape: a
   newline, a quote), the run before the block holding the first one is asked for once
   more; the stream reads that block the general way and offers the reader the rest.

``tests/pipeline/test_plain_delta.py`` holds the proof: the packets a client receives
are the same bytes with the switch on and off, over every recorded transcript of every
vLLM family and hypothesis-generated streams; ``test_plain_delta_native.py`` and the
fuzz target ``plain_blocks`` compare the C function with the pure one; and
docs/benchmarks.md the measurement.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gateway.errors import ConfigError

if TYPE_CHECKING:
    from gateway.upstream import ChunkParser, SSEDecoder

    from ._translate import Translator

#: Rule 6: the variable, and its values.
PLAIN_DELTA_ENV = "NNRP_GATEWAY_PLAIN_DELTA"
FUSED, PYTHON, GENERAL = "fused", "python", "general"
_MODES = (FUSED, PYTHON, GENERAL)

#: What the text may not hold (rule 1): a quote or a backslash (not its own JSON
#: string), a control byte (not JSON; CR and LF among them: not one SSE line).
_NOT_BARE = re.compile(rb'["\\\x00-\x1f]')
_SSE_DATA = b"data: "
_BLANK_LINE = b"\n\n"
_EVENT_HEAD = b'{"delta":"'

#: What one read of plain text deltas became: per chunk, its event's body, or None for
#: an empty text (no event, no token). A tuple, where the general path's is a list.
PlainEvents = tuple[bytes | None, ...]
#: Rule 7: a read's texts (for ``Translator.take_plain``) and its events.
PlainRead = tuple[list[str], PlainEvents]
#: Rule 7's function: (raw, prefix, suffix, longest, event_tail) -> the read, or None.
PlainBlocks = Callable[[bytes, bytes, bytes, int, bytes], PlainRead | None]


def plain_blocks(raw: bytes, prefix: bytes, suffix: bytes, longest: int, event_tail: bytes
                 ) -> PlainRead | None:
    """Rules 1, 3 and 4 on one read's bytes (rule 7): each block ``prefix`` + text +
    ``suffix``, at most ``longest`` bytes before its suffix, its text bare and UTF-8;
    its event ``_EVENT_HEAD`` + text + ``event_tail``. None where any block is not so."""
    if not (raw.startswith(prefix) and raw.endswith(suffix)):
        return None
    start, end = len(prefix), len(raw) - len(suffix)
    if end < start:
        return None  # the head and the tail overlap: no chunk
    if _NOT_BARE.search(raw, start, end) is not None:
        # A quote between them: another event (or a text that is not bare).
        return _several(raw, prefix, suffix, longest, event_tail)
    if end > longest:
        return None  # the general way refuses it (rule 1)
    text = raw[start:end]
    try:
        texts = [text.decode("utf-8")]
    except UnicodeDecodeError:
        return None
    return texts, ((_EVENT_HEAD + text + event_tail,) if text else (None,))  # rule 3


def _several(raw: bytes, prefix: bytes, suffix: bytes, longest: int, event_tail: bytes
             ) -> PlainRead | None:
    """A read of several events, each of them the plain delta."""
    blocks = raw.split(suffix)
    blocks.pop()  # what follows the last suffix: b"" (the read ends with one)
    start = len(prefix)
    texts: list[str] = []
    for block in blocks:
        if (not block.startswith(prefix) or len(block) > longest
                or _NOT_BARE.search(block, start) is not None):
            return None
        try:
            texts.append(block[start:].decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return texts, tuple(_EVENT_HEAD + block[start:] + event_tail if text else None
                        for block, text in zip(blocks, texts, strict=True))


def _native_blocks() -> PlainBlocks | None:
    """Rule 7: the C function, where this install has it (the compiled build)."""
    try:
        from ._plain_delta_native import plain_blocks as native
    except ImportError:
        return None
    return native


#: Rule 7: the C ``plain_blocks``, or None where it is not built.
NATIVE_BLOCKS = _native_blocks()


def plain_delta_mode(environ: Mapping[str, str] = os.environ) -> str:
    """Rule 6: ``NNRP_GATEWAY_PLAIN_DELTA``'s value, one of ``_MODES``."""
    value = environ.get(PLAIN_DELTA_ENV, FUSED).strip().lower() or FUSED
    if value not in _MODES:
        raise ConfigError(f"{PLAIN_DELTA_ENV} is {value!r}, not one of {', '.join(_MODES)}")
    return value


def plain_blocks_of(mode: str) -> PlainBlocks | None:
    """Rule 6: what reads the plain deltas' bytes in ``mode`` (None: the general way)."""
    if mode == GENERAL:
        return None
    return NATIVE_BLOCKS if mode == FUSED and NATIVE_BLOCKS is not None else plain_blocks


class PlainDelta:
    """One stream's fused reader (``ChunkStream.fused``), feeding ``translator``, its
    reads' bytes read by ``blocks`` (rule 7: the pure function or the C one)."""

    __slots__ = ("_blocks", "_event_tail", "_index", "_kept", "_longest", "_prefix",
                 "_suffix", "_translator")

    def __init__(self, translator: Translator, blocks: PlainBlocks = plain_blocks) -> None:
        self._translator = translator
        self._blocks = blocks
        #: The parser's kept head, tail and index the bytes below were made from.
        self._kept: tuple[str, str, int] | None = None
        self._index = 0
        self._prefix = b""  # data: + head
        self._suffix = b""  # tail + blank line
        self._event_tail = b""  # the body after the text (rule 3)
        self._longest = 0  # the longest block (data: + head + text) the decoder takes

    def __call__(self, raw: bytes, decoder: SSEDecoder, parser: ChunkParser
                 ) -> tuple[PlainEvents, int] | None:
        kept = parser.kept
        if kept is None or not decoder.between_events:  # rule 1's where
            return None
        if kept is not self._kept:
            self._keep(kept, decoder.max_line)
        # Rule 8: the read up to its last plain tail; what follows goes the general way.
        end = raw.rfind(self._suffix) + len(self._suffix)
        if end < len(self._suffix):
            return None
        run = raw if end == len(raw) else raw[:end]
        read = self._blocks(run, self._prefix, self._suffix, self._longest, self._event_tail)
        if read is None:
            # Rule 8: a text with an escape (a newline, a quote) ends the run before it.
            escape = raw.find(b"\\", len(self._prefix), end)
            end = raw.rfind(self._suffix, 0, max(escape, 0)) + len(self._suffix)
            if escape < 0 or end < len(self._suffix):
                return None
            read = self._blocks(raw[:end], self._prefix, self._suffix, self._longest,
                                self._event_tail)
        if read is None or not self._translator.take_plain(self._index, read[0]):
            return None  # rule 2, asked last (rule 4)
        return read[1], end

    def _keep(self, kept: tuple[str, str, int], max_line: int) -> None:
        head, tail, index = kept
        self._kept, self._index = kept, index
        self._prefix = _SSE_DATA + head.encode()
        self._suffix = tail.encode() + _BLANK_LINE
        self._event_tail = (f'","index":{index},"type":"response.output_text.delta"}}'
                            .encode())
        # The decoder's cap is on the SSE line: the block and the tail (rule 1).
        self._longest = max_line - len(self._suffix) + len(_BLANK_LINE)
