"""Version bindings and the upstream error table."""

from __future__ import annotations

import pytest

from gateway.upstream import (
    UnsupportedVersion,
    UpstreamMalformed,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamUnavailable,
    select_binding,
    to_profile_error,
)


@pytest.mark.parametrize(("version", "family"), [("0.18.1", "0.18.x"), ("0.18.0", "0.18.x"),
                                                 ("0.22.1", "0.22.x"), ("v0.26.0", "0.26.x"),
                                                 ("0.26.3rc1", "0.26.x")])
def test_tested_families(version: str, family: str) -> None:
    binding, untested = select_binding(version)
    assert binding.family == family
    assert not untested


@pytest.mark.parametrize(("version", "nearest"), [("0.20.2", "0.18.x"), ("0.24.0", "0.22.x"),
                                                  ("0.32.0", "0.32.x"), ("0.33.1", "0.32.x"),
                                                  ("0.10.1", "0.18.x")])
def test_other_versions_refused_unless_allowed(version: str, nearest: str) -> None:
    with pytest.raises(UnsupportedVersion) as info:
        select_binding(version)
    text = str(info.value)
    assert version in text
    assert "0.18.1" in text
    assert "0.22.1" in text
    assert "0.26.0" in text
    assert "--allow-untested-vllm" in text
    binding, untested = select_binding(version, allow_untested=True)
    assert (binding.family, untested) == (nearest, True)


def test_the_known_untested_family_is_never_claimed_tested() -> None:
    with pytest.raises(UnsupportedVersion) as info:
        select_binding("0.32.0")
    assert "0.32" not in str(info.value).split("Supported families:")[1]


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
