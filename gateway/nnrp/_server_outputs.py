"""What a connection sends for the operations of the sessions attached to it, by
session id: each is the ``ServerSession`` output the I/O layer's port calls itself (one
output API: the session keeps its journal, spends the connection's flow windows and
says what goes on the wire now). A mixin of ``ServerConnection``, which holds
``_sessions`` and ``flow``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._body import OPENAI_EVENT_FRAME, FrameShape
from ._constants import DropReason, ErrorCode, ErrorScope, Stage
from ._errors import LocalProtocolError
from ._server_operation import OpState
from ._server_session import recoverable_error

if TYPE_CHECKING:
    from ._flow import FlowControl
    from ._server_session import ServerSession


class SessionOutputs:
    _sessions: dict[int, ServerSession]
    flow: FlowControl

    def _session(self, session_id: int) -> ServerSession:
        session = self._sessions.get(session_id)
        if session is None:
            raise LocalProtocolError(f"session {session_id} is not open on this connection")
        return session

    def superseding(self, session_id: int, operation_id: int) -> bool:
        """Whether a SUPERSEDE of this operation waits for its replacement (rule 9): its
        output is held, and it may end only with the superseded drop."""
        return self.operation_state(session_id, operation_id) is OpState.SUPERSEDING

    def supersede_hold_left(self, session_id: int, operation_id: int) -> float | None:
        """Seconds the superseded operation still waits for its replacement (0 or less:
        the wait is over, drop it superseded); None when it is not held."""
        session = self._sessions.get(session_id)
        return session.supersede_hold_left(operation_id) if session is not None else None

    def operation_state(self, session_id: int, operation_id: int) -> OpState:
        """The state of an operation; DONE once it has left the registry."""
        session = self._sessions.get(session_id)
        return session.operation_state(operation_id) if session is not None else OpState.DONE

    def flow_wait(self, session_id: int, operation_id: int) -> float | None:
        """When the operation's next PARTIAL_RESULT may go (rule 11): 0 now, else seconds
        to wait, or None until the client changes a window (``FlowChanged``)."""
        return self.flow.wait(session_id, operation_id)

    def send_partial(self, session_id: int, operation_id: int, body: bytes) -> bytes | None:
        """``ServerSession.send_partial``: one PARTIAL_RESULT with the next result_sequence
        (1, 2, 3, ...), counted against the client's windows; None when it reaches no
        client now (``_server_session`` rule 5a)."""
        return self._session(session_id).send_partial(operation_id, body)

    def send_progress(self, session_id: int, operation_id: int, stage: Stage) -> bytes | None:
        """PROGRESS for an operation still running (never after a cancel: rule 15)."""
        return self._session(session_id).send_progress(operation_id, stage)

    def send_result(self, session_id: int, operation_id: int, status: int, payload: bytes, *,
                    retry_after_ms: int | None = None,
                    frame: FrameShape = OPENAI_EVENT_FRAME) -> list[bytes]:
        """The terminal RESULT_PUSH and the session's credit (``ServerSession.send_result``)."""
        return self._session(session_id).send_result(operation_id, status, payload,
                                                     retry_after_ms=retry_after_ms,
                                                     frame=frame)

    def send_refusal(self, session_id: int, frame_id: int, operation_id: int, status: int,
                     payload: bytes, *, retry_after_ms: int | None = None) -> list[bytes]:
        """Answer a refused submit (``SubmitRefused``) on its frame; no operation exists."""
        return self._session(session_id).send_refusal(
            frame_id, operation_id, status, payload, retry_after_ms=retry_after_ms)

    def send_drop(self, session_id: int, operation_id: int, drop_reason: DropReason,
                  diagnostic: bytes, *, traced: bool = True) -> list[bytes]:
        """The terminal RESULT_DROP_REASON and the session's credit
        (``ServerSession.send_drop``)."""
        return self._session(session_id).send_drop(operation_id, drop_reason, diagnostic,
                                                   traced=traced)

    def refuse_control(self, session_id: int, frame_id: int, code: ErrorCode, text: str
                       ) -> bytes:
        """ERROR_RECOVERABLE for a control the adapter could not honour (rules 3, 10)."""
        return recoverable_error(code, ErrorScope.FRAME, session_id, frame_id, text).data
