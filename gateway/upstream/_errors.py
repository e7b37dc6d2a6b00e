"""What can go wrong talking to vLLM, and which end cause each failure is.

``UpstreamError`` and its subclasses (``UnsupportedVersion`` lives in ``_versions``)
are a branch of the gateway's one error tree, drawn with what each means in
``gateway.errors``.

``to_profile_error`` classifies a failure as an ``EndCause`` (what that cause then means
on the wire is ``END_TABLE``'s job): 400 and 422 -> invalid_backend_request (vLLM's
message and param kept), 401 -> backend_auth_failed, 404 -> unsupported_model, 503 ->
backend_overload, any other status -> backend_error; overloaded -> backend_overload;
unavailable -> backend_unavailable; timeouts -> request_timeout; malformed streams,
in-stream errors and anything else -> backend_error.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.errors import GatewayError
from gateway.profile import EndCause, ProfileError


class UpstreamError(GatewayError):
    """Base: vLLM could not serve the request."""


class UpstreamUnavailable(UpstreamError):
    """No response at all: refused, reset, or closed before the status line."""


class UpstreamOverloaded(UpstreamError):
    """vLLM, or the gateway's way to it, cannot take the request now: every upstream
    connection is busy past the queue wait, or vLLM does not accept a connection in time
    (its accept queue is full). Recoverable: try again shortly."""


class UpstreamTimeout(UpstreamError):
    def __init__(self, kind: str, seconds: float) -> None:
        super().__init__(f"upstream {kind} timeout after {seconds:g} s")
        self.kind = kind  # "first_chunk", "idle" or "total"
        self.seconds = seconds


class UpstreamStatus(UpstreamError):
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body
        self.message, self.error_type, self.param = _parse_error_body(body)
        super().__init__(f"vLLM answered {status}: {self.message}")


class UpstreamMalformed(UpstreamError):
    def __init__(self, message: str, *, kind: str = "malformed_stream",
                 error_type: str | None = None, status: int | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind  # "malformed_stream", "in_stream_error" or "connection_lost"
        self.error_type = error_type
        self.status = status
        self.param = param


def _parse_error_body(body: bytes) -> tuple[str, str | None, str | None]:
    """vLLM's envelope {"error": {message, type, param, code}} or the flat 401/503 form."""
    try:
        document: Any = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        text = body.decode("utf-8", "replace").strip()
        return (text[:500] or "no error body"), None, None
    error = document.get("error") if isinstance(document, dict) else None
    if isinstance(error, dict):
        param = error.get("param")
        return (str(error.get("message", ""))[:2000], _str_or_none(error.get("type")),
                _str_or_none(param))
    if isinstance(error, str):  # the flat {"error": "Unauthorized"} of the API-key check
        return error, None, None
    if isinstance(document, dict) and "message" in document:  # pre-0.10.1 flat envelope
        return str(document["message"]), _str_or_none(document.get("type")), None
    return body.decode("utf-8", "replace")[:500], None, None


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


#: What vLLM's HTTP status says about a request (vllm-http.md section 2; 422 is 0.26's
#: media-fetch failure). Anything else is backend_error.
_STATUS_CAUSES = {400: EndCause.INVALID_BACKEND_REQUEST, 401: EndCause.BACKEND_AUTH_FAILED,
                  404: EndCause.UNSUPPORTED_MODEL, 422: EndCause.INVALID_BACKEND_REQUEST,
                  503: EndCause.BACKEND_OVERLOAD}


def to_profile_error(error: UpstreamError) -> ProfileError:
    """The single mapping from upstream failures to profile errors (with diagnostics)."""
    if isinstance(error, UpstreamStatus):
        code = _STATUS_CAUSES.get(error.status, EndCause.BACKEND_ERROR)
        diagnostics: dict[str, object] = {"backend_status": error.status}
        if error.error_type:
            diagnostics["backend_error_type"] = error.error_type
        if error.param:
            diagnostics["backend_param"] = error.param
        if code is EndCause.BACKEND_AUTH_FAILED:
            message = "vLLM refused the gateway's credentials (check --upstream-api-key)"
        else:
            message = error.message
        keeps_param = code is EndCause.INVALID_BACKEND_REQUEST  # vLLM's param names the field
        return ProfileError(code, message, param=error.param if keeps_param else None,
                            diagnostics=diagnostics)
    if isinstance(error, UpstreamTimeout):
        return ProfileError(EndCause.REQUEST_TIMEOUT, str(error),
                            diagnostics={"timeout": error.kind})
    if isinstance(error, UpstreamOverloaded):
        return ProfileError(EndCause.BACKEND_OVERLOAD, f"vLLM cannot take more now: {error}")
    if isinstance(error, UpstreamUnavailable):
        return ProfileError(EndCause.BACKEND_UNAVAILABLE, f"vLLM is unreachable: {error}")
    if isinstance(error, UpstreamMalformed):
        diagnostics = {"backend_error_family": error.kind}
        if error.status is not None:
            diagnostics["backend_status"] = error.status
        if error.error_type:
            diagnostics["backend_error_type"] = error.error_type
        if error.param:
            diagnostics["backend_param"] = error.param
        return ProfileError(EndCause.BACKEND_ERROR, str(error), diagnostics=diagnostics)
    return ProfileError(EndCause.BACKEND_ERROR, str(error))
