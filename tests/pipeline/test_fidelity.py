"""The fidelity rule, pure: every field vLLM sends reaches the client.

Recorded pairs (``stream_pair_*`` / ``nonstream_pair_*``, real vLLM 0.32, seeded): the
body rebuilt from the stream equals vLLM's own non-streaming answer to the same request,
field by field, ids and timestamps aside, in every family's shape and however the bytes
are split. And the request fields the gateway reads are read as vLLM's pydantic model
reads them (the table below was measured with vLLM 0.32's pydantic 2.14).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from gateway.pipeline import Translator
from gateway.tools.replay import FAMILIES, VERSIONS, bundled_transcripts, derive
from gateway.upstream import (
    RequestFieldError,
    SSEDecoder,
    lax_bool,
    lax_int,
    output_token_limit,
    parse_chunk,
    select_binding,
)
from tests.support.tiers import examples

TRANSCRIPTS = bundled_transcripts()


def _same_request(stream: dict[str, Any], plain: dict[str, Any]) -> bool:
    return ({k: v for k, v in stream.items() if k not in ("stream", "stream_options")}
            == {k: v for k, v in plain.items() if k != "stream"})


#: Every recorded pair (``nnrp-gateway record``: seeded, so both runs generate the same
#: tokens) whose non-streaming twin asked vLLM the very same thing. The older captures and
#: the hand-written transcripts are not such twins (unseeded, or invented text).
PAIRS = sorted(
    name.removeprefix("stream_") for name, t in TRANSCRIPTS.items()
    if name.startswith("stream_pair_") and t.status == 200
    and (twin := TRANSCRIPTS.get("nonstream_" + name.removeprefix("stream_"))) is not None
    and _same_request(t.request_body, twin.request_body))


def test_the_pairs_are_there() -> None:
    assert len(PAIRS) >= 9
    assert {"pair_logprobs_n2", "pair_token_ids", "pair_logprobs_token_ids"} <= set(PAIRS)


def rebuild(body: bytes, family: str, cuts: list[int]) -> tuple[Translator, list[Any]]:
    binding, _ = select_binding(VERSIONS[family], allow_untested=True)
    translator = Translator(binding, usage_requested=True)
    decoder = SSEDecoder()
    events: list[Any] = []
    bounds = [0, *sorted(set(cuts)), len(body)]
    for start, end in itertools.pairwise(bounds):
        for event in decoder.feed(body[start:end]):
            if not event.is_done:
                events += translator.feed(parse_chunk(event.data))
    return translator, events + translator.finish()


def without_ids(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


@settings(max_examples=examples(60), deadline=None)
@given(pair=st.sampled_from(PAIRS), family=st.sampled_from(FAMILIES), data=st.data())
def test_a_rebuilt_stream_is_vllms_non_streaming_answer(pair: str, family: str,
                                                        data: st.DataObject) -> None:
    stream = derive(TRANSCRIPTS[f"stream_{pair}"], family)
    plain = derive(TRANSCRIPTS[f"nonstream_{pair}"], family)
    cuts = data.draw(st.lists(st.integers(0, len(stream.body)), max_size=8))
    translator, _ = rebuild(stream.body, family, cuts)
    assert without_ids(translator.completed_body()) == without_ids(json.loads(plain.body))


@pytest.mark.parametrize("pair", PAIRS)
def test_per_token_data_rides_on_the_events(pair: str) -> None:
    """Logprobs and token ids reach a streaming client in order, token by token, also for
    tokens with no text (extension vllm.logprobs)."""
    _, events = rebuild(TRANSCRIPTS[f"stream_{pair}"].body, "0.32", [])
    plain = json.loads(TRANSCRIPTS[f"nonstream_{pair}"].body)
    for choice in plain["choices"]:
        mine = [e for e in events if e.get("index") == choice["index"]]
        streamed_logprobs = [entry for e in mine for entry in
                             (e.get("logprobs") or {}).get("content") or []]
        assert streamed_logprobs == ((choice["logprobs"] or {}).get("content") or [])
        streamed_ids = [i for e in mine for i in e.get("token_ids") or []]
        assert streamed_ids == (choice["token_ids"] or [])
        text = "".join(e["delta"] for e in mine if e["type"] == "response.output_text.delta")
        assert text == choice["message"]["content"]


def test_openai_chunk_conveys_every_chunk() -> None:
    body = TRANSCRIPTS["stream_pair_logprobs"].body
    binding, _ = select_binding("0.32.0", allow_untested=True)
    translator = Translator(binding, usage_requested=False, include_openai_chunk=True)
    chunks, conveyed = [], []
    for block in body.split(b"\n\n"):
        if block.startswith(b"data: {"):
            chunk = parse_chunk(block[6:].decode())
            chunks.append(chunk)
            for event in translator.feed(chunk):
                if not conveyed or conveyed[-1] is not event["openai_chunk"]:
                    conveyed.append(event["openai_chunk"])
    assert conveyed == chunks


def test_unknown_fields_pass_through() -> None:
    """A field a future vLLM adds reaches the completed body without being listed."""
    binding, _ = select_binding("0.26.0")
    translator = Translator(binding, usage_requested=False)
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    translator.feed({**base, "future_top": None, "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": "", "audio_text": "a"},
         "future_choice": {"x": 1}}]})
    translator.feed({**base, "future_top": {"k": 2}, "choices": [
        {"index": 0, "delta": {"content": "hi", "audio_text": "b"}, "finish_reason": "stop"}]})
    body = translator.completed_body()
    assert body["future_top"] == {"k": 2}
    choice = body["choices"][0]
    assert choice["future_choice"] == {"x": 1}
    assert choice["message"]["audio_text"] == "ab"  # streamed text fields are joined
    assert choice["message"]["content"] == "hi"


# --------------------------------------------------------------------------- requests

#: (value, what vLLM 0.32's pydantic makes of it: True/False/None, or "error").
BOOLS = [(True, True), (False, False), (0, False), (1, True), (2, "error"), (0.0, False),
         (1.0, True), (1.5, "error"), ("true", True), ("TRUE", True), ("tRuE", True),
         (" true", "error"), ("true ", "error"), ("1", True), ("0", False), ("yes", True),
         ("Y", True), ("on", True), ("off", False), ("t", True), ("f", False), ("n", False),
         ("no", False), ("", "error"), ("maybe", "error"), ("1.0", "error"), (None, None),
         ([True], "error"), ({}, "error")]
INTS = [(2, 2), (2.0, 2), (2.5, "error"), (True, 1), (False, 0), ("2", 2), (" 2", 2),
        ("2 ", 2), ("+2", 2), ("-2", -2), ("0x10", "error"), ("", "error"), (None, None),
        ("abc", "error"), (float("inf"), "error"), ([2], "error")]


@pytest.mark.parametrize(("value", "read"), BOOLS, ids=repr)
def test_booleans_are_read_as_vllm_reads_them(value: Any, read: Any) -> None:
    if read == "error":
        with pytest.raises(RequestFieldError, match="stream must be a boolean"):
            lax_bool(value, "stream")
    else:
        assert lax_bool(value, "stream") is read


@pytest.mark.parametrize(("value", "read"), INTS, ids=repr)
def test_integers_are_read_as_vllm_reads_them(value: Any, read: Any) -> None:
    if read == "error":
        with pytest.raises(RequestFieldError):
            lax_int(value, "max_tokens")
    else:
        assert lax_int(value, "max_tokens") == read


def test_max_completion_tokens_wins() -> None:
    assert output_token_limit({"max_tokens": 2, "max_completion_tokens": "3"}) == (
        "max_completion_tokens", 3)
    assert output_token_limit({"max_tokens": 2, "max_completion_tokens": None}) == (
        "max_tokens", 2)
    assert output_token_limit({}) is None
