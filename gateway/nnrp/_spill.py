"""A big submit held in a file, not in the process: the memory ``_codec``'s decoder fills
for a FRAME_SUBMIT packet when the gateway has a media directory (``--media-dir``;
``gateway.pipeline._media`` D5 makes the file).

Why: a 64 MiB image sent as a media frame was held in the gateway's anonymous memory
from its first byte to its operation's end (peak RSS 1.04x the image through
``--media-dir``: docs/benchmarks.md, "Media"), though all the gateway does with those
bytes is write them to a file for vLLM. A pod's memory limit is set for the streams,
not for the largest image a client may send. The rules:

S1. **A shared mapping of a file, paid for as it fills.** ``SpillMap`` is an ``mmap``
    of a file unlinked from the start (nothing is left behind by a crash; the space is
    the kernel's to free when the last view goes). Its blocks are allocated ahead of
    the bytes, a step at a time (``reserve``, the I/O layer's ``grow``): a write into
    a sparse file's mapping on a full disk is a SIGBUS, not an error, and a header
    announcing 64 MiB must cost the directory no more than the bytes that came (as it
    costs the process nothing in an anonymous map). A step that cannot be had (no
    room in the directory's bound, no space on its disk) has the decoder move what
    arrived into the process's memory and go on there: the submit is served either
    way. To everything that reads the packet a spill is what the anonymous map is:
    views of its bytes, read-only, never copied.
S2. **Written pages leave the process at once.** The decoder tells the map what it has
    written (``settle``), and every page wholly written is dropped from the process's
    resident set (``MADV_DONTNEED``: on a shared file mapping this unmaps the page and
    keeps its bytes, in the page cache and the file). Reading a byte later maps its
    page again, from the page cache.
S3. **Readers of every byte drop what they read.** What walks a whole media frame
    (the write of its file for vLLM, a data URI's base64, the request key's digest)
    does so in slices (``SPILL_SLICE`` bytes; base64's own, smaller) and calls
    ``spill_release`` after each: a frame of any size costs the process a slice of
    resident memory, not the frame. (A big base64 envelope, which is no media frame, is
    read as ever: its pages stay mapped until its operation ends.)
    ``spill_release`` does nothing for bytes that are not a spill's.
S4. **What it costs, and where.** The bytes are in the media directory's filesystem:
    on a disk-backed emptyDir, page cache the kernel writes back and can reclaim; on a
    memory-backed one (``medium: Memory``), the pod's memory all the same, under
    ``--media-dir-bytes`` (which counts spills: D5). Either way the kernel charges
    those pages to the memory cgroup of the process that wrote them: the gateway
    container's limit counts the page cache of a disk-backed directory until it is
    written back and reclaimed, and a tmpfs one's pages for as long as they live. What
    a spill saves is the process's own resident memory (its RSS, what it can never
    give back under pressure), not the container's accounting: prefer a disk-backed
    emptyDir. Freeing the map at the operation's end unmaps a few pages, not the image
    (an anonymous 63 MiB map took 13 ms to unmap on the event loop).

Only the decoder and the readers above touch a ``SpillMap``; this module opens no file
(the I/O layer hands the decoder a factory) and imports neither trio nor httpx.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Callable
from typing import Any

#: S3: the bytes a reader walks between two releases.
SPILL_SLICE = 4 << 20
_PAGE = mmap.PAGESIZE


class SpillMap(mmap.mmap):
    """S1: a big FRAME_SUBMIT's memory, a shared mapping of an unlinked file. ``grow``
    is the I/O layer's: it makes the file's blocks up to a length ready (True), or
    cannot (False)."""

    grow: Callable[[int], bool]

    def reserve(self, end: int) -> bool:
        """S1: whether bytes ``:end`` may be written (their blocks are there)."""
        return self.grow(end)

    def settle(self, start: int, end: int) -> None:
        """S2: bytes ``start:end`` were written; drop every page now wholly written."""
        first = start - start % _PAGE
        last = end - end % _PAGE
        if end == len(self):
            last = end  # the last page is whole once the packet is
        if last > first:
            self.madvise(mmap.MADV_DONTNEED, first, last - first)

    def release(self) -> None:
        """S3: drop every page of the map from the process (they stay in the file)."""
        self.madvise(mmap.MADV_DONTNEED)


#: The I/O layer's factory: memory for a big FRAME_SUBMIT of the given size, or None to
#: use the process's own (a full directory, no file could be made).
SpillMemory = Callable[[int], SpillMap | None]


def spill_of(data: object) -> SpillMap | None:
    """The spill ``data`` is a view of, if it is one."""
    owner = data.obj if type(data) is memoryview else None
    return owner if isinstance(owner, SpillMap) else None


def spill_release(data: Any) -> None:
    """S3: if ``data`` is a view of a spill, drop its pages from the process."""
    owner = spill_of(data)
    if owner is not None:
        owner.release()


def spill_digest_update(digest: Any, data: bytes | memoryview) -> None:
    """``digest.update(data)``, in slices (S3) when ``data`` is a spill's."""
    owner = spill_of(data)
    if owner is None:
        digest.update(data)
        return
    for start in range(0, len(data), SPILL_SLICE):
        digest.update(data[start:start + SPILL_SLICE])
        owner.release()


def spill_sha256(data: bytes | memoryview) -> bytes:
    """The SHA-256 of ``data``, walked in slices (S3) when it is a spill's."""
    digest = hashlib.sha256()
    spill_digest_update(digest, data)
    return digest.digest()
