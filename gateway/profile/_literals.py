"""Long string literals cut out of a big JSON envelope before it is parsed, and spliced
back, as the client wrote them, when the request is encoded for vLLM.

Why: base64 media inside the envelope (a data URI in ``image_url.url``, the frozen
profile's only way to send an image) makes a big body whose parse, and re-encoding for
vLLM, hold the event loop for their whole length: ``json.loads`` and ``json.dumps``
keep the GIL throughout, so a worker thread stalls every other stream just as long
(measured: a 48 MiB parse in a thread left the loop's thread unscheduled for all of its
279 ms). Cut out, those bytes are found with ``bytes.find`` / ``rfind`` (memchr speed),
copied once, and never decoded, parsed or escaped. The rules:

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
"""

from __future__ import annotations

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
#: L1: a run is checked this much at a time (``bytes`` methods need a copy; a window's
#: is small, where a whole run's would be the run again).
_CHECK_WINDOW = 1 << 20


def cut_long_literals(payload: bytes, *, nonce: str, min_literal: int = MIN_LITERAL,
                      threshold: int = CUT_THRESHOLD
                      ) -> tuple[bytes, dict[str, memoryview]]:
    """L1/L2: the document with its long runs replaced by placeholders, and the runs."""
    if len(payload) < threshold:
        return payload, {}
    find, rfind = payload.find, payload.rfind
    pieces: list[bytes] = []
    cuts: dict[str, memoryview] = {}
    kept_from = 0
    quote = find(b'"')
    while 0 <= quote < len(payload) - min_literal:
        window_end = quote + 1 + min_literal
        later = rfind(b'"', quote + 1, window_end)
        if later >= 0:  # too short a run: go on from the window's last quote
            quote = later
            continue
        closing = find(b'"', window_end)
        if closing < 0:
            break
        # The run is checked where it lies and kept as a view of the payload: a cut
        # megabyte is never copied (the request is sent in pieces, ``_media`` D3).
        if payload[closing - 1] != _BACKSLASH and _printable(payload, quote + 1, closing):
            placeholder = f"{PLACEHOLDER_PREFIX}{nonce}-{len(cuts)}"
            pieces += [payload[kept_from:quote + 1], placeholder.encode()]
            cuts[placeholder] = memoryview(payload)[quote + 1:closing]
            kept_from = closing
        quote = closing
    if not cuts:
        return payload, {}
    pieces.append(payload[kept_from:])
    return b"".join(pieces), cuts


def _printable(payload: bytes, start: int, end: int) -> bool:
    """L1: ``payload[start:end]`` is all printable ASCII (measured: the fastest check
    CPython has is ``isascii`` and ``translate`` on a copy; a regex is three times
    slower)."""
    for window in range(start, end, _CHECK_WINDOW):
        run = payload[window:min(window + _CHECK_WINDOW, end)]
        if not run.isascii() or len(run.translate(None, _CONTROL)) != len(run):
            return False
    return True
