"""Long literals cut from a big envelope (gateway/profile/_literals.py, L1-L4): whatever
the document, cutting, parsing and splicing back gives what parsing it whole gives."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest
from hypothesis import given, strategies as st

from gateway.pipeline._media import encode_body
from gateway.profile import ProfileError, read_envelope, read_envelope_steps
from gateway.profile._literals import (
    CUT_THRESHOLD,
    MIN_LITERAL,
    STEP_BYTES,
    cut_long_literals,
)


def _envelope(body: dict[str, Any]) -> bytes:
    return json.dumps({"schema_version": "openai-compatible/1",
                       "operation": "chat.completions.create", "body": body}).encode()


def _image_body(uri: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": 'a "quoted" \\ word'},
        {"type": "image_url", "image_url": {"url": uri}}]}]}


def test_a_data_uri_is_cut_parsed_around_and_spliced_back() -> None:
    uri = "data:image/png;base64," + base64.b64encode(os.urandom(CUT_THRESHOLD)).decode()
    payload = _envelope(_image_body(uri))
    envelope, cuts = read_envelope(payload, nonce="abc", max_bytes=1 << 30)
    ((placeholder, run),) = cuts.items()
    assert placeholder == "nnrp-cut-abc-0" and run == uri.encode()
    part = envelope.body["messages"][0]["content"][1]
    assert part["image_url"]["url"] == placeholder  # the body stays small
    assert json.loads(b"".join(encode_body(envelope.body, {p: [r] for p, r in cuts.items()}))) == \
        _image_body(uri)


def test_small_envelopes_and_short_strings_are_left_alone() -> None:
    small = _envelope(_image_body("data:image/png;base64,AAAA"))
    assert cut_long_literals(small, nonce="n") == (small, {})
    many = _envelope({"model": "m", "messages": [{"role": "user", "content": "x" * 100}] * 20000})
    assert len(many) > CUT_THRESHOLD
    assert cut_long_literals(many, nonce="n") == (many, {})


@pytest.mark.parametrize("run", [
    "é" * MIN_LITERAL,  # not ASCII: json.loads checks it
    "a" * MIN_LITERAL + "\\",  # ends in a backslash: its closing quote is escaped
    "a" * MIN_LITERAL + "\n",  # a raw control character: JSON refuses it in a string
])
def test_runs_the_scan_cannot_vouch_for_are_parsed(run: str) -> None:
    payload = b'{"k": "' + run.encode() + b'", "pad": "' + b"p" * CUT_THRESHOLD + b'"}'
    _, cuts = cut_long_literals(payload, nonce="n")
    assert list(cuts.values()) == [b"p" * CUT_THRESHOLD]


def test_structure_that_looks_like_a_run_falls_back_to_the_whole_parse() -> None:
    # Between the closing quote of "a" and the opening quote of "b": no quote for
    # MIN_LITERAL bytes, yet JSON structure (L3).
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "a": list(range(MIN_LITERAL)), "b": "x" * CUT_THRESHOLD}
    envelope, cuts = read_envelope(_envelope(body), nonce="n", max_bytes=1 << 30)
    assert cuts == {}
    assert envelope.body == body


def test_an_invalid_envelope_is_refused_as_ever() -> None:
    payload = b'{"body": "' + b"a" * CUT_THRESHOLD + b'", oops}'
    with pytest.raises(ProfileError, match="not UTF-8 JSON"):
        read_envelope(payload, nonce="n", max_bytes=1 << 30)


_TEXT = st.text(alphabet=st.sampled_from('ab"\\/é\n '), max_size=12)
_LONG = st.text(alphabet=st.sampled_from('AB+/=:;,"\\é'), min_size=8, max_size=30)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | _TEXT | _LONG,
    # Non-empty containers: an extension that can draw without its children is one
    # hypothesis says does not recurse.
    lambda children: st.lists(children, min_size=1, max_size=4)
    | st.dictionaries(_TEXT | _LONG, children, min_size=1, max_size=4), max_leaves=12)


@given(_JSON)
def test_cut_parse_splice_is_the_whole_parse(document: Any) -> None:
    """With a tiny threshold and run length, every kind of place a run can be: a value, a
    key, inside a string after an escaped quote, JSON structure."""
    payload = json.dumps({"x": document}, ensure_ascii=False).encode()
    shortened, cuts = cut_long_literals(payload, nonce="n", min_literal=8, threshold=0)
    try:
        parsed = json.loads(shortened)
    except ValueError:
        return  # L3: the caller parses the whole document instead
    respliced = b"".join(encode_body(parsed, {p: [r] for p, r in cuts.items()}))
    assert json.loads(respliced) == {"x": document}


@pytest.mark.parametrize("where", ["request_id", "model", "operation", "nnrp"])
def test_a_long_literal_in_a_field_the_gateway_reads_is_checked_as_written(where: str
                                                                           ) -> None:
    """A 64 KiB request_id must be refused for what it is, not pass as a placeholder."""
    long = "r" * CUT_THRESHOLD
    document: dict[str, Any] = {"schema_version": "openai-compatible/1",
                                "operation": "chat.completions.create",
                                "body": {"model": "m", "messages": [{"role": "user",
                                                                    "content": "hi"}]}}
    if where == "model":
        document["body"]["model"] = long
    elif where == "nnrp":
        document["nnrp"] = {"unknown": long}
    else:
        document[where] = long
    payload = json.dumps(document).encode()
    if where == "model":
        envelope, cuts = read_envelope(payload, nonce="n", max_bytes=1 << 30)
        assert cuts == {} and envelope.model == long  # parsed whole, as written
        return
    with pytest.raises(ProfileError) as info:
        read_envelope(payload, nonce="n", max_bytes=1 << 30)
    assert "nnrp-cut" not in info.value.message


@pytest.mark.parametrize("document", ["image", "no literal", "literal in a read field"])
def test_a_big_envelope_of_a_viewed_submit_is_read_in_steps_to_the_same_result(
        document: str) -> None:
    """L5: read from the packet's view, a big envelope is copied and checked a step at a
    time (the caller's loop runs between two), and reads as the bytes read at once do,
    cut, parsed whole, or refused the cut (L3)."""
    blob = base64.b64encode(os.urandom(3 * STEP_BYTES)).decode()
    body = {"image": _image_body("data:image/png;base64," + blob),
            "no literal": {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                           "stop": ["ab"] * STEP_BYTES},
            "literal in a read field": {"model": blob, "messages": [
                {"role": "user", "content": "hi"}]}}[document]
    payload = _envelope(body)
    steps = read_envelope_steps(memoryview(payload).toreadonly(), nonce="n", max_bytes=1 << 30)
    taken = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            stepped, stepped_cuts = done.value
            break
        taken += 1
    envelope, cuts = read_envelope(payload, nonce="n", max_bytes=1 << 30)
    assert (stepped.body, stepped_cuts) == (envelope.body, cuts)
    assert taken >= len(payload) // STEP_BYTES  # the copy alone: a step per window
    assert bool(cuts) is (document == "image")
