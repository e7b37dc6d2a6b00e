"""One session's runtime objects (preview4 OBJECT_DECLARE .. OBJECT_DELTA, 0x41-0x45): the
sans-IO table behind ``_server_controls``' object rules.

The layouts are nnrp-doc's "Runtime Object and Cache Metadata" (``_messages``); the flag
masks and registries its "Value Registries". The spec says what the frames carry, not
what a server must answer: nnrp-py's native server hands every object frame to the
application, and no acknowledgement message exists. So success is silent, and a refusal
is ERROR_RECOVERABLE on the frame (``_server`` rule 3), the code ``FAULTS`` gives; a
refused frame changes nothing.

Rules (cited as O1..O9):

O1. Negotiation. Object frames are served once the session has negotiated
    ``object.lifecycle`` (CAPABILITY_NEGOTIATION); OBJECT_PATCH and OBJECT_DELTA also need
    ``object.delta``. Before that they are refused ``NOT_NEGOTIATED``.
O2. OBJECT_DECLARE: a non-zero object_id not active in the session, the metadata's
    session_id the session's own. Bounded: ``max_objects`` active objects and
    ``max_object_bytes`` of declared ``byte_size`` in all (the session's declared cost).
    A released id may be declared again: it is a new object. Its bytes are kept only as
    O9 says.
O3. Versions. An object's version is the delta_sequence of its last applied PATCH or
    DELTA, 0 after its declaration. OBJECT_REF's object_version 0 means "the current
    one"; any other value must equal it.
O4. OBJECT_REF names an active object. The region flag (bit 2) says offset and length are
    given: without it both must be 0, with it the region must lie within byte_size.
    operation_id 0 is the session's own reference. A non-zero operation_id names an
    operation in flight (nnrp-py's client sends a reference only for an operation it has
    submitted, on that operation's frame): the operation now depends on the object.
    Bounded: ``max_object_references`` references in all. An operation that already
    ended: a normal race, nothing is recorded (as ``_server_controls`` rule 6); one never
    submitted: refused ``UNKNOWN_OPERATION``.
O5. A dependency is a lifetime: an operation whose object is invalidated is dropped (O6).
    openai-compatible/1 gives objects no meaning for chat.completions.create; this
    gateway's media extension reads an object's bytes (O9) where a request names it. An
    operation's references end with it (``retire``).
O6. OBJECT_RELEASE names an active object. Not final (flags bit0 clear): it ends the
    reference of operation_id (0: the session's), which must exist. Final: the object is
    released and every reference to it ends. Flags bit1 (invalidates dependents): each
    operation whose reference ended this way is dropped ``object_invalidated``
    (``Released.invalidated``; the reference adapter's "stop operations whose referenced
    object is invalidated mid-flight").
O7. OBJECT_PATCH / OBJECT_DELTA ("send patches or deltas without resending the full
    object"): the object is active and not finished (a delta with flags bit2, final
    delta, finishes it); delta_sequence is greater than the last one applied; the region
    (region_offset, region_bytes) lies within byte_size. Applied, its delta_sequence is
    the object's version (O3). PATCH and DELTA differ only in how the application reads
    the bytes (bit0, replaces region): this server reads none.
O8. The table lives with its session (a resumed session keeps it) and is emptied when the
    session closes.
O9. Bytes (the gateway's media: ``gateway.profile._media``). An object's bytes are kept
    from the frames that say plainly what they are: an OBJECT_PATCH or OBJECT_DELTA with
    replaces-region (bit0), not compressed (bit1), whose delta bytes are its region
    (``delta_bytes == region_bytes``); they are written at ``region_offset``. A frame of
    any other kind still applies (O7) but leaves the object's bytes unreadable (the
    server would have to guess their meaning). The bytes are whole once every byte of
    ``byte_size`` has been written; only then can a request read them (``read``, at the
    version it names, O3), and a request in flight then depends on the object as an
    OBJECT_REF would make it (O4-O6: invalidated, it is dropped). Whole and read, the
    bytes are frozen: every reader of that version shares one immutable copy, and the
    next patch starts a new one. What has been written is kept as merged runs, at most
    ``MAX_RUNS`` apart (a frame that would scatter more is refused ``FRAGMENTED``: runs
    cost memory and each write a search). The first kept write reserves the whole
    ``byte_size`` from two bounds, the session's ``max_kept_bytes`` and the process's
    ``ObjectBytes`` pool shared by every session; a frame that would pass either is
    refused ``BYTE_LIMIT``. A refused frame changes nothing. The reservation goes back
    when the object is released or made unreadable, and when its session ends, however
    it ends (closed, its connection lost, its resume window over, the process stopping).
    The session's cache (``cache``, ``_cache`` C3) keeps its CACHE_PUT objects' bytes in
    the same reservation: one session, one bound, whichever frames brought the bytes.
    Before either bound refuses, the bytes of cache entries whose ttl has passed are
    given back (``_cache`` C2): the session's own when its bound is reached, every
    session's when the pool is, so an idle session's expired entries never hold room
    that another needs.
"""

from __future__ import annotations

import bisect
import enum
import math
import time
import weakref
from collections.abc import Callable

import attrs

from ._cache import CacheLimits, CacheTable
from ._constants import ErrorCode, ObjectDeltaFlag, ObjectRefFlag, ObjectReleaseFlag
from ._messages import ObjectDeclare, ObjectDelta, ObjectPatch, ObjectRef, ObjectRelease

#: O9: separate written regions an object may have before it is whole.
MAX_RUNS = 256

#: The tokens that serve object frames (O1).
LIFECYCLE_TOKEN = "object.lifecycle"
DELTA_TOKEN = "object.delta"


class ObjectFault(enum.Enum):
    """Why an object frame was refused."""

    NOT_NEGOTIATED = "not_negotiated"
    ZERO_OBJECT_ID = "zero_object_id"
    ALREADY_DECLARED = "already_declared"
    FOREIGN_SESSION = "foreign_session"
    OBJECT_LIMIT = "object_limit"
    BYTE_LIMIT = "byte_limit"
    REFERENCE_LIMIT = "reference_limit"
    UNKNOWN_OBJECT = "unknown_object"
    UNKNOWN_OPERATION = "unknown_operation"
    VERSION_MISMATCH = "version_mismatch"
    REGION_WITHOUT_FLAG = "region_without_flag"
    REGION_OUT_OF_BOUNDS = "region_out_of_bounds"
    NO_SUCH_REFERENCE = "no_such_reference"
    SEQUENCE_NOT_INCREASING = "sequence_not_increasing"
    OBJECT_FINISHED = "object_finished"
    DELTA_SIZE = "delta_size"
    FRAGMENTED = "fragmented"
    #: O9: the object's bytes cannot be read (not all written, or not kept).
    BYTES_UNREADABLE = "bytes_unreadable"


#: The ERROR_RECOVERABLE code of each refusal: the one place that says it.
FAULTS: dict[ObjectFault, ErrorCode] = {
    ObjectFault.NOT_NEGOTIATED: ErrorCode.UNSUPPORTED_CAPABILITY,
    ObjectFault.ZERO_OBJECT_ID: ErrorCode.MALFORMED_BODY,
    ObjectFault.ALREADY_DECLARED: ErrorCode.INVALID_STATE,
    ObjectFault.FOREIGN_SESSION: ErrorCode.INVALID_STATE,
    ObjectFault.OBJECT_LIMIT: ErrorCode.LIMIT_EXCEEDED,
    ObjectFault.BYTE_LIMIT: ErrorCode.LIMIT_EXCEEDED,
    ObjectFault.REFERENCE_LIMIT: ErrorCode.LIMIT_EXCEEDED,
    # An object the session does not hold is a cache miss (the reference adapter's
    # RuntimeObjectFailureCode.CACHE_MISS for an undeclared object).
    ObjectFault.UNKNOWN_OBJECT: ErrorCode.CACHE_MISS,
    ObjectFault.VERSION_MISMATCH: ErrorCode.INVALID_STATE,
    ObjectFault.REGION_WITHOUT_FLAG: ErrorCode.MALFORMED_BODY,
    ObjectFault.REGION_OUT_OF_BOUNDS: ErrorCode.MALFORMED_BODY,
    ObjectFault.UNKNOWN_OPERATION: ErrorCode.INVALID_STATE,
    ObjectFault.NO_SUCH_REFERENCE: ErrorCode.INVALID_STATE,
    ObjectFault.SEQUENCE_NOT_INCREASING: ErrorCode.INVALID_STATE,
    ObjectFault.OBJECT_FINISHED: ErrorCode.INVALID_STATE,
    ObjectFault.DELTA_SIZE: ErrorCode.MALFORMED_BODY,
    ObjectFault.FRAGMENTED: ErrorCode.LIMIT_EXCEEDED,
    ObjectFault.BYTES_UNREADABLE: ErrorCode.INVALID_STATE,
}


@attrs.frozen
class ObjectRefusal:
    """A refused object frame: its fault (``FAULTS`` gives the code) and a diagnostic."""

    fault: ObjectFault
    text: str

    @property
    def code(self) -> ErrorCode:
        return FAULTS[self.fault]


@attrs.frozen
class ObjectLimits:
    """A session's bounds (O2, O4, O6)."""

    max_objects: int = 256
    max_object_bytes: int = 1 << 30
    max_object_references: int = 256
    #: O9: the bytes a session's objects may keep.
    max_kept_bytes: int = 64 << 20


class ObjectBytes:
    """O9: the bytes every session's objects keep, together, in one process."""

    def __init__(self, capacity: int = 1 << 30) -> None:
        self.capacity = capacity
        self.used = 0
        #: The sessions' tables, whose caches' expired entries are swept before the pool
        #: refuses (O9); weak: a session gone is gone from here too.
        self._tables: weakref.WeakSet[ObjectTable] = weakref.WeakSet()
        #: No session's cache entry expires before this (it may be earlier than the
        #: earliest: a sweep then sets it right), so a refusal with nothing expired is
        #: one comparison, not a pass over every session (a flood of refused puts).
        self._next_expiry = math.inf

    def watch(self, table: ObjectTable) -> None:
        self._tables.add(table)

    def __reduce__(self) -> tuple[type[ObjectBytes], tuple[int]]:
        """A pool travels to a worker process as its capacity: what it holds, and the
        tables holding it, are this process's."""
        return ObjectBytes, (self.capacity,)

    def expires_at(self, at: float) -> None:
        """A cache entry's bytes may be taken back from ``at`` (O9)."""
        self._next_expiry = min(self._next_expiry, at)

    def take(self, size: int, now: float = -math.inf) -> bool:
        """Reserve ``size`` bytes; ``now``, the asking table's clock: expired entries
        are taken back first when some may be (O9)."""
        if self.used + size > self.capacity:
            if self._next_expiry <= now:
                tables = list(self._tables)
                for table in tables:
                    table.cache.sweep_due()
                self._next_expiry = min((table.cache.next_expiry for table in tables),
                                        default=math.inf)
            if self.used + size > self.capacity:
                return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size


@attrs.frozen
class Released:
    """An applied OBJECT_RELEASE: the operations it invalidated (O6), to be dropped."""

    invalidated: tuple[int, ...] = ()


@attrs.define
class _Entry:
    declaration: ObjectDeclare
    version: int = 0
    finished: bool = False
    #: Operation ids holding a reference (0: the session's own).
    references: set[int] = attrs.field(factory=set)
    #: O9: the kept bytes, reserved whole at the first kept write: being written
    #: (``data``) or whole and shared by its readers (``frozen``), never both for long;
    #: what has been written, as merged [start, end) runs; whether a frame made the bytes
    #: unreadable.
    data: bytearray | None = None
    frozen: bytes | None = None
    starts: list[int] = attrs.field(factory=list)
    ends: list[int] = attrs.field(factory=list)
    unreadable: bool = False

    @property
    def reserved(self) -> bool:
        return self.data is not None or self.frozen is not None

    def runs_after(self, offset: int, end: int) -> tuple[int, int, int]:
        """The runs ``[offset, end)`` would merge with (``starts[i:j]``), and how many
        runs there would be then."""
        first = bisect.bisect_left(self.ends, offset)
        last = bisect.bisect_right(self.starts, end)
        return first, last, len(self.starts) - (last - first) + 1

    def write(self, offset: int, payload: bytes | memoryview) -> None:
        if self.frozen is not None:  # a new version over a whole one: its own copy
            self.data, self.frozen = bytearray(self.frozen), None
        assert self.data is not None
        end = offset + len(payload)
        self.data[offset:end] = payload
        first, last, _ = self.runs_after(offset, end)
        if first < last:
            offset, end = min(offset, self.starts[first]), max(end, self.ends[last - 1])
        self.starts[first:last], self.ends[first:last] = [offset], [end]

    @property
    def written(self) -> int:
        return sum(end - start for start, end in zip(self.starts, self.ends, strict=True))

    @property
    def whole(self) -> bool:
        size = self.declaration.byte_size
        return size == 0 or (self.starts == [0] and self.ends == [size])

    def shared(self) -> bytes:
        """The whole bytes, frozen once for every reader of this version."""
        if self.frozen is None:
            self.frozen, self.data = bytes(self.data or b""), None
        return self.frozen


class ObjectTable:
    """The runtime objects of one session. Each method returns None (``Released`` for a
    release) when the frame was applied, or the refusal (nothing changed)."""

    def __init__(self, session_id: int, limits: ObjectLimits,
                 pool: ObjectBytes | None = None, *, cache: CacheLimits | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.session_id = session_id
        self.limits = limits
        #: O9: the process's bound (a table alone is bounded by its own limit only).
        self.pool = pool if pool is not None else ObjectBytes()
        self._objects: dict[int, _Entry] = {}
        self._declared_bytes = 0
        self._reference_count = 0
        self._kept_bytes = 0
        #: The session's CACHE_PUT objects, their bytes kept within this table's bounds.
        self.cache = CacheTable(self, cache, clock=clock)
        self.pool.watch(self)

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._objects)

    @property
    def declared_bytes(self) -> int:
        return self._declared_bytes

    @property
    def reference_count(self) -> int:
        return self._reference_count

    @property
    def kept_bytes(self) -> int:
        """O9: the bytes this session's objects, and its cache, hold reserved."""
        return self._kept_bytes

    @property
    def max_kept_bytes(self) -> int:
        return self.limits.max_kept_bytes

    def take_kept(self, size: int) -> ErrorCode | None:
        """O9: reserve ``size`` bytes from the session's bound and the process's pool;
        None, or LIMIT_EXCEEDED (the session's bound) or SERVER_BUSY (the pool's)."""
        if self._kept_bytes + size > self.limits.max_kept_bytes:
            self.cache.sweep_due()  # O9: expired entries first
            if self._kept_bytes + size > self.limits.max_kept_bytes:
                return ErrorCode.LIMIT_EXCEEDED
        if not self.pool.take(size, self.cache.clock()):
            return ErrorCode.SERVER_BUSY
        self._kept_bytes += size
        return None

    def give_kept(self, size: int) -> None:
        self._kept_bytes -= size
        self.pool.give(size)

    def expires_at(self, at: float) -> None:
        self.pool.expires_at(at)

    def read(self, object_id: int, version: int, operation_id: int, *,
             operation_in_flight: bool = True) -> bytes | ObjectRefusal:
        """O9: the object's bytes at ``version`` (0: the current one), shared, never to be
        changed, read by ``operation_id``, which now depends on the object (O4-O6) if it
        is still in flight (one that ended meanwhile holds nothing: ``retire`` ran)."""
        entry, refusal = self._active(object_id)
        if entry is None:
            assert refusal is not None
            return refusal
        if version and version != entry.version:
            return ObjectRefusal(ObjectFault.VERSION_MISMATCH,
                                 f"object {object_id} is at version {entry.version}, "
                                 f"not {version}")
        if entry.unreadable or (not entry.reserved and entry.declaration.byte_size):
            return ObjectRefusal(ObjectFault.BYTES_UNREADABLE,
                                 f"object {object_id}'s bytes are not kept: they came "
                                 "compressed or as a delta that does not replace its region, "
                                 "or not at all")
        if not entry.whole:
            return ObjectRefusal(ObjectFault.BYTES_UNREADABLE,
                                 f"object {object_id} is not whole yet: {entry.written} of "
                                 f"its {entry.declaration.byte_size} bytes written")
        if operation_in_flight:
            refusal = self._depend(entry, operation_id)
            if refusal is not None:
                return refusal
        return entry.shared()

    def version(self, object_id: int) -> int | None:
        """The object's version (O3), or None when it is not active."""
        entry = self._objects.get(object_id)
        return entry.version if entry is not None else None

    def references(self, object_id: int) -> frozenset[int]:
        """The operations holding a reference to the object (0: the session)."""
        entry = self._objects.get(object_id)
        return frozenset(entry.references) if entry is not None else frozenset()

    # ------------------------------------------------------------------ frames

    def declare(self, request: ObjectDeclare) -> ObjectRefusal | None:
        """O2."""
        object_id = request.object_id
        if object_id == 0:
            return ObjectRefusal(ObjectFault.ZERO_OBJECT_ID, "object_id must be non-zero")
        if request.session_id != self.session_id:
            return ObjectRefusal(ObjectFault.FOREIGN_SESSION,
                                 f"object {object_id} is declared for session "
                                 f"{request.session_id}, not this session {self.session_id}")
        if object_id in self._objects:
            return ObjectRefusal(ObjectFault.ALREADY_DECLARED,
                                 f"object {object_id} is already declared and active")
        limits = self.limits
        if len(self._objects) >= limits.max_objects:
            return ObjectRefusal(ObjectFault.OBJECT_LIMIT,
                                 f"session holds {limits.max_objects} objects (the limit)")
        if self._declared_bytes + request.byte_size > limits.max_object_bytes:
            return ObjectRefusal(ObjectFault.BYTE_LIMIT,
                                 f"object {object_id} of {request.byte_size} bytes would pass "
                                 f"the session's {limits.max_object_bytes} declared bytes")
        self._objects[object_id] = _Entry(request)
        self._declared_bytes += request.byte_size
        return None

    def reference(self, request: ObjectRef, *, operation_in_flight: bool,
                  operation_seen: bool) -> ObjectRefusal | None:
        """O3, O4. ``operation_in_flight`` / ``operation_seen``: what the session knows of
        ``request.operation_id``."""
        entry, refusal = self._active(request.object_id)
        if entry is None:
            return refusal
        if request.object_version and request.object_version != entry.version:
            return ObjectRefusal(ObjectFault.VERSION_MISMATCH,
                                 f"object {request.object_id} is at version {entry.version}, "
                                 f"not {request.object_version}")
        size = entry.declaration.byte_size
        if not request.flags & ObjectRefFlag.REGION_PRESENT:
            if request.offset or request.length:
                return ObjectRefusal(ObjectFault.REGION_WITHOUT_FLAG,
                                     "offset and length need the region-present flag (bit 2)")
        elif request.offset > size or request.length > size - request.offset:
            return ObjectRefusal(ObjectFault.REGION_OUT_OF_BOUNDS,
                                 f"region {request.offset}+{request.length} passes object "
                                 f"{request.object_id}'s {size} bytes")
        operation_id = request.operation_id
        if operation_id and not operation_in_flight:
            if operation_seen:
                return None  # ended already: a normal race, nothing to depend (O4)
            return ObjectRefusal(ObjectFault.UNKNOWN_OPERATION,
                                 f"operation {operation_id} was never submitted in this "
                                 "session: reference an operation in flight")
        return self._depend(entry, operation_id)

    def _depend(self, entry: _Entry, operation_id: int) -> ObjectRefusal | None:
        """O4: ``operation_id`` (0: the session) holds a reference to the object, within
        the session's bound; an exact repeat holds nothing more."""
        if operation_id in entry.references:
            return None
        if self._reference_count >= self.limits.max_object_references:
            return ObjectRefusal(ObjectFault.REFERENCE_LIMIT,
                                 f"session holds {self.limits.max_object_references} object "
                                 "references (the limit)")
        entry.references.add(operation_id)
        self._reference_count += 1
        return None

    def release(self, request: ObjectRelease) -> ObjectRefusal | Released:
        """O6."""
        entry, refusal = self._active(request.object_id)
        if entry is None:
            assert refusal is not None
            return refusal
        object_id = request.object_id
        if request.flags & ObjectReleaseFlag.FINAL_RELEASE:
            ended = sorted(entry.references)
            del self._objects[object_id]
            self._declared_bytes -= entry.declaration.byte_size
            self._free(entry)
        else:
            if request.operation_id not in entry.references:
                return ObjectRefusal(ObjectFault.NO_SUCH_REFERENCE,
                                     f"operation {request.operation_id} holds no reference "
                                     f"to object {object_id}")
            ended = [request.operation_id]
            entry.references.discard(request.operation_id)
        self._reference_count -= len(ended)
        if not request.flags & ObjectReleaseFlag.INVALIDATES_DEPENDENTS:
            return Released()
        return Released(tuple(operation_id for operation_id in ended if operation_id))

    def apply_delta(self, request: ObjectPatch | ObjectDelta,
                    body: bytes | memoryview = b"") -> ObjectRefusal | None:
        """O7, O9 (``body``: the frame's body, metadata then delta bytes)."""
        entry, refusal = self._active(request.object_id)
        if entry is None:
            return refusal
        object_id = request.object_id
        if entry.finished:
            return ObjectRefusal(ObjectFault.OBJECT_FINISHED,
                                 f"object {object_id} had its final delta")
        if request.delta_sequence <= entry.version:
            return ObjectRefusal(ObjectFault.SEQUENCE_NOT_INCREASING,
                                 f"delta_sequence {request.delta_sequence} of object "
                                 f"{object_id} does not follow {entry.version}")
        size = entry.declaration.byte_size
        if request.region_offset > size or request.region_bytes > size - request.region_offset:
            return ObjectRefusal(ObjectFault.REGION_OUT_OF_BOUNDS,
                                 f"region {request.region_offset}+{request.region_bytes} "
                                 f"passes object {object_id}'s {size} bytes")
        kept = (request.flags & ObjectDeltaFlag.REPLACES_REGION
                and not request.flags & ObjectDeltaFlag.COMPRESSED
                and request.delta_bytes == request.region_bytes)
        delta = memoryview(body)[request.metadata_bytes:]
        if kept and not entry.unreadable:
            if len(delta) != request.region_bytes:
                return ObjectRefusal(ObjectFault.DELTA_SIZE,
                                     f"{len(delta)} delta bytes for a region of "
                                     f"{request.region_bytes}")
            if entry.runs_after(request.region_offset,
                                request.region_offset + request.region_bytes)[2] > MAX_RUNS:
                return ObjectRefusal(ObjectFault.FRAGMENTED,
                                     f"object {object_id}'s bytes would lie in more than "
                                     f"{MAX_RUNS} separate regions: send larger or "
                                     "adjacent ones")
            if not entry.reserved:
                refusal = self._reserve(entry)
                if refusal is not None:
                    return refusal
            entry.write(request.region_offset, delta)
        elif not kept:
            entry.unreadable = True
            self._free(entry)
        entry.version = request.delta_sequence
        entry.finished = bool(request.flags & ObjectDeltaFlag.FINAL_DELTA)
        return None

    def _reserve(self, entry: _Entry) -> ObjectRefusal | None:
        """O9: the whole object, from the session's bound and the process's."""
        size = entry.declaration.byte_size
        object_id = entry.declaration.object_id
        passed = self.take_kept(size)
        if passed is ErrorCode.LIMIT_EXCEEDED:
            return ObjectRefusal(ObjectFault.BYTE_LIMIT,
                                 f"object {object_id}'s {size} bytes would pass the "
                                 f"session's {self.limits.max_kept_bytes} kept bytes")
        if passed is not None:
            return ObjectRefusal(ObjectFault.BYTE_LIMIT,
                                 f"object {object_id}'s {size} bytes would pass this "
                                 f"server's {self.pool.capacity} kept object bytes")
        entry.data = bytearray(size)
        return None

    def _free(self, entry: _Entry) -> None:
        if entry.reserved:
            self.give_kept(entry.declaration.byte_size)
            entry.data = entry.frozen = None
            entry.starts, entry.ends = [], []

    # ------------------------------------------------------------------ operations (O5), close (O8)

    def retire(self, operation_id: int) -> None:
        """The operation ended: its references (and its cache dependencies) end with it."""
        self.cache.retire(operation_id)
        if not self._reference_count:
            return  # the hot path: most sessions reference nothing
        for entry in self._objects.values():
            if operation_id in entry.references:
                entry.references.discard(operation_id)
                self._reference_count -= 1

    def clear(self) -> None:
        """The session ended (O8, O9): its objects and its cache go, their bytes given back."""
        self.cache.clear()
        for entry in self._objects.values():
            self._free(entry)
        self._objects.clear()
        self._declared_bytes = 0
        self._reference_count = 0

    def _active(self, object_id: int) -> tuple[_Entry | None, ObjectRefusal | None]:
        entry = self._objects.get(object_id)
        if entry is None:
            return None, ObjectRefusal(ObjectFault.UNKNOWN_OBJECT,
                                       f"object {object_id} is not declared in this session")
        return entry, None
