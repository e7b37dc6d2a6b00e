"""``ProfileError``: a request-level failure carrying its profile error code.

Every failure of an operation ends as exactly one ``response.error`` event carried by the
terminal RESULT_PUSH. The code is an ``EndCause``; what it means (status, error type,
outcome, log level) is ``END_TABLE``'s business, never this class's.
"""

from __future__ import annotations

from gateway.errors import GatewayError

from ._outcomes import END_TABLE, ERROR_CAUSES, EndCause, EndSpec, Push


class ProfileError(GatewayError):
    """A request the profile (or vLLM, mapped by the upstream client) refuses."""

    def __init__(self, code: EndCause | str, message: str, *, param: str | None = None,
                 diagnostics: dict[str, object] | None = None,
                 retry_after_ms: int | None = None) -> None:
        cause = EndCause(code) if code in EndCause.__members__.values() else None
        if cause not in ERROR_CAUSES:
            raise ValueError(f"unknown profile error code {code!r}")
        super().__init__(message)
        self.code = cause
        self.message = message
        self.param = param
        self.diagnostics = diagnostics or {}
        #: When a recoverable cause may be retried (None: the server's default).
        self.retry_after_ms = retry_after_ms

    @property
    def spec(self) -> EndSpec:
        return END_TABLE[self.code]

    @property
    def status(self) -> int:
        terminal = self.spec.terminal
        assert isinstance(terminal, Push)
        return terminal.status

    @property
    def error_type(self) -> str:
        terminal = self.spec.terminal
        assert isinstance(terminal, Push)
        assert terminal.error_type is not None
        return terminal.error_type
