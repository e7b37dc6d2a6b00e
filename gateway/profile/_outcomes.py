"""How an operation ends: one table from end cause to terminal, outcome, log level, metric.

Every operation ends exactly once, for one ``EndCause``. ``END_TABLE`` is the only place
that says what that cause means on the wire and in the books (docs/reference/original-plan.md rule
4):

* the **terminal**: a RESULT_PUSH with a status (and, for errors, the ``response.error``
  type), a RESULT_DROP_REASON with a drop reason, or nothing at all (the peer is gone);
* the **outcome**: the bounded ``outcome`` label of metrics and the canonical log line;
* the **log level** of that log line;
* whether the cause counts as an **upstream error** (``upstream_errors_total{model_name, kind}``);
* whether it is **recoverable**: the client may try again later (or elsewhere), so the
  terminal is preceded by ERROR_RECOVERABLE and RETRY_AFTER with a retry time.

vLLM's own admission refusals (0.29+: a 503, or the same refusal as a 200 stream's
first and only event) are backend_overload, recoverable; the gateway's load-aware
refusal, before vLLM is called, is scheduler_rejected, recoverable and shed (not an
upstream error: vLLM was never asked).

Statuses follow docs/reference/nnrp-wire.md section 4 (completed 200, overload 503, timeout 504,
other
errors 500; validation errors 4xx). Drops follow the same section: CANCEL/ABORT/
FRAME_CANCEL -> peer_cancelled; DEADLINE -> deadline_expired; EXPIRE_AT -> superseded (the
wire case priority-deadline expects code 2, section 7); SUPERSEDE -> superseded; a spent
token budget -> budget_exceeded; an invalidated object the operation references ->
object_invalidated; shutdown -> transport_closed. Which control ended an
operation, and so which cause it is, is ``CANCEL_CAUSES``.

The profile error codes (``response.error``'s ``error.code``) are the error causes'
values; the other causes never reach a client as text.
"""

from __future__ import annotations

import enum

import attrs

from gateway.nnrp import CancelSource, DropReason


class EndCause(enum.StrEnum):
    """Why an operation ended. Error causes' values are the profile's error codes."""

    COMPLETED = "completed"
    # The request, refused by the profile before vLLM is called (the client's fault).
    INVALID_SUBMIT_BODY = "invalid_submit_body"
    INVALID_BODY = "invalid_body"
    UNSUPPORTED_SCHEMA_VERSION = "unsupported_schema_version"
    UNSUPPORTED_OPERATION = "unsupported_operation"
    MISSING_MODEL = "missing_model"
    MISSING_MESSAGES = "missing_messages"
    INVALID_REQUEST_ID = "invalid_request_id"
    INVALID_NNRP_POLICY = "invalid_nnrp_policy"
    # Submits refused before they became operations (their values are RefusalReason's).
    DUPLICATE_OPERATION_ID = "duplicate_operation_id"
    ADAPTER_OPERATION_LIMIT = "adapter_operation_limit"
    SESSION_CLOSING = "session_closing"
    SERVER_DRAINING = "server_draining"
    RESUBMISSION_DIFFERS = "resubmission_differs"  # not the request it resubmits
    RESULTS_UNAVAILABLE = "results_unavailable"  # resubmitted, but not replayable
    # Its body references cached objects the session does not hold (never put, expired,
    # invalidated, or of another kind: gateway.nnrp._cache C6).
    OBJECT_REFERENCE_UNRESOLVED = "object_reference_unresolved"
    # Refused before vLLM is called: vLLM's published load is past the configured
    # thresholds (load-aware admission, gateway.upstream._load). The profile's transient
    # code for a scheduler's refusal (docs/reference/nnrp-wire.md section 4).
    SCHEDULER_REJECTED = "scheduler_rejected"
    # What vLLM said, or did not say.
    INVALID_BACKEND_REQUEST = "invalid_backend_request"
    BACKEND_AUTH_FAILED = "backend_auth_failed"
    UNSUPPORTED_MODEL = "unsupported_model"
    BACKEND_OVERLOAD = "backend_overload"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    BACKEND_ERROR = "backend_error"
    REQUEST_TIMEOUT = "request_timeout"
    # A bug in the gateway, said once.
    ADAPTER_RUNTIME_ERROR = "adapter_runtime_error"
    # Ended from outside the handler.
    PEER_CANCELLED = "peer_cancelled"  # CANCEL, ABORT, FRAME_CANCEL, SESSION_CLOSE(abort)
    DEADLINE_EXPIRED = "deadline_expired"  # DEADLINE
    EXPIRED_AT = "expired_at"  # EXPIRE_AT
    SUPERSEDED = "superseded"  # SUPERSEDE, once the replacement was admitted
    BUDGET_EXCEEDED = "budget_exceeded"  # BUDGET_UPDATE's token budget spent mid-stream
    OBJECT_INVALIDATED = "object_invalidated"  # an object it references was invalidated
    SHUTDOWN = "shutdown"  # drain timeout, session close timeout
    DISCONNECTED = "disconnected"  # the connection is gone: nobody to tell
    RESUME_EXPIRED = "resume_expired"  # detached past its window, or never resubmitted
    RESUME_ABANDONED = "resume_abandoned"  # its resubmission was refused (different, gap)
    #: Its client was away and a live request needed its upstream slot (upstream/_slots.py
    #: rule 2): what it produced is held, then this drop.
    RESUME_PREEMPTED = "resume_preempted"
    PROTOCOL_FAILURE = "protocol_failure"  # the peer broke the protocol on its connection
    NO_TERMINAL = "no_terminal"  # the handler returned without one (a bug)


class Outcome(enum.StrEnum):
    """The ``outcome`` label: bounded, summable across every other label."""

    OK = "ok"
    INVALID_REQUEST = "invalid_request"
    SHED = "shed"
    UPSTREAM_ERROR = "upstream_error"
    DEADLINE = "deadline"
    INTERNAL_ERROR = "internal_error"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"
    BUDGET_EXCEEDED = "budget_exceeded"
    SHUTDOWN = "shutdown"
    DISCONNECTED = "disconnected"


@attrs.frozen
class Push:
    """Terminal RESULT_PUSH with this status; ``error_type`` for a ``response.error``."""

    status: int
    error_type: str | None = None


@attrs.frozen
class Drop:
    """Terminal RESULT_DROP_REASON, with the reason's name as its ASCII diagnostic, and
    preceded by TRACE_CONTEXT (header.frame_id 0) naming the operation's trace.

    Two wire cases pull in opposite directions, so both are per cause: cancel-abort
    requires the TRACE_CONTEXT before the drop (the reference adapter sends it for every
    control-ended operation), while priority-deadline (EXPIRE_AT) allows no frame but the
    drop, and compares its body with an empty one."""

    reason: DropReason
    traced: bool = True
    explained: bool = True

    @property
    def diagnostic(self) -> bytes:
        return self.reason.name.lower().encode("ascii") if self.explained else b""


@attrs.frozen
class Silent:
    """No terminal: the connection that would carry it is gone."""


Terminal = Push | Drop | Silent


@attrs.frozen
class EndSpec:
    terminal: Terminal
    outcome: Outcome
    log_level: str
    upstream_error: bool = False
    recoverable: bool = False

    @property
    def ended_from_outside(self) -> bool:
        """Cancelled, expired, shut down or disconnected: the handler did not finish it."""
        return not isinstance(self.terminal, Push)


def _refused(status: int, error_type: str, outcome: Outcome, level: str, *,
             recoverable: bool = False) -> EndSpec:
    return EndSpec(Push(status, error_type), outcome, level, recoverable=recoverable)


def _invalid(status: int = 400) -> EndSpec:
    return EndSpec(Push(status, "invalid_request_error"), Outcome.INVALID_REQUEST, "info")


def _upstream(status: int, error_type: str, outcome: Outcome, level: str, *,
              recoverable: bool = False) -> EndSpec:
    return EndSpec(Push(status, error_type), outcome, level, upstream_error=True,
                   recoverable=recoverable)


C = EndCause
END_TABLE: dict[EndCause, EndSpec] = {
    C.COMPLETED: EndSpec(Push(200), Outcome.OK, "info"),
    C.INVALID_SUBMIT_BODY: _invalid(),
    C.INVALID_BODY: _invalid(),
    C.UNSUPPORTED_SCHEMA_VERSION: _invalid(),
    C.UNSUPPORTED_OPERATION: _invalid(),
    C.MISSING_MODEL: _invalid(),
    C.MISSING_MESSAGES: _invalid(),
    C.INVALID_REQUEST_ID: _invalid(),
    C.INVALID_NNRP_POLICY: _invalid(),
    C.DUPLICATE_OPERATION_ID: _invalid(409),
    C.ADAPTER_OPERATION_LIMIT: _refused(503, "overloaded_error", Outcome.SHED, "warning",
                                        recoverable=True),
    C.SESSION_CLOSING: _refused(503, "overloaded_error", Outcome.SHED, "info"),
    C.SERVER_DRAINING: _refused(503, "overloaded_error", Outcome.SHED, "info",
                                recoverable=True),
    C.SCHEDULER_REJECTED: _refused(503, "overloaded_error", Outcome.SHED, "info",
                                   recoverable=True),
    C.RESUBMISSION_DIFFERS: _invalid(409),
    C.RESULTS_UNAVAILABLE: _invalid(410),
    # What the request's body references is not in the session's cache (each missing
    # reference was answered CACHE_MISS first, with its reason: gateway.nnrp._cache C6).
    C.OBJECT_REFERENCE_UNRESOLVED: _invalid(404),
    C.INVALID_BACKEND_REQUEST: _upstream(400, "invalid_request_error", Outcome.UPSTREAM_ERROR,
                                         "info"),
    C.BACKEND_AUTH_FAILED: _upstream(502, "backend_error", Outcome.UPSTREAM_ERROR, "error"),
    C.UNSUPPORTED_MODEL: _upstream(404, "invalid_request_error", Outcome.UPSTREAM_ERROR, "info"),
    C.BACKEND_OVERLOAD: _upstream(503, "overloaded_error", Outcome.UPSTREAM_ERROR, "warning",
                                  recoverable=True),
    C.BACKEND_UNAVAILABLE: _upstream(503, "backend_error", Outcome.UPSTREAM_ERROR, "warning",
                                     recoverable=True),
    C.BACKEND_ERROR: _upstream(500, "backend_error", Outcome.UPSTREAM_ERROR, "warning"),
    C.REQUEST_TIMEOUT: _upstream(504, "timeout_error", Outcome.DEADLINE, "warning",
                                 recoverable=True),
    C.ADAPTER_RUNTIME_ERROR: _refused(500, "internal_error", Outcome.INTERNAL_ERROR, "error"),
    C.PEER_CANCELLED: EndSpec(Drop(DropReason.PEER_CANCELLED), Outcome.CANCELLED, "info"),
    C.DEADLINE_EXPIRED: EndSpec(Drop(DropReason.DEADLINE_EXPIRED), Outcome.DEADLINE, "info"),
    C.EXPIRED_AT: EndSpec(Drop(DropReason.SUPERSEDED, traced=False, explained=False),
                          Outcome.DEADLINE, "info"),
    C.SUPERSEDED: EndSpec(Drop(DropReason.SUPERSEDED), Outcome.SUPERSEDED, "info"),
    C.BUDGET_EXCEEDED: EndSpec(Drop(DropReason.BUDGET_EXCEEDED), Outcome.BUDGET_EXCEEDED, "info"),
    # The client invalidated an object the operation depends on (OBJECT_RELEASE with
    # invalidates-dependents): the drop reason the spec names for it.
    C.OBJECT_INVALIDATED: EndSpec(Drop(DropReason.OBJECT_INVALIDATED), Outcome.CANCELLED,
                                  "info"),
    C.SHUTDOWN: EndSpec(Drop(DropReason.TRANSPORT_CLOSED), Outcome.SHUTDOWN, "info"),
    C.DISCONNECTED: EndSpec(Silent(), Outcome.DISCONNECTED, "info"),
    # Ended for a client that is not there (a detached session, an operation not yet
    # resubmitted): as if it had cancelled (vLLM aborts); the drop reaches no one.
    C.RESUME_EXPIRED: EndSpec(Drop(DropReason.TRANSPORT_CLOSED), Outcome.CANCELLED, "info"),
    C.RESUME_ABANDONED: EndSpec(Drop(DropReason.TRANSPORT_CLOSED), Outcome.CANCELLED, "info"),
    # A detached operation gave its upstream slot to a live request: the spec's drop for
    # results a receiver did not take in time. Its client, back, holds the results so far.
    C.RESUME_PREEMPTED: EndSpec(Drop(DropReason.BACKPRESSURE), Outcome.SHED, "info"),
    # The sans-IO server writes these drops itself, ahead of its fatal ERROR (its rule 2):
    # by the time the operation ends its protocol state is gone.
    C.PROTOCOL_FAILURE: EndSpec(Drop(DropReason.TRANSPORT_CLOSED, traced=False,
                                     explained=False), Outcome.DISCONNECTED, "info"),
    C.NO_TERMINAL: EndSpec(Drop(DropReason.TRANSPORT_CLOSED), Outcome.INTERNAL_ERROR, "error"),
}
del C

#: Which end cause a peer's control is (the sans-IO server names the control).
CANCEL_CAUSES: dict[CancelSource, EndCause] = {
    CancelSource.FRAME_CANCEL: EndCause.PEER_CANCELLED,
    CancelSource.CANCEL: EndCause.PEER_CANCELLED,
    CancelSource.ABORT: EndCause.PEER_CANCELLED,
    CancelSource.SESSION_CANCEL: EndCause.PEER_CANCELLED,
    CancelSource.SESSION_CLOSE: EndCause.PEER_CANCELLED,
    CancelSource.SUPERSEDE: EndCause.SUPERSEDED,
    CancelSource.OBJECT_INVALIDATED: EndCause.OBJECT_INVALIDATED,
}

#: The causes a ``response.error`` may carry (RESULT_PUSH with an error status).
ERROR_CAUSES = frozenset(cause for cause, spec in END_TABLE.items()
                         if isinstance(spec.terminal, Push) and spec.terminal.error_type)
