"""Media delivery: the bytes of a request's media frames to vLLM (the plan is
``gateway.profile._media``'s; this is its I/O side). The rules:

D1. **Data URIs** (the default): each reference becomes ``data:TYPE;base64,...`` (bare
    base64 for ``input_audio``, rule M6), spliced into the encoded request body (D3).
    Base64 holds the GIL from start to end (a worker thread stalls the event loop just
    as long; measured: a 48 MiB encode in a thread left the loop's thread unscheduled
    for all of its 200 ms), so it runs on the loop in slices of ``ENCODE_SLICE`` bytes
    with a checkpoint between them: no other stream waits for more than one slice. A
    frame referenced twice with one type is encoded once.
D2. **A media directory** (``--media-dir``: a directory vLLM reads, started with
    ``--allowed-local-media-path`` on it; in a pod, an emptyDir both containers
    mount): each frame a URL part references is written once, to a file of its own
    (``nnrp-media-<random>.<ext>``, created exclusively, readable by the pod's other
    container), in a worker thread (``os.write`` releases the GIL), and the part becomes
    ``file://PATH``: nothing is encoded and the client's bytes are copied once.
    ``input_audio`` still travels as base64 (vLLM reads no file for it). The files are
    removed when the operation's upstream exchange ends, whatever the end (success,
    error, cancel, a dropped connection, a drain), in a shielded cleanup. The bytes a
    process has in the directory at once are bounded (``--media-dir-bytes``: keep it,
    times the workers, under the volume's size, whose overflow evicts the pod): a
    request whose files would pass it is refused before anything is written, as a
    gateway at capacity (``scheduler_rejected``, retry later).
D3. **The body is encoded once**: ``json.dumps`` of the body with its placeholders (the
    body holds no media bytes: it stays small), split at the placeholders and joined
    with what each stands for: the media's deliveries, and the long literals cut from a
    big envelope before it was parsed (``gateway.profile._literals``), as the client
    wrote them. Media bytes never pass through ``json.dumps``, and the result is never
    joined: it goes to vLLM as its pieces (a joined 84 MiB body, and the head added to
    it, held the event loop for 0.3-0.6 s: docs/benchmarks.md, "Media").
D4. **The directory at start** (``MediaDirectory.prepare``): it must exist and be
    writable (else a ``ConfigError``: one ``error:`` line, exit 2), and the files a
    previous run of this process left there are removed, its own only: with
    ``--workers`` each worker names its files ``nnrp-media-w<index>-...`` and sweeps
    those (a worker restarted must not take a live sibling's files from vLLM); worker 0
    also takes a single-process run's leftovers.
D5. **A big submit is read into the directory** (``MediaDirectory.spill``,
    ``gateway.nnrp._spill`` S1-S4): the decoder holds a FRAME_SUBMIT of 64 KiB or more
    that does not arrive in one read in a file of this directory, unlinked as it is
    made (``O_TMPFILE``; where the filesystem has none, made and unlinked at once); the
    pages it fills leave the process as they fill, and D2's write and D1's base64 read
    it a slice at a time. Its blocks are allocated ``GROW_STEP`` ahead of its bytes, and
    count against ``--media-dir-bytes`` as they are, until its last view goes (a
    ``weakref.finalize``, which may run in a worker thread: the count has a lock): a
    header announcing 64 MiB costs the directory nothing until the bytes come. A spill
    is made only where the bound has room for it and the file its frame becomes; one
    that cannot be made, or cannot grow (the bound, a full disk, no ``fallocate``), is
    the process's memory instead, what arrived moved there: the submit is served
    either way.
"""

from __future__ import annotations

import base64
import json
import mmap
import os
import re
import secrets
import threading
import weakref
from collections.abc import AsyncIterator, Generator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
import trio

from gateway.errors import ConfigError
from gateway.nnrp import SPILL_SLICE, SpillMap, spill_release
from gateway.profile import MEDIA_EXTENSIONS, EndCause, ProfileError

if TYPE_CHECKING:
    from gateway.profile import MediaPlan, MediaSlot

log = structlog.get_logger("gateway.pipeline.media")

T = TypeVar("T")

#: A piece of an encoded request (D3): JSON text, base64, a path, or a cut literal (a
#: view of the envelope).
Piece = bytes | memoryview

#: D3: a placeholder, whole (``gateway.profile._media`` M7, ``_literals`` L2): the number
#: is matched to its end, so ``...-1`` never takes the place of ``...-10``.
_PLACEHOLDER = re.compile(rb"nnrp-(?:media|cut)-[0-9a-z]+-[0-9]+")

#: D1: bytes of media encoded between two checkpoints (a multiple of 3: the slices'
#: base64 joins into the whole's). About a millisecond of base64 on this VM.
ENCODE_SLICE = 3 * 64 * 1024
#: D2: the files' name prefix (D4 sweeps only these).
FILE_PREFIX = "nnrp-media-"
#: D2: the bytes a process may have in the directory at once, by default.
MEDIA_DIR_CAPACITY = 1 << 30
#: D2: when a request refused for a full directory may try again.
FULL_RETRY_AFTER_MS = 1000
#: D5: a spill's blocks are allocated this far ahead of its bytes (a step of fallocate
#: on tmpfs zeroes its pages: about a millisecond here for 4 MiB, on the event loop).
GROW_STEP = 4 << 20
#: D2: how long the cleanup may take once the operation is cancelled.
CLEANUP_TIMEOUT = 5.0
#: D2: readable by vLLM's container, which shares the directory, not by the world
#: beyond the pod (the directory itself should be the pod's own).
FILE_MODE = 0o640


async def stepped(steps: Generator[None, None, T]) -> T:
    """Run a sans-IO reader's steps (``gateway.profile._literals`` L5) with a checkpoint
    between two: a big envelope is read without holding the event loop."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await trio.lowlevel.checkpoint()


async def encode_base64(data: bytes | memoryview) -> list[bytes]:
    """D1: base64 of ``data`` in pieces, a slice at a time with a checkpoint between
    slices (the pieces are joined once, with the body: ``encode_body``)."""
    view = memoryview(data)
    pieces = []
    for start in range(0, len(data), ENCODE_SLICE):
        pieces.append(base64.b64encode(view[start:start + ENCODE_SLICE]))
        if len(data) > ENCODE_SLICE:
            spill_release(data)  # D5: a spill's pages read back leave again
            await trio.lowlevel.checkpoint()
    return pieces


def encode_body(body: dict[str, Any], replacements: Mapping[str, Sequence[Piece]]
                ) -> tuple[Piece, ...]:
    """D3: the body as JSON, each placeholder string replaced by its pieces (which must
    be valid inside a JSON string: base64, a data URI, a path). The pieces are not
    joined: the request goes to vLLM piece by piece (``upstream._http1.RequestBody``),
    so a big one is never copied whole on the event loop."""
    text = json.dumps(body).encode()
    if not replacements:
        return (text,)
    pieces: list[Piece] = []
    end = 0
    for match in _PLACEHOLDER.finditer(text):
        replacement = replacements.get(match.group().decode())
        if replacement is None:  # the client's own text that looks like one: kept
            continue
        pieces.append(text[end:match.start()])
        pieces += replacement
        end = match.end()
    pieces.append(text[end:])
    return tuple(pieces)


class MediaDirectory:
    """D2/D4: where ``--media-dir`` files go."""

    def __init__(self, path: Path, *, worker: int | None = None,
                 capacity: int = MEDIA_DIR_CAPACITY) -> None:
        self.path = path.resolve()
        #: D2: the bytes this process may have in the directory at once, and has.
        self.capacity = capacity
        self.used = 0
        #: D4: this process's part of the names (None: the only process).
        self.owner = "" if worker is None else f"w{worker}-"
        self.worker = worker
        #: D5: the bytes of the spills alive now (their finalizers may run in any thread).
        self.spilled = 0
        self._spill_lock = threading.Lock()

    def _mine(self, name: str) -> bool:
        if not name.startswith(FILE_PREFIX):
            return False
        rest = name[len(FILE_PREFIX):]
        if self.worker is None:
            return True
        return rest.startswith(self.owner) or (self.worker == 0 and not rest.startswith("w"))

    def prepare(self) -> int:
        """D4: check the directory and sweep what a previous run left; the count swept."""
        self.check()
        return self.sweep()

    def check(self) -> None:
        """D4: a directory this process can write in, or a ``ConfigError`` saying not."""
        if not self.path.is_dir():
            raise ConfigError(f"--media-dir {self.path}: not a directory")
        probe = self.path / f"{FILE_PREFIX}probe-{secrets.token_hex(8)}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"--media-dir {self.path}: not writable "
                              f"({exc.strerror or exc})") from None

    def sweep(self) -> int:
        """D4: remove the files a previous run left (this prefix only); the count."""
        swept = 0
        for leftover in self.path.glob(f"{FILE_PREFIX}*"):
            if not self._mine(leftover.name):
                continue
            try:
                leftover.unlink()
                swept += 1
            except OSError:
                pass
        if swept:
            log.info("media directory swept", path=str(self.path), files=swept)
        return swept

    def spill(self, size: int) -> SpillMap | None:
        """D5: memory for a big submit in a file of the directory, or None (the
        process's own: no room for it and the file its frame becomes, or no file to be
        had). Its blocks, and its count in the bound, come as its bytes do (``grow``)."""
        with self._spill_lock:
            if self.used + self.spilled + 2 * size > self.capacity:
                return None  # room for it and for the file its frame becomes (D2)
        try:
            fd = self._spill_fd()
            try:
                os.ftruncate(fd, size)  # its length, sparse: no block is allocated here
                memory = SpillMap(fd, size, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            log.warning("submit not spilled to the media directory: held in memory",
                        path=str(self.path), bytes=size, error=exc.strerror or str(exc))
            return None
        blocks = _SpillBlocks(self, fd, size)
        memory.grow = blocks.grow
        # The file's blocks and its count go with the map's last reference (its last
        # view), in whichever thread drops it.
        weakref.finalize(memory, blocks.close)
        return memory

    def _spill_fd(self) -> int:
        """An unlinked file of the directory, open (``_spill`` S1)."""
        flags = os.O_RDWR | os.O_CLOEXEC
        try:
            return os.open(self.path, flags | os.O_TMPFILE, 0o600)
        except (AttributeError, OSError):  # no O_TMPFILE here: made, then unlinked
            path = self.path / f"{FILE_PREFIX}{self.owner}spill-{secrets.token_hex(12)}"
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                path.unlink()
            except BaseException:
                os.close(fd)
                raise
            return fd

    def take_spill(self, size: int) -> bool:
        """D5: count ``size`` more bytes of spills, if the bound has room for them."""
        with self._spill_lock:
            if self.used + self.spilled + size > self.capacity:
                return False
            self.spilled += size
            return True

    def give_spill(self, size: int) -> None:
        with self._spill_lock:
            self.spilled -= size

    def write(self, data: bytes | memoryview, media_type: str) -> Path:
        """One file, created exclusively (in a worker thread: ``deliver``); a spill's
        bytes a slice at a time (D5)."""
        extension = MEDIA_EXTENSIONS.get(media_type, "bin")
        path = self.path / f"{FILE_PREFIX}{self.owner}{secrets.token_hex(12)}.{extension}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[:SPILL_SLICE]):]
                spill_release(data)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        return path


class _SpillBlocks:
    """D5: one spill's file: its blocks allocated ahead of its bytes, ``GROW_STEP`` at
    a time, each step counted against the directory's bound first (``_spill`` S1)."""

    def __init__(self, directory: MediaDirectory, fd: int, size: int) -> None:
        self._directory = directory
        self._fd = fd
        self._size = size
        self.allocated = 0

    def grow(self, end: int) -> bool:
        if end <= self.allocated:
            return True
        target = min(self._size, max(end, self.allocated + GROW_STEP))
        step = target - self.allocated
        if not self._directory.take_spill(step):
            return False
        try:
            os.posix_fallocate(self._fd, self.allocated, step)
        except OSError as exc:  # no space, or no fallocate on this filesystem
            self._directory.give_spill(step)
            log.warning("submit's spill cannot grow: held in memory",
                        path=str(self._directory.path), bytes=self._size,
                        error=exc.strerror or str(exc))
            return False
        self.allocated = target
        return True

    def close(self) -> None:
        """The map's finalizer (it runs once, when the map is gone: nothing grows it
        after)."""
        os.close(self._fd)
        self._directory.give_spill(self.allocated)


class MediaDelivery:
    """D1-D3 for one gateway: data URIs, or files in a ``MediaDirectory``."""

    def __init__(self, directory: MediaDirectory | None = None) -> None:
        self.directory = directory

    @property
    def mode(self) -> str:
        """How media reaches vLLM (the capability document says it)."""
        return "file" if self.directory is not None else "data_uri"

    @asynccontextmanager
    async def deliver(self, plan: MediaPlan, body: dict[str, Any],
                      cuts: Mapping[str, Piece] | None = None
                      ) -> AsyncIterator[tuple[Piece, ...] | None]:
        """The encoded request body with the plan's media in it, and the long literals
        cut from the envelope (``gateway.profile._literals``) back where they were; None
        when there is neither (the client encodes the body as ever). Files written here
        are gone on exit."""
        if not plan.slots and not cuts:
            yield None
            return
        written: list[Path] = []
        reserved = self._reserve(plan)
        try:
            replacements = {placeholder: [run] for placeholder, run in (cuts or {}).items()}
            replacements.update(await self._replacements(plan, written))
            yield encode_body(body, replacements)
        finally:
            if written:
                with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT):
                    await trio.to_thread.run_sync(_remove, written)
            if self.directory is not None:
                self.directory.used -= reserved

    def _reserve(self, plan: MediaPlan) -> int:
        """D2: room in the directory for the plan's files, or the request refused."""
        directory = self.directory
        if directory is None:
            return 0
        frames = {frame.index: frame for frame in plan.frames}
        size = sum(len(frames[index].data)
                   for index in {slot.frame for slot in plan.slots if not slot.inline})
        held = directory.used + directory.spilled  # files and spills (D5)
        if held + size > directory.capacity:
            raise ProfileError(EndCause.SCHEDULER_REJECTED,
                               f"the media directory holds {held} bytes of requests in "
                               f"flight; {size} more would pass its {directory.capacity} "
                               "(--media-dir-bytes): retry later",
                               retry_after_ms=FULL_RETRY_AFTER_MS)
        directory.used += size
        return size

    async def _replacements(self, plan: MediaPlan, written: list[Path]
                            ) -> dict[str, list[Piece]]:
        frames = {frame.index: frame for frame in plan.frames}
        encoded: dict[tuple[int, str, bool], list[Piece]] = {}
        files: dict[int, Path] = {}
        replacements: dict[str, list[Piece]] = {}
        for slot in plan.slots:
            data = frames[slot.frame].data
            if self.directory is not None and not slot.inline:
                path = files.get(slot.frame)
                if path is None:
                    path = files[slot.frame] = await trio.to_thread.run_sync(
                        self.directory.write, data, slot.media_type)
                    written.append(path)
                replacements[slot.placeholder] = [path.as_uri().encode()]
                continue
            key = (slot.frame, slot.media_type, slot.inline)
            if key not in encoded:
                encoded[key] = [_data_prefix(slot), *await encode_base64(data)]
            replacements[slot.placeholder] = encoded[key]
        return replacements


def _data_prefix(slot: MediaSlot) -> bytes:
    return b"" if slot.inline else f"data:{slot.media_type};base64,".encode()


def _remove(paths: list[Path]) -> None:
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:  # the sweep at the next start takes it
            log.warning("media file not removed", path=str(path), error=str(exc))
