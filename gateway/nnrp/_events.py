"""Events the sans-IO server connection hands to its I/O adapter.

Frozen attrs classes; never subclass them. The adapter processes them in order.
"""

from __future__ import annotations

import enum

import attrs

from ._body import TypedBody
from ._errors import ProtocolError
from ._fleet import Elsewhere
from ._messages import ClientHello, Error, FrameSubmit, SessionOpen


class CancelSource(enum.Enum):
    """Which control ended an operation early (feeds metrics and logs)."""

    FRAME_CANCEL = "frame_cancel"
    CANCEL = "cancel"
    ABORT = "abort"
    SESSION_CANCEL = "session_cancel"  # CANCEL/ABORT with operation_id 0
    SESSION_CLOSE = "session_close"  # SESSION_CLOSE with in_flight=abort
    SUPERSEDE = "supersede"  # a SUPERSEDE whose replacement has been admitted
    #: OBJECT_RELEASE with invalidates-dependents, of an object the operation references
    OBJECT_INVALIDATED = "object_invalidated"


class RefusalReason(enum.Enum):
    """Why a FRAME_SUBMIT was refused before it became an operation."""

    DUPLICATE_OPERATION_ID = "duplicate_operation_id"
    OPERATION_LIMIT = "adapter_operation_limit"
    SESSION_CLOSING = "session_closing"
    DRAINING = "server_draining"
    #: After a resume: the resubmission is not the request it resubmits...
    RESUBMISSION_DIFFERS = "resubmission_differs"
    #: ...or what the client may have missed is no longer held...
    RESULTS_UNAVAILABLE = "results_unavailable"
    #: ...or the position it declares is none (malformed, or past the last result): the
    #: operation still waits for a resubmission that can be served.
    INVALID_NNRP_POLICY = "invalid_nnrp_policy"
    #: Its body references cached objects (object_reference region) this server does not
    #: hold: each is answered CACHE_MISS first.
    OBJECT_REFERENCE_UNRESOLVED = "object_reference_unresolved"


@attrs.frozen
class TraceInfo:
    """A TRACE_CONTEXT's metadata; the attribute body is only counted."""

    trace_id: int
    span_id: int
    parent_span_id: int
    trace_flags: int
    attribute_bytes: int

    @property
    def eligible(self) -> bool:
        """Both ids non-zero: the context can become a W3C traceparent."""
        return self.trace_id != 0 and self.span_id != 0


@attrs.frozen
class SendBytes:
    """Bytes the state machine wants written (a reply), in order with other sends."""

    data: bytes


@attrs.frozen
class HandshakeCompleted:
    hello: ClientHello
    accepted_profile_bitmap: int


@attrs.frozen
class SessionOpened:
    session_id: int
    request: SessionOpen
    max_in_flight: int
    #: Resume was granted (a token went out with the ACK).
    resumable: bool = False
    #: Resume was asked for and not granted: why (``_resumption.NotGranted``'s value).
    not_granted: str | None = None


@attrs.frozen
class SessionResumed:
    """A SESSION_OPEN with a resume token was accepted (status resumed): the session is
    attached to this connection again; its operations whose results are held wait for
    their resubmission (``OperationResumed``)."""

    session_id: int
    request: SessionOpen


@attrs.frozen
class SessionMigrated:
    """SESSION_MIGRATE was accepted on this connection (rule 4): the session, taken from
    the connection or the detached state it was in, continues here. Results of operations
    on frames after ``last_result_frame_id`` are replayed; the client submits from
    ``resume_from_frame_id`` on."""

    session_id: int
    last_result_frame_id: int
    resume_from_frame_id: int
    #: What is held of those frames, to send now (packets in order), and how many of
    #: them are PARTIAL_RESULTs.
    replay: tuple[bytes, ...] = ()
    replayed_events: int = 0


@attrs.frozen
class HandedOff:
    """A resume or migration names a session another process of the gateway holds (rule
    4d): nothing was answered and nothing more is read here; the I/O layer relays the
    connection, from its first byte, to that process: another worker of this pod, or
    (in a fleet) a worker of another pod. ``refusal``: the answer to send instead when
    that process cannot be reached (a worker restarted, its sessions with it: rejected;
    a pod out of reach: retry later); ``busy``: when it was reached but ended the
    connection before answering (at its connection limit, shutting down: retry later;
    a migration: refused either way)."""

    session_id: int
    #: Where the token's session lives (``_resumption`` R11).
    destination: Elsewhere
    refusal: bytes
    busy: bytes


@attrs.frozen
class SessionOpenRefused:
    session_id: int
    error_code: int
    message: str
    #: A resume (a token was presented): counted and logged apart (rate-limited).
    resume: bool = False
    #: Answered without a look: the connection collected too many refusals (rule 4e).
    rate_limited: bool = False


@attrs.frozen
class HolderProbed:
    """A resume named a session still attached to ``holder`` (another connection, as the
    sans-IO layer knows it): that connection must show it is alive (``_resumption``
    R8). The I/O layer sends it ``ping`` and closes it if nothing arrives on it within
    ``timeout`` seconds."""

    session_id: int
    holder: object
    ping: bytes
    timeout: float


@attrs.frozen
class SessionTaken:
    """A SESSION_MIGRATE took the session from ``previous`` (another connection) to this
    one (``_resumption`` R9): the I/O layer moves its operations here and writes
    ``notice`` to the old connection (a non-fatal ERROR naming the session)."""

    session_id: int
    previous: object
    notice: bytes


@attrs.frozen
class OperationSubmitted:
    """A new operation. ``typed_body`` is None when the body failed to parse (``body_error``).
    ``priority_class`` is the session's (SESSION_OPEN); ``token_budget`` the session's
    BUDGET_UPDATE, if any."""

    session_id: int
    operation_id: int
    frame_id: int
    submit: FrameSubmit
    typed_body: TypedBody | None
    body_error: str | None
    header_trace_id: int
    trace: TraceInfo | None
    deadline_unix_ms: int | None
    deadline_drop_reason: int
    priority_class: int = 0
    token_budget: int | None = None


@attrs.frozen
class RequestKeyWanted:
    """A big submit's request key is wanted before it can be handled
    (``_server_session`` rule 5c): the I/O layer computes
    ``config.resubmission.read(body)`` off the event loop and hands it to
    ``ServerConnection.request_keyed``; until then the connection handles nothing more
    of what the client sent. Nothing but a connection failure comes after it in its
    batch."""

    session_id: int
    body: TypedBody = attrs.field(repr=False)


@attrs.frozen
class OperationResumed:
    """After a resume, the client resubmitted an operation whose results the server holds,
    on its original frame, asking for the same request (``_server_session`` rule 5b):
    ``replay`` (packets in order) goes out now, then the operation goes on live.
    ``running``: it has not ended yet (the I/O layer wakes it)."""

    session_id: int
    operation_id: int
    replay: tuple[bytes, ...]
    replayed_events: int
    after: int | None
    running: bool


class AbandonCause(enum.Enum):
    """Why an operation of a resumed session ends unseen (rule 5b). One whose
    resubmissions' window passed is the book's expiry instead (``ExpiryKind``)."""

    RESUBMISSION_REFUSED = "resubmission_refused"  # another request, or a gap
    SESSION_CLOSED = "session_closed"  # SESSION_CLOSE before its resubmission


@attrs.frozen
class OperationAbandoned:
    """Nothing more of a running operation reaches the client: the I/O layer ends it
    (its upstream aborted). Its frames are muted already."""

    session_id: int
    operation_id: int
    cause: AbandonCause


@attrs.frozen
class SubmitRefused:
    """A FRAME_SUBMIT that did not become an operation; answer with ``send_refusal``."""

    session_id: int
    operation_id: int
    frame_id: int
    reason: RefusalReason
    message: str


@attrs.frozen
class OperationCancelled:
    session_id: int
    operation_id: int
    frame_id: int
    source: CancelSource
    reason: int
    diagnostic: bytes


@attrs.frozen
class OperationSuperseding:
    """A SUPERSEDE whose replacement has not arrived (``_server_controls`` rule 9): the
    client counts the operation superseded already, so nothing of it can be delivered
    but its drop, which waits for the replacement (an ``OperationCancelled`` then) or
    for ``supersede_hold_ms``. The adapter stops the operation's work now."""

    session_id: int
    operation_id: int
    frame_id: int


@attrs.frozen
class DeadlineUpdated:
    session_id: int
    operation_id: int
    deadline_unix_ms: int
    drop_reason: int


@attrs.frozen
class PriorityRequested:
    """A PRIORITY_UPDATE for an active operation. Whether it can still take effect (before
    dispatch, and vLLM schedules by priority) is the adapter's to say; a refusal is
    ``ServerConnection.refuse_control``."""

    session_id: int
    operation_id: int
    frame_id: int
    priority_class: int
    priority_delta: int


@attrs.frozen
class BudgetRequested:
    """A BUDGET_UPDATE's token budget for an active operation (``operation_id`` None: the
    session's, for operations submitted from now on). ``increment`` adds to the current
    budget instead of replacing it."""

    session_id: int
    operation_id: int | None
    frame_id: int
    token_budget: int
    increment: bool


@attrs.frozen
class FlowChanged:
    """A client changed a window (credits, pause, resume): blocked output may move."""


@attrs.frozen
class CapabilitiesNegotiated:
    """The runtime tokens a session now has (after CAPABILITY_NEGOTIATION or DEGRADE_PROFILE)."""

    session_id: int
    tokens: frozenset[str]


@attrs.frozen
class FrameIgnored:
    """A well-formed frame the server takes note of and does nothing with (see the rule
    table in ``_server``): counted and logged, never answered with an error."""

    session_id: int
    msg_type: int
    reason: str


@attrs.frozen
class TraceContextUpdated:
    """A TRACE_CONTEXT; ``operation_id`` None means the session default."""

    session_id: int
    operation_id: int | None
    trace: TraceInfo


@attrs.frozen
class SessionCloseRequested:
    session_id: int
    abort: bool
    drain_timeout_ms: int


@attrs.frozen
class PeerClosed:
    """The peer sent CLOSE."""


@attrs.frozen
class PeerError:
    """The peer sent ERROR; ``fatal`` ends the connection."""

    error: Error
    diagnostic: bytes
    fatal: bool


@attrs.frozen
class ConnectionFailed:
    """A fatal protocol violation. Write ``replies`` (packets in order: a drop for every
    operation still in flight, then the fatal ERROR; none before the handshake), then
    close the connection."""

    error: ProtocolError
    replies: tuple[bytes, ...]


Event = (
    SendBytes | HandshakeCompleted | SessionOpened | SessionResumed | SessionMigrated
    | HandedOff | HolderProbed | SessionTaken
    | SessionOpenRefused | OperationSubmitted | OperationResumed | OperationAbandoned
    | SubmitRefused | RequestKeyWanted
    | OperationCancelled | OperationSuperseding | DeadlineUpdated | TraceContextUpdated
    | PriorityRequested | BudgetRequested | FlowChanged | CapabilitiesNegotiated | FrameIgnored
    | SessionCloseRequested | PeerClosed | PeerError | ConnectionFailed
)
