"""A big submit held in a file, not in the process: the memory ``_codec``'s decoder fills
for a FRAME_SUBMIT packet when the gateway has a media directory (``--media-dir``;
``gateway.pipeline._media`` D5 makes the file).

Why: a 64 MiB image sent as a media frame was held in the gateway's anonymous memory
from its first byte to its operation's end (peak RSS 1.04x the image through
``--media-dir``: docs/benchmarks.md, "Media"), though all the gateway does with those
bytes is write them to a file for vLLM. A pod's memory limit is set for the streams,
not for the largest image a client may send. The rules:

S1. **A shared mapping of a file.** ``SpillMap`` is an ``mmap`` of a file whose blocks
    were allocated when it was made (a write into a sparse file's mapping on a full
    disk is a SIGBUS, not an error), unlinked from the start (nothing is left behind
    by a crash; the space is the kernel's to free when the last view goes). To
    everything that reads the packet it is what the anonymous map is: views of its
    bytes, read-only, never copied.
S2. **Written pages leave the process at once.** The decoder tells the map what it has
    written (``settle``), and every page wholly written is dropped from the process's
    resident set (``MADV_DONTNEED``: on a shared file mapping this unmaps the page and
    keeps its bytes, in the page cache and the file). Reading a byte later maps its
    page again, from the page cache.
S3. **Readers of every byte drop what they read.** What walks a whole media frame
    (the write of its file for vLLM, a data URI's base64, the request key's digest)
    does so in slices of ``SPILL_SLICE`` bytes and calls ``spill_release`` after each:
    a frame of any size costs the process a slice of resident memory, not the frame.
    ``spill_release`` does nothing for bytes that are not a spill's.
S4. **What it costs, and where.** The bytes are in the media directory's filesystem:
    on a disk-backed emptyDir, page cache the kernel writes back and can reclaim; on a
    memory-backed one (``medium: Memory``), the pod's memory all the same, under
    ``--media-dir-bytes`` (which counts spills: D5). Freeing the map at the
    operation's end unmaps a few pages, not the image (an anonymous 63 MiB map took
    13 ms to unmap on the event loop).

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
    """S1: a big FRAME_SUBMIT's memory, a shared mapping of an unlinked file."""

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


def spill_release(data: Any) -> None:
    """S3: if ``data`` is a view of a spill, drop its pages from the process."""
    owner = data.obj if type(data) is memoryview else None
    if isinstance(owner, SpillMap):
        owner.release()


def spill_digest_update(digest: Any, data: bytes | memoryview) -> None:
    """``digest.update(data)``, in slices (S3) when ``data`` is a spill's."""
    owner = data.obj if type(data) is memoryview else None
    if not isinstance(owner, SpillMap):
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
