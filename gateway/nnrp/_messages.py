"""Metadata of every NNRP/1 preview4 message a Level 1 session exchanges.

One frozen attrs class per message type; the layout (section 3 of nnrp-wire.md) sits
beside the fields it packs. Messages that share a layout (CANCEL and ABORT, say)
share a private base; the concrete classes only pin ``MSG_TYPE``.

Each class offers:

* ``LAYOUT`` — the fixed-width metadata layout (``LAYOUT.size`` is the exact meta_len);
* ``validate()`` — enum ranges, flag masks and cross-field rules, run on decode;
* ``expected_body_len()`` — what ``body_len`` must be (``None`` when the body is
  typed regions that a separate parser checks).

Field values are plain ints: the hot path never builds enums. The registries in
``_constants`` name them.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ._constants import (
    PAYLOAD_KIND_MASK,
    STAGE_VENDOR_BASE,
    CloseAckStatus,
    CloseReason,
    ControlReason,
    DropReason,
    ErrorCode,
    ErrorScope,
    FlowBackpressure,
    FlowFlag,
    FlowReason,
    FlowScope,
    InFlightPolicy,
    MsgType,
    PayloadKind,
    PressureLevel,
    PriorityClass,
    ResultClass,
    Role,
    SessionOpenStatus,
    Stage,
    SubmitMode,
)
from ._layout import Layout, check, check_mask, check_range

#: Registries as ranges, computed once (len() of an enum iterates it).
_CLOSEACKSTATUS_VALUES = range(len(CloseAckStatus))
_CLOSEREASON_VALUES = range(len(CloseReason))
_CONTROLREASON_VALUES = range(len(ControlReason))
_DROPREASON_VALUES = range(len(DropReason))
_ERRORSCOPE_VALUES = range(len(ErrorScope))
_FLOWBACKPRESSURE_VALUES = range(len(FlowBackpressure))
_FLOWREASON_VALUES = range(len(FlowReason))
_FLOWSCOPE_VALUES = range(len(FlowScope))
_INFLIGHTPOLICY_VALUES = range(len(InFlightPolicy))
_PRESSURELEVEL_VALUES = range(len(PressureLevel))
_PRIORITYCLASS_VALUES = range(len(PriorityClass))
_RESULTCLASS_VALUES = range(len(ResultClass))
_ROLE_VALUES = range(len(Role))
_SESSIONOPENSTATUS_VALUES = range(len(SessionOpenStatus))
_SUBMITMODE_VALUES = range(len(SubmitMode))
_ROLES = _ROLE_VALUES
_REASONS = _CONTROLREASON_VALUES
_DROP_REASONS = _DROPREASON_VALUES
_STAGES = frozenset(int(s) for s in Stage)
_ERROR_CODES = range(1, len(ErrorCode) + 1)


class _Message:
    """Shared behaviour; never instantiated directly."""

    __slots__ = ()
    LAYOUT: ClassVar[Layout]
    MSG_TYPE: ClassVar[MsgType]

    def validate(self) -> None:
        """Check registries and cross-field rules; raise RemoteProtocolError."""

    def expected_body_len(self) -> int | None:
        """The exact body length this metadata announces (default: no body)."""
        return 0


# --------------------------------------------------------------------------- header-only


@attrs.frozen
class _HeaderOnly(_Message):
    LAYOUT: ClassVar[Layout] = Layout(())


@attrs.frozen
class Close(_HeaderOnly):
    """CLOSE (0x05): the connection is going away."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.CLOSE


@attrs.frozen
class FrameCancel(_HeaderOnly):
    """FRAME_CANCEL (0x11): cancel the operation bound to header.frame_id."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.FRAME_CANCEL


@attrs.frozen
class ResultDrop(_HeaderOnly):
    """RESULT_DROP (0x13): header-only drop of header.frame_id's result."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.RESULT_DROP


@attrs.frozen
class Ping(_HeaderOnly):
    """PING (0x20). The reference runtime does not auto-PONG; we do."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.PING


@attrs.frozen
class Pong(_HeaderOnly):
    """PONG (0x21)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.PONG


# --------------------------------------------------------------------------- handshake


@attrs.frozen
class ClientHello(_Message):
    """CLIENT_HELLO (0x01), 64 B."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.CLIENT_HELLO
    LAYOUT: ClassVar[Layout] = Layout((
        ("min_version", "B"), ("max_version", "B"), ("wire_format_bitmap", "H"),
        ("profile_bitmap", "I"), ("payload_kind_bitmap", "I"), ("codec_bitmap", "I"),
        ("compression_bitmap", "I"), ("dtype_bitmap", "I"), ("layout_bitmap", "I"),
        ("cache_digest_bitmap", "H"), ("cache_object_bitmap", "H"),
        ("cache_namespace_count", "H"), ("max_lane_count", "H"),
        ("max_cache_entries", "I"), ("max_cache_bytes", "I"),
        ("cadence_x100", "H"), ("latency_budget_ms", "H"), ("quality_tier", "H"),
        ("degrade_policy", "H"), ("requested_session_id", "I"), ("auth_bytes", "I"),
        ("control_extension_bytes", "I"),
    ))
    min_version: int = 1
    max_version: int = 1
    wire_format_bitmap: int = 1
    profile_bitmap: int = 0
    payload_kind_bitmap: int = 0
    codec_bitmap: int = 0
    compression_bitmap: int = 0
    dtype_bitmap: int = 0
    layout_bitmap: int = 0
    cache_digest_bitmap: int = 0
    cache_object_bitmap: int = 0
    cache_namespace_count: int = 0
    max_lane_count: int = 0
    max_cache_entries: int = 0
    max_cache_bytes: int = 0
    cadence_x100: int = 0
    latency_budget_ms: int = 0
    quality_tier: int = 0
    degrade_policy: int = 0
    requested_session_id: int = 0
    auth_bytes: int = 0
    control_extension_bytes: int = 0

    def validate(self) -> None:
        check(self.min_version <= self.max_version,
              f"client_hello: min_version {self.min_version} > max_version {self.max_version}")

    def expected_body_len(self) -> int | None:
        return self.auth_bytes + self.control_extension_bytes


@attrs.frozen
class ServerHelloAck(_Message):
    """SERVER_HELLO_ACK (0x02), 80 B."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.SERVER_HELLO_ACK
    LAYOUT: ClassVar[Layout] = Layout((
        ("selected_version", "B"), ("selected_wire_format", "B"), ("auth_status", "B"),
        (None, "B"), ("session_id", "I"),
        ("accepted_profile_bitmap", "I"), ("accepted_payload_kind_bitmap", "I"),
        ("accepted_codec_bitmap", "I"), ("accepted_compression_bitmap", "I"),
        ("accepted_dtype_bitmap", "I"), ("accepted_layout_bitmap", "I"),
        ("cache_digest_bitmap", "I"), ("cache_object_bitmap", "I"),
        ("max_cache_entries", "I"), ("max_cache_bytes", "I"),
        ("max_lane_count", "H"), ("max_concurrent_frames", "H"), ("cadence_x100", "H"),
        ("latency_budget_ms", "H"), ("quality_tier", "H"), ("degrade_policy", "H"),
        ("max_body_bytes", "I"), ("token_ttl_ms", "I"), ("retry_after_ms", "I"),
        ("control_extension_bytes", "I"), ("server_flags", "I"),
    ))
    selected_version: int = 1
    selected_wire_format: int = 0
    auth_status: int = 0
    session_id: int = 0
    accepted_profile_bitmap: int = 0
    accepted_payload_kind_bitmap: int = 0
    accepted_codec_bitmap: int = 0
    accepted_compression_bitmap: int = 0
    accepted_dtype_bitmap: int = 0
    accepted_layout_bitmap: int = 0
    cache_digest_bitmap: int = 0
    cache_object_bitmap: int = 0
    max_cache_entries: int = 0
    max_cache_bytes: int = 0
    max_lane_count: int = 0
    max_concurrent_frames: int = 0
    cadence_x100: int = 0
    latency_budget_ms: int = 0
    quality_tier: int = 0
    degrade_policy: int = 0
    max_body_bytes: int = 0
    token_ttl_ms: int = 0
    retry_after_ms: int = 0
    control_extension_bytes: int = 0
    server_flags: int = 0

    def expected_body_len(self) -> int | None:
        return self.control_extension_bytes


@attrs.frozen
class _Probe(_Message):
    LAYOUT: ClassVar[Layout] = Layout((("probe_id", "I"), ("payload_bytes", "I"),
                                       ("timestamp_us", "Q")))
    probe_id: int = 0
    payload_bytes: int = 0
    timestamp_us: int = 0

    def expected_body_len(self) -> int | None:
        return self.payload_bytes


@attrs.frozen
class TransportProbe(_Probe):
    """TRANSPORT_PROBE (0x19), 16 B; may precede the hello."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.TRANSPORT_PROBE


@attrs.frozen
class TransportProbeAck(_Probe):
    """TRANSPORT_PROBE_ACK (0x1A), 16 B."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.TRANSPORT_PROBE_ACK


# --------------------------------------------------------------------------- sessions


@attrs.frozen
class SessionOpen(_Message):
    """SESSION_OPEN (0x07), 48 B. Body = resume token ‖ auth ‖ session extension."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.SESSION_OPEN
    LAYOUT: ClassVar[Layout] = Layout((
        ("requested_session_id", "I"), ("profile_id", "H"), ("priority_class", "B"),
        ("session_flags", "B"), ("schema_id", "I"), ("schema_version", "I"),
        ("default_deadline_ms", "I"), ("max_in_flight", "H"), (None, "H"),
        ("lease_ttl_hint_ms", "I"), ("resume_token_bytes", "I"), ("auth_bytes", "I"),
        ("session_extension_bytes", "I"), ("client_session_tag", "Q"),
    ))
    requested_session_id: int = 0
    profile_id: int = 0
    priority_class: int = 0
    session_flags: int = 0
    schema_id: int = 0
    schema_version: int = 0
    default_deadline_ms: int = 0
    max_in_flight: int = 0
    lease_ttl_hint_ms: int = 0
    resume_token_bytes: int = 0
    auth_bytes: int = 0
    session_extension_bytes: int = 0
    client_session_tag: int = 0

    def validate(self) -> None:
        check_range(self.priority_class, _PRIORITYCLASS_VALUES, "session_open.priority_class")
        check_mask(self.session_flags, 0x0F, "session_open.session_flags")

    def expected_body_len(self) -> int | None:
        return self.resume_token_bytes + self.auth_bytes + self.session_extension_bytes


@attrs.frozen
class SessionOpenAck(_Message):
    """SESSION_OPEN_ACK (0x08), 56 B. A rejection carries a UTF-8 diagnostic body."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.SESSION_OPEN_ACK
    LAYOUT: ClassVar[Layout] = Layout((
        ("session_id", "I"), ("profile_id", "H"), ("priority_class", "B"), ("status", "B"),
        ("schema_id", "I"), ("schema_version", "I"), ("granted_operation_credit", "H"),
        ("max_in_flight", "H"), ("lease_ttl_ms", "I"), ("resume_window_ms", "I"),
        ("resume_token_bytes", "I"), ("session_extension_bytes", "I"),
        ("server_session_tag", "Q"), ("route_scope_id", "I"), ("session_error_code", "I"),
        ("session_flags_ack", "I"),
    ))
    session_id: int = 0
    profile_id: int = 0
    priority_class: int = 0
    status: int = 0
    schema_id: int = 0
    schema_version: int = 0
    granted_operation_credit: int = 0
    max_in_flight: int = 0
    lease_ttl_ms: int = 0
    resume_window_ms: int = 0
    resume_token_bytes: int = 0
    session_extension_bytes: int = 0
    server_session_tag: int = 0
    route_scope_id: int = 0
    session_error_code: int = 0
    session_flags_ack: int = 0

    def validate(self) -> None:
        check_range(self.priority_class, _PRIORITYCLASS_VALUES,
                    "session_open_ack.priority_class")
        check_range(self.status, _SESSIONOPENSTATUS_VALUES, "session_open_ack.status")
        check_mask(self.session_flags_ack, 0x1F, "session_open_ack.session_flags_ack")

    def expected_body_len(self) -> int | None:
        # Opened: token ‖ extension; rejected: those plus a free-form diagnostic.
        return None


@attrs.frozen
class SessionClose(_Message):
    """SESSION_CLOSE (0x09), 24 B; client to server only."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.SESSION_CLOSE
    LAYOUT: ClassVar[Layout] = Layout((
        ("reason", "H"), ("in_flight_policy", "B"), (None, "B"), ("drain_timeout_ms", "I"),
        ("last_operation_id", "Q"), ("session_error_code", "I"), ("close_tag", "I"),
    ))
    reason: int = 0
    in_flight_policy: int = 0
    drain_timeout_ms: int = 0
    last_operation_id: int = 0
    session_error_code: int = 0
    close_tag: int = 0

    def validate(self) -> None:
        check_range(self.reason, _CLOSEREASON_VALUES, "session_close.reason")
        check_range(self.in_flight_policy, _INFLIGHTPOLICY_VALUES,
                    "session_close.in_flight_policy")


@attrs.frozen
class SessionCloseAck(_Message):
    """SESSION_CLOSE_ACK (0x0A), 16 B."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.SESSION_CLOSE_ACK
    LAYOUT: ClassVar[Layout] = Layout((
        ("status", "B"), (None, "B"), (None, "H"), ("last_operation_id", "Q"),
        ("session_error_code", "I"),
    ))
    status: int = 0
    last_operation_id: int = 0
    session_error_code: int = 0

    def validate(self) -> None:
        check_range(self.status, _CLOSEACKSTATUS_VALUES, "session_close_ack.status")


@attrs.frozen
class Error(_Message):
    """ERROR (0x06), 32 B; body = UTF-8 diagnostic."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.ERROR
    LAYOUT: ClassVar[Layout] = Layout((
        ("code", "I"), ("scope", "I"), ("is_fatal", "I"), ("retry_after_ms", "I"),
        ("related_session_id", "I"), ("related_frame_id", "I"), ("related_view_id", "I"),
        ("diagnostic_bytes", "I"),
    ))
    code: int = int(ErrorCode.INTERNAL_ERROR)
    scope: int = 0
    is_fatal: int = 0
    retry_after_ms: int = 0
    related_session_id: int = 0
    related_frame_id: int = 0
    related_view_id: int = 0
    diagnostic_bytes: int = 0

    def validate(self) -> None:
        check_range(self.code, _ERROR_CODES, "error.code")
        check_range(self.scope, _ERRORSCOPE_VALUES, "error.scope")
        check_range(self.is_fatal, range(2), "error.is_fatal")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


# --------------------------------------------------------------------------- data


@attrs.frozen
class FrameSubmit(_Message):
    """FRAME_SUBMIT (0x10), 72 B; the body is a typed body (see ``_body``)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.FRAME_SUBMIT
    LAYOUT: ClassVar[Layout] = Layout((
        ("src_width", "H"), ("src_height", "H"), ("tile_width", "H"), ("tile_height", "H"),
        ("tile_count", "H"), ("section_count", "H"), ("frame_class", "B"),
        ("input_profile", "B"), ("tile_index_mode", "B"), (None, "B"),
        ("latency_budget_ms", "H"), ("target_fps_x100", "H"), ("retry_of_frame", "I"),
        ("tile_base_id", "I"), ("camera_bytes", "I"), ("tile_index_bytes", "I"), (None, "I"),
        ("operation_id", "Q"), (None, "I"), ("submit_mode", "B"), ("budget_policy", "B"),
        ("loss_tolerance", "B"), (None, "B"), ("object_ref_mask", "I"),
        ("dependency_frame_id", "I"), ("payload_kind_bitmap", "I"),
        ("payload_frame_count", "H"), (None, "H"),
    ))
    src_width: int = 0
    src_height: int = 0
    tile_width: int = 0
    tile_height: int = 0
    tile_count: int = 0
    section_count: int = 0
    frame_class: int = 0
    input_profile: int = 0
    # The SDK's builder sets raw_u16 (1) even without tensors (nnrp-wire.md section 6).
    tile_index_mode: int = 1
    latency_budget_ms: int = 0
    target_fps_x100: int = 0
    retry_of_frame: int = 0
    tile_base_id: int = 0
    camera_bytes: int = 0
    tile_index_bytes: int = 0
    operation_id: int = 0
    submit_mode: int = 0
    budget_policy: int = 0
    loss_tolerance: int = 0xFF
    object_ref_mask: int = 0
    dependency_frame_id: int = 0
    payload_kind_bitmap: int = 0
    payload_frame_count: int = 0

    def validate(self) -> None:
        # One cheap guard for the common case; the detailed checks name the culprit.
        if (self.operation_id and self.submit_mode <= 2 and self.budget_policy <= 0x0F
                and (self.loss_tolerance <= 3 or self.loss_tolerance == 0xFF)
                and self.payload_kind_bitmap <= PAYLOAD_KIND_MASK
                and self.tile_index_mode <= 3 and self.input_profile <= 2
                and (self.payload_kind_bitmap & 1 or not (
                    self.src_width or self.src_height or self.tile_width or self.tile_height
                    or self.tile_count or self.section_count or self.input_profile
                    or self.tile_base_id or self.camera_bytes or self.tile_index_bytes))):
            return
        check(self.operation_id != 0, "frame_submit.operation_id must be non-zero")
        check_range(self.submit_mode, _SUBMITMODE_VALUES, "frame_submit.submit_mode")
        check_mask(self.budget_policy, 0x0F, "frame_submit.budget_policy")
        check(self.loss_tolerance <= 3 or self.loss_tolerance == 0xFF,
              f"frame_submit.loss_tolerance {self.loss_tolerance} is not 0-3 or 0xFF")
        check_mask(self.payload_kind_bitmap, PAYLOAD_KIND_MASK, "frame_submit.payload_kind_bitmap")
        check_range(self.tile_index_mode, range(4), "frame_submit.tile_index_mode")
        check_range(self.input_profile, range(3), "frame_submit.input_profile")
        check(False, "frame_submit: tensor fields must be 0 without a tensor payload")

    def expected_body_len(self) -> int | None:
        return None


@attrs.frozen
class ResultPush(_Message):
    """RESULT_PUSH (0x12), 64 B; the body is a typed body."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.RESULT_PUSH
    LAYOUT: ClassVar[Layout] = Layout((
        ("status_code", "H"), ("result_flags", "H"), ("section_count", "H"),
        ("tile_count", "H"), ("active_profile_id", "H"), (None, "H"), ("inference_ms", "H"),
        ("queue_ms", "H"), ("server_total_ms", "H"), (None, "H"), ("tile_base_id", "I"),
        ("tile_index_bytes", "I"), (None, "Q"), (None, "Q"), ("result_class", "B"),
        ("applied_budget", "B"), (None, "H"), ("reused_frame_id", "I"),
        ("covered_tiles", "H"), ("dropped_tiles", "H"), ("payload_kind_bitmap", "I"),
        ("payload_frame_count", "H"), (None, "H"),
    ))
    status_code: int = 200
    result_flags: int = 0
    section_count: int = 0
    tile_count: int = 0
    active_profile_id: int = 0
    inference_ms: int = 0
    queue_ms: int = 0
    server_total_ms: int = 0
    tile_base_id: int = 0
    tile_index_bytes: int = 0
    result_class: int = 0
    applied_budget: int = 0
    reused_frame_id: int = 0
    covered_tiles: int = 0
    dropped_tiles: int = 0
    payload_kind_bitmap: int = 0
    payload_frame_count: int = 0

    def validate(self) -> None:
        check_mask(self.result_flags, 0x07, "result_push.result_flags")
        check_range(self.result_class, _RESULTCLASS_VALUES, "result_push.result_class")
        check_mask(self.applied_budget, 0x0F, "result_push.applied_budget")
        check_mask(self.payload_kind_bitmap, PAYLOAD_KIND_MASK, "result_push.payload_kind_bitmap")
        stale = self.result_class == ResultClass.STALE_REUSE or bool(self.result_flags & 0x01)
        check(stale == (self.reused_frame_id != 0),
              "result_push: stale semantics and a non-zero reused_frame_id must agree")
        if not self.payload_kind_bitmap & PayloadKind.TENSOR:
            check(not any((self.section_count, self.tile_count, self.tile_base_id,
                           self.tile_index_bytes, self.covered_tiles, self.dropped_tiles)),
                  "result_push: tensor fields must be 0 without a tensor payload")
            return
        partial = self.result_class == ResultClass.PARTIAL or bool(self.result_flags & 0x04)
        check(not partial or self.dropped_tiles > 0,
              "result_push: a partial result needs dropped_tiles > 0")
        check(self.covered_tiles + self.dropped_tiles == self.tile_count,
              "result_push: covered_tiles + dropped_tiles must equal tile_count")

    def expected_body_len(self) -> int | None:
        return None


# --------------------------------------------------------------------------- flow


@attrs.frozen
class FlowUpdate(_Message):
    """FLOW_UPDATE (0x17), 32 B."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.FLOW_UPDATE
    LAYOUT: ClassVar[Layout] = Layout((
        ("scope", "B"), ("reason", "B"), ("backpressure", "B"), (None, "B"),
        ("connection_credit", "H"), ("session_credit", "H"), ("operation_credit", "H"),
        (None, "H"), ("operation_id", "Q"), ("retry_after_ms", "I"), ("credit_epoch", "I"),
        ("flags", "I"),
    ))
    scope: int = 0
    reason: int = 0
    backpressure: int = 0
    connection_credit: int = 0
    session_credit: int = 0
    operation_credit: int = 0
    operation_id: int = 0
    retry_after_ms: int = 0
    credit_epoch: int = 0
    flags: int = 0

    def validate(self) -> None:
        check_range(self.scope, _FLOWSCOPE_VALUES, "flow_update.scope")
        check_range(self.reason, _FLOWREASON_VALUES, "flow_update.reason")
        check_range(self.backpressure, _FLOWBACKPRESSURE_VALUES, "flow_update.backpressure")
        check_mask(self.flags, 0x0F, "flow_update.flags")
        # Each scope carries only its own credit (and only operation scope an operation_id).
        if self.scope == FlowScope.CONNECTION:
            check(not (self.session_credit or self.operation_credit or self.operation_id),
                  "flow_update: connection scope may only set conn_credit")
        elif self.scope == FlowScope.SESSION:
            check(not (self.connection_credit or self.operation_credit or self.operation_id),
                  "flow_update: session scope may only set session_credit")
        else:
            check(self.operation_id != 0, "flow_update: operation scope needs an operation_id")
            check(not (self.connection_credit or self.session_credit),
                  "flow_update: operation scope may only set op_credit")
        check(not self.retry_after_ms or bool(self.flags & FlowFlag.RETRY_AFTER_VALID),
              "flow_update: retry_after_ms without retry_after_valid")


@attrs.frozen
class ResultHint(_Message):
    """RESULT_HINT (0x18), 16 B."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.RESULT_HINT
    LAYOUT: ClassVar[Layout] = Layout((("budget_policy", "I"), ("congestion", "I"),
                                       ("reason", "I"), ("retry_after_ms", "I")))
    budget_policy: int = 0
    congestion: int = 0
    reason: int = 0
    retry_after_ms: int = 0

    def validate(self) -> None:
        check_range(self.budget_policy, range(5), "result_hint.budget_policy")
        check_range(self.congestion, range(4), "result_hint.congestion")
        check_range(self.reason, range(5), "result_hint.reason")


# --------------------------------------------------------------------------- runtime control


@attrs.frozen
class _ControlRequest(_Message):
    LAYOUT: ClassVar[Layout] = Layout((
        ("operation_id", "Q"), ("control_sequence", "Q"), ("reason", "H"),
        ("source_role", "B"), ("flags", "B"), ("diagnostic_bytes", "I"), (None, "Q"),
    ))
    operation_id: int = 0
    control_sequence: int = 0
    reason: int = 0
    source_role: int = 0
    flags: int = 0
    diagnostic_bytes: int = 0

    def validate(self) -> None:
        check_range(self.reason, _REASONS, "cancel.reason")
        check_range(self.source_role, _ROLES, "cancel.source_role")
        check_mask(self.flags, 0x03, "cancel.flags")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


@attrs.frozen
class Cancel(_ControlRequest):
    """CANCEL (0x30): operation_id 0 cancels the whole session."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.CANCEL


@attrs.frozen
class Abort(_ControlRequest):
    """ABORT (0x31): like CANCEL, without cooperation."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.ABORT


@attrs.frozen
class _Scheduling(_Message):
    LAYOUT: ClassVar[Layout] = Layout((
        ("operation_id", "Q"), ("control_sequence", "Q"), ("priority_class", "H"),
        ("priority_delta", "h"), ("deadline_unix_ms", "Q"), ("flags", "I"),
    ))
    operation_id: int = 0
    control_sequence: int = 0
    priority_class: int = 0
    priority_delta: int = 0
    deadline_unix_ms: int = 0
    flags: int = 0

    def validate(self) -> None:
        check_mask(self.flags, 0x03, f"{self.MSG_TYPE.name.lower()}.flags")


@attrs.frozen
class PriorityUpdate(_Scheduling):
    """PRIORITY_UPDATE (0x32)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.PRIORITY_UPDATE

    def validate(self) -> None:
        super().validate()
        check_range(self.priority_class, _PRIORITYCLASS_VALUES,
                    "priority_update.priority_class")


@attrs.frozen
class Deadline(_Scheduling):
    """DEADLINE (0x33): absolute unix-ms deadline; may arrive before its submit."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.DEADLINE

    def validate(self) -> None:
        super().validate()
        check(self.deadline_unix_ms != 0, "deadline.deadline_unix_ms must be non-zero")


@attrs.frozen
class ExpireAt(_Scheduling):
    """EXPIRE_AT (0x34): like DEADLINE; the wire case expects drop code superseded."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.EXPIRE_AT

    def validate(self) -> None:
        super().validate()
        check(self.deadline_unix_ms != 0, "expire_at.deadline_unix_ms must be non-zero")


@attrs.frozen
class Supersede(_Message):
    """SUPERSEDE (0x35), 32 B."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.SUPERSEDE
    LAYOUT: ClassVar[Layout] = Layout((
        ("old_operation_id", "Q"), ("new_operation_id", "Q"), ("control_sequence", "Q"),
        ("drop_reason", "H"), ("flags", "H"), ("diagnostic_bytes", "I"),
    ))
    old_operation_id: int = 0
    new_operation_id: int = 0
    control_sequence: int = 0
    drop_reason: int = 0
    flags: int = 0
    diagnostic_bytes: int = 0

    def validate(self) -> None:
        check_range(self.drop_reason, _DROP_REASONS, "supersede.drop_reason")
        check_mask(self.flags, 0x01, "supersede.flags")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


@attrs.frozen
class BudgetUpdate(_Message):
    """BUDGET_UPDATE (0x36), 40 B."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.BUDGET_UPDATE
    LAYOUT: ClassVar[Layout] = Layout((
        ("operation_id", "Q"), ("compute_units", "Q"), ("memory_bytes", "Q"),
        ("bandwidth_bytes", "Q"), ("token_budget", "I"), ("flags", "I"),
    ))
    operation_id: int = 0
    compute_units: int = 0
    memory_bytes: int = 0
    bandwidth_bytes: int = 0
    token_budget: int = 0
    flags: int = 0

    def validate(self) -> None:
        check_mask(self.flags, 0x03, "budget_update.flags")


@attrs.frozen
class Progress(_Message):
    """PROGRESS (0x37), 32 B."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.PROGRESS
    LAYOUT: ClassVar[Layout] = Layout((
        ("operation_id", "Q"), ("progress_sequence", "Q"), ("stage", "H"),
        ("percent_x100", "H"), ("object_id", "Q"), ("body_bytes", "I"),
    ))
    operation_id: int = 0
    progress_sequence: int = 0
    stage: int = 0
    percent_x100: int = 0xFFFF
    object_id: int = 0
    body_bytes: int = 0

    def validate(self) -> None:
        check(self.percent_x100 <= 10000 or self.percent_x100 == 0xFFFF,
              f"progress.percent_x100 {self.percent_x100} is not <= 10000 or 0xFFFF")
        check(self.stage in _STAGES or self.stage >= STAGE_VENDOR_BASE,
              f"progress.stage {self.stage} is not defined")

    def expected_body_len(self) -> int | None:
        return self.body_bytes


@attrs.frozen
class PartialResult(_Message):
    """PARTIAL_RESULT (0x38), 40 B; body = one raw event (openai-compatible/1)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.PARTIAL_RESULT
    LAYOUT: ClassVar[Layout] = Layout((
        ("operation_id", "Q"), ("result_sequence", "Q"), ("object_id", "Q"),
        ("delta_sequence", "Q"), ("body_bytes", "I"), ("flags", "I"),
    ))
    operation_id: int = 0
    result_sequence: int = 0
    object_id: int = 0
    delta_sequence: int = 0
    body_bytes: int = 0
    flags: int = 0

    def validate(self) -> None:
        check_mask(self.flags, 0x03, "partial_result.flags")

    def expected_body_len(self) -> int | None:
        return self.body_bytes


@attrs.frozen
class _Pressure(_Message):
    LAYOUT: ClassVar[Layout] = Layout((
        ("scope_id", "Q"), ("credit_window", "Q"), ("level", "H"), ("reason", "H"),
        ("retry_after_ms", "I"), ("flags", "I"), (None, "I"),
    ))
    scope_id: int = 0
    credit_window: int = 0
    level: int = 0
    reason: int = 0
    retry_after_ms: int = 0
    flags: int = 0

    def validate(self) -> None:
        check_range(self.level, _PRESSURELEVEL_VALUES, "pressure.level")
        check_mask(self.flags, 0x03, "pressure.flags")


@attrs.frozen
class Backpressure(_Pressure):
    """BACKPRESSURE (0x39)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.BACKPRESSURE


@attrs.frozen
class CreditUpdate(_Pressure):
    """CREDIT_UPDATE (0x3A)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.CREDIT_UPDATE


@attrs.frozen
class _Capability(_Message):
    LAYOUT: ClassVar[Layout] = Layout((
        ("profile_id", "H"), ("capability_count", "H"), ("cost_model", "H"),
        ("preference_rank", "H"), ("limit_bytes", "Q"), ("limit_units", "Q"),
        ("body_bytes", "I"), ("flags", "I"),
    ))
    profile_id: int = 0
    capability_count: int = 0
    cost_model: int = 0
    preference_rank: int = 0
    limit_bytes: int = 0
    limit_units: int = 0
    body_bytes: int = 0
    flags: int = 0

    def validate(self) -> None:
        check_mask(self.flags, 0x03, "capability.flags")

    def expected_body_len(self) -> int | None:
        return self.body_bytes


@attrs.frozen
class CapabilityNegotiation(_Capability):
    """CAPABILITY_NEGOTIATION (0x3B)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.CAPABILITY_NEGOTIATION


@attrs.frozen
class DegradeProfile(_Capability):
    """DEGRADE_PROFILE (0x3C)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.DEGRADE_PROFILE


@attrs.frozen
class _Hint(_Message):
    LAYOUT: ClassVar[Layout] = Layout((
        ("operation_id", "Q"), ("route_id", "I"), ("executor", "H"), ("affinity", "H"),
        ("deadline_unix_ms", "Q"), ("body_bytes", "I"), ("flags", "I"),
    ))
    operation_id: int = 0
    route_id: int = 0
    executor: int = 0
    affinity: int = 0
    deadline_unix_ms: int = 0
    body_bytes: int = 0
    flags: int = 0

    def validate(self) -> None:
        check_mask(self.flags, 0x03, "hint.flags")

    def expected_body_len(self) -> int | None:
        return self.body_bytes


@attrs.frozen
class RouteHint(_Hint):
    """ROUTE_HINT (0x3D)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.ROUTE_HINT


@attrs.frozen
class ExecutionHint(_Hint):
    """EXECUTION_HINT (0x3E)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.EXECUTION_HINT


@attrs.frozen
class TraceContext(_Message):
    """TRACE_CONTEXT (0x3F), 32 B; body = opaque attributes (counted, never logged)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.TRACE_CONTEXT
    LAYOUT: ClassVar[Layout] = Layout((
        ("trace_id", "Q"), ("span_id", "Q"), ("parent_span_id", "Q"), ("stage", "H"),
        ("trace_flags", "H"), ("body_bytes", "I"),
    ))
    trace_id: int = 0
    span_id: int = 0
    parent_span_id: int = 0
    stage: int = 0
    trace_flags: int = 0
    body_bytes: int = 0

    def validate(self) -> None:
        check_mask(self.trace_flags, 0x03, "trace_context.flags")

    def expected_body_len(self) -> int | None:
        return self.body_bytes


@attrs.frozen
class ResultDropReason(_Message):
    """RESULT_DROP_REASON (0x40), 32 B; body = ASCII diagnostic."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.RESULT_DROP_REASON
    LAYOUT: ClassVar[Layout] = Layout((
        ("operation_id", "Q"), ("result_sequence", "Q"), ("drop_reason", "H"),
        ("source_role", "B"), ("flags", "B"), ("diagnostic_bytes", "I"), (None, "Q"),
    ))
    operation_id: int = 0
    result_sequence: int = 0
    drop_reason: int = 0
    source_role: int = 0
    flags: int = 0
    diagnostic_bytes: int = 0

    def validate(self) -> None:
        check_range(self.drop_reason, _DROP_REASONS, "result_drop_reason.drop_reason")
        check_range(self.source_role, _ROLES, "result_drop_reason.source_role")
        check_mask(self.flags, 0x03, "result_drop_reason.flags")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


@attrs.frozen
class ErrorRecoverable(_Message):
    """ERROR_RECOVERABLE (0x48), 32 B."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.ERROR_RECOVERABLE
    LAYOUT: ClassVar[Layout] = Layout((
        ("error_code", "I"), ("scope", "I"), ("recovery_action", "H"), ("role", "B"),
        ("flags", "B"), ("retry_after_ms", "I"), ("related_session_id", "I"),
        ("related_frame_id", "I"), ("related_view_id", "I"), ("diagnostic_bytes", "I"),
    ))
    error_code: int = 0
    scope: int = 0
    recovery_action: int = 0
    role: int = 0
    flags: int = 0
    retry_after_ms: int = 0
    related_session_id: int = 0
    related_frame_id: int = 0
    related_view_id: int = 0
    diagnostic_bytes: int = 0

    def validate(self) -> None:
        check_range(self.scope, _ERRORSCOPE_VALUES, "error_recoverable.scope")
        check_range(self.role, _ROLES, "error_recoverable.role")
        check_mask(self.flags, 0x03, "error_recoverable.flags")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


@attrs.frozen
class RetryAfter(_Message):
    """RETRY_AFTER (0x49), 32 B."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.RETRY_AFTER
    LAYOUT: ClassVar[Layout] = Layout((
        ("scope_id", "Q"), ("control_sequence", "Q"), ("retry_after_ms", "I"),
        ("jitter_ms", "I"), ("reason", "H"), ("role", "B"), ("flags", "B"),
        ("diagnostic_bytes", "I"),
    ))
    scope_id: int = 0
    control_sequence: int = 0
    retry_after_ms: int = 0
    jitter_ms: int = 0
    reason: int = 0
    role: int = 0
    flags: int = 0
    diagnostic_bytes: int = 0

    def validate(self) -> None:
        check_range(self.role, _ROLES, "retry_after.role")
        check_mask(self.flags, 0x03, "retry_after.flags")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


Message = (
    Close | FrameCancel | ResultDrop | Ping | Pong | ClientHello | ServerHelloAck
    | TransportProbe | TransportProbeAck | SessionOpen | SessionOpenAck | SessionClose
    | SessionCloseAck | Error | FrameSubmit | ResultPush | FlowUpdate | ResultHint | Cancel
    | Abort | PriorityUpdate | Deadline | ExpireAt | Supersede | BudgetUpdate | Progress
    | PartialResult | Backpressure | CreditUpdate | CapabilityNegotiation | DegradeProfile
    | RouteHint | ExecutionHint | TraceContext | ResultDropReason | ErrorRecoverable
    | RetryAfter
)

#: Every message type this codec understands, by wire code. Anything else is an
#: unknown type and closes the connection (section 2).
MESSAGE_CLASSES: dict[int, type[Message]] = {
    int(cls.MSG_TYPE): cls
    for cls in (
        Close, FrameCancel, ResultDrop, Ping, Pong, ClientHello, ServerHelloAck,
        TransportProbe, TransportProbeAck, SessionOpen, SessionOpenAck, SessionClose,
        SessionCloseAck, Error, FrameSubmit, ResultPush, FlowUpdate, ResultHint, Cancel, Abort,
        PriorityUpdate, Deadline, ExpireAt, Supersede, BudgetUpdate, Progress, PartialResult,
        Backpressure, CreditUpdate, CapabilityNegotiation, DegradeProfile, RouteHint,
        ExecutionHint, TraceContext, ResultDropReason, ErrorRecoverable, RetryAfter,
    )
}
