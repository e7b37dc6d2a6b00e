"""One session's runtime objects (preview4 OBJECT_DECLARE .. OBJECT_DELTA, 0x41-0x45): the
sans-IO table behind ``_server_controls``' object rules.

The layouts are nnrp-doc's "Runtime Object and Cache Metadata" (``_messages``); the flag
masks and registries its "Value Registries". The spec says what the frames carry, not
what a server must answer: nnrp-py's native server hands every object frame to the
application, and no acknowledgement message exists. So success is silent, and a refusal
is ERROR_RECOVERABLE on the frame (``_server`` rule 3), the code ``FAULTS`` gives; a
refused frame changes nothing.

Rules (cited as O1..O8):

O1. Negotiation. Object frames are served once the session has negotiated
    ``object.lifecycle`` (CAPABILITY_NEGOTIATION); OBJECT_PATCH and OBJECT_DELTA also need
    ``object.delta``. Before that they are refused ``NOT_NEGOTIATED``.
O2. OBJECT_DECLARE: a non-zero object_id not active in the session, the metadata's
    session_id the session's own. Bounded: ``max_objects`` active objects and
    ``max_object_bytes`` of declared ``byte_size`` in all (the session's declared cost).
    A released id may be declared again: it is a new object. The server keeps none of an
    object's bytes: nothing it serves could read them (docs/runtime-controls.md).
O3. Versions. An object's version is the delta_sequence of its last applied PATCH or
    DELTA, 0 after its declaration. OBJECT_REF's object_version 0 means "the current
    one"; any other value must equal it.
O4. OBJECT_REF names an active object. The region flag (bit 2) says offset and length are
    given: without it both must be 0, with it the region must lie within byte_size.
    operation_id 0 is the session's own reference (it keeps nothing alive that a release
    would not end). A non-zero operation_id must be an operation not yet submitted: the
    reference is held for its submit (bounded: ``max_object_references`` in all), and
    binds the object to that operation's input. An operation already in flight cannot
    take new input: refused ``OPERATION_RUNNING``. One that already ended: a normal race,
    noted (as ``_server_controls`` rule 6).
O5. What a submit gets (``take_dependencies``): the objects its held references name, or
    that it was invalidated. This server takes no runtime object as operation input
    (openai-compatible/1 gives objects no meaning for chat.completions.create), so the
    session refuses such a submit with a clear error, and drops an invalidated one with
    ``object_invalidated`` (``_server_session`` rule 5).
O6. OBJECT_RELEASE names an active object. Not final (flags bit0 clear): it ends the
    reference of operation_id (0: the session's), which must exist. Final: the object is
    released and every reference to it ends. Flags bit1 (invalidates dependents): each
    operation whose held reference ended this way is dropped ``object_invalidated`` when
    its submit comes (remembered, bounded like the references).
O7. OBJECT_PATCH / OBJECT_DELTA ("send patches or deltas without resending the full
    object"): the object is active and not finished (a delta with flags bit2, final
    delta, finishes it); delta_sequence is greater than the last one applied; the region
    (region_offset, region_bytes) lies within byte_size. Applied, its delta_sequence is
    the object's version (O3). PATCH and DELTA differ only in how the application reads
    the bytes (bit0, replaces region): this server reads none.
O8. The table lives with its session (a resumed session keeps it) and is emptied when the
    session closes.
"""

from __future__ import annotations

import enum

import attrs

from ._constants import ErrorCode, ObjectDeltaFlag, ObjectRefFlag, ObjectReleaseFlag
from ._messages import ObjectDeclare, ObjectDelta, ObjectPatch, ObjectRef, ObjectRelease

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
    VERSION_MISMATCH = "version_mismatch"
    REGION_WITHOUT_FLAG = "region_without_flag"
    REGION_OUT_OF_BOUNDS = "region_out_of_bounds"
    OPERATION_RUNNING = "operation_running"
    NO_SUCH_REFERENCE = "no_such_reference"
    SEQUENCE_NOT_INCREASING = "sequence_not_increasing"
    OBJECT_FINISHED = "object_finished"


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
    ObjectFault.OPERATION_RUNNING: ErrorCode.UNSUPPORTED_CAPABILITY,
    ObjectFault.NO_SUCH_REFERENCE: ErrorCode.INVALID_STATE,
    ObjectFault.SEQUENCE_NOT_INCREASING: ErrorCode.INVALID_STATE,
    ObjectFault.OBJECT_FINISHED: ErrorCode.INVALID_STATE,
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


@attrs.frozen
class Dependencies:
    """What a submit depends on (O5): the objects its held references name, in the order
    they were referenced, and the object whose release invalidated it (0: none)."""

    object_ids: tuple[int, ...] = ()
    invalidated_by: int = 0

    def __bool__(self) -> bool:
        return bool(self.object_ids or self.invalidated_by)


@attrs.define
class _Entry:
    declaration: ObjectDeclare
    version: int = 0
    finished: bool = False
    #: Operation ids holding a reference (0: the session's own).
    references: set[int] = attrs.field(factory=set)


class ObjectTable:
    """The runtime objects of one session. Each method returns None when the frame was
    applied, or the refusal (nothing changed)."""

    def __init__(self, session_id: int, limits: ObjectLimits) -> None:
        self.session_id = session_id
        self.limits = limits
        self._objects: dict[int, _Entry] = {}
        self._declared_bytes = 0
        #: operation_id (not yet submitted) -> object ids it references, in order (O4).
        self._held: dict[int, dict[int, None]] = {}
        #: operation_id (not yet submitted) -> the object whose release invalidated it (O6).
        self._invalidated: dict[int, int] = {}

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._objects)

    @property
    def declared_bytes(self) -> int:
        return self._declared_bytes

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

    def reference(self, request: ObjectRef, *, operation_running: bool,
                  operation_ended: bool) -> ObjectRefusal | None:
        """O3, O4. ``operation_running`` / ``operation_ended``: what the session knows of
        ``request.operation_id`` (both False: not submitted yet)."""
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
        if operation_id == 0:
            entry.references.add(0)
            return None
        if operation_running:
            return ObjectRefusal(ObjectFault.OPERATION_RUNNING,
                                 f"operation {operation_id} is already running: a reference "
                                 "binds an object to an operation's input, before its submit")
        if operation_ended:
            return None  # a normal race: nothing to bind (O4)
        held = self._held.get(operation_id)
        if held is None or request.object_id not in held:
            if self._held_count() >= self.limits.max_object_references:
                return ObjectRefusal(ObjectFault.REFERENCE_LIMIT,
                                     f"session holds {self.limits.max_object_references} "
                                     "references for operations not yet submitted (the limit)")
            self._held.setdefault(operation_id, {})[request.object_id] = None
        entry.references.add(operation_id)
        return None

    def release(self, request: ObjectRelease) -> ObjectRefusal | None:
        """O6."""
        entry, refusal = self._active(request.object_id)
        if entry is None:
            return refusal
        object_id = request.object_id
        if request.flags & ObjectReleaseFlag.FINAL_RELEASE:
            ended = set(entry.references)
            del self._objects[object_id]
            self._declared_bytes -= entry.declaration.byte_size
        else:
            if request.operation_id not in entry.references:
                return ObjectRefusal(ObjectFault.NO_SUCH_REFERENCE,
                                     f"operation {request.operation_id} holds no reference "
                                     f"to object {object_id}")
            ended = {request.operation_id}
            entry.references.discard(request.operation_id)
        invalidates = bool(request.flags & ObjectReleaseFlag.INVALIDATES_DEPENDENTS)
        for operation_id in ended - {0}:
            held = self._held.get(operation_id)
            if held is not None:
                held.pop(object_id, None)
                if not held:
                    del self._held[operation_id]
            if invalidates and (len(self._invalidated) < self.limits.max_object_references
                                or operation_id in self._invalidated):
                self._invalidated.setdefault(operation_id, object_id)
        return None

    def apply_delta(self, request: ObjectPatch | ObjectDelta) -> ObjectRefusal | None:
        """O7."""
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
        entry.version = request.delta_sequence
        entry.finished = bool(request.flags & ObjectDeltaFlag.FINAL_DELTA)
        return None

    # ------------------------------------------------------------------ submits (O5), close (O8)

    def take_dependencies(self, operation_id: int) -> Dependencies:
        """What the submit of ``operation_id`` depends on; held references become the
        operation's (they end with it: nothing is held for it any more)."""
        held = self._held.pop(operation_id, None)
        invalidated_by = self._invalidated.pop(operation_id, 0)
        object_ids = tuple(held) if held else ()
        for object_id in object_ids:
            entry = self._objects.get(object_id)
            if entry is not None:
                entry.references.discard(operation_id)
        return Dependencies(object_ids, invalidated_by)

    def clear(self) -> None:
        self._objects.clear()
        self._held.clear()
        self._invalidated.clear()
        self._declared_bytes = 0

    def _active(self, object_id: int) -> tuple[_Entry | None, ObjectRefusal | None]:
        entry = self._objects.get(object_id)
        if entry is None:
            return None, ObjectRefusal(ObjectFault.UNKNOWN_OBJECT,
                                       f"object {object_id} is not declared in this session")
        return entry, None

    def _held_count(self) -> int:
        return sum(len(held) for held in self._held.values())

