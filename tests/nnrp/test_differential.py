"""Differential tests against nnrp-py's pure-Python reference codec (``nnrp.core``).

Both directions on randomized metadata: ours encodes and theirs decodes and
re-encodes byte-identically; theirs encodes and ours decodes to the same values.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from gateway import nnrp
from tests.support.strategies import messages, packets
from tests.support.tiers import examples

core = pytest.importorskip("nnrp.core")
runtime_types = pytest.importorskip("nnrp.runtime.types")
core_packet = pytest.importorskip("nnrp.core.packet")
schema = pytest.importorskip("nnrp.schema")

#: Our class -> nnrp-py's class, for layouts whose named fields line up positionally.
RUNTIME_PAIRS: dict[type[Any], Any] = {
    nnrp.Cancel: runtime_types.ControlRequestMetadata,
    nnrp.Abort: runtime_types.ControlRequestMetadata,
    nnrp.PriorityUpdate: runtime_types.SchedulingMetadata,
    nnrp.Deadline: runtime_types.SchedulingMetadata,
    nnrp.ExpireAt: runtime_types.SchedulingMetadata,
    nnrp.Supersede: runtime_types.SupersedeMetadata,
    nnrp.BudgetUpdate: runtime_types.BudgetMetadata,
    nnrp.Progress: runtime_types.ProgressMetadata,
    nnrp.PartialResult: runtime_types.PartialResultMetadata,
    nnrp.Backpressure: runtime_types.PressureMetadata,
    nnrp.CreditUpdate: runtime_types.PressureMetadata,
    nnrp.CapabilityNegotiation: runtime_types.CapabilityMetadata,
    nnrp.DegradeProfile: runtime_types.CapabilityMetadata,
    nnrp.RouteHint: runtime_types.RouteHintMetadata,
    nnrp.ExecutionHint: runtime_types.RouteHintMetadata,
    nnrp.TraceContext: runtime_types.TraceContextMetadata,
    nnrp.ResultDropReason: runtime_types.ResultDropReasonMetadata,
    nnrp.ErrorRecoverable: runtime_types.RecoverableErrorMetadata,
    nnrp.RetryAfter: runtime_types.RetryAfterMetadata,
    nnrp.SessionClose: runtime_types.SessionCloseMetadata,
}
#: Layouts nnrp-py only offers as pack/unpack pairs (its classes carry reserved fields).
CORE_PAIRS: dict[type[Any], Any] = {
    nnrp.ClientHello: core.ClientHelloMetadata,
    nnrp.ServerHelloAck: core.ServerHelloAckMetadata,
    nnrp.SessionOpen: core.SessionOpenMetadata,
    nnrp.FlowUpdate: core.FlowUpdateMetadata,
    nnrp.ResultHint: core.ResultHintMetadata,
    nnrp.TransportProbe: core.TransportProbeMetadata,
    nnrp.TransportProbeAck: core.TransportProbeAckMetadata,
    nnrp.Error: core.ErrorMetadata,
    nnrp.FrameSubmit: core.FrameSubmitMetadata,
    nnrp.ResultPush: core.ResultPushMetadata,
}


#: Layouts added for preview4's session patch, migration, cache and object messages: nnrp-py
#: builds them with reordered arguments, so they are compared through bytes only.
BYTE_PAIRS: dict[type[Any], Any] = {
    nnrp.SessionPatch: core.SessionPatchMetadata,
    nnrp.SessionPatchAck: core.SessionPatchAckMetadata,
    nnrp.CachePut: core.CachePutMetadata,
    nnrp.CacheAck: core.CacheAckMetadata,
    nnrp.CacheInvalidate: core.CacheInvalidateMetadata,
    nnrp.SessionMigrate: core.SessionMigrateMetadata,
    nnrp.SessionMigrateAck: core.SessionMigrateAckMetadata,
    nnrp.ObjectDeclare: runtime_types.ObjectDescriptorMetadata,
    nnrp.ObjectRef: runtime_types.ObjectReferenceMetadata,
    nnrp.ObjectRelease: runtime_types.ObjectReleaseMetadata,
    nnrp.ObjectPatch: runtime_types.ObjectDeltaMetadata,
    nnrp.ObjectDelta: runtime_types.ObjectDeltaMetadata,
    nnrp.CacheReference: runtime_types.CacheReferenceMetadata,
    nnrp.CacheMiss: runtime_types.CacheMissMetadata,
}


def _meta_bytes(message: Any) -> bytes:
    layout = message.LAYOUT
    return bytes(layout.pack_struct.pack(*layout.get_values(message)))


def _ours_decode(cls: type[Any], raw: bytes) -> Any:
    value = cls.unpack(raw)
    return value


def _theirs_accepts(their_cls: Any, raw: bytes) -> Any | None:
    try:
        return their_cls.unpack(raw)
    except (ValueError, TypeError):
        return None


@pytest.mark.parametrize("cls", list(RUNTIME_PAIRS), ids=lambda c: c.MSG_TYPE.name)
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_runtime_metadata_both_directions(cls: type[Any], data: st.DataObject) -> None:
    ours = data.draw(messages(cls))
    their_cls = RUNTIME_PAIRS[cls]
    raw = _meta_bytes(ours)
    # Ours encodes, theirs decodes and re-encodes identically.
    theirs = _theirs_accepts(their_cls, raw)
    assert theirs is not None, "nnrp-py rejects metadata our validator accepts"
    assert theirs.pack() == raw
    # Theirs encodes (built from the same field values), ours decodes to the same message.
    rebuilt = their_cls(*cls.LAYOUT.get_values(ours))
    assert _ours_decode(cls, rebuilt.pack()) == ours


@pytest.mark.parametrize("cls", list(CORE_PAIRS), ids=lambda c: c.MSG_TYPE.name)
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_core_metadata_both_directions(cls: type[Any], data: st.DataObject) -> None:
    ours = data.draw(messages(cls))
    raw = _meta_bytes(ours)
    theirs = _theirs_accepts(CORE_PAIRS[cls], raw)
    assert theirs is not None, "nnrp-py rejects metadata our validator accepts"
    their_raw = theirs.pack()
    assert their_raw == raw
    assert _ours_decode(cls, their_raw) == ours


@pytest.mark.parametrize("cls", list(BYTE_PAIRS), ids=lambda c: c.MSG_TYPE.name)
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_added_metadata_both_directions(cls: type[Any], data: st.DataObject) -> None:
    ours = data.draw(messages(cls))
    raw = _meta_bytes(ours)
    theirs = _theirs_accepts(BYTE_PAIRS[cls], raw)
    assert theirs is not None, "nnrp-py rejects metadata our validator accepts"
    assert theirs.pack() == raw
    assert _ours_decode(cls, theirs.pack()) == ours


def test_core_layout_sizes_agree() -> None:
    for ours, theirs in {**CORE_PAIRS, **RUNTIME_PAIRS, **BYTE_PAIRS}.items():
        assert ours.LAYOUT.size == theirs.STRUCT.size, ours.__name__


@settings(max_examples=examples(60), deadline=None)
@given(packet=packets())
def test_header_both_directions(packet: nnrp.Packet) -> None:
    raw = nnrp.encode(packet)
    theirs = core.NnrpHeader.unpack(raw[:40])
    assert theirs.pack() == raw[:40]
    assert int(theirs.msg_type) == packet.msg_type
    assert (theirs.session_id, theirs.frame_id, theirs.trace_id) == (
        packet.session_id, packet.frame_id, packet.trace_id)


@settings(max_examples=examples(60), deadline=None)
@given(payload=st.binary(max_size=300), session_id=st.integers(1, 2**32 - 1),
       frame_id=st.integers(1, 2**32 - 1), operation_id=st.integers(1, 2**64 - 1),
       trace_id=st.integers(0, 2**64 - 1))
def test_openai_submit_is_byte_identical_to_the_reference_builder(
        payload: bytes, session_id: int, frame_id: int, operation_id: int, trace_id: int) -> None:
    client = nnrp.ClientConnection()
    client.hello()
    client.receive_data(nnrp.encode(nnrp.Packet(nnrp.ServerHelloAck(accepted_profile_bitmap=2))))
    client.open_session()
    client.receive_data(nnrp.encode(nnrp.Packet(nnrp.SessionOpenAck(session_id=session_id),
                                                session_id=session_id)))
    ours = client.submit(session_id, operation_id, frame_id, payload, trace_id=trace_id)
    frame = core_packet.build_typed_payload_frame(
        core.PayloadKind.STRUCTURED_EVENT, payload, profile_id=0,
        stream_semantics=schema.StreamSemantics.SNAPSHOT)
    theirs = core_packet.build_frame_submit_typed_payload_packet(
        session_id=session_id, frame_id=frame_id, operation_id=operation_id, frames=[frame],
        trace_id=trace_id)
    assert ours == theirs.pack()


@settings(max_examples=examples(40), deadline=None)
@given(payload=st.binary(max_size=300))
def test_our_result_body_passes_the_reference_validator(payload: bytes) -> None:
    body = nnrp.pack_single_frame(payload)
    metadata = core.ResultPushMetadata(
        status_code=200, result_flags=0, section_count=0, tile_count=0, active_profile_id=0,
        reserved0=0, inference_ms=0, queue_ms=0, server_total_ms=0, reserved1=0, tile_base_id=0,
        tile_index_bytes=0, payload_kind_bitmap=core.PayloadKind.STRUCTURED_EVENT,
        payload_frame_count=1)
    core_packet.validate_result_push_body(metadata, body)
    view = core_packet.unpack_body(body)
    assert bytes(view.typed_payload_frame_region) == payload
