"""One operation of a server session as NNRP sees it: its record (``ServerOperation``),
its states and the table of the transitions a send or a control may make
(``OPERATION_TABLE``, rule 15 of ``_server_session``: exactly one terminal, nothing
after it), and what a session holds for an operation not yet submitted (a deadline,
rule 8) or for a replacement not yet arrived (a SUPERSEDE, rule 9)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import attrs

#: Field factories typed Any: compiled, a typed class-body default fails its check
#: (gateway/compiled.py rule 3).
_new_set: Callable[[], Any] = set


class OpState(enum.Enum):
    # OPERATION_TABLE is asked once an event with a (state, action) key: Enum's own
    # __hash__ is Python (hash of the name), two calls an event, 1.5 % of the gateway's
    # CPU at 256 paced streams. A member is its only equal (Enum compares by identity),
    # so identity's hash, in C, is the same contract.
    __hash__ = object.__hash__

    ACTIVE = "active"
    #: A SUPERSEDE waits for its replacement: the client counts the operation ended, so
    #: only its drop (or a cancel) may follow (rules 9, 15).
    SUPERSEDING = "superseding"
    CANCELLING = "cancelling"  # a cancel arrived: only RESULT_DROP_REASON may follow
    DONE = "done"


class OpAction(enum.Enum):
    __hash__ = object.__hash__  # as OpState's

    PARTIAL = "partial"
    PROGRESS = "progress"
    RESULT = "result"
    DROP = "drop"
    CANCEL = "cancel"
    HOLD = "hold"  # a SUPERSEDE whose replacement has not arrived


#: Operation transitions; a missing entry is a LocalProtocolError (rule 15).
OPERATION_TABLE: dict[tuple[OpState, OpAction], OpState] = {
    (OpState.ACTIVE, OpAction.PARTIAL): OpState.ACTIVE,
    (OpState.ACTIVE, OpAction.PROGRESS): OpState.ACTIVE,
    (OpState.ACTIVE, OpAction.RESULT): OpState.DONE,
    (OpState.ACTIVE, OpAction.DROP): OpState.DONE,
    (OpState.ACTIVE, OpAction.CANCEL): OpState.CANCELLING,
    (OpState.ACTIVE, OpAction.HOLD): OpState.SUPERSEDING,
    (OpState.SUPERSEDING, OpAction.DROP): OpState.DONE,
    (OpState.SUPERSEDING, OpAction.CANCEL): OpState.CANCELLING,
    (OpState.CANCELLING, OpAction.DROP): OpState.DONE,
    (OpState.CANCELLING, OpAction.CANCEL): OpState.CANCELLING,
}


@attrs.define
class ServerOperation:
    operation_id: int
    frame_id: int
    state: OpState = OpState.ACTIVE
    sequence: int = 0
    progress_sequence: int = 0
    #: The trace the TRACE_CONTEXT before a drop names (the submit's, or a later one).
    trace_id: int = 0
    trace_flags: int = 0
    #: (msg_type, control_sequence) already seen: exact repeats are ignored (rule 6).
    controls: set[tuple[int, int]] = attrs.field(factory=_new_set)
    #: While SUPERSEDING: until when (``clock``) it waits for its replacement.
    held_until: float = 0.0
    #: Its frames reach no client now: awaiting its resubmission, or muted (rule 5a).
    quiet: bool = False


@attrs.frozen
class PendingDeadline:
    frame_id: int
    deadline_unix_ms: int
    drop_reason: int


@attrs.frozen
class PendingSupersede:
    old_operation_id: int
    diagnostic: bytes
