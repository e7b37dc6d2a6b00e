"""Runtime objects in the sans-IO core (gateway/nnrp/_objects.py, rules O1-O8; the
controls' rule 17; the session's rule 5 for a submit whose body references cached
objects; _body's object-reference region),
as pure data: bytes in, events and reply frames out.

The metadata bytes are compared with nnrp-py's independent pure-Python codec
(``nnrp.runtime``), and the suite's golden object-reference block and legacy typed-payload
vectors are read and re-emitted byte for byte.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from nnrp import runtime as reference
from nnrp.core.messages.data import ObjectReferenceBlock
from nnrp.core.packet import pack_object_reference_blocks, unpack_object_reference_blocks

from gateway import nnrp
from gateway.profile import CANCEL_CAUSES, END_TABLE, Drop, EndCause, Push
from tests.support.golden import CASES
from tests.support.resume import SESSION_ENDS
from tests.support.tiers import examples
from tests.support.wire import of, pk, replies

HELLO = nnrp.ClientHello(profile_bitmap=0b11)
OPEN = nnrp.SessionOpen(profile_id=2, schema_id=0x1001, schema_version=3, max_in_flight=4)
OBJECT_TOKENS = ("object.cost", "object.delta", "object.lifecycle", "object.ownership")
SESSION = 1


def negotiate(tokens: tuple[str, ...] = OBJECT_TOKENS) -> bytes:
    body = nnrp.pack_tokens(tokens)
    return pk(nnrp.CapabilityNegotiation(profile_id=2, capability_count=len(tokens),
                                         body_bytes=len(body)),
              session_id=SESSION, body=body)


def connected(*, tokens: tuple[str, ...] = OBJECT_TOKENS, **config: Any
              ) -> nnrp.ServerConnection:
    conn = nnrp.ServerConnection(nnrp.ServerConfig(runtime_tokens=frozenset(OBJECT_TOKENS),
                                                   **config))
    conn.receive_data(pk(HELLO) + pk(OPEN))
    if tokens:
        conn.receive_data(negotiate(tokens))
    return conn


def declare(object_id: int, byte_size: int = 64, session_id: int = SESSION, **kw: Any
            ) -> bytes:
    message = nnrp.ObjectDeclare(object_id=object_id, object_kind=7, producer_role=1,
                                 consumer_role=2, session_id=session_id, byte_size=byte_size,
                                 ownership_hint=3, **kw)
    return pk(message, session_id=SESSION)


def ref(object_id: int, operation_id: int, **kw: Any) -> bytes:
    return pk(nnrp.ObjectRef(object_id=object_id, operation_id=operation_id, **kw),
              session_id=SESSION)


def release(object_id: int, operation_id: int = 0, flags: int = 1) -> bytes:
    return pk(nnrp.ObjectRelease(object_id=object_id, operation_id=operation_id,
                                 source_role=1, flags=flags), session_id=SESSION)


def delta(object_id: int, sequence: int, *, patch: bool = False, offset: int = 0,
          region: int = 8, payload: bytes = b"12345678", flags: int = 0) -> bytes:
    cls = nnrp.ObjectPatch if patch else nnrp.ObjectDelta
    return pk(cls(object_id=object_id, delta_sequence=sequence, region_offset=offset,
                  region_bytes=region, delta_bytes=len(payload), flags=flags),
              session_id=SESSION, body=payload)


def submit(operation_id: int, frame_id: int, body: bytes | None = None, **kw: Any) -> bytes:
    return pk(nnrp.FrameSubmit(operation_id=operation_id, payload_kind_bitmap=0x10,
                               payload_frame_count=1, **kw),
              session_id=SESSION, frame_id=frame_id,
              body=nnrp.pack_single_frame(b"{}") if body is None else body)


def refused(events: list[Any]) -> tuple[int, str]:
    """The one ERROR_RECOVERABLE the events send: (code, diagnostic)."""
    (reply,) = replies(events)
    assert isinstance(reply.message, nnrp.ErrorRecoverable)
    assert reply.session_id == SESSION and reply.message.scope == nnrp.ErrorScope.SESSION
    return reply.message.error_code, reply.body.decode()


# --------------------------------------------------------------------------- bytes


def reference_packs() -> list[tuple[Any, bytes]]:
    """Each object message, ours and nnrp-py's encoding of the same values."""
    return [
        (nnrp.ObjectDeclare(object_id=33, object_kind=7, producer_role=1, consumer_role=2,
                            session_id=9, byte_size=4096, compute_cost_units=12,
                            memory_location_hint=1, ownership_hint=3, lifetime_hint_ms=500,
                            metadata_bytes=4),
         reference.ObjectDescriptorMetadata(33, 7, 1, 2, 9, 4096, 12, 1, 3, 500, 4).pack()),
        (nnrp.ObjectRef(object_id=33, operation_id=101, object_version=2, offset=16, length=32,
                        flags=5, metadata_bytes=4),
         reference.ObjectReferenceMetadata(33, 101, 2, 16, 32, 5, 4).pack()),
        (nnrp.ObjectRelease(object_id=33, operation_id=101, release_reason=4, source_role=1,
                            flags=3, diagnostic_bytes=6),
         reference.ObjectReleaseMetadata(33, 101, 4, 1, 3, 6).pack()),
        (nnrp.ObjectPatch(object_id=33, delta_sequence=2, region_offset=0, region_bytes=1024,
                          delta_bytes=8, flags=3, metadata_bytes=4),
         reference.ObjectDeltaMetadata(33, 2, 0, 1024, 8, 3, 4).pack()),
        (nnrp.ObjectDelta(object_id=33, delta_sequence=3, region_offset=8, region_bytes=8,
                          delta_bytes=8, flags=4, metadata_bytes=0),
         reference.ObjectDeltaMetadata(33, 3, 8, 8, 8, 4, 0).pack()),
    ]


@pytest.mark.parametrize(("message", "golden"), reference_packs(),
                         ids=lambda v: type(v).__name__ if not isinstance(v, bytes) else "")
def test_object_metadata_is_nnrp_pys_bytes(message: Any, golden: bytes) -> None:
    layout = type(message).LAYOUT
    assert layout.size == len(golden)
    assert layout.pack_struct.pack(*layout.get_values(message)) == golden
    assert type(message).unpack(golden) == message


@pytest.mark.parametrize(("message", "golden"), reference_packs(),
                         ids=lambda v: type(v).__name__ if not isinstance(v, bytes) else "")
def test_object_packets_decode_whole_byte_by_byte_and_with_trailing_bytes(
        message: Any, golden: bytes) -> None:
    body = b"x" * message.expected_body_len()
    raw = pk(message, session_id=SESSION, body=body)
    (whole,) = nnrp.Decoder().feed(raw)
    assert whole.message == message and whole.body == body
    decoder = nnrp.Decoder()
    packets = [p for byte in raw for p in decoder.feed(bytes([byte]))]
    assert packets == [whole]
    trailing = nnrp.Decoder()
    assert trailing.feed(raw + raw[:7]) == [whole]
    assert trailing.feed(raw[7:]) == [whole]


@pytest.mark.parametrize(("cls", "offset", "value", "field"), [
    (nnrp.ObjectDeclare, 40, 1, "reserved field at byte 40"),
    (nnrp.ObjectRef, 40, 8, "flags: reserved bits 0x8"),
    (nnrp.ObjectRelease, 19, 4, "flags: reserved bits 0x4"),
    (nnrp.ObjectRelease, 24, 1, "reserved field at byte 24"),
    (nnrp.ObjectDelta, 32, 8, "flags: reserved bits 0x8"),
    (nnrp.ObjectDeclare, 8, 13, "object_kind: value 13 is not defined"),
])
def test_reserved_bits_and_undefined_values_are_rejected(cls: Any, offset: int, value: int,
                                                         field: str) -> None:
    raw = bytearray(cls.LAYOUT.size)
    struct.pack_into("<B", raw, offset, value)
    with pytest.raises(nnrp.RemoteProtocolError, match=field):
        cls.unpack(bytes(raw))


# --------------------------------------------------------------------------- O1


def test_every_fault_has_one_code() -> None:
    assert set(nnrp.FAULTS) == set(nnrp.ObjectFault)


def test_object_frames_need_the_negotiated_tokens() -> None:
    conn = connected(tokens=())
    code, text = refused(conn.receive_data(declare(7)))
    assert code == nnrp.ErrorCode.UNSUPPORTED_CAPABILITY and "object.lifecycle" in text
    assert text.startswith("OBJECT_DECLARE: not_negotiated: ")
    conn.receive_data(negotiate(("object.lifecycle",)))
    assert conn.receive_data(declare(7)) == []
    code, text = refused(conn.receive_data(delta(7, 1)))
    assert code == nnrp.ErrorCode.UNSUPPORTED_CAPABILITY and "object.delta" in text


def test_negotiation_grants_the_object_tokens() -> None:
    conn = connected(tokens=())
    (reply,) = replies(conn.receive_data(negotiate()))
    assert isinstance(reply.message, nnrp.CapabilityNegotiation)
    assert nnrp.parse_tokens(reply.body, reply.message.capability_count) == OBJECT_TOKENS


# --------------------------------------------------------------------------- lifecycle


def test_declare_reference_release_is_silent_and_counted() -> None:
    conn = connected()
    session = conn.session(SESSION)
    assert session is not None
    assert conn.receive_data(declare(7, byte_size=100)) == []
    assert of(conn.receive_data(submit(300, 1)), nnrp.OperationSubmitted)
    assert conn.receive_data(ref(7, 0)) == []  # the session's own reference
    assert conn.receive_data(ref(7, 300)) == []  # operation 300 depends on it
    assert session.objects.references(7) == {0, 300}
    assert session.objects.declared_bytes == 100 and session.objects.reference_count == 2
    assert conn.receive_data(release(7, 300, flags=0)) == []  # 300's reference ends
    assert session.objects.references(7) == {0}
    assert conn.receive_data(release(7)) == []  # final
    assert len(session.objects) == 0 and session.objects.declared_bytes == 0
    assert session.objects.reference_count == 0
    code, _ = refused(conn.receive_data(ref(7, 0)))
    assert code == nnrp.ErrorCode.CACHE_MISS
    assert conn.receive_data(declare(7)) == []  # a released id names a new object


@pytest.mark.parametrize(("frames", "fault"), [
    ([declare(0)], nnrp.ObjectFault.ZERO_OBJECT_ID),
    ([declare(7, session_id=2)], nnrp.ObjectFault.FOREIGN_SESSION),
    ([declare(7), declare(7)], nnrp.ObjectFault.ALREADY_DECLARED),
    ([ref(9, 0)], nnrp.ObjectFault.UNKNOWN_OBJECT),
    ([declare(7), ref(7, 0, object_version=3)], nnrp.ObjectFault.VERSION_MISMATCH),
    ([declare(7), ref(7, 0, offset=4)], nnrp.ObjectFault.REGION_WITHOUT_FLAG),
    ([declare(7, byte_size=64), ref(7, 0, offset=60, length=8, flags=4)],
     nnrp.ObjectFault.REGION_OUT_OF_BOUNDS),
    ([declare(7), release(7, 300, flags=0)], nnrp.ObjectFault.NO_SUCH_REFERENCE),
    ([declare(7), ref(7, 300)], nnrp.ObjectFault.UNKNOWN_OPERATION),
    ([declare(7), delta(7, 2), delta(7, 2)], nnrp.ObjectFault.SEQUENCE_NOT_INCREASING),
    ([declare(7, byte_size=64), delta(7, 1, offset=60)], nnrp.ObjectFault.REGION_OUT_OF_BOUNDS),
    ([declare(7), delta(7, 1, flags=4), delta(7, 2)], nnrp.ObjectFault.OBJECT_FINISHED),
    ([release(9)], nnrp.ObjectFault.UNKNOWN_OBJECT),
])
def test_each_refusal_has_its_code_and_changes_nothing(frames: list[bytes],
                                                      fault: nnrp.ObjectFault) -> None:
    conn = connected()
    session = conn.session(SESSION)
    assert session is not None
    for frame in frames[:-1]:
        assert conn.receive_data(frame) == []
    before = (len(session.objects), session.objects.declared_bytes,
              session.objects.version(7), session.objects.references(7))
    code, text = refused(conn.receive_data(frames[-1]))
    assert code == nnrp.FAULTS[fault] and f": {fault.value}: " in text
    assert (len(session.objects), session.objects.declared_bytes,
            session.objects.version(7), session.objects.references(7)) == before


def test_an_operations_references_end_with_it_and_a_late_one_is_a_race() -> None:
    conn = connected()
    session = conn.session(SESSION)
    assert session is not None
    conn.receive_data(declare(7) + declare(8))
    assert of(conn.receive_data(submit(5, 1)), nnrp.OperationSubmitted)
    assert conn.receive_data(ref(7, 5) + ref(8, 5) + ref(8, 5)) == []  # a repeat: nothing
    assert session.objects.reference_count == 2
    conn.send_result(SESSION, 5, 200, b"{}")
    assert session.objects.references(7) == session.objects.references(8) == set()
    assert conn.receive_data(ref(7, 5)) == []  # ended already: recorded nowhere
    assert session.objects.reference_count == 0


# --------------------------------------------------------------------------- limits


def test_bounds_by_count_bytes_and_held_references() -> None:
    limits = nnrp.ObjectLimits(max_objects=2, max_object_bytes=100, max_object_references=2)
    conn = connected(objects=limits)
    assert conn.receive_data(declare(1, byte_size=60)) == []
    code, text = refused(conn.receive_data(declare(2, byte_size=41)))
    assert code == nnrp.ErrorCode.LIMIT_EXCEEDED and "byte_limit" in text
    assert conn.receive_data(declare(2, byte_size=40)) == []
    code, text = refused(conn.receive_data(declare(3, byte_size=0)))
    assert code == nnrp.ErrorCode.LIMIT_EXCEEDED and "object_limit" in text
    conn.receive_data(submit(300, 1) + submit(301, 2))
    assert conn.receive_data(ref(1, 300) + ref(2, 300)) == []
    assert conn.receive_data(ref(1, 300)) == []  # a repeat holds nothing more
    code, text = refused(conn.receive_data(ref(1, 301)))
    assert code == nnrp.ErrorCode.LIMIT_EXCEEDED and "reference_limit" in text
    assert conn.receive_data(release(1)) == []  # ends 300's reference to 1: room again
    assert conn.receive_data(ref(2, 301)) == []


# --------------------------------------------------------------------------- delta (O3, O7)


def test_patches_and_deltas_version_the_object_without_resending_it() -> None:
    conn = connected()
    session = conn.session(SESSION)
    assert session is not None
    conn.receive_data(declare(7, byte_size=64))
    assert conn.receive_data(delta(7, 1, patch=True, flags=1)) == []
    assert conn.receive_data(delta(7, 5, offset=56)) == []
    assert session.objects.version(7) == 5
    assert conn.receive_data(ref(7, 0, object_version=5)) == []
    code, _ = refused(conn.receive_data(ref(7, 0, object_version=1)))
    assert code == nnrp.ErrorCode.INVALID_STATE
    assert conn.receive_data(delta(7, 6, flags=4)) == []  # final delta
    code, text = refused(conn.receive_data(delta(7, 7, patch=True)))
    assert "object_finished" in text


# --------------------------------------------------------------------------- invalidation (O6)


def test_an_invalidating_release_drops_the_operations_that_depend_on_it() -> None:
    conn = connected()
    conn.receive_data(declare(7) + declare(8) + submit(300, 1) + submit(301, 2)
                      + submit(302, 3))
    conn.receive_data(ref(7, 300) + ref(7, 301) + ref(8, 302))
    events = conn.receive_data(release(7, flags=3))  # final, invalidates dependents
    cancelled = of(events, nnrp.OperationCancelled)
    assert [(c.operation_id, c.frame_id, c.source, c.reason) for c in cancelled] == [
        (300, 1, nnrp.CancelSource.OBJECT_INVALIDATED, nnrp.ControlReason.DEPENDENCY_FAILED),
        (301, 2, nnrp.CancelSource.OBJECT_INVALIDATED, nnrp.ControlReason.DEPENDENCY_FAILED)]
    assert cancelled[0].diagnostic == b"object 7 was invalidated"
    assert replies(events) == []  # the drop is the operation's terminal, sent as it ends
    cause = CANCEL_CAUSES[nnrp.CancelSource.OBJECT_INVALIDATED]
    assert END_TABLE[cause].terminal == Drop(nnrp.DropReason.OBJECT_INVALIDATED)
    trace, drop = (nnrp.decode_packet(raw) for raw in conn.send_drop(
        SESSION, 300, nnrp.DropReason.OBJECT_INVALIDATED, b"object_invalidated"))
    assert isinstance(trace.message, nnrp.TraceContext) and trace.frame_id == 0
    assert isinstance(drop.message, nnrp.ResultDropReason) and drop.frame_id == 1
    assert drop.message.drop_reason == nnrp.DropReason.OBJECT_INVALIDATED
    # A non-final invalidating release drops only the operation it names; one without
    # the flag drops nothing.
    events = conn.receive_data(release(8, 302, flags=0))
    assert not of(events, nnrp.OperationCancelled)
    conn.receive_data(ref(8, 302))
    (only,) = of(conn.receive_data(release(8, 302, flags=2)), nnrp.OperationCancelled)
    assert only.operation_id == 302
    assert END_TABLE[EndCause.OBJECT_REFERENCE_UNRESOLVED].terminal == Push(
        404, "invalid_request_error")


def test_session_close_empties_the_table() -> None:
    conn = connected()
    conn.receive_data(declare(7) + submit(300, 1))
    conn.receive_data(ref(7, 300))
    conn.receive_data(pk(nnrp.SessionClose(), session_id=SESSION))
    session = conn.session(SESSION)
    assert session is not None and len(session.objects) == 0
    assert session.objects.reference_count == 0 and session.objects.declared_bytes == 0


# --------------------------------------------------------------------------- object-reference region


def test_object_reference_block_golden() -> None:
    raw = bytes.fromhex(CASES["l0.object_reference.block.golden"]["metadata_hex"])
    (block,) = nnrp.unpack_object_references(raw)
    assert block == nnrp.ObjectReference(int(nnrp.CacheObjectKind.TILE_INDEX_BLOCK), 7,
                                         0x11223344, 0x55667788)
    assert block.pack() == raw
    assert nnrp.unpack_object_references(raw + raw) == (block, block)


@pytest.mark.parametrize(("raw", "error"), [
    (bytes(23), "not a multiple of 24"),
    (struct.pack("<HHIQQ", 2, 1, 7, 1, 2), "ref_flags 0x1 must be 0"),
    (struct.pack("<HHIQQ", 10, 0, 7, 1, 2), "object_kind 10 is not defined"),
])
def test_bad_object_reference_blocks(raw: bytes, error: str) -> None:
    with pytest.raises(nnrp.TypedBodyError, match=error):
        nnrp.unpack_object_references(raw)


TILE_REF = nnrp.ObjectReference(int(nnrp.CacheObjectKind.TILE_INDEX_BLOCK), 7, 0x11223344,
                                0x55667788)
FRAME = (nnrp.TypedDescriptor(), b'{"a":1}')


def test_frame_submit_parse_emit_keeps_object_references() -> None:
    """Suite case l1.frame_submit.message.parse_emit: typed payload and object-reference
    bookkeeping intact through parse and emit."""
    body = nnrp.pack_typed_body([FRAME], object_references=[TILE_REF])
    submit_meta = nnrp.FrameSubmit(operation_id=9, submit_mode=int(nnrp.SubmitMode.MIXED),
                                   object_ref_mask=0b10, payload_kind_bitmap=0x10,
                                   payload_frame_count=1)
    raw = pk(submit_meta, session_id=SESSION, frame_id=3, body=body)
    (packet,) = nnrp.Decoder().feed(raw)
    parsed = nnrp.parse_typed_body(packet.body, payload_kind_bitmap=0x10, payload_frame_count=1)
    assert parsed.object_references == (TILE_REF,)
    nnrp.check_object_references(parsed.object_references, submit_mode=2, object_ref_mask=0b10)
    re_emitted = nnrp.pack_typed_body([(f.descriptor, f.payload) for f in parsed.frames],
                                      object_references=parsed.object_references)
    assert pk(packet.message, session_id=SESSION, frame_id=3, body=re_emitted) == raw


@pytest.mark.parametrize(("mode", "mask", "references", "error"), [
    (0, 0b10, [TILE_REF], "inline submit"),
    (0, 0, [TILE_REF], "inline submit"),
    (2, 0b10000, [], "undefined slots"),
    (2, 0b11, [TILE_REF], "names \\[1, 2\\]"),
    (2, 0, [TILE_REF], "names \\[\\]"),
    (1, 0b110, [TILE_REF._replace(object_kind=3), TILE_REF], "slot order"),
])
def test_mask_and_region_must_agree(mode: int, mask: int, references: list[Any],
                                    error: str) -> None:
    with pytest.raises(nnrp.TypedBodyError, match=error):
        nnrp.check_object_references(references, submit_mode=mode, object_ref_mask=mask)


def test_a_submit_referencing_cached_objects_gets_cache_misses_then_its_refusal() -> None:
    """Suite case l1.result_push.object_reference.resolve, server side: references that do
    not resolve surface as protocol-shaped cache misses."""
    conn = connected(tokens=())
    camera = TILE_REF._replace(object_kind=int(nnrp.CacheObjectKind.CAMERA_BLOCK),
                               cache_key_lo=1)
    body = nnrp.pack_typed_body([FRAME], object_references=[camera, TILE_REF])
    events = conn.receive_data(submit(9, 3, body, submit_mode=1, object_ref_mask=0b11))
    misses = replies(events)
    # On the submit's frame, with the session's profile: how the client matches them.
    assert [(m.session_id, m.frame_id, m.message) for m in misses] == [
        (SESSION, 3, nnrp.CacheMiss(cache_namespace=7, profile_id=2, miss_reason=1,
                                    cache_key_hi=0x11223344, cache_key_lo=key_lo))
        for key_lo in (1, 0x55667788)]
    assert events.index(of(events, nnrp.SubmitRefused)[0]) == 2  # after the misses
    (refusal,) = of(events, nnrp.SubmitRefused)
    assert refusal.reason is nnrp.RefusalReason.OBJECT_REFERENCE_UNRESOLVED
    assert (refusal.operation_id, refusal.frame_id) == (9, 3)


def test_a_mask_without_its_blocks_fails_only_the_operation() -> None:
    conn = connected(tokens=())
    (submitted,) = of(conn.receive_data(submit(9, 3, submit_mode=2, object_ref_mask=0b1)),
                      nnrp.OperationSubmitted)
    assert submitted.typed_body is None and "object_ref_mask" in (submitted.body_error or "")
    assert conn.state is nnrp.ConnState.READY


# --------------------------------------------------------------------------- legacy descriptors


def test_legacy_typed_payload_descriptor_golden() -> None:
    raw = bytes.fromhex(CASES["l0.typed_payload.descriptor.golden"]["descriptor_hex"])
    (descriptor,) = nnrp.unpack_legacy_descriptors(raw)
    assert descriptor == nnrp.LegacyDescriptor(0x10, 3, 4, 7)
    assert descriptor.pack() == raw


def test_legacy_typed_payload_frame_regions_golden() -> None:
    case = CASES["l0.typed_payload.frame_regions.golden"]
    region = bytes.fromhex(case["descriptor_region_hex"])
    payload = bytes.fromhex(case["payload_hex"])
    descriptors = nnrp.unpack_legacy_descriptors(region)
    frames = [payload[d.offset:d.offset + d.length] for d in descriptors]
    assert [(d.payload_kind, d.profile_id) for d in descriptors] == [
        (0x02, 1), (0x04, 2), (0x08, 3), (0x10, 4)]
    assert frames == [b"tok", b"au", b"video", b"evt"]
    assert b"".join(d.pack() for d in descriptors) == region
    assert b"".join(frames) == payload


def test_a_submit_with_legacy_descriptors_is_refused_saying_so() -> None:
    legacy = nnrp.LegacyDescriptor(0x10, 0, 0, 2).pack()
    body = nnrp.Prelude(typed_descriptor=len(legacy), typed_frame=2).pack() + legacy + b"{}"
    with pytest.raises(nnrp.TypedBodyError, match="preview2 descriptors of 16 bytes"):
        nnrp.parse_typed_body(body, payload_kind_bitmap=0x10, payload_frame_count=1)


def test_an_object_exchange_fed_byte_by_byte_answers_the_same_bytes() -> None:
    """The server's whole input, whole, one byte at a time, and with a next packet's
    first bytes trailing: the same events and reply bytes each way."""
    exchange = (negotiate() + declare(7) + submit(5, 1) + ref(7, 5) + delta(7, 1)
                + ref(9, 0) + release(7, flags=3) + declare(0))

    def run(chunks: list[bytes]) -> tuple[list[Any], list[bytes]]:
        conn = nnrp.ServerConnection(nnrp.ServerConfig(
            runtime_tokens=frozenset(OBJECT_TOKENS)))
        events = [e for chunk in chunks for e in conn.receive_data(chunk)]
        return ([type(e).__name__ for e in events],
                [e.data for e in events if isinstance(e, nnrp.SendBytes)])

    start = pk(HELLO) + pk(OPEN)
    whole = run([start + exchange])
    assert whole == run([bytes([b]) for b in start + exchange])
    trailing = start + exchange + declare(8)[:11]
    assert whole == run([trailing])
    assert whole[0].count("OperationCancelled") == 1
    assert whole[0].count("SendBytes") == 5  # hello, open, negotiation, two refusals


@settings(max_examples=examples(200), deadline=None)
@given(blocks=st.lists(st.tuples(st.sampled_from([int(k) for k in nnrp.CacheObjectKind]),
                                 st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
                                 st.integers(0, 2**64 - 1)), max_size=4))
def test_object_reference_blocks_are_nnrp_pys_bytes(
        blocks: list[tuple[int, int, int, int]]) -> None:
    """Any region of blocks: ours packs nnrp-py's bytes, and each reads the other's."""
    ours = [nnrp.ObjectReference(*block) for block in blocks]
    theirs = [ObjectReferenceBlock(kind, 0, namespace, hi, lo)
              for kind, namespace, hi, lo in blocks]
    region = b"".join(block.pack() for block in ours)
    assert region == pack_object_reference_blocks(theirs)
    assert nnrp.unpack_object_references(region) == tuple(ours)
    assert [(b.object_kind, b.cache_namespace, b.cache_key_hi, b.cache_key_lo)
            for b in unpack_object_reference_blocks(region)] == blocks


# --------------------------------------------------------------------------- kept bytes (O9)


def _replace(object_id: int, sequence: int, offset: int, payload: bytes, **kw: Any) -> bytes:
    return delta(object_id, sequence, patch=True, offset=offset, region=len(payload),
                 payload=payload, flags=int(nnrp.ObjectDeltaFlag.REPLACES_REGION), **kw)


def test_bytes_written_by_region_are_read_whole_at_a_version() -> None:
    conn = connected()
    session = conn.session(SESSION)
    assert session is not None
    conn.receive_data(declare(7, byte_size=12) + submit(300, 1))
    table = session.objects
    assert conn.receive_data(_replace(7, 1, 8, b"IJKL")) == []
    refusal = table.read(7, 0, 300)
    assert isinstance(refusal, nnrp.ObjectRefusal) and "4 of its 12 bytes" in refusal.text
    conn.receive_data(_replace(7, 2, 0, b"ABCDEFGH"))  # out of order, then whole
    assert table.read(7, 0, 300) == b"ABCDEFGHIJKL"
    assert table.read(7, 2, 300) == b"ABCDEFGHIJKL"
    assert table.references(7) == {300}  # the reader depends on it (O4-O6)
    conn.receive_data(_replace(7, 3, 4, b"efgh"))
    stale = table.read(7, 2, 300)
    assert isinstance(stale, nnrp.ObjectRefusal) and stale.fault is nnrp.ObjectFault.VERSION_MISMATCH
    assert table.read(7, 3, 300) == b"ABCDefghIJKL"
    assert table.kept_bytes == 12


def test_a_frame_whose_bytes_the_server_cannot_read_makes_the_object_unreadable() -> None:
    conn = connected()
    session = conn.session(SESSION)
    assert session is not None
    conn.receive_data(declare(7, byte_size=8) + declare(8, byte_size=8))
    conn.receive_data(_replace(7, 1, 0, b"ABCDEFGH"))
    conn.receive_data(delta(7, 2, payload=b"12345678"))  # a delta that replaces nothing
    conn.receive_data(delta(8, 1, patch=True, payload=b"xy", region=8,
                            flags=int(nnrp.ObjectDeltaFlag.REPLACES_REGION
                                      | nnrp.ObjectDeltaFlag.COMPRESSED)))
    for object_id in (7, 8):
        refusal = session.objects.read(object_id, 0, 0)
        assert isinstance(refusal, nnrp.ObjectRefusal)
        assert refusal.fault is nnrp.ObjectFault.BYTES_UNREADABLE
    assert session.objects.kept_bytes == 0  # nothing held for bytes no one can read


def test_kept_bytes_are_bounded_per_session_and_per_process_and_given_back() -> None:
    pool = nnrp.ObjectBytes(capacity=20)
    conn = connected(objects=nnrp.ObjectLimits(max_kept_bytes=16), object_bytes=pool)
    session = conn.session(SESSION)
    assert session is not None
    conn.receive_data(declare(7, byte_size=12) + declare(8, byte_size=8))
    conn.receive_data(_replace(7, 1, 0, b"A" * 4))
    assert (session.objects.kept_bytes, pool.used) == (12, 12)  # reserved whole
    code, text = refused(conn.receive_data(_replace(8, 1, 0, b"B" * 8)))
    assert code == nnrp.ErrorCode.LIMIT_EXCEEDED and "16 kept bytes" in text
    assert session.objects.version(8) == 0  # the refused frame changed nothing
    conn.receive_data(release(7))
    assert (session.objects.kept_bytes, pool.used) == (0, 0)
    other = connected(objects=nnrp.ObjectLimits(max_kept_bytes=16), object_bytes=pool)
    other_session = other.session(SESSION)
    assert other_session is not None
    other.receive_data(declare(9, byte_size=16) + _replace(9, 1, 0, b"C" * 16))
    code, text = refused(conn.receive_data(_replace(8, 1, 0, b"B" * 8)))
    assert "this server's 20 kept object bytes" in text  # the process's pool, shared
    other_session.objects.clear()
    assert pool.used == 0


def test_a_delta_whose_bytes_do_not_match_its_region_is_refused() -> None:
    conn = connected()
    conn.receive_data(declare(7, byte_size=8) + _replace(7, 1, 0, b"ABCD"))
    raw = pk(nnrp.ObjectPatch(object_id=7, delta_sequence=2, region_offset=4, region_bytes=4,
                              delta_bytes=4, metadata_bytes=2,
                              flags=int(nnrp.ObjectDeltaFlag.REPLACES_REGION)),
             session_id=SESSION, body=b"mm" + b"EFGH")
    assert conn.receive_data(raw) == []  # metadata first, then the delta bytes
    session = conn.session(SESSION)
    assert session is not None
    assert session.objects.read(7, 0, 0) == b"ABCDEFGH"


@pytest.mark.parametrize("end", SESSION_ENDS)
def test_every_end_of_a_session_gives_its_kept_bytes_back(end: str) -> None:
    """However a session ends, its reservation returns to the process's pool (a review
    found a connection lost or a window expired keeping it for good)."""
    from tests.support.resume import RESUMABLE, Clock, book, connection, end_session

    pool = nnrp.ObjectBytes(capacity=64)
    clock = Clock()
    sessions = book(clock, window=10.0)
    conn = connection(sessions, runtime_tokens=frozenset(OBJECT_TOKENS), object_bytes=pool)
    conn.receive_data(pk(RESUMABLE) + negotiate())
    conn.receive_data(declare(7, byte_size=16) + _replace(7, 1, 0, b"A" * 16))
    assert pool.used == 16
    end_session(conn, sessions, clock, end, session_id=SESSION, pool=pool)
    assert pool.used == 0


def test_readers_share_one_frozen_copy_and_a_patch_starts_a_new_version() -> None:
    conn = connected()
    session = conn.session(SESSION)
    assert session is not None
    conn.receive_data(declare(7, byte_size=8) + _replace(7, 1, 0, b"ABCDEFGH"))
    first, second = (session.objects.read(7, 0, 0) for _ in range(2))
    assert first == b"ABCDEFGH" and first is second  # no copy per reader
    conn.receive_data(_replace(7, 2, 2, b"cd"))
    assert first == b"ABCDEFGH"  # what a reader holds never changes
    assert session.objects.read(7, 0, 0) == b"ABcdEFGH"
    assert session.objects.kept_bytes == 8


def test_scattered_regions_are_bounded_and_merge_as_they_meet() -> None:
    conn = connected()
    session = conn.session(SESSION)
    assert session is not None
    size = 2 * nnrp.MAX_RUNS + 2
    conn.receive_data(declare(7, byte_size=size))
    for run in range(nnrp.MAX_RUNS):  # every other byte: MAX_RUNS separate regions
        assert conn.receive_data(_replace(7, run + 1, 2 * run, b"x")) == []
    code, text = refused(conn.receive_data(_replace(7, 1000, size - 1, b"y")))
    assert code == nnrp.ErrorCode.LIMIT_EXCEEDED and "fragmented" in text
    assert session.objects.version(7) == nnrp.MAX_RUNS  # the refused frame changed nothing
    # Filling the gaps merges them; the object becomes whole.
    for run in range(nnrp.MAX_RUNS):
        conn.receive_data(_replace(7, 2000 + run, 2 * run + 1, b"-"))
    conn.receive_data(_replace(7, 3000, size - 2, b"yz"))
    assert session.objects.read(7, 0, 0) == b"x-" * nnrp.MAX_RUNS + b"yz"


def test_metadata_comes_first_and_a_late_reader_holds_no_reference() -> None:
    conn = connected()
    session = conn.session(SESSION)
    assert session is not None
    conn.receive_data(declare(7, byte_size=8))
    bad = pk(nnrp.ObjectPatch(object_id=7, delta_sequence=1, region_offset=0, region_bytes=4,
                              delta_bytes=4, metadata_bytes=2,
                              flags=int(nnrp.ObjectDeltaFlag.REPLACES_REGION)),
             session_id=SESSION, body=b"m" * 6)
    assert conn.receive_data(bad) == []  # 4 delta bytes after 2 of metadata: fine
    pool = session.objects.pool
    assert pool.used == 8
    # A fragmenting frame is refused before anything is reserved for a new object.
    conn.receive_data(declare(9, byte_size=8))
    assert pool.used == 8
    fresh = connected()
    fresh_session = fresh.session(SESSION)
    assert fresh_session is not None
    fresh.receive_data(declare(8, byte_size=8) + _replace(8, 1, 0, b"ABCDEFGH"))
    assert fresh_session.objects.read(8, 0, 99, operation_in_flight=False) == b"ABCDEFGH"
    assert fresh_session.objects.references(8) == frozenset()  # an ended reader holds none
