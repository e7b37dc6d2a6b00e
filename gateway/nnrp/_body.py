"""Typed bodies of FRAME_SUBMIT and RESULT_PUSH (docs/reference/nnrp-wire.md section 3, "Body
prelude").

    body = prelude (32 B: six u32 region lengths, body_flags, reserved)
         ‖ inline_object ‖ object_reference ‖ typed_descriptor ‖ typed_frame
         ‖ extension_descriptor ‖ extension_payload

The typed-descriptor region holds ``payload_frame_count`` descriptors of 24 B; each
points (offset, length) into the typed-frame region. Offsets ascend and never overlap,
and the union of the descriptors' kinds must equal the non-tensor bits of the
metadata's ``payload_kind_bitmap``.

The object-reference region holds 24-byte cache-backed references (``ObjectReference``:
object_kind u16, ref_flags u16 = 0, cache_namespace u32, cache_key_hi u64, cache_key_lo
u64; nnrp-py's ``ObjectReferenceBlock``, suite case ``l0.object_reference.block.golden``).
FRAME_SUBMIT's ``object_ref_mask`` says which standard slots are referenced, and the
region must hold exactly those, in slot order (``check_object_references``; nnrp-py's
``_validate_frame_submit_object_contract``): an inline submit references nothing.

Preview2's 16-byte descriptor (kind u16, profile u16, offset u32, length u32, reserved
u32) survives only in the suite's legacy L0 vectors and "is never valid on the live
wire" (the wire digest, section 3): ``LegacyDescriptor`` reads and writes it, and a
submit whose descriptor region has that shape is refused saying so.

A violation raises ``TypedBodyError``: it fails the one operation, never the
connection (the reference server hands such a submit to the application, which
answers ``invalid_submit_body``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

import attrs

from ._constants import CacheObjectKind, DescriptorFlag, PayloadKind, StreamSemantics, SubmitMode
from ._errors import TypedBodyError

PRELUDE = struct.Struct("<8I")
DESCRIPTOR = struct.Struct("<HBBIIHHII")
OBJECT_REFERENCE = struct.Struct("<HHIQQ")
LEGACY_DESCRIPTOR = struct.Struct("<HHIII")
PRELUDE_LEN = PRELUDE.size  # 32
DESCRIPTOR_LEN = DESCRIPTOR.size  # 24
OBJECT_REFERENCE_LEN = OBJECT_REFERENCE.size  # 24
LEGACY_DESCRIPTOR_LEN = LEGACY_DESCRIPTOR.size  # 16
#: FRAME_SUBMIT object_ref_mask: bit -> the standard slot it references, in slot order.
REFERENCE_SLOTS = ((1 << 0, int(CacheObjectKind.CAMERA_BLOCK)),
                   (1 << 1, int(CacheObjectKind.TILE_INDEX_BLOCK)),
                   (1 << 2, int(CacheObjectKind.TENSOR_SECTION_TABLE)),
                   (1 << 3, int(CacheObjectKind.PAYLOAD_LAYOUT_TEMPLATE)))
_SLOT_MASK = sum(bit for bit, _ in REFERENCE_SLOTS)
_CACHE_OBJECT_KINDS = frozenset(int(k) for k in CacheObjectKind)
_KIND_BITS = frozenset(int(k) for k in PayloadKind if k and k != PayloadKind.TENSOR)


@attrs.frozen
class Prelude:
    """The body-region prelude: the six region lengths, in wire order."""

    inline_object: int = 0
    object_reference: int = 0
    typed_descriptor: int = 0
    typed_frame: int = 0
    extension_descriptor: int = 0
    extension_payload: int = 0

    def pack(self) -> bytes:
        return PRELUDE.pack(self.inline_object, self.object_reference, self.typed_descriptor,
                            self.typed_frame, self.extension_descriptor,
                            self.extension_payload, 0, 0)

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> Prelude:
        if len(data) < PRELUDE_LEN:
            raise TypedBodyError(f"typed body of {len(data)} bytes is shorter than the "
                                 f"{PRELUDE_LEN}-byte prelude")
        *lengths, body_flags, reserved = PRELUDE.unpack_from(data, 0)
        if body_flags or reserved:
            raise TypedBodyError("prelude body_flags and reserved must be 0")
        return cls(*lengths)

    def total(self) -> int:
        return (self.inline_object + self.object_reference + self.typed_descriptor
                + self.typed_frame + self.extension_descriptor + self.extension_payload)


class TypedDescriptor(NamedTuple):
    """A 24-byte TypedPayloadDescriptor (a NamedTuple: built once per frame on the hot path)."""

    profile_id: int = 0
    payload_kind: int = int(PayloadKind.STRUCTURED_EVENT)
    descriptor_flags: int = 0
    schema_id: int = 0
    schema_version: int = 0
    stream_semantics: int = int(StreamSemantics.SNAPSHOT)
    offset: int = 0
    length: int = 0

    def pack(self) -> bytes:
        return DESCRIPTOR.pack(self.profile_id, self.payload_kind, self.descriptor_flags,
                               self.schema_id, self.schema_version, self.stream_semantics, 0,
                               self.offset, self.length)

    @classmethod
    def unpack(cls, data: bytes | memoryview, offset: int = 0) -> TypedDescriptor:
        """Parse and check one descriptor."""
        (profile_id, kind, flags, schema_id, schema_version, semantics, reserved, off,
         length) = DESCRIPTOR.unpack_from(data, offset)
        if kind not in _KIND_BITS:
            raise TypedBodyError(f"descriptor payload_kind {kind:#x} is not one non-tensor kind")
        if flags & ~0x0F:
            raise TypedBodyError(f"descriptor flags {flags:#x} has reserved bits")
        if semantics > StreamSemantics.APPEND:
            raise TypedBodyError(f"descriptor stream_semantics {semantics} is not defined")
        if reserved:
            raise TypedBodyError("descriptor reserved field must be 0")
        return cls(profile_id, kind, flags, schema_id, schema_version, semantics, off, length)


class ObjectReference(NamedTuple):
    """A 24-byte cache-backed object reference of the object_reference region."""

    object_kind: int
    cache_namespace: int
    cache_key_hi: int
    cache_key_lo: int

    def pack(self) -> bytes:
        return OBJECT_REFERENCE.pack(self.object_kind, 0, self.cache_namespace,
                                     self.cache_key_hi, self.cache_key_lo)

    @classmethod
    def unpack(cls, data: bytes | memoryview, offset: int = 0) -> ObjectReference:
        kind, ref_flags, namespace, key_hi, key_lo = OBJECT_REFERENCE.unpack_from(data, offset)
        if kind not in _CACHE_OBJECT_KINDS:
            raise TypedBodyError(f"object reference object_kind {kind} is not defined")
        if ref_flags:
            raise TypedBodyError(f"object reference ref_flags {ref_flags:#x} must be 0")
        return cls(kind, namespace, key_hi, key_lo)


def unpack_object_references(region: bytes | memoryview) -> tuple[ObjectReference, ...]:
    """Every block of an object_reference region."""
    if len(region) % OBJECT_REFERENCE_LEN:
        raise TypedBodyError(f"object_reference region of {len(region)} bytes is not a "
                             f"multiple of {OBJECT_REFERENCE_LEN}")
    return tuple(ObjectReference.unpack(region, offset)
                 for offset in range(0, len(region), OBJECT_REFERENCE_LEN))


def check_object_references(references: Sequence[ObjectReference], *, submit_mode: int,
                            object_ref_mask: int) -> None:
    """FRAME_SUBMIT's mask and its region agree (module docstring)."""
    if object_ref_mask & ~_SLOT_MASK:
        raise TypedBodyError(f"object_ref_mask {object_ref_mask:#x} names undefined slots")
    if submit_mode == SubmitMode.INLINE and (object_ref_mask or references):
        raise TypedBodyError("an inline submit (submit_mode 0) references no object")
    expected = [kind for bit, kind in REFERENCE_SLOTS if object_ref_mask & bit]
    actual = [reference.object_kind for reference in references]
    if actual != expected:
        raise TypedBodyError(f"object_reference region holds kinds {actual}, object_ref_mask "
                             f"{object_ref_mask:#x} names {expected} (one each, in slot order)")


class LegacyDescriptor(NamedTuple):
    """Preview2's 16-byte typed-payload descriptor (legacy L0 vectors only)."""

    payload_kind: int
    profile_id: int
    offset: int
    length: int

    def pack(self) -> bytes:
        return LEGACY_DESCRIPTOR.pack(self.payload_kind, self.profile_id, self.offset,
                                      self.length, 0)

    @classmethod
    def unpack(cls, data: bytes | memoryview, offset: int = 0) -> LegacyDescriptor:
        kind, profile_id, frame_offset, length, reserved = LEGACY_DESCRIPTOR.unpack_from(
            data, offset)
        if kind not in _KIND_BITS:
            raise TypedBodyError(f"legacy descriptor payload_kind {kind:#x} is not one "
                                 "non-tensor kind")
        if reserved:
            raise TypedBodyError("legacy descriptor reserved field must be 0")
        return cls(kind, profile_id, frame_offset, length)


def unpack_legacy_descriptors(region: bytes | memoryview) -> tuple[LegacyDescriptor, ...]:
    """A legacy descriptor table: ascending, non-overlapping frames."""
    if len(region) % LEGACY_DESCRIPTOR_LEN:
        raise TypedBodyError(f"legacy descriptor table of {len(region)} bytes is not a "
                             f"multiple of {LEGACY_DESCRIPTOR_LEN}")
    descriptors = tuple(LegacyDescriptor.unpack(region, offset)
                        for offset in range(0, len(region), LEGACY_DESCRIPTOR_LEN))
    end_of_previous = 0
    for index, descriptor in enumerate(descriptors):
        if descriptor.offset < end_of_previous:
            raise TypedBodyError(f"legacy descriptor {index} offset {descriptor.offset} "
                                 f"overlaps or goes back (previous frame ends at "
                                 f"{end_of_previous})")
        end_of_previous = descriptor.offset + descriptor.length
    return descriptors


class TypedFrame(NamedTuple):
    """One typed payload frame: its descriptor and its bytes (a read-only view of the
    packet's body when that is one: a big body is never copied, ``_codec``)."""

    descriptor: TypedDescriptor
    payload: bytes | memoryview


class TypedBody(NamedTuple):
    """A parsed typed body. Inline objects and extension regions are kept raw."""

    frames: tuple[TypedFrame, ...]
    inline_object: bytes = b""
    object_references: tuple[ObjectReference, ...] = ()
    extension_descriptor: bytes = b""
    extension_payload: bytes = b""


def pack_typed_body(frames: Sequence[tuple[TypedDescriptor, bytes]], *,
                    object_references: Sequence[ObjectReference] = ()) -> bytes:
    """Build prelude ‖ object references ‖ descriptors ‖ frame payloads, laying the
    payloads out back to back.

    The descriptors' ``offset`` and ``length`` are filled in here.
    """
    descriptors = bytearray()
    offset = 0
    for descriptor, payload in frames:
        descriptors += descriptor._replace(offset=offset, length=len(payload)).pack()
        offset += len(payload)
    references = b"".join(reference.pack() for reference in object_references)
    prelude = Prelude(object_reference=len(references), typed_descriptor=len(descriptors),
                      typed_frame=offset)
    return b"".join((prelude.pack(), references, bytes(descriptors),
                     *(p for _, p in frames)))


class FrameShape(NamedTuple):
    """How one typed frame is described: its descriptor fields but offset and length."""

    profile_id: int
    kind: int
    flags: int
    schema_id: int
    schema_version: int
    stream_semantics: int


#: openai-compatible/1: one JSON event, profile 0, schema 0/0, SNAPSHOT
#: (docs/reference/nnrp-wire.md s. 4).
OPENAI_EVENT_FRAME = FrameShape(0, int(PayloadKind.STRUCTURED_EVENT), 0, 0, 0,
                                int(StreamSemantics.SNAPSHOT))
#: The token profile's complete text: profile 2, TOKEN_CHUNK, schema 0x1001 v3, terminal.
TOKEN_TEXT_FRAME = FrameShape(2, int(PayloadKind.TOKEN_CHUNK), int(DescriptorFlag.TERMINAL),
                              0x1001, 3, int(StreamSemantics.SNAPSHOT))


def pack_single_frame(payload: bytes, *, profile_id: int = 0,
                      kind: int = int(PayloadKind.STRUCTURED_EVENT), flags: int = 0,
                      schema_id: int = 0, schema_version: int = 0,
                      stream_semantics: int = int(StreamSemantics.SNAPSHOT)) -> bytes:
    """The common case, one typed frame: a fast path without intermediate objects."""
    return b"".join((
        PRELUDE.pack(0, 0, DESCRIPTOR_LEN, len(payload), 0, 0, 0, 0),
        DESCRIPTOR.pack(profile_id, kind, flags, schema_id, schema_version, stream_semantics,
                        0, 0, len(payload)),
        payload,
    ))


def parse_typed_body(body: bytes | memoryview, *, payload_kind_bitmap: int,
                     payload_frame_count: int) -> TypedBody:
    """Parse and check a typed body against its metadata's bitmap and frame count. The
    frames of a body that is a view are views of it (no copy); of ``bytes``, ``bytes``."""
    if payload_frame_count == 1 and len(body) >= PRELUDE_LEN + DESCRIPTOR_LEN:
        # Fast path for the openai mapping: one frame, no object or extension regions.
        (inline, objref, desc_len, frame_len, ext_desc, ext_payload, body_flags,
         reserved) = PRELUDE.unpack_from(body, 0)
        if (desc_len == DESCRIPTOR_LEN and not (inline or objref or ext_desc or ext_payload
                                                or body_flags or reserved)
                and PRELUDE_LEN + DESCRIPTOR_LEN + frame_len == len(body)):
            descriptor = TypedDescriptor.unpack(body, PRELUDE_LEN)
            if (descriptor.offset == 0 and descriptor.length == frame_len
                    and descriptor.payload_kind == payload_kind_bitmap & ~int(PayloadKind.TENSOR)):
                return TypedBody((TypedFrame(descriptor, body[PRELUDE_LEN + DESCRIPTOR_LEN:]),))
    prelude = Prelude.unpack(body)
    if PRELUDE_LEN + prelude.total() != len(body):
        raise TypedBodyError(
            f"body regions add up to {PRELUDE_LEN + prelude.total()} bytes, body_len is "
            f"{len(body)}")
    if (payload_frame_count and prelude.typed_descriptor == LEGACY_DESCRIPTOR_LEN
            * payload_frame_count):
        raise TypedBodyError(
            f"typed_descriptor region is {prelude.typed_descriptor} bytes: "
            f"{payload_frame_count} preview2 descriptors of {LEGACY_DESCRIPTOR_LEN} bytes, "
            f"which preview4 does not accept on the wire (descriptors are "
            f"{DESCRIPTOR_LEN} bytes)")
    if prelude.typed_descriptor != DESCRIPTOR_LEN * payload_frame_count:
        raise TypedBodyError(
            f"typed_descriptor region is {prelude.typed_descriptor} bytes, payload_frame_count "
            f"{payload_frame_count} needs {DESCRIPTOR_LEN * payload_frame_count}")
    viewed = isinstance(body, memoryview)
    view = memoryview(body)
    cursor = PRELUDE_LEN
    regions = []
    for length in (prelude.inline_object, prelude.object_reference, prelude.typed_descriptor,
                   prelude.typed_frame, prelude.extension_descriptor, prelude.extension_payload):
        regions.append(view[cursor:cursor + length])
        cursor += length
    inline, objref, desc_region, frame_region, ext_desc, ext_payload = regions

    frames: list[TypedFrame] = []
    kinds = 0
    end_of_previous = 0
    for index in range(payload_frame_count):
        descriptor = TypedDescriptor.unpack(desc_region, index * DESCRIPTOR_LEN)
        if descriptor.offset < end_of_previous:
            raise TypedBodyError(f"descriptor {index} offset {descriptor.offset} overlaps or "
                                 f"goes back (previous frame ends at {end_of_previous})")
        end = descriptor.offset + descriptor.length
        if end > len(frame_region):
            raise TypedBodyError(f"descriptor {index} runs to {end}, past the "
                                 f"{len(frame_region)}-byte typed_frame region")
        payload = frame_region[descriptor.offset:end]
        frames.append(TypedFrame(descriptor, payload if viewed else bytes(payload)))
        kinds |= descriptor.payload_kind
        end_of_previous = end
    if kinds != payload_kind_bitmap & ~int(PayloadKind.TENSOR):
        raise TypedBodyError(f"descriptor kinds {kinds:#x} differ from payload_kind_bitmap "
                             f"{payload_kind_bitmap:#x}")
    return TypedBody(tuple(frames), bytes(inline), unpack_object_references(objref),
                     bytes(ext_desc), bytes(ext_payload))
