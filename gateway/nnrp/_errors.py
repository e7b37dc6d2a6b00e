"""Protocol errors raised by the sans-IO layer: ``ProtocolError`` and its subclasses, a
branch of the gateway's one error tree, drawn with what each means in ``gateway.errors``.

Each error carries the NNRP ``ErrorCode`` that an ERROR frame would report and
whether the problem is fatal to the connection.
"""

from __future__ import annotations

from gateway.errors import GatewayError

from ._constants import ErrorCode


class ProtocolError(GatewayError):
    """Base class. ``code`` is the ERROR frame code; ``fatal`` ends the connection."""

    def __init__(self, message: str, *, code: ErrorCode = ErrorCode.MALFORMED_HEADER,
                 fatal: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.fatal = fatal


class RemoteProtocolError(ProtocolError):
    """The peer violated the protocol."""


class HttpAnswerError(RemoteProtocolError):
    """The server answered the hello in HTTP: the client dialled an HTTP server (vLLM's own
    port, a proxy), not NNRP. ``status_line``: the first line of its answer, as far as it
    came (``HTTP/1.1 400 Bad Request``)."""

    def __init__(self, status_line: str) -> None:
        super().__init__(f"the server answered in HTTP ({status_line!r}), not NNRP",
                         code=ErrorCode.MALFORMED_HEADER)
        self.status_line = status_line


class TypedBodyError(RemoteProtocolError):
    """A typed body (prelude, descriptors, regions) is invalid; fails one operation only."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ErrorCode.MALFORMED_BODY, fatal=False)


class LocalProtocolError(ProtocolError):
    """Our own side tried an action the state machine forbids; never reaches the wire."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ErrorCode.INVALID_STATE, fatal=False)
