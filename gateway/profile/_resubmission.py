"""The key of a request: how a resubmission after a resume is told from another request
(the sans-IO ``ResubmissionRule``; ``gateway.nnrp._journal`` J3), at a cost on the event
loop that does not grow with the megabytes a request carries.

Why: the key was the SHA-256 of the envelope's whole JSON, parsed and written back in
one order (0.62 s for a 48 MiB envelope, holding the GIL throughout: a worker thread
would stall every other stream as long), and a submit with media frames was keyed by
its joined bytes (a copy of all of them, and a resubmission that declares its position
differed from its request). The rules:

K1. **What is keyed.** The request's value: the envelope's JSON (its keys in one order,
    any whitespace, any escaping) without ``nnrp.resume_after_sequence``, the one field a
    resubmission may add or change (it says where to continue: read back beside the
    key, or why it is no position); then each typed frame's descriptor (all but its
    offset and length) and, for the frames after the envelope (media, ``_media`` M1)
    and the body's object (inline and referenced: what a submit depends on, C6 of
    ``gateway.nnrp._cache``) and extension regions, their SHA-256. A payload that is not a
    JSON object, or that Python cannot write back, is keyed by its bytes (``raw:``),
    with the rest as above.
K2. **Long strings by digest.** In the keyed JSON, every string (a value or a key) of
    at least ``LONG_STRING`` characters stands as ``"\\0sha256:<hex of its UTF-8>"``; a
    shorter one that begins with ``\\0`` gets one more, so no string can stand for
    another. hashlib releases the GIL on a big buffer: a digest costs the loop nothing.
K3. **A big envelope is not parsed whole.** From ``CUT_THRESHOLD`` bytes, each run of at
    least ``MIN_LITERAL`` bytes between two quotes with no backslash in it is cut out
    (as ``_literals`` L1-L2 cut them for vLLM), and only the rest is parsed. Without a
    backslash, a run's bytes are its string's UTF-8 (in JSON that parses), and the string
    it ends is long (K2: a run is ``MIN_LITERAL`` bytes, more than ``LONG_STRING``
    characters however it is written): it is digested from its pieces, the bytes before
    the cut and the run, never joined. A run that is no string (``_literals`` L3: the
    rest does not parse) has the envelope parsed whole, as does one with a backslash
    (its string's value is not its bytes: slow, but right). So a request cut or not
    has one key. A run is not checked for control characters, which only JSON that
    does not parse holds (such a request fails whichever way it is keyed).
K4. **Bounded holds.** The envelope may be a view of the packet (a big body is never
    copied, ``gateway.nnrp._codec``): it is searched ``CHUNK`` bytes at a time, so no
    step holds the GIL longer than a copy of ``CHUNK`` bytes. The I/O layer runs
    ``read`` in a worker thread for a big submit (``gateway.nnrp._server_session`` rule 5c):
    what holds the GIL there is that search and the parse of what is left.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets
from typing import Any

from gateway.nnrp import ResubmissionRead, TypedBody, spill_sha256

from ._literals import CUT_THRESHOLD, MIN_LITERAL, PLACEHOLDER_PREFIX, long_runs

#: K2: strings this long or longer are keyed by their digest. Below any string a cut run
#: can end (a ``MIN_LITERAL``-byte run is at least ``MIN_LITERAL / 12`` characters: a
#: surrogate pair written ``\\uXXXX\\uXXXX`` is the most bytes one character takes).
LONG_STRING = 4096
#: K4: the most bytes searched under the GIL at once.
CHUNK = 1 << 20
#: K1: the one policy field a resubmission may add or change.
RESUME_POSITION = "resume_after_sequence"
_DIGEST_MARK = "\0sha256:"



class EnvelopeResubmission:
    """The openai-compatible/1 ``ResubmissionRule`` (K1-K4). ``cut_threshold``,
    ``min_literal`` and ``long_string``: K2's and K3's sizes (tests make them small, to
    cross them with small requests)."""

    def __init__(self, *, cut_threshold: int = CUT_THRESHOLD, min_literal: int = MIN_LITERAL,
                 long_string: int = LONG_STRING) -> None:
        if min_literal < long_string * 12:
            raise ValueError(f"min_literal must be at least 12 x long_string "
                             f"({long_string * 12}): every cut run must end a long string (K3)")
        self.cut_threshold = cut_threshold
        self.min_literal = min_literal
        self.long_string = long_string

    def read(self, body: TypedBody | None) -> ResubmissionRead:
        frames = body.frames if body is not None else ()
        rest = hashlib.sha256()
        for index, (descriptor, payload) in enumerate(frames):  # K1: all but offset, length
            rest.update(repr(tuple(descriptor)[:6]).encode())
            if index:  # a spill's in slices (gateway.nnrp._spill S3)
                rest.update(spill_sha256(payload))
        if body is not None:
            references = b"".join(reference.pack() for reference in body.object_references)
            for region in (body.inline_object, references, body.extension_descriptor,
                           body.extension_payload):
                rest.update(hashlib.sha256(region).digest())
        envelope = frames[0].payload if frames else b""
        kind, keyed, position, problem = self._envelope(envelope)
        key = hashlib.sha256(keyed)
        key.update(rest.digest())
        return ResubmissionRead(kind + key.digest(), position, problem)

    def key(self, body: TypedBody | None) -> bytes:
        return self.read(body).key

    def _envelope(self, envelope: bytes | memoryview
                  ) -> tuple[bytes, bytes, int | None, str | None]:
        """K1-K3: (``json:`` or ``raw:``, what is hashed, the position, its problem)."""
        document, runs = _cut_document(memoryview(envelope), self.cut_threshold,
                                       self.min_literal, self.long_string)
        if document is None:
            return b"raw:", hashlib.sha256(envelope).digest(), None, None
        position, problem = _take_position(document)
        try:
            keyed = _keyed(document, runs)
            canonical = json.dumps(keyed, sort_keys=True, ensure_ascii=False)
            return b"json:", canonical.encode("utf-8", "surrogatepass"), position, problem
        except (ValueError, RecursionError):  # nested past what can be walked or written
            return b"raw:", hashlib.sha256(envelope).digest(), position, problem


def _take_position(document: dict[str, Any]) -> tuple[int | None, str | None]:
    """K1: the position, removed from the document (with ``nnrp`` if nothing else)."""
    policy = document.get("nnrp")
    if not isinstance(policy, dict) or RESUME_POSITION not in policy:
        return None, None
    value = policy.pop(RESUME_POSITION)
    if not policy:
        del document["nnrp"]
    if type(value) is int and value >= 0:
        return value, None
    return None, (f"nnrp.{RESUME_POSITION} must be an integer >= 0, "
                  f"not {json.dumps(value)[:40]}")


# ---------------------------------------------------------------------- K3, K4: the cut


class _Runs:
    """The runs cut out of one envelope: each placeholder's (start, end) in it; and K2's
    length."""

    def __init__(self, view: memoryview, nonce: str, long_string: int) -> None:
        self.view = view
        self.long_string = long_string
        self.pattern = re.compile(re.escape(f"{PLACEHOLDER_PREFIX}{nonce}-") + r"(\d+)")
        self.marker = f"{PLACEHOLDER_PREFIX}{nonce}-"
        self.spans: list[tuple[int, int]] = []


def _cut_document(view: memoryview, threshold: int, min_literal: int, long_string: int
                  ) -> tuple[dict[str, Any] | None, _Runs]:
    """The envelope's document (None: not a JSON object), and the runs cut out of it."""
    runs = _Runs(view, secrets.token_hex(8), long_string)
    if len(view) >= threshold:
        shortened = _shortened(view, min_literal, runs)
        if shortened is not None:
            document = _parse(shortened)
            if document is not None:
                return document, runs
            runs.spans.clear()
    return _parse(bytes(view)), runs  # small, or a run that is no string (K3)


def _parse(data: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        # ValueError: JSONDecodeError, or an integer past Python's digit limit.
        return None
    return document if isinstance(document, dict) else None


def _shortened(view: memoryview, min_literal: int, runs: _Runs) -> bytes | None:
    """K3: the envelope with each long run without a backslash replaced by a
    placeholder (``_literals`` L1's scan, over a view, ``CHUNK`` bytes at a time); None
    when none is cut."""
    pieces: list[bytes] = []
    kept_from = 0
    for quote, closing in long_runs(functools.partial(_find, view),
                                    functools.partial(_rfind, view), len(view), min_literal):
        if _find(view, b"\\", quote + 1, closing) < 0:
            pieces += [bytes(view[kept_from:quote + 1]),
                       f"{runs.marker}{len(runs.spans)}".encode()]
            runs.spans.append((quote + 1, closing))
            kept_from = closing
    if not runs.spans:
        return None
    pieces.append(bytes(view[kept_from:]))
    return b"".join(pieces)


def _find(view: memoryview, needle: bytes, start: int, end: int) -> int:
    """``bytes.find`` over a view, copying at most ``CHUNK`` bytes at a time (K4)."""
    while start < end:
        stop = min(start + CHUNK, end)
        found = bytes(view[start:stop]).find(needle)
        if found >= 0:
            return start + found
        start = stop
    return -1


def _rfind(view: memoryview, needle: bytes, start: int, end: int) -> int:
    """``bytes.rfind`` over a view's window (the scan's windows are ``MIN_LITERAL``)."""
    found = bytes(view[start:end]).rfind(needle)
    return start + found if found >= 0 else -1


# ---------------------------------------------------------------------- K2: the keyed JSON


def _keyed(value: Any, runs: _Runs) -> Any:
    """The document with its long strings as digests (K2), its cut runs put back as
    the digests of the strings they end (K3)."""
    if isinstance(value, str):
        return _keyed_string(value, runs)
    if isinstance(value, dict):
        return {_keyed_string(key, runs): _keyed(item, runs) for key, item in value.items()}
    if isinstance(value, list):
        return [_keyed(item, runs) for item in value]
    return value


def _keyed_string(text: str, runs: _Runs) -> str:
    if runs.spans and runs.marker in text:
        digest = hashlib.sha256()
        end = 0
        for match in runs.pattern.finditer(text):
            digest.update(text[end:match.start()].encode("utf-8", "surrogatepass"))
            start, stop = runs.spans[int(match.group(1))]
            digest.update(runs.view[start:stop])  # the run's bytes are its UTF-8
            end = match.end()
        digest.update(text[end:].encode("utf-8", "surrogatepass"))
        return _DIGEST_MARK + digest.hexdigest()
    if len(text) >= runs.long_string:
        return _DIGEST_MARK + hashlib.sha256(
            text.encode("utf-8", "surrogatepass")).hexdigest()
    return "\0" + text if text.startswith("\0") else text

