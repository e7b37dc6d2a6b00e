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

vLLM's own refusals (``classify_refusal``, the table ``REFUSALS``). Since 0.29 vLLM
refuses work itself (``vllm/exceptions.py``, ``AsyncLLM.check_admission``); each refusal
is a ``GracefulHTTPError`` that ``create_error_response`` writes as
``{"error": {"message", "type": "Service Unavailable", "param": null, "code": 503}}``
with no Retry-After header. The admission check runs twice: once before the response
starts (``OpenAIServing`` -> HTTP 503), and again inside ``AsyncLLM.add_request`` when
a streamed response has already answered 200, where the stream generator writes the
same object as its first and only event, then ``data: [DONE]`` (seen live).
Both are the same refusal, so both are backend_overload with a retry hint:

=================================================  ===========  =====================
what vLLM sent (503 status, or a code-503 event     end cause    reason (the counter's
before any chunk)                                                label; vLLM's own
                                                                 ``admission_rejections``
                                                                 label where it has one)
=================================================  ===========  =====================
"The engine is currently busy and cannot accept"    overload     max_num_queued_reqs
"The engine has reached its prefill token backlog"  overload     max_num_queued_tokens
type ``ServiceUnavailableError``                    overload     retryable
                                                    (``RetryableRequestError``)
any other 503 (a proxy, a scaling message)          overload     unavailable
=================================================  ===========  =====================

A code-503 event after output was produced is no refusal (the client already holds part
of an answer): backend_error, as any in-stream error. vLLM's dead engine is one fixed
message (``EngineDeadError``, ``vllm/v1/engine/exceptions.py``) on a 500 (0.33 maps it
so on every path) or an in-stream event: backend_error. ``engine_dead`` recognises both;
the 500 makes the gateway stop calling vLLM ready until ``/health`` says otherwise, the
in-stream event only has ``/health`` asked at once (the pipeline decides).
"""

from __future__ import annotations

import enum
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
                 param: str | None = None, backend_message: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind  # "malformed_stream", "in_stream_error" or "connection_lost"
        self.error_type = error_type
        self.status = status
        self.param = param
        #: An in-stream error's own message, as vLLM wrote it.
        self.backend_message = backend_message
        #: An in-stream error that was the stream's first event: nothing was produced
        #: (set by the chunk stream, which knows what came before).
        self.before_output = False


class RefusalReason(enum.StrEnum):
    """Why vLLM refused a request (the ``reason`` label; module table)."""

    MAX_NUM_QUEUED_REQS = "max_num_queued_reqs"
    MAX_NUM_QUEUED_TOKENS = "max_num_queued_tokens"
    RETRYABLE = "retryable"
    UNAVAILABLE = "unavailable"


#: The module table's rows, first match wins: (message prefix or None, error type or
#: None) -> reason. Messages from ``vllm/exceptions.py`` (0.32.0, installed source).
REFUSALS: tuple[tuple[str | None, str | None, RefusalReason], ...] = (
    ("The engine is currently busy and cannot accept new requests", None,
     RefusalReason.MAX_NUM_QUEUED_REQS),
    ("The engine has reached its prefill token backlog limit", None,
     RefusalReason.MAX_NUM_QUEUED_TOKENS),
    (None, "ServiceUnavailableError", RefusalReason.RETRYABLE),
    (None, None, RefusalReason.UNAVAILABLE),
)
#: ``EngineDeadError``'s fixed message (vllm/v1/engine/exceptions.py).
ENGINE_DEAD_MESSAGE = ("EngineCore encountered an issue. See stack trace (above) for the "
                       "root cause.")


def classify_refusal(message: str, error_type: str | None) -> RefusalReason:
    """The reason of a 503 refusal (``REFUSALS``)."""
    for prefix, wanted_type, reason in REFUSALS:
        if prefix is not None and not message.startswith(prefix):
            continue
        if wanted_type is not None and error_type != wanted_type:
            continue
        return reason
    raise AssertionError("REFUSALS ends with a catch-all row")


def refusal_of(error: UpstreamError) -> RefusalReason | None:
    """vLLM's refusal, if ``error`` is one (module table): a 503 before the response
    started, or a code-503 event that was the stream's first."""
    if isinstance(error, UpstreamStatus) and error.status == 503:
        return classify_refusal(error.message, error.error_type)
    if (isinstance(error, UpstreamMalformed) and error.kind == "in_stream_error"
            and error.status == 503 and error.before_output):
        return classify_refusal(error.backend_message or "", error.error_type)
    return None


def engine_dead(error: UpstreamError) -> bool:
    """vLLM said its engine is dead (module docstring)."""
    if isinstance(error, UpstreamStatus):
        return error.status == 500 and error.message == ENGINE_DEAD_MESSAGE
    return (isinstance(error, UpstreamMalformed) and error.kind == "in_stream_error"
            and error.backend_message == ENGINE_DEAD_MESSAGE)


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


#: What vLLM's HTTP status says about a request (docs/reference/vllm-http.md section 2; 422 is
#: 0.26's
#: media-fetch failure). Anything else is backend_error.
_STATUS_CAUSES = {400: EndCause.INVALID_BACKEND_REQUEST, 401: EndCause.BACKEND_AUTH_FAILED,
                  404: EndCause.UNSUPPORTED_MODEL, 422: EndCause.INVALID_BACKEND_REQUEST,
                  503: EndCause.BACKEND_OVERLOAD}


def to_profile_error(error: UpstreamError, *, retry_after_ms: int | None = None
                     ) -> ProfileError:
    """The single mapping from upstream failures to profile errors (with diagnostics).
    ``retry_after_ms``: the retry time told with vLLM's own refusals (the caller derives
    it from vLLM's queue signals)."""
    refusal = refusal_of(error)
    if refusal is not None:
        diagnostics: dict[str, object] = {"backend_status": 503, "backend_refusal": str(refusal)}
        error_type = getattr(error, "error_type", None)
        if error_type:
            diagnostics["backend_error_type"] = error_type
        if isinstance(error, UpstreamMalformed):
            diagnostics["backend_error_family"] = error.kind
            message = error.backend_message or str(error)
        else:
            assert isinstance(error, UpstreamStatus)
            message = error.message
        return ProfileError(EndCause.BACKEND_OVERLOAD, message, diagnostics=diagnostics,
                            retry_after_ms=retry_after_ms)
    if isinstance(error, UpstreamStatus):
        code = _STATUS_CAUSES.get(error.status, EndCause.BACKEND_ERROR)
        diagnostics = {"backend_status": error.status}
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
        return ProfileError(EndCause.BACKEND_OVERLOAD, f"vLLM cannot take more now: {error}",
                            retry_after_ms=retry_after_ms)
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
