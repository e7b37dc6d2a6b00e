"""NNRP/1 preview4 registries: message types, flags, error codes and enum ranges.

Every number here is a wire value; each comment names the section of
``docs/reference/nnrp-wire.md`` (the project's digest of the spec) it comes from.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

MAGIC = b"NNRP"
VERSION_MAJOR = 1
WIRE_FORMAT = 0
HEADER_LEN = 40

#: Largest packet the protocol allows (section 1); a bigger one is fatal.
PROTOCOL_MAX_PACKET = 64 * 1024 * 1024
#: Our default cap: a submit may carry up to the protocol's largest packet (heavy media:
#: docs/media.md); a connection buffers at most one packet (an oversized submit is
#: discarded as it arrives: ``_codec``), so memory is this times the connections at most.
DEFAULT_MAX_PACKET = PROTOCOL_MAX_PACKET


class MsgType(IntEnum):
    """msg_type codes (section 2)."""

    CLIENT_HELLO = 0x01
    SERVER_HELLO_ACK = 0x02
    SESSION_PATCH = 0x03
    SESSION_PATCH_ACK = 0x04
    CLOSE = 0x05
    ERROR = 0x06
    SESSION_OPEN = 0x07
    SESSION_OPEN_ACK = 0x08
    SESSION_CLOSE = 0x09
    SESSION_CLOSE_ACK = 0x0A
    FRAME_SUBMIT = 0x10
    FRAME_CANCEL = 0x11
    RESULT_PUSH = 0x12
    RESULT_DROP = 0x13
    CACHE_PUT = 0x14
    CACHE_ACK = 0x15
    CACHE_INVALIDATE = 0x16
    FLOW_UPDATE = 0x17
    RESULT_HINT = 0x18
    TRANSPORT_PROBE = 0x19
    TRANSPORT_PROBE_ACK = 0x1A
    SESSION_MIGRATE = 0x1B
    SESSION_MIGRATE_ACK = 0x1C
    PING = 0x20
    PONG = 0x21
    CANCEL = 0x30
    ABORT = 0x31
    PRIORITY_UPDATE = 0x32
    DEADLINE = 0x33
    EXPIRE_AT = 0x34
    SUPERSEDE = 0x35
    BUDGET_UPDATE = 0x36
    PROGRESS = 0x37
    PARTIAL_RESULT = 0x38
    BACKPRESSURE = 0x39
    CREDIT_UPDATE = 0x3A
    CAPABILITY_NEGOTIATION = 0x3B
    DEGRADE_PROFILE = 0x3C
    ROUTE_HINT = 0x3D
    EXECUTION_HINT = 0x3E
    TRACE_CONTEXT = 0x3F
    RESULT_DROP_REASON = 0x40
    OBJECT_DECLARE = 0x41
    OBJECT_REF = 0x42
    OBJECT_RELEASE = 0x43
    OBJECT_PATCH = 0x44
    OBJECT_DELTA = 0x45
    CACHE_REFERENCE = 0x46
    CACHE_MISS = 0x47
    ERROR_RECOVERABLE = 0x48
    RETRY_AFTER = 0x49


class HeaderFlag(IntFlag):
    """Common-header flags (section 2); any bit outside the mask is rejected."""

    NONE = 0
    ACK_REQUIRED = 0x01
    CAN_DROP = 0x02
    STALE = 0x04
    EOS = 0x08
    RETRANSMIT = 0x10
    KEYFRAME = 0x20


HEADER_FLAG_MASK = 0x3F


class ErrorCode(IntEnum):
    """ERROR (0x06) codes (section 3, "Connection-level errors")."""

    UNSUPPORTED_VERSION = 0x01
    AUTH_FAILED = 0x02
    INVALID_STATE = 0x03
    MALFORMED_HEADER = 0x04
    MALFORMED_BODY = 0x05
    UNSUPPORTED_CAPABILITY = 0x06
    LIMIT_EXCEEDED = 0x07
    FRAME_EXPIRED = 0x08
    FRAME_CANCELLED = 0x09
    CACHE_MISS = 0x0A
    SERVER_BUSY = 0x0B
    INTERNAL_ERROR = 0x0C


class ErrorScope(IntEnum):
    """ERROR and ERROR_RECOVERABLE scope."""

    CONNECTION = 0
    SESSION = 1
    FRAME = 2


class PayloadKind(IntFlag):
    """payload_kind bits (section 3, FRAME_SUBMIT)."""

    NONE = 0
    TENSOR = 0x01
    TOKEN_CHUNK = 0x02
    AUDIO = 0x04
    VIDEO = 0x08
    STRUCTURED_EVENT = 0x10
    TOOL_DELTA = 0x20
    OPAQUE = 0x40


PAYLOAD_KIND_MASK = 0x7F


class StreamSemantics(IntEnum):
    UNSPECIFIED = 0
    SNAPSHOT = 1
    APPEND = 2


class DescriptorFlag(IntFlag):
    NONE = 0
    TERMINAL = 0x01
    PARTIAL = 0x02
    SCHEMA_OVERRIDE = 0x04
    PROFILE_HINT = 0x08


class PriorityClass(IntEnum):
    INTERACTIVE = 0
    BALANCED = 1
    BACKGROUND = 2


class SessionOpenStatus(IntEnum):
    OPENED = 0
    REJECTED = 1
    RETRY_LATER = 2
    RESUMED = 3


class SessionFlag(IntFlag):
    """session_flags of SESSION_OPEN (mask 0x0F; bits 1-3 are the SDK contract's)."""

    ALLOW_RESUME = 0x01


class SessionAckFlag(IntFlag):
    """session_flags_ack of SESSION_OPEN_ACK (mask 0x1F): what the server granted, never
    more than the client asked for (preview3 section 7.1B)."""

    RESUME_ENABLED = 0x01


class SessionError(IntEnum):
    """session_error_code values of SESSION_OPEN_ACK (section 3)."""

    NONE = 0
    AUTH_FAILED = 0x00010001
    PROFILE_UNSUPPORTED = 0x00010002
    SCHEMA_UNSUPPORTED = 0x00010003
    PRIORITY_REJECTED = 0x00010004
    LEASE_POLICY_REJECTED = 0x00010005
    RESUME_REJECTED = 0x00010006
    LIMIT_REACHED = 0x00010007


class CloseReason(IntEnum):
    NORMAL = 0
    CLIENT_SHUTDOWN = 1
    SERVER_SHUTDOWN = 2
    IDLE = 3
    PROTOCOL_ERROR = 4
    AUTH_REVOKED = 5


class InFlightPolicy(IntEnum):
    DRAIN = 0
    ABORT = 1


class CloseAckStatus(IntEnum):
    ACK = 0
    DRAINING = 1
    CLOSED = 2
    REJECTED = 3


class ControlReason(IntEnum):
    """reason registry of CANCEL/ABORT (section 3, "Registries")."""

    UNSPECIFIED = 0
    USER_CANCELLED = 1
    SUPERSEDED = 2
    DEADLINE_EXPIRED = 3
    BUDGET_EXCEEDED = 4
    DEPENDENCY_FAILED = 5
    TRANSPORT_CLOSING = 6
    SHUTDOWN = 7
    CONFORMANCE_INJECTION = 8


class DropReason(IntEnum):
    """drop_reason registry of RESULT_DROP_REASON (section 3)."""

    NONE = 0
    DEADLINE_EXPIRED = 1
    SUPERSEDED = 2
    PEER_CANCELLED = 3
    BACKPRESSURE = 4
    CAPABILITY_MISMATCH = 5
    BUDGET_EXCEEDED = 6
    OBJECT_INVALIDATED = 7
    TRANSPORT_CLOSED = 8
    INJECTION = 9


class Role(IntEnum):
    """source_role registry; 0 is "unspecified" and accepted from peers."""

    UNSPECIFIED = 0
    CLIENT = 1
    SERVER = 2
    RUNTIME = 3
    SUBAGENT = 4
    TOOL = 5
    SCHEDULER = 6
    CONFORMANCE_RUNNER = 7


class Stage(IntEnum):
    """PROGRESS stage codes; 0x8000 and above is vendor space."""

    QUEUED = 1
    ADMITTED = 2
    INPUT_RECEIVED = 3
    PREPROCESSING = 4
    EXECUTING = 5
    WAITING_DEPENDENCY = 6
    PRODUCING_PARTIAL = 7
    FINALIZING = 8
    COMPLETED = 9
    DROPPED = 0x0A
    FAILED = 0x0B


STAGE_VENDOR_BASE = 0x8000


class PressureLevel(IntEnum):
    NONE = 0
    SOFT = 1
    HARD = 2
    PAUSED = 3


class FlowScope(IntEnum):
    CONNECTION = 0
    SESSION = 1
    OPERATION = 2


class FlowReason(IntEnum):
    GRANT = 0
    REDUCE = 1
    PAUSE = 2
    RESUME = 3
    CONGESTION = 4


class FlowBackpressure(IntEnum):
    NONE = 0
    SOFT = 1
    HARD = 2


class FlowFlag(IntFlag):
    NONE = 0
    CREDIT_VALID = 0x01
    RETRY_AFTER_VALID = 0x02
    BACKGROUND_ONLY = 0x04
    DRAIN_IN_FLIGHT_ONLY = 0x08


class CancelFlag(IntFlag):
    """CANCEL / ABORT flags."""

    NONE = 0
    COOPERATIVE = 0x01
    HARD = 0x02


class SchedulingFlag(IntFlag):
    """PRIORITY_UPDATE / DEADLINE / EXPIRE_AT flags."""

    NONE = 0
    DISCARD_STALE = 0x01
    EMIT_DROP_REASON = 0x02


class PartialFlag(IntFlag):
    """PARTIAL_RESULT flags."""

    NONE = 0
    FINAL_PARTIAL = 0x01
    OBJECT_REF = 0x02


class ObjectRefFlag(IntFlag):
    """OBJECT_REF flags (value registries, "Flag Masks")."""

    NONE = 0
    BORROWED = 0x01
    MUTABLE = 0x02
    REGION_PRESENT = 0x04


class ObjectReleaseFlag(IntFlag):
    """OBJECT_RELEASE flags."""

    NONE = 0
    FINAL_RELEASE = 0x01
    INVALIDATES_DEPENDENTS = 0x02


class ObjectDeltaFlag(IntFlag):
    """OBJECT_PATCH / OBJECT_DELTA flags."""

    NONE = 0
    REPLACES_REGION = 0x01
    COMPRESSED = 0x02
    FINAL_DELTA = 0x04


class PressureFlag(IntFlag):
    """BACKPRESSURE / CREDIT_UPDATE flags: which scope ``scope_id`` names (neither: session)."""

    NONE = 0
    CONNECTION = 0x01
    OPERATION = 0x02


class CapabilityFlag(IntFlag):
    """CAPABILITY_NEGOTIATION / DEGRADE_PROFILE flags."""

    NONE = 0
    HARD_REQUIREMENT = 0x01
    DOWNGRADE_ALLOWED = 0x02


class TraceFlag(IntFlag):
    """TRACE_CONTEXT trace_flags."""

    NONE = 0
    SAMPLED = 0x01
    ERROR = 0x02


class DropFlag(IntFlag):
    """RESULT_DROP_REASON flags."""

    NONE = 0
    FINAL = 0x01
    RETRYABLE = 0x02


#: Two flag bits whose names the digest does not give (SUPERSEDE has one).
TWO_FLAG_BITS = 0x03


class SubmitMode(IntEnum):
    INLINE = 0
    REFERENCE = 1
    MIXED = 2


class InputProfile(IntEnum):
    """FRAME_SUBMIT input_profile (tensor submits only)."""

    UNSPECIFIED = 0
    CHANGED_TILES_LUMA = 1
    DENSE_LUMA_FRAME = 2


class TileIndexMode(IntEnum):
    """FRAME_SUBMIT tile_index_mode; the SDK's builder sets RAW_U16 even without tensors."""

    DENSE_RANGE = 0
    RAW_U16 = 1
    DELTA_U16 = 2
    BITSET = 3


class LossTolerance(IntEnum):
    """FRAME_SUBMIT loss_tolerance; 0xFF means "inherit the session's"."""

    STRICT = 0
    BEST_EFFORT = 1
    LOW_LATENCY = 2
    FIRE_AND_FORGET = 3
    INHERIT = 0xFF


class BudgetPolicy(IntFlag):
    """FRAME_SUBMIT budget_policy bits (and RESULT_PUSH applied_budget)."""

    NONE = 0
    ALLOW_PARTIAL = 0x01
    ALLOW_STALE_REUSE = 0x02
    ALLOW_DEGRADED = 0x04
    ALLOW_DROP = 0x08


class ResultFlag(IntFlag):
    """RESULT_PUSH result_flags."""

    NONE = 0
    STALE = 0x01
    FALLBACK = 0x02
    PARTIAL = 0x04


class ResultHintBudgetPolicy(IntEnum):
    NONE = 0
    FULL = 1
    PARTIAL = 2
    STALE_REUSE = 3
    DROP = 4


class ResultHintCongestion(IntEnum):
    NONE = 0
    STEADY = 1
    ELEVATED = 2
    SATURATED = 3


class ResultHintReason(IntEnum):
    NONE = 0
    QUEUE_FULL = 1
    SERVER_BUSY = 2
    BUDGET_EXCEEDED = 3
    SUPERSEDED = 4


class ResultClass(IntEnum):
    COMPLETE = 0
    PARTIAL = 1
    STALE_REUSE = 2
    DEGRADED = 3


class TransportId(IntEnum):
    """Carrier ids (SESSION_MIGRATE; 0 is not a transport)."""

    QUIC = 1
    TCP = 2
    IPC = 3
    WEBSOCKET = 4


class MigrateAccept(IntEnum):
    """accept_code of SESSION_MIGRATE_ACK. The spec defines only 0 (accepted; "non-zero
    means a rejection reason", preview2 section 10.4); the other values are this
    gateway's, listed in docs/runtime-controls.md."""

    ACCEPTED = 0
    #: No detached or attached session answers to this id and migration token (the
    #: same answer whatever was wrong: nothing says whether the session exists).
    REFUSED = 1
    #: old_transport_id equals new_transport_id: not a migration (nnrp-core's rule).
    SAME_TRANSPORT = 2
    #: new_transport_id is not the transport the migrate arrived on.
    TRANSPORT_MISMATCH = 3
    #: The server is draining: open a session elsewhere. Kept in the registry; no longer
    #: sent (a drain still lets a session move, as it still answers resumes: R12).
    DRAINING = 4


class SessionPatchField(IntFlag):
    """SESSION_PATCH patch_mask bits."""

    NONE = 0
    TARGET_CADENCE = 0x01
    QUALITY_TIER = 0x02
    DEGRADE_POLICY = 0x04
    ACTIVE_LANE_MASK = 0x08
    PREFERRED_CODEC = 0x10
    PREFERRED_COMPRESSION = 0x20
    PROFILE_PATCH = 0x40


SESSION_PATCH_FIELDS = 0x7F


class PatchAckStatus(IntEnum):
    ACCEPTED = 0
    PARTIALLY_APPLIED = 1
    REJECTED = 2


class PatchRejectReason(IntEnum):
    NONE = 0
    UNSUPPORTED_FIELD = 1
    INVALID_RANGE = 2
    UNSUPPORTED_STRATEGY = 3
    INVALID_LANE_MASK = 4
    RATE_LIMITED = 5


class CacheObjectKind(IntEnum):
    """CACHE_PUT object_kind."""

    CAMERA_BLOCK = 1
    TILE_INDEX_BLOCK = 2
    TENSOR_SECTION_TABLE = 3
    CODEC_TABLE = 4
    REUSABLE_RESULT_OBJECT = 5
    PAYLOAD_LAYOUT_TEMPLATE = 6
    PROMPT_SEGMENT = 7
    TOOL_SCHEMA = 8
    STRUCTURED_EVENT_SCHEMA = 9


class CacheAckStatus(IntEnum):
    ACCEPTED = 0
    REJECTED = 1
    REPLACED = 2


class CacheInvalidateScope(IntEnum):
    WHOLE_SESSION = 0
    NAMESPACE = 1
    OBJECT_KIND = 2
    OBJECT_KEY = 3


class CacheReuseScope(IntEnum):
    OPERATION = 0
    SESSION = 1
    CONNECTION = 2
    GLOBAL = 3
    TENANT = 4
    PROFILE = 5


class CacheMissReason(IntEnum):
    UNKNOWN = 0
    NOT_FOUND = 1
    EXPIRED = 2
    INVALIDATED = 3
    SCHEMA_MISMATCH = 4
    PRODUCER_UNAVAILABLE = 5
    LEASE_REQUIRED = 6
    PERMISSION_DENIED = 7


class RuntimeObjectKind(IntEnum):
    UNSPECIFIED = 0
    TENSOR = 1
    TOKEN_BLOCK = 2
    IMAGE_TILE = 3
    FEATURE_MAP = 4
    TOOL_RESULT = 5
    TRACE_SEGMENT = 6
    OPAQUE_BYTES = 7
    DOCUMENT_CHUNK = 8
    AUDIO_CHUNK = 9
    VIDEO_CHUNK = 10
    ROUTE_PLAN = 11
    CACHE_MANIFEST = 12


class MemoryLocationHint(IntEnum):
    UNSPECIFIED = 0
    HOST_MEMORY = 1
    DEVICE_MEMORY = 2
    SHARED_MEMORY = 3
    REMOTE_MEMORY = 4
    MMAP_FILE = 5
    OBJECT_STORE = 6


class OwnershipHint(IntEnum):
    UNSPECIFIED = 0
    PRODUCER_OWNED = 1
    CONSUMER_OWNED = 2
    SESSION_OWNED = 3
    BORROWED = 4
    TRANSFER_ON_REF = 5
    RELEASE_ON_DROP = 6


class ObjectReleaseReason(IntEnum):
    COMPLETED = 0
    CANCELLED = 1
    EXPIRED = 2
    REPLACED = 3
    INVALIDATED = 4
    OWNER_CLOSED = 5
    LEASE_EXPIRED = 6
    CONFORMANCE_INJECTION = 7


class PressureReason(IntEnum):
    """BACKPRESSURE / CREDIT_UPDATE reason."""

    UNSPECIFIED = 0
    RECEIVER_QUEUE_FULL = 1
    SENDER_QUEUE_FULL = 2
    MEMORY = 3
    BANDWIDTH = 4
    COMPUTE = 5
    DEADLINE = 6
    FAIRNESS = 7
    INJECTION = 8


class RecoverableFlag(IntFlag):
    """ERROR_RECOVERABLE flags."""

    NONE = 0
    RETRYABLE_NOW = 0x01
    RETRY_AFTER_REQUIRED = 0x02


class RetryScopeFlag(IntFlag):
    """RETRY_AFTER flags: which scope ``scope_id`` names (neither: session)."""

    NONE = 0
    CONNECTION = 0x01
    OPERATION = 0x02


class HintFlag(IntFlag):
    """ROUTE_HINT / EXECUTION_HINT flags."""

    NONE = 0
    MUST_HONOR = 0x01
    BEST_EFFORT = 0x02


class SupersedeFlag(IntFlag):
    """SUPERSEDE flags (nnrp-rs names bit0 ``abort_old_immediately``)."""

    NONE = 0
    ABORT_OLD_IMMEDIATELY = 0x01


class BudgetFlag(IntFlag):
    """BUDGET_UPDATE flags: how the budgets combine with the current ones."""

    NONE = 0
    REPLACE = 0x01
    INCREMENT = 0x02


class StandardProfile(IntEnum):
    """Profile ids: bit (profile_id - 1) of a hello profile bitmap stands for the profile."""

    OPENAI_TYPED = 0  # per-frame profile of the openai-compatible/1 typed descriptor
    TENSOR = 1
    TOKEN = 2


#: The stock clients' session schema (section 1): token profile, schema 0x1001 v3.
TOKEN_SCHEMA_ID = 0x1001
TOKEN_SCHEMA_VERSION = 3
