"""Version bindings and the upstream error table."""

from __future__ import annotations

import pytest

from gateway.upstream import (
    BINDINGS,
    UnsupportedVersion,
    UpstreamMalformed,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamUnavailable,
    engine_dead,
    parse_chunk,
    refusal_of,
    select_binding,
    to_profile_error,
)


@pytest.mark.parametrize(("version", "family"), [("0.18.1", "0.18.x"), ("0.18.0", "0.18.x"),
                                                 ("0.22.1", "0.22.x"), ("v0.26.0", "0.26.x"),
                                                 ("0.26.3rc1", "0.26.x"), ("0.32.0", "0.32.x"),
                                                 ("0.32.4", "0.32.x"), ("0.33.0", "0.32.x")])
def test_tested_families(version: str, family: str) -> None:
    binding, untested = select_binding(version)
    assert binding.family == family
    assert not untested


@pytest.mark.parametrize(("version", "nearest"), [("0.20.2", "0.18.x"), ("0.24.0", "0.22.x"),
                                                  ("0.27.0", "0.26.x"), ("0.29.1", "0.26.x"),
                                                  ("0.30.2", "0.32.x"), ("0.31.0", "0.32.x"),
                                                  ("0.34.0", "0.32.x"), ("0.10.1", "0.18.x")])
def test_other_versions_refused_unless_allowed(version: str, nearest: str) -> None:
    with pytest.raises(UnsupportedVersion) as info:
        select_binding(version)
    text = str(info.value)
    assert version in text
    assert "0.18.1" in text
    assert "0.22.1" in text
    assert "0.26.0" in text
    assert "0.32.0" in text
    assert "--allow-untested-vllm" in text
    binding, untested = select_binding(version, allow_untested=True)
    assert (binding.family, untested) == (nearest, True)


def test_the_lines_between_the_band_and_0_32_are_refused() -> None:
    """0.27-0.31 were never bound: refused with the design's diagnostic (the detected
    version, the families and anchors, the flag), never served as a neighbour silently."""
    for minor in range(27, 32):
        with pytest.raises(UnsupportedVersion) as info:
            select_binding(f"0.{minor}.0")
        assert f"vLLM 0.{minor}.0 is not a tested version" in str(info.value)


def test_each_anchor_says_how_it_was_verified() -> None:
    evidence = {b.anchor: b.evidence for b in BINDINGS}
    assert evidence == {"0.18.1": "gpu_smoke", "0.22.1": "gpu_smoke", "0.26.0": "gpu_smoke",
                        "0.32.0": "live_cpu"}
    assert [b.priority_header for b in BINDINGS] == [False, False, False, True]


def test_shapes_follow_each_release() -> None:
    """The declared fields of each release's ChatCompletionResponse (vllm-http.md s. 2)."""
    shapes = {v: select_binding(v, allow_untested=True)[0].shape
              for v in ("0.18.1", "0.22.1", "0.26.0", "0.32.0")}
    assert "prompt_text" not in shapes["0.18.1"].body
    assert "routed_experts" not in shapes["0.18.1"].choice
    assert "prompt_text" in shapes["0.22.1"].body
    assert "routed_experts" in shapes["0.22.1"].choice
    assert {"ec_transfer_params", "metrics"} <= set(shapes["0.26.0"].body)
    assert [s.empty_tool_calls_kept for s in shapes.values()] == [True, True, False, False]
    assert shapes["0.32.0"].usage == ("prompt_tokens_details", "completion_tokens_details")


@pytest.mark.parametrize(("error", "code", "status"), [
    (UpstreamStatus(400, b'{"error":{"message":"temperature must be >= 0","type":'
                         b'"BadRequestError","param":"temperature","code":400}}'),
     "invalid_backend_request", 400),
    (UpstreamStatus(401, b'{"error":"Unauthorized"}'), "backend_auth_failed", 502),
    (UpstreamStatus(404, b'{"error":{"message":"no","type":"NotFoundError","param":"model"}}'),
     "unsupported_model", 404),
    (UpstreamStatus(500, b'{"error":{"message":"boom","type":"InternalServerError"}}'),
     "backend_error", 500),
    (UpstreamStatus(503, b'{"error":"The model is currently scaling..."}'),
     "backend_overload", 503),
    (UpstreamStatus(502, b"<html>bad gateway</html>"), "backend_error", 500),
    (UpstreamUnavailable("refused"), "backend_unavailable", 503),
    (UpstreamTimeout("first_chunk", 2), "request_timeout", 504),
    (UpstreamMalformed("garbage"), "backend_error", 500),
    (UpstreamMalformed("engine", kind="in_stream_error", status=500), "backend_error", 500),
])
def test_error_table(error: Exception, code: str, status: int) -> None:
    profile_error = to_profile_error(error)  # type: ignore[arg-type]
    assert profile_error.code == code
    assert profile_error.status == status


def test_400_keeps_message_and_param() -> None:
    error = to_profile_error(UpstreamStatus(400, b'{"error":{"message":"temperature must be '
                                                 b'>= 0","type":"BadRequestError","param":'
                                                 b'"temperature","code":400}}'))
    assert error.message == "temperature must be >= 0"
    assert error.param == "temperature"
    assert error.diagnostics == {"backend_status": 400, "backend_error_type": "BadRequestError",
                                 "backend_param": "temperature"}


@pytest.mark.parametrize("text", [b'"a\\ud800b"', b'"a\xed\xa0\x80b"'],
                         ids=["escaped", "utf-8-encoded"])
def test_a_completion_with_a_lone_surrogate_is_refused_however_it_is_written(
        text: bytes) -> None:
    from gateway.upstream import parse_completion

    body = (b'{"object": "chat.completion", "id": "x", "choices": '
            b'[{"message": {"content": ' + text + b'}}]}')
    with pytest.raises(UpstreamMalformed, match=r"not Unicode|not UTF-8"):
        parse_completion(body)
    # A valid pair, escaped, is one character and fine.
    fine = parse_completion(body.replace(text, b'"\\ud83d\\ude00"'))
    assert fine["choices"][0]["message"]["content"] == "\U0001F600"


# vLLM 0.32.0's refusals, byte for byte as create_error_response writes them (GracefulHTTPError:
# type is the HTTP phrase, param null; vllm/exceptions.py, .../error_response.py).
QUEUE_FULL = (b'{"error":{"message":"The engine is currently busy and cannot accept new '
              b'requests. Please try again later or on a different instance.","type":'
              b'"Service Unavailable","param":null,"code":503}}')
QUEUED_TOKENS = (b'{"error":{"message":"The engine has reached its prefill token backlog '
                 b'limit. Please try again later or on a different instance.","type":'
                 b'"Service Unavailable","param":null,"code":503}}')
RETRYABLE = (b'{"error":{"message":"Request failed; please retry","type":'
             b'"ServiceUnavailableError","param":null,"code":503}}')
ENGINE_DEAD = (b'{"error":{"message":"EngineCore encountered an issue. See stack trace '
               b'(above) for the root cause.","type":"InternalServerError","param":null,'
               b'"code":500}}')


@pytest.mark.parametrize(("body", "reason"), [
    (QUEUE_FULL, "max_num_queued_reqs"), (QUEUED_TOKENS, "max_num_queued_tokens"),
    (RETRYABLE, "retryable"), (b'{"error":"The model is currently scaling..."}', "unavailable"),
    (b"<html>503 from a proxy</html>", "unavailable")])
def test_vllm_refusals_before_the_first_byte(body: bytes, reason: str) -> None:
    error = UpstreamStatus(503, body)
    assert refusal_of(error) == reason
    profile_error = to_profile_error(error, retry_after_ms=2500)
    assert (profile_error.code, profile_error.status) == ("backend_overload", 503)
    assert profile_error.spec.recoverable
    assert profile_error.retry_after_ms == 2500
    assert profile_error.diagnostics["backend_refusal"] == reason


def _in_stream(body: bytes, *, before_output: bool) -> UpstreamMalformed:
    with pytest.raises(UpstreamMalformed) as info:
        parse_chunk(body.decode())
    info.value.before_output = before_output
    return info.value


@pytest.mark.parametrize(("body", "reason"), [(QUEUE_FULL, "max_num_queued_reqs"),
                                              (QUEUED_TOKENS, "max_num_queued_tokens")])
def test_the_same_refusal_as_a_200_streams_first_event(body: bytes, reason: str) -> None:
    first = _in_stream(body, before_output=True)
    assert refusal_of(first) == reason
    profile_error = to_profile_error(first, retry_after_ms=900)
    assert (profile_error.code, profile_error.retry_after_ms) == ("backend_overload", 900)
    assert profile_error.message.startswith("The engine")  # vLLM's own words
    # After output, a client holds part of an answer: an error, not a refusal to retry.
    later = _in_stream(body, before_output=False)
    assert refusal_of(later) is None
    assert to_profile_error(later).code == "backend_error"


def test_a_dead_engine_is_a_backend_error_the_gateway_notices() -> None:
    for error in (UpstreamStatus(500, ENGINE_DEAD), _in_stream(ENGINE_DEAD, before_output=True)):
        assert engine_dead(error)
        assert to_profile_error(error).code == "backend_error"
        assert refusal_of(error) is None
    assert not engine_dead(UpstreamStatus(500, b'{"error":{"message":"boom"}}'))
