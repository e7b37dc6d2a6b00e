"""Metadata of every NNRP/1 preview4 message a Level 1 session exchanges.

One frozen attrs class per message type, its fields in wire order, each declared once
with its struct code and registry (``wire`` and ``reserved`` from ``_layout``; the
layouts are section 3 of docs/reference/nnrp-wire.md). Messages that share a layout (CANCEL and
ABORT, say) share a private base; the concrete classes only bind ``MSG_TYPE``.

Each class offers ``LAYOUT`` (``LAYOUT.size`` is the exact meta_len), ``check`` (rules
between fields; one field's registry is checked by the layout), ``validate`` and
``expected_body_len`` (what body_len must be; ``None`` when the body is typed regions
that a separate parser checks).

Field values are plain ints: the hot path never builds enums. The registries in
``_constants`` name them.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ._constants import (
    PAYLOAD_KIND_MASK,
    SESSION_PATCH_FIELDS,
    STAGE_VENDOR_BASE,
    BudgetFlag,
    BudgetPolicy,
    CacheAckStatus,
    CacheInvalidateScope,
    CacheMissReason,
    CacheObjectKind,
    CacheReuseScope,
    CancelFlag,
    CapabilityFlag,
    CloseAckStatus,
    CloseReason,
    ControlReason,
    DropFlag,
    DropReason,
    ErrorCode,
    ErrorScope,
    FlowBackpressure,
    FlowFlag,
    FlowReason,
    FlowScope,
    HintFlag,
    InFlightPolicy,
    InputProfile,
    LossTolerance,
    MemoryLocationHint,
    MsgType,
    ObjectDeltaFlag,
    ObjectRefFlag,
    ObjectReleaseFlag,
    ObjectReleaseReason,
    OwnershipHint,
    PartialFlag,
    PatchAckStatus,
    PatchRejectReason,
    PayloadKind,
    PressureFlag,
    PressureLevel,
    PriorityClass,
    RecoverableFlag,
    ResultClass,
    ResultFlag,
    ResultHintBudgetPolicy,
    ResultHintCongestion,
    ResultHintReason,
    RetryScopeFlag,
    Role,
    RuntimeObjectKind,
    SchedulingFlag,
    SessionOpenStatus,
    Stage,
    SubmitMode,
    SupersedeFlag,
    TileIndexMode,
    TraceFlag,
    TransportId,
)
from ._layout import Reserved, WireMessage, check, message, reserved, wire

_ALL_BUDGET_BITS = int(BudgetPolicy.ALLOW_PARTIAL | BudgetPolicy.ALLOW_STALE_REUSE
                       | BudgetPolicy.ALLOW_DEGRADED | BudgetPolicy.ALLOW_DROP)
_ALL_RESULT_FLAGS = int(ResultFlag.STALE | ResultFlag.FALLBACK | ResultFlag.PARTIAL)
_SESSION_FLAGS = 0x0F  # bit0 allow_resume; bits 1-3 defined by the SDK contract
_SESSION_FLAGS_ACK = 0x1F  # bit0 resume_enabled
_BOOLEAN = range(2)
_TENSOR = int(PayloadKind.TENSOR)  # a plain int: IntFlag arithmetic costs ~0.5 us per use
_STALE = int(ResultFlag.STALE)
_PARTIAL = int(ResultFlag.PARTIAL)


# --------------------------------------------------------------------------- header-only


@attrs.frozen
class _HeaderOnly(WireMessage):
    pass


@message(MsgType.CLOSE)
@attrs.frozen
class Close(_HeaderOnly):
    """CLOSE (0x05): the connection is going away."""


@message(MsgType.FRAME_CANCEL)
@attrs.frozen
class FrameCancel(_HeaderOnly):
    """FRAME_CANCEL (0x11): cancel the operation bound to header.frame_id."""


@message(MsgType.RESULT_DROP)
@attrs.frozen
class ResultDrop(_HeaderOnly):
    """RESULT_DROP (0x13): header-only drop of header.frame_id's result."""


@message(MsgType.PING)
@attrs.frozen
class Ping(_HeaderOnly):
    """PING (0x20). The reference runtime does not auto-PONG; we do."""


@message(MsgType.PONG)
@attrs.frozen
class Pong(_HeaderOnly):
    """PONG (0x21)."""


# --------------------------------------------------------------------------- handshake


@message(MsgType.CLIENT_HELLO)
@attrs.frozen
class ClientHello(WireMessage):
    """CLIENT_HELLO (0x01), 64 B."""

    min_version: int = wire("B", 1)
    max_version: int = wire("B", 1)
    wire_format_bitmap: int = wire("H", 1)
    profile_bitmap: int = wire("I")
    payload_kind_bitmap: int = wire("I")
    codec_bitmap: int = wire("I")
    compression_bitmap: int = wire("I")
    dtype_bitmap: int = wire("I")
    layout_bitmap: int = wire("I")
    cache_digest_bitmap: int = wire("H")
    cache_object_bitmap: int = wire("H")
    cache_namespace_count: int = wire("H")
    max_lane_count: int = wire("H")
    max_cache_entries: int = wire("I")
    max_cache_bytes: int = wire("I")
    cadence_x100: int = wire("H")
    latency_budget_ms: int = wire("H")
    quality_tier: int = wire("H")
    degrade_policy: int = wire("H")
    requested_session_id: int = wire("I")
    auth_bytes: int = wire("I")
    control_extension_bytes: int = wire("I")

    def check(self) -> None:
        check(self.min_version <= self.max_version,
              f"client_hello: min_version {self.min_version} > max_version {self.max_version}")

    def expected_body_len(self) -> int | None:
        return self.auth_bytes + self.control_extension_bytes


@message(MsgType.SERVER_HELLO_ACK)
@attrs.frozen
class ServerHelloAck(WireMessage):
    """SERVER_HELLO_ACK (0x02), 80 B."""

    selected_version: int = wire("B", 1)
    selected_wire_format: int = wire("B")
    auth_status: int = wire("B")
    _reserved: ClassVar[Reserved] = reserved("B")
    session_id: int = wire("I")
    accepted_profile_bitmap: int = wire("I")
    accepted_payload_kind_bitmap: int = wire("I")
    accepted_codec_bitmap: int = wire("I")
    accepted_compression_bitmap: int = wire("I")
    accepted_dtype_bitmap: int = wire("I")
    accepted_layout_bitmap: int = wire("I")
    cache_digest_bitmap: int = wire("I")
    cache_object_bitmap: int = wire("I")
    max_cache_entries: int = wire("I")
    max_cache_bytes: int = wire("I")
    max_lane_count: int = wire("H")
    max_concurrent_frames: int = wire("H")
    cadence_x100: int = wire("H")
    latency_budget_ms: int = wire("H")
    quality_tier: int = wire("H")
    degrade_policy: int = wire("H")
    max_body_bytes: int = wire("I")
    token_ttl_ms: int = wire("I")
    retry_after_ms: int = wire("I")
    control_extension_bytes: int = wire("I")
    server_flags: int = wire("I")

    def expected_body_len(self) -> int | None:
        return self.control_extension_bytes


@attrs.frozen
class _Probe(WireMessage):
    probe_id: int = wire("I")
    payload_bytes: int = wire("I")
    timestamp_us: int = wire("Q")

    def expected_body_len(self) -> int | None:
        return self.payload_bytes


@message(MsgType.TRANSPORT_PROBE)
@attrs.frozen
class TransportProbe(_Probe):
    """TRANSPORT_PROBE (0x19), 16 B; may precede the hello."""


@message(MsgType.TRANSPORT_PROBE_ACK)
@attrs.frozen
class TransportProbeAck(_Probe):
    """TRANSPORT_PROBE_ACK (0x1A), 16 B."""


# --------------------------------------------------------------------------- sessions


@message(MsgType.SESSION_OPEN)
@attrs.frozen
class SessionOpen(WireMessage):
    """SESSION_OPEN (0x07), 48 B. Body = resume token ‖ auth ‖ session extension."""

    requested_session_id: int = wire("I")
    profile_id: int = wire("H")
    priority_class: int = wire("B", allowed=PriorityClass)
    session_flags: int = wire("B", mask=_SESSION_FLAGS)
    schema_id: int = wire("I")
    schema_version: int = wire("I")
    default_deadline_ms: int = wire("I")
    max_in_flight: int = wire("H")
    _reserved: ClassVar[Reserved] = reserved("H")
    lease_ttl_hint_ms: int = wire("I")
    resume_token_bytes: int = wire("I")
    auth_bytes: int = wire("I")
    session_extension_bytes: int = wire("I")
    client_session_tag: int = wire("Q")

    def expected_body_len(self) -> int | None:
        return self.resume_token_bytes + self.auth_bytes + self.session_extension_bytes


@message(MsgType.SESSION_OPEN_ACK)
@attrs.frozen
class SessionOpenAck(WireMessage):
    """SESSION_OPEN_ACK (0x08), 56 B. A rejection carries a UTF-8 diagnostic body."""

    session_id: int = wire("I")
    profile_id: int = wire("H")
    priority_class: int = wire("B", allowed=PriorityClass)
    status: int = wire("B", allowed=SessionOpenStatus)
    schema_id: int = wire("I")
    schema_version: int = wire("I")
    granted_operation_credit: int = wire("H")
    max_in_flight: int = wire("H")
    lease_ttl_ms: int = wire("I")
    resume_window_ms: int = wire("I")
    resume_token_bytes: int = wire("I")
    session_extension_bytes: int = wire("I")
    server_session_tag: int = wire("Q")
    route_scope_id: int = wire("I")
    session_error_code: int = wire("I")
    session_flags_ack: int = wire("I", mask=_SESSION_FLAGS_ACK)

    def expected_body_len(self) -> int | None:
        # Opened: token ‖ extension; rejected: those plus a free-form diagnostic.
        return None


@message(MsgType.SESSION_CLOSE)
@attrs.frozen
class SessionClose(WireMessage):
    """SESSION_CLOSE (0x09), 24 B; client to server only."""

    reason: int = wire("H", allowed=CloseReason)
    in_flight_policy: int = wire("B", allowed=InFlightPolicy)
    _reserved: ClassVar[Reserved] = reserved("B")
    drain_timeout_ms: int = wire("I")
    last_operation_id: int = wire("Q")
    session_error_code: int = wire("I")
    close_tag: int = wire("I")


@message(MsgType.SESSION_CLOSE_ACK)
@attrs.frozen
class SessionCloseAck(WireMessage):
    """SESSION_CLOSE_ACK (0x0A), 16 B."""

    status: int = wire("B", allowed=CloseAckStatus)
    _reserved_byte: ClassVar[Reserved] = reserved("B")
    _reserved_short: ClassVar[Reserved] = reserved("H")
    last_operation_id: int = wire("Q")
    session_error_code: int = wire("I")


@message(MsgType.ERROR)
@attrs.frozen
class Error(WireMessage):
    """ERROR (0x06), 32 B; body = UTF-8 diagnostic."""

    code: int = wire("I", int(ErrorCode.INTERNAL_ERROR), allowed=ErrorCode)
    scope: int = wire("I", allowed=ErrorScope)
    is_fatal: int = wire("I", allowed=_BOOLEAN)
    retry_after_ms: int = wire("I")
    related_session_id: int = wire("I")
    related_frame_id: int = wire("I")
    related_view_id: int = wire("I")
    diagnostic_bytes: int = wire("I")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


# --------------------------------------------------------------------------- data


@message(MsgType.FRAME_SUBMIT)
@attrs.frozen
class FrameSubmit(WireMessage):
    """FRAME_SUBMIT (0x10), 72 B; the body is a typed body (see ``_body``)."""

    src_width: int = wire("H")
    src_height: int = wire("H")
    tile_width: int = wire("H")
    tile_height: int = wire("H")
    tile_count: int = wire("H")
    section_count: int = wire("H")
    frame_class: int = wire("B")
    input_profile: int = wire("B", allowed=InputProfile)
    # The SDK's builder sets raw_u16 (1) even without tensors (docs/reference/nnrp-wire.md section
    # 6).
    tile_index_mode: int = wire("B", int(TileIndexMode.RAW_U16), allowed=TileIndexMode)
    _reserved_byte: ClassVar[Reserved] = reserved("B")
    latency_budget_ms: int = wire("H")
    target_fps_x100: int = wire("H")
    retry_of_frame: int = wire("I")
    tile_base_id: int = wire("I")
    camera_bytes: int = wire("I")
    tile_index_bytes: int = wire("I")
    _reserved_word: ClassVar[Reserved] = reserved("I")
    operation_id: int = wire("Q")
    _reserved_word_2: ClassVar[Reserved] = reserved("I")
    submit_mode: int = wire("B", allowed=SubmitMode)
    budget_policy: int = wire("B", mask=_ALL_BUDGET_BITS)
    loss_tolerance: int = wire("B", int(LossTolerance.INHERIT), allowed=LossTolerance)
    _reserved_byte_2: ClassVar[Reserved] = reserved("B")
    object_ref_mask: int = wire("I")
    dependency_frame_id: int = wire("I")
    payload_kind_bitmap: int = wire("I", mask=PAYLOAD_KIND_MASK)
    payload_frame_count: int = wire("H")
    _reserved_short: ClassVar[Reserved] = reserved("H")

    def check(self) -> None:
        check(self.operation_id != 0, "frame_submit.operation_id must be non-zero")
        if not self.payload_kind_bitmap & _TENSOR:
            check(not (self.src_width or self.src_height or self.tile_width
                       or self.tile_height or self.tile_count or self.section_count
                       or self.input_profile or self.tile_base_id or self.camera_bytes
                       or self.tile_index_bytes),
                  "frame_submit: tensor fields must be 0 without a tensor payload")

    def expected_body_len(self) -> int | None:
        return None


@message(MsgType.RESULT_PUSH)
@attrs.frozen
class ResultPush(WireMessage):
    """RESULT_PUSH (0x12), 64 B; the body is a typed body."""

    status_code: int = wire("H", 200)
    result_flags: int = wire("H", mask=_ALL_RESULT_FLAGS)
    section_count: int = wire("H")
    tile_count: int = wire("H")
    active_profile_id: int = wire("H")
    _reserved_short: ClassVar[Reserved] = reserved("H")
    inference_ms: int = wire("H")
    queue_ms: int = wire("H")
    server_total_ms: int = wire("H")
    _reserved_short_2: ClassVar[Reserved] = reserved("H")
    tile_base_id: int = wire("I")
    tile_index_bytes: int = wire("I")
    _reserved_quad: ClassVar[Reserved] = reserved("Q")
    _reserved_quad_2: ClassVar[Reserved] = reserved("Q")
    result_class: int = wire("B", allowed=ResultClass)
    applied_budget: int = wire("B", mask=_ALL_BUDGET_BITS)
    _reserved_short_3: ClassVar[Reserved] = reserved("H")
    reused_frame_id: int = wire("I")
    covered_tiles: int = wire("H")
    dropped_tiles: int = wire("H")
    payload_kind_bitmap: int = wire("I", mask=PAYLOAD_KIND_MASK)
    payload_frame_count: int = wire("H")
    _reserved_short_4: ClassVar[Reserved] = reserved("H")

    def check(self) -> None:
        stale = self.result_class == ResultClass.STALE_REUSE or bool(self.result_flags & _STALE)
        check(stale == (self.reused_frame_id != 0),
              "result_push: stale semantics and a non-zero reused_frame_id must agree")
        if not self.payload_kind_bitmap & _TENSOR:
            check(not any((self.section_count, self.tile_count, self.tile_base_id,
                           self.tile_index_bytes, self.covered_tiles, self.dropped_tiles)),
                  "result_push: tensor fields must be 0 without a tensor payload")
            return
        partial = self.result_class == ResultClass.PARTIAL or bool(self.result_flags & _PARTIAL)
        check(not partial or self.dropped_tiles > 0,
              "result_push: a partial result needs dropped_tiles > 0")
        check(self.covered_tiles + self.dropped_tiles == self.tile_count,
              "result_push: covered_tiles + dropped_tiles must equal tile_count")

    def expected_body_len(self) -> int | None:
        return None


# --------------------------------------------------------------------------- flow


@message(MsgType.FLOW_UPDATE)
@attrs.frozen
class FlowUpdate(WireMessage):
    """FLOW_UPDATE (0x17), 32 B."""

    scope: int = wire("B", allowed=FlowScope)
    reason: int = wire("B", allowed=FlowReason)
    backpressure: int = wire("B", allowed=FlowBackpressure)
    _reserved_byte: ClassVar[Reserved] = reserved("B")
    connection_credit: int = wire("H")
    session_credit: int = wire("H")
    operation_credit: int = wire("H")
    _reserved_short: ClassVar[Reserved] = reserved("H")
    operation_id: int = wire("Q")
    retry_after_ms: int = wire("I")
    credit_epoch: int = wire("I")
    flags: int = wire("I", mask=int(FlowFlag.CREDIT_VALID | FlowFlag.RETRY_AFTER_VALID
                                    | FlowFlag.BACKGROUND_ONLY | FlowFlag.DRAIN_IN_FLIGHT_ONLY))

    def check(self) -> None:
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


@message(MsgType.RESULT_HINT)
@attrs.frozen
class ResultHint(WireMessage):
    """RESULT_HINT (0x18), 16 B."""

    budget_policy: int = wire("I", allowed=ResultHintBudgetPolicy)
    congestion: int = wire("I", allowed=ResultHintCongestion)
    reason: int = wire("I", allowed=ResultHintReason)
    retry_after_ms: int = wire("I")


# --------------------------------------------------------------------------- runtime control


@attrs.frozen
class _ControlRequest(WireMessage):
    operation_id: int = wire("Q")
    control_sequence: int = wire("Q")
    reason: int = wire("H", allowed=ControlReason)
    source_role: int = wire("B", allowed=Role)
    flags: int = wire("B", mask=int(CancelFlag.COOPERATIVE | CancelFlag.HARD))
    diagnostic_bytes: int = wire("I")
    _reserved: ClassVar[Reserved] = reserved("Q")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


@message(MsgType.CANCEL)
@attrs.frozen
class Cancel(_ControlRequest):
    """CANCEL (0x30): operation_id 0 cancels the whole session."""


@message(MsgType.ABORT)
@attrs.frozen
class Abort(_ControlRequest):
    """ABORT (0x31): like CANCEL, without cooperation."""


@attrs.frozen
class _Scheduling(WireMessage):
    operation_id: int = wire("Q")
    control_sequence: int = wire("Q")
    priority_class: int = wire("H")
    priority_delta: int = wire("h")
    deadline_unix_ms: int = wire("Q")
    flags: int = wire("I", mask=int(SchedulingFlag.DISCARD_STALE
                                    | SchedulingFlag.EMIT_DROP_REASON))


@message(MsgType.PRIORITY_UPDATE)
@attrs.frozen
class PriorityUpdate(_Scheduling):
    """PRIORITY_UPDATE (0x32). priority_class is a plain u16 here, not SESSION_OPEN's 0-2
    registry: the suite's priority-deadline case sends 10, and nnrp-py accepts it."""


@message(MsgType.DEADLINE)
@attrs.frozen
class Deadline(_Scheduling):
    """DEADLINE (0x33): absolute unix-ms deadline; may arrive before its submit."""

    def check(self) -> None:
        check(self.deadline_unix_ms != 0, "deadline.deadline_unix_ms must be non-zero")


@message(MsgType.EXPIRE_AT)
@attrs.frozen
class ExpireAt(_Scheduling):
    """EXPIRE_AT (0x34): like DEADLINE; the wire case expects drop code superseded."""

    def check(self) -> None:
        check(self.deadline_unix_ms != 0, "expire_at.deadline_unix_ms must be non-zero")


@message(MsgType.SUPERSEDE)
@attrs.frozen
class Supersede(WireMessage):
    """SUPERSEDE (0x35), 32 B."""

    old_operation_id: int = wire("Q")
    new_operation_id: int = wire("Q")
    control_sequence: int = wire("Q")
    drop_reason: int = wire("H", allowed=DropReason)
    flags: int = wire("H", mask=int(SupersedeFlag.ABORT_OLD_IMMEDIATELY))
    diagnostic_bytes: int = wire("I")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


@message(MsgType.BUDGET_UPDATE)
@attrs.frozen
class BudgetUpdate(WireMessage):
    """BUDGET_UPDATE (0x36), 40 B."""

    operation_id: int = wire("Q")
    compute_units: int = wire("Q")
    memory_bytes: int = wire("Q")
    bandwidth_bytes: int = wire("Q")
    token_budget: int = wire("I")
    flags: int = wire("I", mask=int(BudgetFlag.REPLACE | BudgetFlag.INCREMENT))


@message(MsgType.PROGRESS)
@attrs.frozen
class Progress(WireMessage):
    """PROGRESS (0x37), 32 B."""

    operation_id: int = wire("Q")
    progress_sequence: int = wire("Q")
    stage: int = wire("H")
    percent_x100: int = wire("H", 0xFFFF)  # 0xFFFF: unknown
    object_id: int = wire("Q")
    body_bytes: int = wire("I")

    def check(self) -> None:
        check(self.percent_x100 <= 10000 or self.percent_x100 == 0xFFFF,
              f"progress.percent_x100 {self.percent_x100} is not <= 10000 or 0xFFFF")
        check(self.stage in _STAGES or self.stage >= STAGE_VENDOR_BASE,
              f"progress.stage {self.stage} is not defined")

    def expected_body_len(self) -> int | None:
        return self.body_bytes


_STAGES = frozenset(int(s) for s in Stage)


@message(MsgType.PARTIAL_RESULT)
@attrs.frozen
class PartialResult(WireMessage):
    """PARTIAL_RESULT (0x38), 40 B; body = one raw event (openai-compatible/1)."""

    operation_id: int = wire("Q")
    result_sequence: int = wire("Q")
    object_id: int = wire("Q")
    delta_sequence: int = wire("Q")
    body_bytes: int = wire("I")
    flags: int = wire("I", mask=int(PartialFlag.FINAL_PARTIAL | PartialFlag.OBJECT_REF))

    def expected_body_len(self) -> int | None:
        return self.body_bytes


@attrs.frozen
class _Pressure(WireMessage):
    scope_id: int = wire("Q")
    credit_window: int = wire("Q")
    level: int = wire("H", allowed=PressureLevel)
    reason: int = wire("H")
    retry_after_ms: int = wire("I")
    flags: int = wire("I", mask=int(PressureFlag.CONNECTION | PressureFlag.OPERATION))
    _reserved: ClassVar[Reserved] = reserved("I")


@message(MsgType.BACKPRESSURE)
@attrs.frozen
class Backpressure(_Pressure):
    """BACKPRESSURE (0x39). Level none is CREDIT_UPDATE's: BACKPRESSURE says there is
    pressure (soft, hard or paused), and nnrp-py's native peers refuse level 0 in it."""

    def check(self) -> None:
        check(self.level != PressureLevel.NONE, "backpressure.level must be 1..3")


@message(MsgType.CREDIT_UPDATE)
@attrs.frozen
class CreditUpdate(_Pressure):
    """CREDIT_UPDATE (0x3A)."""


@attrs.frozen
class _Capability(WireMessage):
    profile_id: int = wire("H")
    capability_count: int = wire("H")
    cost_model: int = wire("H")
    preference_rank: int = wire("H")
    limit_bytes: int = wire("Q")
    limit_units: int = wire("Q")
    body_bytes: int = wire("I")
    flags: int = wire("I", mask=int(CapabilityFlag.HARD_REQUIREMENT
                                    | CapabilityFlag.DOWNGRADE_ALLOWED))

    def expected_body_len(self) -> int | None:
        return self.body_bytes


@message(MsgType.CAPABILITY_NEGOTIATION)
@attrs.frozen
class CapabilityNegotiation(_Capability):
    """CAPABILITY_NEGOTIATION (0x3B)."""


@message(MsgType.DEGRADE_PROFILE)
@attrs.frozen
class DegradeProfile(_Capability):
    """DEGRADE_PROFILE (0x3C)."""


@attrs.frozen
class _Hint(WireMessage):
    operation_id: int = wire("Q")
    route_id: int = wire("I")
    executor: int = wire("H")
    affinity: int = wire("H")
    deadline_unix_ms: int = wire("Q")
    body_bytes: int = wire("I")
    flags: int = wire("I", mask=int(HintFlag.MUST_HONOR | HintFlag.BEST_EFFORT))

    def expected_body_len(self) -> int | None:
        return self.body_bytes


@message(MsgType.ROUTE_HINT)
@attrs.frozen
class RouteHint(_Hint):
    """ROUTE_HINT (0x3D)."""


@message(MsgType.EXECUTION_HINT)
@attrs.frozen
class ExecutionHint(_Hint):
    """EXECUTION_HINT (0x3E)."""


@message(MsgType.TRACE_CONTEXT)
@attrs.frozen
class TraceContext(WireMessage):
    """TRACE_CONTEXT (0x3F), 32 B; body = opaque attributes (counted, never logged)."""

    trace_id: int = wire("Q")
    span_id: int = wire("Q")
    parent_span_id: int = wire("Q")
    stage: int = wire("H")
    trace_flags: int = wire("H", mask=int(TraceFlag.SAMPLED | TraceFlag.ERROR))
    body_bytes: int = wire("I")

    def expected_body_len(self) -> int | None:
        return self.body_bytes


@message(MsgType.RESULT_DROP_REASON)
@attrs.frozen
class ResultDropReason(WireMessage):
    """RESULT_DROP_REASON (0x40), 32 B; body = ASCII diagnostic."""

    operation_id: int = wire("Q")
    result_sequence: int = wire("Q")
    drop_reason: int = wire("H", allowed=DropReason)
    source_role: int = wire("B", allowed=Role)
    flags: int = wire("B", mask=int(DropFlag.FINAL | DropFlag.RETRYABLE))
    diagnostic_bytes: int = wire("I")
    _reserved: ClassVar[Reserved] = reserved("Q")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


@message(MsgType.ERROR_RECOVERABLE)
@attrs.frozen
class ErrorRecoverable(WireMessage):
    """ERROR_RECOVERABLE (0x48), 32 B."""

    error_code: int = wire("I")
    scope: int = wire("I", allowed=ErrorScope)
    recovery_action: int = wire("H")
    role: int = wire("B", allowed=Role)
    flags: int = wire("B", mask=int(RecoverableFlag.RETRYABLE_NOW
                                    | RecoverableFlag.RETRY_AFTER_REQUIRED))
    retry_after_ms: int = wire("I")
    related_session_id: int = wire("I")
    related_frame_id: int = wire("I")
    related_view_id: int = wire("I")
    diagnostic_bytes: int = wire("I")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


@message(MsgType.RETRY_AFTER)
@attrs.frozen
class RetryAfter(WireMessage):
    """RETRY_AFTER (0x49), 32 B."""

    scope_id: int = wire("Q")
    control_sequence: int = wire("Q")
    retry_after_ms: int = wire("I")
    jitter_ms: int = wire("I")
    reason: int = wire("H", allowed=ControlReason)
    role: int = wire("B", allowed=Role)
    flags: int = wire("B", mask=int(RetryScopeFlag.CONNECTION | RetryScopeFlag.OPERATION))
    diagnostic_bytes: int = wire("I")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


# --------------------------------------------------------------------------- session patch,
# migration, caches and runtime objects (nnrp-py: core/messages/control.py, runtime/types.py)


@message(MsgType.SESSION_PATCH)
@attrs.frozen
class SessionPatch(WireMessage):
    """SESSION_PATCH (0x03), 36 B; body = the profile patch block."""

    profile_id: int = wire("H")
    _reserved: ClassVar[Reserved] = reserved("H")
    patch_mask: int = wire("I", mask=SESSION_PATCH_FIELDS)
    target_cadence_x100: int = wire("I")
    quality_tier: int = wire("H")
    degrade_policy: int = wire("H")
    active_lane_mask: int = wire("Q")
    preferred_codec_bitmap: int = wire("I")
    preferred_compression_bitmap: int = wire("I")
    profile_patch_bytes: int = wire("I")

    def expected_body_len(self) -> int | None:
        return self.profile_patch_bytes


@message(MsgType.SESSION_PATCH_ACK)
@attrs.frozen
class SessionPatchAck(WireMessage):
    """SESSION_PATCH_ACK (0x04), 48 B."""

    ack_status: int = wire("H", allowed=PatchAckStatus)
    reject_reason: int = wire("H", allowed=PatchRejectReason)
    applied_patch_mask: int = wire("I", mask=SESSION_PATCH_FIELDS)
    rejected_patch_mask: int = wire("I", mask=SESSION_PATCH_FIELDS)
    retry_after_ms: int = wire("I")
    effective_profile_id: int = wire("H")
    _reserved: ClassVar[Reserved] = reserved("H")
    effective_target_cadence_x100: int = wire("I")
    effective_quality_tier: int = wire("H")
    effective_degrade_policy: int = wire("H")
    effective_lane_mask: int = wire("Q")
    effective_codec_bitmap: int = wire("I")
    effective_compression_bitmap: int = wire("I")
    profile_patch_ack_bytes: int = wire("I")

    def expected_body_len(self) -> int | None:
        return self.profile_patch_ack_bytes


@message(MsgType.CACHE_PUT)
@attrs.frozen
class CachePut(WireMessage):
    """CACHE_PUT (0x14), 40 B; body = the object."""

    cache_namespace: int = wire("I")
    object_kind: int = wire("I", allowed=CacheObjectKind)
    cache_key_hi: int = wire("Q")
    cache_key_lo: int = wire("Q")
    ttl_ms: int = wire("I")
    object_bytes: int = wire("I")
    codec_bitmap: int = wire("I")
    flags: int = wire("I", mask=0x03)  # pinned, reusable

    def expected_body_len(self) -> int | None:
        return self.object_bytes


@message(MsgType.CACHE_ACK)
@attrs.frozen
class CacheAck(WireMessage):
    """CACHE_ACK (0x15), 40 B."""

    cache_namespace: int = wire("I")
    status: int = wire("I", allowed=CacheAckStatus)
    cache_key_hi: int = wire("Q")
    cache_key_lo: int = wire("Q")
    accepted_ttl_ms: int = wire("I")
    max_object_bytes: int = wire("I")
    detail_code: int = wire("I")
    _reserved: ClassVar[Reserved] = reserved("I")


@message(MsgType.CACHE_INVALIDATE)
@attrs.frozen
class CacheInvalidate(WireMessage):
    """CACHE_INVALIDATE (0x16), 32 B."""

    scope: int = wire("I", allowed=CacheInvalidateScope)
    cache_namespace: int = wire("I")
    cache_key_hi: int = wire("Q")
    cache_key_lo: int = wire("Q")
    reason_code: int = wire("I")
    _reserved: ClassVar[Reserved] = reserved("I")

    def check(self) -> None:
        # The identity fields a scope leaves out must be zero.
        if self.scope == CacheInvalidateScope.WHOLE_SESSION:
            check(not (self.cache_namespace or self.cache_key_hi or self.cache_key_lo),
                  "cache_invalidate: whole_session scope names no namespace or key")
        elif self.scope == CacheInvalidateScope.NAMESPACE:
            check(not (self.cache_key_hi or self.cache_key_lo),
                  "cache_invalidate: namespace scope names no key")
        elif self.scope == CacheInvalidateScope.OBJECT_KIND:
            check(self.cache_key_hi <= 0xFFFFFFFF and not self.cache_key_lo,
                  "cache_invalidate: object_kind scope names a kind, not a key")


@message(MsgType.SESSION_MIGRATE)
@attrs.frozen
class SessionMigrate(WireMessage):
    """SESSION_MIGRATE (0x1B), 24 B."""

    old_transport_id: int = wire("I", allowed=TransportId)
    new_transport_id: int = wire("I", allowed=TransportId)
    last_result_frame_id: int = wire("Q")
    client_migrate_ts_us: int = wire("Q")

    def expected_body_len(self) -> int | None:
        # The migration token (preview2 section 10.4, step 3: "after validating the
        # session_id and migration token"). The layout has no length field for it, and
        # nnrp-py's builder takes a free body: here it is the session's resume token.
        return None


@message(MsgType.SESSION_MIGRATE_ACK)
@attrs.frozen
class SessionMigrateAck(WireMessage):
    """SESSION_MIGRATE_ACK (0x1C), 24 B (the u64 at offset 4 is unaligned, as specified).
    accept_code 0 means accepted (nnrp-py's client); the spec gives no other values."""

    accept_code: int = wire("I")
    resume_from_frame_id: int = wire("Q")
    grace_window_ms: int = wire("I")
    server_migrate_ts_us: int = wire("Q")

    def expected_body_len(self) -> int | None:
        # As SESSION_MIGRATE's body is the migration token, an accepted migration's
        # ACK may carry the session's next one (this gateway rotates it:
        # gateway/nnrp/_resumption.py R9); the layout has no length field for it.
        return None


@message(MsgType.OBJECT_DECLARE)
@attrs.frozen
class ObjectDeclare(WireMessage):
    """OBJECT_DECLARE (0x41), 48 B; body = object metadata."""

    object_id: int = wire("Q")
    object_kind: int = wire("H", allowed=RuntimeObjectKind)
    producer_role: int = wire("B", allowed=Role)
    consumer_role: int = wire("B", allowed=Role)
    session_id: int = wire("I")
    byte_size: int = wire("Q")
    compute_cost_units: int = wire("I")
    memory_location_hint: int = wire("H", allowed=MemoryLocationHint)
    ownership_hint: int = wire("H", allowed=OwnershipHint)
    lifetime_hint_ms: int = wire("I")
    metadata_bytes: int = wire("I")
    _reserved: ClassVar[Reserved] = reserved("Q")

    def expected_body_len(self) -> int | None:
        return self.metadata_bytes


@message(MsgType.OBJECT_REF)
@attrs.frozen
class ObjectRef(WireMessage):
    """OBJECT_REF (0x42), 48 B; body = reference metadata."""

    object_id: int = wire("Q")
    operation_id: int = wire("Q")
    object_version: int = wire("Q")
    offset: int = wire("Q")
    length: int = wire("Q")
    flags: int = wire("I", mask=int(ObjectRefFlag.BORROWED | ObjectRefFlag.MUTABLE
                                    | ObjectRefFlag.REGION_PRESENT))
    metadata_bytes: int = wire("I")

    def expected_body_len(self) -> int | None:
        return self.metadata_bytes


@message(MsgType.OBJECT_RELEASE)
@attrs.frozen
class ObjectRelease(WireMessage):
    """OBJECT_RELEASE (0x43), 32 B; body = ASCII diagnostic."""

    object_id: int = wire("Q")
    operation_id: int = wire("Q")
    release_reason: int = wire("H", allowed=ObjectReleaseReason)
    source_role: int = wire("B", allowed=Role)
    flags: int = wire("B", mask=int(ObjectReleaseFlag.FINAL_RELEASE
                                    | ObjectReleaseFlag.INVALIDATES_DEPENDENTS))
    diagnostic_bytes: int = wire("I")
    _reserved: ClassVar[Reserved] = reserved("Q")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


@attrs.frozen
class _ObjectDelta(WireMessage):
    object_id: int = wire("Q")
    delta_sequence: int = wire("Q")
    region_offset: int = wire("Q")
    region_bytes: int = wire("I")
    delta_bytes: int = wire("I")
    flags: int = wire("I", mask=int(ObjectDeltaFlag.REPLACES_REGION
                                    | ObjectDeltaFlag.COMPRESSED | ObjectDeltaFlag.FINAL_DELTA))
    metadata_bytes: int = wire("I")

    def expected_body_len(self) -> int | None:
        return self.metadata_bytes + self.delta_bytes


@message(MsgType.OBJECT_PATCH)
@attrs.frozen
class ObjectPatch(_ObjectDelta):
    """OBJECT_PATCH (0x44), 40 B; body = metadata ‖ patch bytes."""


@message(MsgType.OBJECT_DELTA)
@attrs.frozen
class ObjectDelta(_ObjectDelta):
    """OBJECT_DELTA (0x45), 40 B; body = metadata ‖ delta bytes."""


@message(MsgType.CACHE_REFERENCE)
@attrs.frozen
class CacheReference(WireMessage):
    """CACHE_REFERENCE (0x46), 56 B; body = reference metadata."""

    cache_namespace: int = wire("I")
    profile_id: int = wire("H")
    reuse_scope: int = wire("H", allowed=CacheReuseScope)
    cache_key_hi: int = wire("Q")
    cache_key_lo: int = wire("Q")
    lease_id: int = wire("Q")
    producer_trace_id: int = wire("Q")
    expiration_hint_ms: int = wire("I")
    metadata_bytes: int = wire("I")
    flags: int = wire("I", mask=0x03)  # lease required, body fallback
    _reserved: ClassVar[Reserved] = reserved("I")

    def expected_body_len(self) -> int | None:
        return self.metadata_bytes


@message(MsgType.CACHE_MISS)
@attrs.frozen
class CacheMiss(WireMessage):
    """CACHE_MISS (0x47), 32 B; body = ASCII diagnostic."""

    cache_namespace: int = wire("I")
    profile_id: int = wire("H")
    miss_reason: int = wire("H", allowed=CacheMissReason)
    cache_key_hi: int = wire("Q")
    cache_key_lo: int = wire("Q")
    diagnostic_bytes: int = wire("I")
    _reserved: ClassVar[Reserved] = reserved("I")

    def expected_body_len(self) -> int | None:
        return self.diagnostic_bytes


Message = (
    Close | FrameCancel | ResultDrop | Ping | Pong | ClientHello | ServerHelloAck
    | TransportProbe | TransportProbeAck | SessionOpen | SessionOpenAck | SessionClose
    | SessionCloseAck | Error | FrameSubmit | ResultPush | FlowUpdate | ResultHint | Cancel
    | Abort | PriorityUpdate | Deadline | ExpireAt | Supersede | BudgetUpdate | Progress
    | PartialResult | Backpressure | CreditUpdate | CapabilityNegotiation | DegradeProfile
    | RouteHint | ExecutionHint | TraceContext | ResultDropReason | ErrorRecoverable
    | RetryAfter | SessionPatch | SessionPatchAck | CachePut | CacheAck | CacheInvalidate
    | SessionMigrate | SessionMigrateAck | ObjectDeclare | ObjectRef | ObjectRelease
    | ObjectPatch | ObjectDelta | CacheReference | CacheMiss
)

#: Every message type preview4 defines, by wire code. Anything else is an unknown type
#: and closes the connection (section 2).
MESSAGE_CLASSES: dict[int, type[Message]] = {
    int(cls.MSG_TYPE): cls
    for cls in (
        Close, FrameCancel, ResultDrop, Ping, Pong, ClientHello, ServerHelloAck,
        TransportProbe, TransportProbeAck, SessionOpen, SessionOpenAck, SessionClose,
        SessionCloseAck, Error, FrameSubmit, ResultPush, FlowUpdate, ResultHint, Cancel, Abort,
        PriorityUpdate, Deadline, ExpireAt, Supersede, BudgetUpdate, Progress, PartialResult,
        Backpressure, CreditUpdate, CapabilityNegotiation, DegradeProfile, RouteHint,
        ExecutionHint, TraceContext, ResultDropReason, ErrorRecoverable, RetryAfter,
        SessionPatch, SessionPatchAck, CachePut, CacheAck, CacheInvalidate, SessionMigrate,
        SessionMigrateAck, ObjectDeclare, ObjectRef, ObjectRelease, ObjectPatch, ObjectDelta,
        CacheReference, CacheMiss,
    )
}
assert set(MESSAGE_CLASSES) == {int(t) for t in MsgType}, "a preview4 type has no class"
