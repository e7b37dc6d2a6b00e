"""Every applicable golden vector of the vendored nnrp-conformance preview4 suite.

Each test compares our bytes with bytes from outside this project: hex in the suite's
cases, hex rendered by nnrp-rs or captured live (nnrp-wire.md section 6), or the output
of nnrp-py's independent pure-Python codec for the suite's semantic vectors.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from nnrp.core.messages import control as reference

from gateway import nnrp
from tests.support.golden import CASES, VECTORS_BY_NAME


def _meta_roundtrip(cls: type[Any], hex_text: str) -> Any:
    raw = bytes.fromhex(hex_text)
    assert len(raw) == cls.LAYOUT.size
    message = cls.unpack(raw)
    assert cls.LAYOUT.pack_struct.pack(*cls.LAYOUT.get_values(message)) == raw
    return message


def test_header_fixed_shape_golden() -> None:
    raw = bytes.fromhex(CASES["l0.header.fixed_shape.golden"]["header_hex"])
    header = nnrp.Header.unpack(raw)
    assert (header.msg_type, header.flags, header.meta_len, header.body_len) == (0x10, 0x21, 48, 4096)
    assert (header.session_id, header.frame_id, header.view_id, header.trace_id) == (7, 11, 2, 123456789)
    assert header.pack() == raw


def test_header_all_caller_controlled_fields() -> None:
    vector = VECTORS_BY_NAME["preview4.header.all_caller_controlled_fields"]
    header = nnrp.Header(
        msg_type=nnrp.MsgType.FRAME_SUBMIT,
        flags=nnrp.HeaderFlag.ACK_REQUIRED | nnrp.HeaderFlag.KEYFRAME,
        meta_len=vector["meta_len"], body_len=vector["body_len"],
        session_id=vector["session_id"], frame_id=vector["frame_id"], view_id=vector["view_id"],
        route_id=vector["route_id"], trace_id=vector["trace_id"])
    # nnrp-wire.md section 6 gives its bytes.
    expected = "4e4e5250010010282100000003020100060504004433221188776655aa99ccbb0807060504030201"
    assert header.pack().hex() == expected
    assert nnrp.Header.unpack(bytes.fromhex(expected)) == header


def test_client_hello_golden() -> None:
    hello = _meta_roundtrip(nnrp.ClientHello, CASES["l0.control.client_hello.golden"]["metadata_hex"])
    assert (hello.profile_bitmap, hello.cadence_x100, hello.latency_budget_ms) == (1, 6000, 100)
    assert hello.auth_bytes == 96


@pytest.mark.parametrize("case", ["l0.flow_update.packet.golden", "l0.result_hint.packet.golden"])
def test_packet_golden_roundtrip(case: str) -> None:
    raw = bytes.fromhex(CASES[case]["packet_hex"])
    (packet,) = nnrp.Decoder().feed(raw)
    assert nnrp.encode(packet) == raw
    assert nnrp.decode_packet(raw) == packet


def test_flow_update_golden_fields() -> None:
    (packet,) = nnrp.Decoder().feed(bytes.fromhex(CASES["l0.flow_update.packet.golden"]["packet_hex"]))
    assert packet.message == nnrp.FlowUpdate(scope=1, reason=4, backpressure=2, session_credit=1,
                                             retry_after_ms=40, credit_epoch=5, flags=3)
    assert (packet.session_id, packet.route_id, packet.trace_id) == (21, 6, 13)


def test_frame_submit_metadata_golden() -> None:
    submit = _meta_roundtrip(nnrp.FrameSubmit,
                             CASES["l0.frame_submit.metadata.golden"]["metadata_hex"])
    assert submit.operation_id == 0x0102030405060708
    assert (submit.submit_mode, submit.budget_policy, submit.loss_tolerance) == (2, 5, 0xFF)
    assert (submit.payload_kind_bitmap, submit.payload_frame_count) == (0x11, 2)


def test_result_push_metadata_golden() -> None:
    result = _meta_roundtrip(nnrp.ResultPush, CASES["l0.result_push.metadata.golden"]["metadata_hex"])
    assert (result.result_flags, result.result_class, result.reused_frame_id) == (5, 1, 41)
    assert (result.covered_tiles, result.dropped_tiles, result.payload_frame_count) == (53, 31, 3)


def test_body_prelude_golden() -> None:
    raw = bytes.fromhex(CASES["l0.body_region.prelude.golden"]["metadata_hex"])
    prelude = nnrp.Prelude.unpack(raw)
    assert prelude == nnrp.Prelude(24, 24, 24, 14, 16, 5)
    assert prelude.pack() == raw


@pytest.mark.parametrize("source", ["case", "vector"])
def test_typed_descriptor_golden(source: str) -> None:
    raw = bytes.fromhex(CASES["l0.typed_payload.descriptor.current.golden"]["descriptor_hex"])
    if source == "vector":
        v = VECTORS_BY_NAME["preview4.metadata.typed_payload_descriptor.token_partial"]
        built = nnrp.TypedDescriptor(v["profile_id"], int(nnrp.PayloadKind.TOKEN_CHUNK),
                                     v["descriptor_flags"], v["schema_id"], v["schema_version"],
                                     v["stream_semantics"], v["offset"], v["length"])
        assert built.pack() == raw
    descriptor = nnrp.TypedDescriptor.unpack(raw)
    assert descriptor == nnrp.TypedDescriptor(2, 2, 2, 0x1001, 3, 2, 8, 24)
    assert descriptor.pack() == raw


def _ours(message: Any) -> bytes:
    return type(message).LAYOUT.pack_struct.pack(*type(message).LAYOUT.get_values(message))


@pytest.mark.parametrize("name", ["nnrp1.metadata.session_open.default_context",
                                  "nnrp1.metadata.session_open.resume_request"])
def test_session_open_vectors(name: str) -> None:
    v = VECTORS_BY_NAME[name]
    priority = nnrp.PriorityClass[v["priority_class"].upper()]
    message = nnrp.SessionOpen(
        requested_session_id=v["requested_session_id"], profile_id=v["profile_id"],
        priority_class=int(priority),
        session_flags=v["session_flags"], schema_id=v["schema_id"],
        schema_version=v["schema_version"], default_deadline_ms=v["default_deadline_ms"],
        max_in_flight=v["max_in_flight_operations"],
        lease_ttl_hint_ms=v["lease_ttl_hint_ms"], resume_token_bytes=v["resume_token_bytes"],
        auth_bytes=v["auth_bytes"], session_extension_bytes=v["session_extension_bytes"],
        client_session_tag=v["client_session_tag"])
    golden = reference.SessionOpenMetadata(
        v["requested_session_id"], v["profile_id"],
        reference.SessionPriorityClass(int(priority)), v["session_flags"], v["schema_id"],
        v["schema_version"], v["default_deadline_ms"], v["max_in_flight_operations"],
        v["lease_ttl_hint_ms"], v["resume_token_bytes"], v["auth_bytes"],
        v["session_extension_bytes"], v["client_session_tag"]).pack()
    assert _ours(message) == golden
    assert _meta_roundtrip(nnrp.SessionOpen, golden.hex()) == message


#: nnrp-wire.md section 6, rendered by nnrp-rs from recipe session_open_ack.opened.
OPENED_ACK = ("2a000000 0200 01 00 01100000 03000000 0200 0400 30750000 c0d40100 10000000 "
              "08000000 21436587a9cbed0f 07000000 00000000 05000000").replace(" ", "")


def test_session_open_ack_opened_golden_hex() -> None:
    golden = OPENED_ACK
    v = VECTORS_BY_NAME["nnrp1.metadata.session_open_ack.opened"]
    message = _meta_roundtrip(nnrp.SessionOpenAck, golden)
    assert message == nnrp.SessionOpenAck(
        session_id=v["session_id"], profile_id=v["accepted_profile_id"], priority_class=1,
        status=0, schema_id=v["schema_id"], schema_version=v["schema_version"],
        granted_operation_credit=v["granted_operation_credit"],
        max_in_flight=v["max_in_flight_operations"], lease_ttl_ms=v["lease_ttl_ms"],
        resume_window_ms=v["resume_window_ms"], resume_token_bytes=v["resume_token_bytes"],
        session_extension_bytes=v["session_extension_bytes"],
        server_session_tag=v["server_session_tag"], route_scope_id=v["route_scope_id"],
        session_error_code=v["session_error_code"], session_flags_ack=v["session_flags_ack"])


@pytest.mark.parametrize("name", ["nnrp1.metadata.session_open_ack.resumed",
                                  "nnrp1.metadata.session_open_ack.resume_rejected"])
def test_session_open_ack_vectors(name: str) -> None:
    v = VECTORS_BY_NAME[name]
    status = int(nnrp.SessionOpenStatus[v["session_status"].upper()])
    message = nnrp.SessionOpenAck(
        session_id=v["session_id"], profile_id=v["accepted_profile_id"],
        priority_class=int(nnrp.PriorityClass[v["accepted_priority_class"].upper()]),
        status=status, schema_id=v["schema_id"], schema_version=v["schema_version"],
        granted_operation_credit=v["granted_operation_credit"],
        max_in_flight=v["max_in_flight_operations"], lease_ttl_ms=v["lease_ttl_ms"],
        resume_window_ms=v["resume_window_ms"], resume_token_bytes=v["resume_token_bytes"],
        session_extension_bytes=v["session_extension_bytes"],
        server_session_tag=v["server_session_tag"], route_scope_id=v["route_scope_id"],
        session_error_code=v["session_error_code"], session_flags_ack=v["session_flags_ack"])
    # Golden bytes: nnrp-rs's "opened" rendering with each differing field patched at its
    # offset from the spec's table (nnrp-wire.md section 3), not from our layout.
    golden = bytearray(bytes.fromhex(OPENED_ACK))
    for offset, fmt, value in (
            (0, "<I", v["session_id"]), (4, "<H", v["accepted_profile_id"]),
            (6, "<B", message.priority_class), (7, "<B", status), (8, "<I", v["schema_id"]),
            (12, "<I", v["schema_version"]), (16, "<H", v["granted_operation_credit"]),
            (18, "<H", v["max_in_flight_operations"]), (20, "<I", v["lease_ttl_ms"]),
            (24, "<I", v["resume_window_ms"]), (28, "<I", v["resume_token_bytes"]),
            (32, "<I", v["session_extension_bytes"]), (36, "<Q", v["server_session_tag"]),
            (44, "<I", v["route_scope_id"]), (48, "<I", v["session_error_code"]),
            (52, "<I", v["session_flags_ack"])):
        struct.pack_into(fmt, golden, offset, value)
    assert _ours(message) == bytes(golden)
    assert _meta_roundtrip(nnrp.SessionOpenAck, golden.hex()) == message
    if status == nnrp.SessionOpenStatus.REJECTED:
        assert message.session_error_code == nnrp.SessionError.RESUME_REJECTED


def test_session_close_and_ack_vectors() -> None:
    v = VECTORS_BY_NAME["nnrp1.metadata.session_close.drain"]
    close = nnrp.SessionClose(reason=int(nnrp.CloseReason.CLIENT_SHUTDOWN), in_flight_policy=0,
                              drain_timeout_ms=v["drain_timeout_ms"],
                              last_operation_id=v["last_operation_id"],
                              session_error_code=v["session_error_code"],
                              close_tag=v["session_close_tag"])
    raw = nnrp.SessionClose.LAYOUT.pack_struct.pack(*nnrp.SessionClose.LAYOUT.get_values(close))
    assert raw.hex() == "0100" "00" "00" "e8030000" "6300000000000000" "00000000" "44332211"
    v = VECTORS_BY_NAME["nnrp1.metadata.session_close_ack.draining"]
    ack = nnrp.SessionCloseAck(status=int(nnrp.CloseAckStatus.DRAINING),
                               last_operation_id=v["last_operation_id"])
    # The live capture's CLOSE_ACK ("02 00 0000 <last_op u64> <error u32>"), status draining.
    golden = bytes.fromhex("01" "00" "0000") + struct.pack("<QI", v["last_operation_id"], 0)
    assert _ours(ack) == golden
    assert _meta_roundtrip(nnrp.SessionCloseAck, golden.hex()) == ack


@pytest.mark.parametrize("name", ["nnrp1.packet.flow_update.session_hard",
                                  "nnrp1.packet.flow_update.connection_grant",
                                  "nnrp1.packet.flow_update.operation_pause"])
def test_flow_update_packet_vectors(name: str) -> None:
    v = VECTORS_BY_NAME[name]
    flags = 0
    for flag in v["flow_update_flags"]:
        flags |= nnrp.FlowFlag[flag.upper()]
    message = nnrp.FlowUpdate(
        scope=int(nnrp.FlowScope[v["scope_kind"].upper()]),
        reason=int(nnrp.FlowReason[v["update_reason"].upper()]),
        backpressure=int(nnrp.FlowBackpressure[v["backpressure_level"].upper()]),
        connection_credit=v["connection_credit"], session_credit=v["session_credit"],
        operation_credit=v["operation_credit"], operation_id=v["operation_id"],
        retry_after_ms=v["retry_after_ms"], credit_epoch=v["credit_epoch"], flags=flags)
    packet = nnrp.Packet(message, session_id=v["session_id"], route_id=v["route_id"],
                         trace_id=v["trace_id"])
    golden_meta = reference.FlowUpdateMetadata(
        reference.FlowUpdateScopeKind(message.scope), reference.FlowUpdateReason(message.reason),
        reference.FlowUpdateBackpressureLevel(message.backpressure), message.connection_credit,
        message.session_credit, message.operation_credit, message.operation_id,
        message.retry_after_ms, message.credit_epoch, reference.FlowUpdateFlags(flags)).pack()
    raw = nnrp.encode(packet)
    assert raw[40:] == golden_meta
    assert nnrp.decode_packet(raw) == packet


def test_live_capture_cancel_and_close_bytes() -> None:
    """The [cap] exchange of nnrp-wire.md section 6: the cancel path metadata."""
    cancel = bytes.fromhex("6500000000000000 0100000000000000 0100 01 01 00000000 "
                           "0000000000000000".replace(" ", ""))
    message = _meta_roundtrip(nnrp.Cancel, cancel.hex())
    assert (message.operation_id, message.reason, message.source_role, message.flags) == (
        0x65, 1, 1, 1)
    drop = bytes.fromhex("6500000000000000 0200000000000000 0300 03 00 0e000000 "
                         "0000000000000000".replace(" ", ""))
    message = _meta_roundtrip(nnrp.ResultDropReason, drop.hex())
    assert (message.result_sequence, message.drop_reason, message.diagnostic_bytes) == (2, 3, 14)
    close = bytes.fromhex("0100 00 00 00000000 6500000000000000 00000000 01000000".replace(" ", ""))
    assert _meta_roundtrip(nnrp.SessionClose, close.hex()).last_operation_id == 0x65
    ack = bytes.fromhex("02 00 0000 6500000000000000 00000000".replace(" ", ""))
    assert _meta_roundtrip(nnrp.SessionCloseAck, ack.hex()).status == nnrp.CloseAckStatus.CLOSED
