"""``Translator.feed_encoded`` against ``feed`` + ``encode_event`` (issue 25).

Two translators fed the same chunks, one each way, must give the same bytes chunk by
chunk, the same refusals, and end in the same state: the completed body, usage, extra
fields, the chunk count, and what ``finish`` and ``abort`` then say.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from gateway.pipeline import Translator
from gateway.pipeline._translate import forces_tool_choice
from gateway.profile import events as ev
from gateway.tools.replay import FAMILIES, family_transcripts
from gateway.upstream import BINDINGS, Binding, UpstreamMalformed, parse_chunk, select_binding
from gateway.upstream._chunks import check_chunk
from tests.support.tiers import examples


def outcome(step: Any) -> Any:
    try:
        return "events", step()
    except UpstreamMalformed as exc:
        return "refused", (str(exc), exc.kind)


def run_both(binding: Binding, chunks: list[dict[str, Any]], **options: Any) -> int:
    """Feed both ways and compare everything; how many chunks the short way served."""
    general = Translator(binding, **options)
    fused = Translator(binding, **options)
    served = 0
    for chunk in chunks:
        before = fused.choices.get(chunk["choices"][0]["index"]) if chunk["choices"] else None
        expected = outcome(lambda c=chunk: [ev.encode_event(e) for e in general.feed(
            json.loads(json.dumps(c)))])  # its own copy: feed may keep parts of the chunk
        got = outcome(lambda c=chunk: fused.feed_encoded(json.loads(json.dumps(c))))
        assert got == expected, chunk
        served += before is not None and expected[0] == "events"
        if expected[0] == "refused":
            break
    assert fused.chunks == general.chunks
    assert fused.usage == general.usage and fused.extra == general.extra
    assert json.dumps(fused.completed_body()) == json.dumps(general.completed_body())
    assert [ev.encode_event(e) for e in fused.finish()] == [
        ev.encode_event(e) for e in general.finish()]
    assert [ev.encode_event(e) for e in fused.abort("cut")] == [
        ev.encode_event(e) for e in general.abort("cut")]
    return served


def transcript_chunks(family: str) -> list[tuple[str, Binding, dict[str, Any],
                                                 list[dict[str, Any]]]]:
    out = []
    for name, transcript in sorted(family_transcripts(family).items()):
        if not transcript.streaming or transcript.status != 200:
            continue
        binding, _ = select_binding(transcript.vllm_version)
        chunks = []
        for block in transcript.body.split(b"\n\n"):
            if block.startswith(b"data: ") and block != b"data: [DONE]":
                try:
                    chunks.append(parse_chunk(block[6:].decode("utf-8")))
                except (UpstreamMalformed, UnicodeDecodeError):
                    break  # the stream ends here for the gateway too
        out.append((name, binding, transcript.request_body, chunks))
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("usage_requested", [False, True])
@pytest.mark.parametrize("include_openai_chunk", [False, True])
def test_every_recorded_stream_translates_the_same_either_way(
        family: str, usage_requested: bool, include_openai_chunk: bool) -> None:
    served = 0
    for _name, binding, request, chunks in transcript_chunks(family):
        served += run_both(binding, chunks, usage_requested=usage_requested,
                           include_openai_chunk=include_openai_chunk,
                           forced_tool_choice=forces_tool_choice(request))
    if not include_openai_chunk:
        assert served >= 20  # the short way is the one the text streams take


# ------------------------------------------------------------------ generated streams

texts = st.text(st.characters(codec="utf-8"), max_size=6)


@st.composite
def chunk_streams(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A checked stream's chunks: the plain text delta among every shape around it."""
    chunks = []
    extra_top = draw(st.dictionaries(st.sampled_from(["system_fingerprint", "prompt_text",
                                                      "prompt_token_ids"]),
                                     st.none() | texts, max_size=2))
    for _ in range(draw(st.integers(1, 12))):
        shape = draw(st.sampled_from(["plain", "plain", "plain", "role", "empty", "finish",
                                      "logprobs", "token_ids", "reasoning", "noise",
                                      "usage", "extra_delta", "no_token_ids", "wrong"]))
        index = draw(st.integers(0, 2))
        delta: dict[str, Any] = {"content": draw(texts)}
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None,
                                  "finish_reason": None, "token_ids": None}
        top: dict[str, Any] = {"id": "chatcmpl-g", "object": "chat.completion.chunk",
                               "created": 7, "model": "m", "choices": [choice]}
        if shape == "role":
            choice["delta"] = {"role": "assistant", "content": ""}
            top.update(extra_top)
        elif shape == "empty":
            choice["delta"] = {}
        elif shape == "finish":
            choice["finish_reason"] = draw(st.sampled_from(["stop", "length"]))
            choice["stop_reason"] = draw(st.none() | st.integers(0, 9))
        elif shape == "logprobs":
            choice["logprobs"] = {"content": [{"token": "x", "logprob": -0.5}]}
        elif shape == "token_ids":
            choice["token_ids"] = draw(st.lists(st.integers(0, 99), max_size=3))
        elif shape == "reasoning":
            choice["delta"] = {"reasoning": draw(texts)}
        elif shape == "noise":
            delta["tool_calls"] = []
        elif shape == "usage":
            top["choices"] = []
            top["usage"] = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
        elif shape == "extra_delta":
            delta["annotations"] = draw(st.none() | texts)
        elif shape == "no_token_ids":
            del choice["token_ids"]
        elif shape == "wrong":
            choice["delta"] = {"content": None}
        check_chunk(top)
        chunks.append(top)
    return chunks


@settings(max_examples=examples(300), deadline=None)
@given(chunks=chunk_streams(), binding=st.sampled_from(BINDINGS),
       usage_requested=st.booleans(), include_openai_chunk=st.booleans())
def test_generated_streams_translate_the_same_either_way(
        chunks: list[dict[str, Any]], binding: Binding, usage_requested: bool,
        include_openai_chunk: bool) -> None:
    run_both(binding, chunks, usage_requested=usage_requested,
             include_openai_chunk=include_openai_chunk)


def test_the_short_way_encodes_like_the_event_encoder() -> None:
    for text in ["", "plain", 'quote " and \\ back', "\u2028\x00\x1f é 😀"]:
        assert ev.encode_text_delta(3, text) == ev.encode_event(ev.text_delta(3, text))
