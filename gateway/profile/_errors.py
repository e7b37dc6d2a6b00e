"""openai-compatible/1 error codes: one table from code to terminal status and outcome.

Every failure of an operation ends as exactly one ``response.error`` event carried by
the terminal RESULT_PUSH. This table is the single place that says, for each profile
error code, which RESULT_PUSH status it gets (nnrp-wire.md section 4: completed 200,
cancelled 499, request_timeout 504, overload 503, other errors 500; validation errors
4xx), which metrics outcome it counts as, and how loudly it is logged.

    ProfileError                  a request the profile refuses (the client's fault)
    UpstreamError                 vLLM could not serve it (see gateway.upstream)
      ├── UpstreamUnavailable       refused/reset before a response  -> backend_unavailable
      ├── UpstreamTimeout           first chunk, idle, total, deadline -> request_timeout
      ├── UpstreamStatus            a 4xx/5xx answer                  -> by status
      └── UpstreamMalformed         a stream that breaks the contract -> backend_error
"""

from __future__ import annotations

import attrs


@attrs.frozen
class ErrorSpec:
    status: int
    error_type: str
    outcome: str
    log_level: str


#: code -> (RESULT_PUSH status, error.type, metrics outcome, log level)
ERROR_TABLE: dict[str, ErrorSpec] = {
    # The envelope and the submit itself (client side).
    "invalid_submit_body": ErrorSpec(400, "invalid_request_error", "invalid_request", "info"),
    "invalid_body": ErrorSpec(400, "invalid_request_error", "invalid_request", "info"),
    "unsupported_schema_version": ErrorSpec(400, "invalid_request_error", "invalid_request",
                                            "info"),
    "unsupported_operation": ErrorSpec(400, "invalid_request_error", "invalid_request", "info"),
    "missing_model": ErrorSpec(400, "invalid_request_error", "invalid_request", "info"),
    "missing_messages": ErrorSpec(400, "invalid_request_error", "invalid_request", "info"),
    "invalid_request_id": ErrorSpec(400, "invalid_request_error", "invalid_request", "info"),
    "invalid_nnrp_policy": ErrorSpec(400, "invalid_request_error", "invalid_request", "info"),
    "duplicate_operation_id": ErrorSpec(409, "invalid_request_error", "invalid_request", "info"),
    "adapter_operation_limit": ErrorSpec(503, "overloaded_error", "shed", "warning"),
    "session_closing": ErrorSpec(503, "overloaded_error", "shed", "info"),
    # What vLLM said.
    "invalid_backend_request": ErrorSpec(400, "invalid_request_error", "upstream_error", "info"),
    "backend_auth_failed": ErrorSpec(502, "backend_error", "upstream_error", "error"),
    "unsupported_model": ErrorSpec(404, "invalid_request_error", "upstream_error", "info"),
    "backend_overload": ErrorSpec(503, "overloaded_error", "upstream_error", "warning"),
    "backend_unavailable": ErrorSpec(503, "backend_error", "upstream_error", "warning"),
    "backend_error": ErrorSpec(500, "backend_error", "upstream_error", "warning"),
    "request_timeout": ErrorSpec(504, "timeout_error", "deadline", "warning"),
    "adapter_runtime_error": ErrorSpec(500, "internal_error", "internal_error", "error"),
}


class ProfileError(Exception):
    """A request-level failure with a profile error code (see ``ERROR_TABLE``)."""

    def __init__(self, code: str, message: str, *, param: str | None = None,
                 diagnostics: dict[str, object] | None = None) -> None:
        if code not in ERROR_TABLE:
            raise ValueError(f"unknown profile error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.diagnostics = diagnostics or {}

    @property
    def spec(self) -> ErrorSpec:
        return ERROR_TABLE[self.code]
