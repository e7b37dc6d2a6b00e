"""Long string literals cut out of a big JSON envelope before it is parsed, and spliced
back, as the client wrote them, when the request is encoded for vLLM.

Why: base64 media inside the envelope (a data URI in ``image_url.url``, the frozen
profile's only way to send an image) makes a big body whose parse, and re-encoding for
vLLM, hold the event loop for their whole length: ``json.loads`` and ``json.dumps``
keep the GIL throughout, so a worker thread stalls every other stream just as long
(measured: a 48 MiB parse in a thread left the loop's thread unscheduled for all of its
279 ms). Cut out, those bytes are found with ``bytes.find`` / ``rfind`` (memchr speed),
and never copied, decoded, parsed or escaped. The rules:

L1. Only an envelope of at least ``CUT_THRESHOLD`` bytes is scanned; only a run of at
    least ``MIN_LITERAL`` bytes between two quotes, all printable ASCII (no control
    character, which JSON would refuse in a string) and not ending in a backslash (so
    the closing quote is not escaped), is cut. The scan asks, from each
    quote, whether the next ``MIN_LITERAL`` bytes hold another (``rfind``): a document of
    many short strings costs one ``rfind`` per ``MIN_LITERAL`` bytes, not a step per
    quote.
L2. A cut run becomes a placeholder, ``nnrp-cut-<nonce>-<k>`` (characters JSON never
    escapes; the nonce is random per request), and the shortened document is parsed.
L3. The scan does not track which quotes open strings. A run that follows an escaped
    quote lies inside a string all the same, and splices back exactly; a run that
    follows a closing quote is JSON structure, and its placeholder between two strings
    can never parse: then the whole envelope is parsed as it came (slow, but right), and
    nothing is cut. Likewise when a placeholder lands in a field the gateway itself
    reads (``READ_FIELDS``: the schema, operation, request id, model, the ``nnrp``
    policy), which must be checked as the client wrote it. So a document parses to the
    same value, and is checked the same, cut or not.
L4. The placeholders stay in the parsed body wherever the runs were (a string value, or
    part of one, or a key); the request sent to vLLM is the body's JSON with each
    placeholder replaced by its run's bytes (``gateway.pipeline._media``, D3): vLLM gets
    the client's bytes.
L5. A big envelope is read in steps: ``cut_steps`` (and ``copy_steps``, which copies a
    big submit's envelope out of the packet: searching needs ``bytes`` methods) yield
    after each ``STEP_BYTES`` they copy or check, so the caller can let the event loop
    run between them (``gateway.pipeline``): a 46 MiB envelope held it for 150 ms in
    one step. ``cut_long_literals`` runs them to the end at once.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Generator, Iterator
from typing import TypeVar

#: L1: envelopes smaller than this are parsed as they are.
CUT_THRESHOLD = 1 << 20
#: L1: the shortest run cut out (a small image's base64; no prompt text is this long
#: without a quote, a backslash or a non-ASCII character... and if one is, it is
#: spliced back as it was).
MIN_LITERAL = 64 << 10
PLACEHOLDER_PREFIX = "nnrp-cut-"
#: L1: what a run may not hold (JSON refuses raw control characters in a string).
_CONTROL = bytes(range(0x20))
_BACKSLASH = ord("\\")
#: L5: the bytes a step copies or checks (about a millisecond on this VM). A run is
#: checked a window at a time besides: ``bytes`` methods need a copy, and a window's is
#: small where a whole run's would be the run again.
STEP_BYTES = 1 << 20

#: What ``cut_steps`` searches: ``bytes``, or a copy of a big envelope (``copy_steps``).
Text = bytes | mmap.mmap
T = TypeVar("T")
#: ``bytes.find`` / ``rfind``'s shape (sub, start, end), over whatever holds the text.
Finder = Callable[[bytes, int, int], int]


def cut_long_literals(payload: bytes, *, nonce: str, min_literal: int = MIN_LITERAL,
                      threshold: int = CUT_THRESHOLD
                      ) -> tuple[bytes, dict[str, memoryview]]:
    """L1/L2: the document with its long runs replaced by placeholders, and the runs."""
    return finish(cut_steps(payload, nonce=nonce, min_literal=min_literal,
                            threshold=threshold))


def long_runs(find: Finder, rfind: Finder, size: int, min_literal: int
              ) -> Iterator[tuple[int, int]]:
    """L1's scan: each (opening, closing) quote pair at least ``min_literal`` bytes apart
    with no quote between, found from each quote by asking whether the next
    ``min_literal`` bytes hold another (``rfind``). Whether a run is cut is the caller's
    rule (here L1's; ``_resubmission`` K3's); the scan goes on after its closing quote
    either way."""
    quote = find(b'"', 0, size)
    while 0 <= quote < size - min_literal:
        window_end = quote + 1 + min_literal
        later = rfind(b'"', quote + 1, window_end)
        if later >= 0:  # too short a run: go on from the window's last quote
            quote = later
            continue
        closing = find(b'"', window_end, size)
        if closing < 0:
            return
        yield quote, closing
        quote = closing


def cut_steps(payload: Text, *, nonce: str, min_literal: int = MIN_LITERAL,
              threshold: int = CUT_THRESHOLD
              ) -> Generator[None, None, tuple[bytes, dict[str, memoryview]]]:
    """``cut_long_literals`` in steps (L5)."""
    if len(payload) < threshold:
        return payload[:] if isinstance(payload, mmap.mmap) else payload, {}
    pieces: list[bytes] = []
    cuts: dict[str, memoryview] = {}
    kept_from = 0
    for quote, closing in long_runs(payload.find, payload.rfind, len(payload), min_literal):
        # The run is checked where it lies and kept as a view of the payload: a cut
        # megabyte is never copied (the request is sent in pieces, ``_media`` D3).
        printable = yield from _printable(payload, quote + 1, closing)
        if payload[closing - 1] != _BACKSLASH and printable:
            placeholder = f"{PLACEHOLDER_PREFIX}{nonce}-{len(cuts)}"
            pieces += [payload[kept_from:quote + 1], placeholder.encode()]
            cuts[placeholder] = memoryview(payload)[quote + 1:closing]
            kept_from = closing
    if not cuts:
        return payload[:] if isinstance(payload, mmap.mmap) else payload, {}
    pieces.append(payload[kept_from:])
    return b"".join(pieces), cuts


def copy_steps(view: memoryview) -> Generator[None, None, mmap.mmap]:
    """L5: ``view``'s bytes in memory of their own that ``cut_steps`` can search, copied a
    window at a time (an anonymous map: its pages come as they are written, no zeroed
    allocation up front)."""
    copy = mmap.mmap(-1, max(len(view), 1))
    for start in range(0, len(view), STEP_BYTES):
        copy[start:start + STEP_BYTES] = view[start:start + STEP_BYTES]
        yield
    return copy


def finish(steps: Generator[None, None, T]) -> T:
    """Run ``steps`` to their end at once (a small document, or a caller with no loop)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def _printable(payload: Text, start: int, end: int) -> Generator[None, None, bool]:
    """L1: ``payload[start:end]`` is all printable ASCII, a step per window (measured:
    the fastest check CPython has is ``isascii`` and ``translate`` on a copy; a regex is
    three times slower)."""
    for window in range(start, end, STEP_BYTES):
        run = payload[window:min(window + STEP_BYTES, end)]
        if not run.isascii() or len(run.translate(None, _CONTROL)) != len(run):
            return False
        yield
    return True
