"""The plain text delta's pattern (``_chunks`` rules 1-4) against the general path.

The general path (``json.loads`` and the checks) is the referee: for every input, the
fast path either declines (None) or builds exactly what the general path returns, and
``parse_chunk`` answers every input as the general path does, the same dict (types and
key order too) or the same error; and a stream's ``ChunkParser``, which keeps the head
of the last chunk the pattern read (rule 4), answers each chunk of a stream as
``parse_chunk`` does alone.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings, strategies as st

from gateway.tools.replay import FAMILIES, family_transcripts
from gateway.upstream import ChunkParser, UpstreamMalformed, parse_chunk
from gateway.upstream._chunks import _parse_in_general, _plain_text_chunk
from tests.support.tiers import examples


def general(data: str) -> dict[str, Any] | str:
    """The general path alone (the error's text on a refusal)."""
    try:
        return _parse_in_general(data)
    except UpstreamMalformed as exc:
        return str(exc)


def answer(data: str) -> tuple[str, Any]:
    """``parse_chunk``'s answer, in a form two paths can be compared by."""
    try:
        return "chunk", typed(parse_chunk(data))
    except UpstreamMalformed as exc:
        return "error", (str(exc), exc.kind)


def typed(value: Any) -> Any:
    """A value with every type and key order spelled out (1 == True == 1.0 in Python)."""
    if isinstance(value, dict):
        return ("dict", [(key, typed(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("list", [typed(item) for item in value])
    return (type(value).__name__, value)


def assert_same(data: str) -> bool:
    """The fast path declines or agrees with the general path; True when it took it."""
    fast = _plain_text_chunk(data)
    if fast is None:
        return False
    reference = general(data)
    assert isinstance(reference, dict), (data, reference)
    assert typed(fast) == typed(reference), data
    return True


def assert_same_answer(data: str) -> None:
    """``parse_chunk`` answers as the general path does: its chunk, or an error."""
    reference = general(data)
    kind, value = answer(data)
    if isinstance(reference, dict):
        assert (kind, value) == ("chunk", typed(reference))
    else:
        assert kind == "error"


def recorded_payloads() -> list[str]:
    """Every SSE data payload of every transcript, as each family plays it."""
    payloads = set()
    for family in FAMILIES:
        for transcript in family_transcripts(family).values():
            if not transcript.streaming:
                continue
            for block in transcript.body.split(b"\n\n"):
                if block.startswith(b"data: ") and block != b"data: [DONE]":
                    try:
                        payloads.add(block[6:].decode("utf-8"))
                    except UnicodeDecodeError:
                        continue  # the SSE decoder refuses these before any chunk parse
    return sorted(payloads)


def test_every_recorded_chunk_reads_the_same_either_way() -> None:
    payloads = recorded_payloads()
    for data in payloads:
        # Taken exactly when the chunk is the plain shape, or it would be dead weight.
        assert assert_same(data) == is_plain(data), data
    assert sum(map(is_plain, payloads)) >= 40  # every family's text streams
    for data in payloads:
        reference = general(data)
        kind, value = answer(data)
        if isinstance(reference, dict):
            assert (kind, value) == ("chunk", typed(reference)), data


def is_plain(data: str) -> bool:
    """Whether ``data`` is vLLM's compact plain text delta with no surrogate escape, judged
    from the general path's result (not by the pattern)."""
    chunk = general(data)
    if not isinstance(chunk, dict) or "\\ud" in data.lower():
        return False
    if list(chunk) != ["id", "object", "created", "model", "choices"]:
        return False
    if len(chunk["choices"]) != 1:
        return False
    choice = chunk["choices"][0]
    if list(choice) not in (["index", "delta", "logprobs", "finish_reason", "token_ids"],
                            ["index", "delta", "logprobs", "finish_reason"]):
        return False
    if (list(choice["delta"]) != ["content"] or type(choice["delta"]["content"]) is not str
            or any(choice[key] is not None for key in list(choice)[2:])):
        return False
    return json.dumps(chunk, separators=(",", ":"), ensure_ascii=False) == data


PLAIN = ('{{"id":"{id}","object":"chat.completion.chunk","created":{created},'
         '"model":"{model}","choices":[{{"index":{index},"delta":{{"content":{content}}},'
         '"logprobs":null,"finish_reason":null{tail}}}]}}')


def plain(content: str = '"hi"', *, id: str = "chatcmpl-1", model: str = "m",
          created: str = "1796034842", index: str = "0", tail: str = ',"token_ids":null'
          ) -> str:
    return PLAIN.format(id=id, model=model, created=created, index=index, content=content,
                        tail=tail)


@pytest.mark.parametrize("data", [
    plain(), plain(tail=""), plain('""'), plain('"a\\nb\\"c\\\\d\\/e\\u00e9\\t"'),
    plain('"\u2028 raw \u0085 and é"'),
    plain(index="3"), plain(created="0"),
])
def test_plain_shapes_take_the_pattern(data: str) -> None:
    assert assert_same(data)


@pytest.mark.parametrize(("data", "why"), [
    (plain('"\\ud800 lone"'), "a lone surrogate: the general path refuses it"),
    (plain('"\\udc00"'), "a lone low surrogate"),
    (plain('"\\ud83d\\ude00 pair"'), "a pair: any surrogate escape goes the general way"),
    (plain('"raw\ttab"'), "a raw control character is not JSON"),
    (plain('"bad \\x escape"'), "an escape JSON has not"),
    (plain('"\\u12"'), "a short \\u escape"),
    (plain(created="01"), "a leading zero is not JSON"),
    (plain(created="-1"), "created below 0"),
    (plain(index="-1"), "a negative index"),
    (plain(id=""), "an empty id"),
    (plain(model=""), "an empty model"),
    (plain(id="a\\u0041"), "an escape in the id"),
    (plain('"x"', tail=',"token_ids":[1]'), "token ids"),
    (plain().replace('"logprobs":null', '"logprobs":{}'), "logprobs"),
    (plain().replace(',"finish_reason":null', ',"finish_reason":"stop"'), "a finish"),
    (plain().replace('"object":"chat.completion.chunk"', '"object":"x"'), "another object"),
    (plain().replace(",", ", "), "spaces"),
    (plain() + "x", "trailing bytes"),
    (plain(created="1" * 19), "past 18 digits: the general path reads it"),
])
def test_other_shapes_take_the_general_path(data: str, why: str) -> None:
    assert _plain_text_chunk(data) is None, why
    assert_same_answer(data)


#: Text that a token may be: any code point, surrogates included (as escapes below).
texts = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF))


def escape(text: str, how: int) -> str:
    """``text`` as a JSON string: vLLM's way (UTF-8 as is), all ASCII, or raw (which may
    leave a control character or a quote unescaped: not JSON, or not this shape)."""
    if how == 0:
        return json.dumps(text, ensure_ascii=False)
    if how == 1:
        return json.dumps(text, ensure_ascii=True)
    return '"' + text + '"'


@settings(max_examples=examples(400), deadline=None)
@given(text=texts, how=st.integers(0, 2), index=st.integers(0, 2**40),
       created=st.integers(0, 2**70), token_ids=st.booleans(),
       id=st.text(min_size=0, max_size=8), model=st.text(min_size=0, max_size=8))
@example(text="\ud800", how=1, index=0, created=0, token_ids=True, id="c", model="m")
@example(text="\x00", how=2, index=0, created=0, token_ids=True, id="c", model="m")
@example(text='a"b', how=2, index=0, created=0, token_ids=False, id="c", model="m")
def test_generated_chunks_read_the_same_either_way(
        text: str, how: int, index: int, created: int, token_ids: bool, id: str,
        model: str) -> None:
    data = plain(escape(text, how), id=id.replace('"', ""), model=model.replace('"', ""),
                 created=str(created), index=str(index),
                 tail=',"token_ids":null' if token_ids else "")
    assert_same(data)
    assert_same_answer(data)


@settings(max_examples=examples(300), deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | texts,
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["id", "object", "created", "model",
                                                       "choices", "index", "delta",
                                                       "content", "logprobs",
                                                       "finish_reason", "token_ids"]),
                                      inner, max_size=6),
                    max_leaves=12))
def test_generated_json_never_fools_the_pattern(value: Any) -> None:
    """Any JSON value in vLLM's compact encoding: taken only when the general path
    builds the very same chunk."""
    data = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert_same(data)


def test_a_number_past_pythons_digit_limit_is_a_malformed_chunk() -> None:
    # json.loads raises a bare ValueError (not JSONDecodeError) for an integer of more
    # than sys.get_int_max_str_digits() digits: it must end as backend_error, not as the
    # gateway's own runtime error.
    data = plain(created="1" * 5000)
    assert _plain_text_chunk(data) is None
    with pytest.raises(UpstreamMalformed, match="number that cannot be read"):
        parse_chunk(data)


# --------------------------------------------------------------------------- rule 4


def stream_answers(payloads: list[str]) -> list[tuple[str, Any]]:
    """One ``ChunkParser``'s answers to a stream's payloads, in order, as ``answer``
    gives them (a refusal does not end the parser: the next chunk is read as ever)."""
    parser = ChunkParser()
    answers: list[tuple[str, Any]] = []
    for data in payloads:
        try:
            answers.append(("chunk", typed(parser(data))))
        except UpstreamMalformed as exc:
            answers.append(("error", (str(exc), exc.kind)))
    return answers


def recorded_streams() -> list[list[str]]:
    """Every streamed transcript's SSE data payloads, in order, as each family plays it."""
    streams = []
    for family in FAMILIES:
        for transcript in family_transcripts(family).values():
            if not transcript.streaming:
                continue
            payloads = []
            for block in transcript.body.split(b"\n\n"):
                if block.startswith(b"data: ") and block != b"data: [DONE]":
                    try:
                        payloads.append(block[6:].decode("utf-8"))
                    except UnicodeDecodeError:
                        continue
            streams.append(payloads)
    return streams


def pattern_matches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on, every chunk the pattern is asked to match, in order."""
    from gateway.upstream import _chunks

    matched: list[str] = []
    pattern = _chunks._PLAIN_TEXT_CHUNK

    class Counting:
        def fullmatch(self, data: str) -> Any:
            matched.append(data)
            return pattern.fullmatch(data)

    monkeypatch.setattr(_chunks, "_PLAIN_TEXT_CHUNK", Counting())
    return matched


def test_every_recorded_stream_reads_the_same_with_its_head_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    streams = recorded_streams()
    assert len(streams) >= 40
    expected = [[answer(data) for data in payloads] for payloads in streams]
    matched = pattern_matches(monkeypatch)  # counted from here: the parsers' own asks
    plain_chunks = may_keep = 0
    for payloads, answers in zip(streams, expected, strict=True):
        assert stream_answers(payloads) == answers, payloads[:2]
        plain_chunks += sum(map(is_plain, payloads))
        may_keep += head_repeats(payloads)
    # Every plain text delta that could take the kept head took it: the pattern saw the
    # rest only (a stream's first, an escape, a new head or tail).
    kept = plain_chunks - sum(map(is_plain, matched))
    assert kept == may_keep and kept >= 90, (kept, may_keep, plain_chunks)


def head_repeats(payloads: list[str]) -> int:
    """The plain text deltas of a stream that rule 4 lets skip the pattern, judged from
    the general path's view (``is_plain``): no escape in the text, and the same head and
    tail as the last plain chunk before it."""
    count, last = 0, None
    marker = '"delta":{"content":"'
    for data in payloads:
        if not is_plain(data):
            continue
        key = (data[:data.index(marker) + len(marker)], data.endswith(',"token_ids":null}]}'))
        if key == last and "\\" not in data:
            count += 1
        last = key
    return count


def test_the_kept_head_is_what_most_chunks_of_a_stream_take(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first plain text delta, the next ones of the stream skip the pattern."""
    matched = pattern_matches(monkeypatch)
    parser = ChunkParser()
    chunks = [plain(f'"{word}"') for word in ("a", "quick", "brown", "fox")]
    for data in chunks:
        assert typed(parser(data)) == typed(general(data))
    assert matched == chunks[:1]
    # An escape, a new id, the other tail: the pattern reads it, and keeps the new head.
    for data in (plain('"a\\nb"'), plain('"x"', id="other"), plain('"y"', id="other"),
                 plain('"z"', id="other", tail="")):
        assert typed(parser(data)) == typed(general(data))
    assert matched == [*chunks[:1], plain('"a\\nb"'), plain('"x"', id="other"),
                       plain('"z"', id="other", tail="")]


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(texts, st.integers(0, 2), st.sampled_from(["c1", "c2"]),
                          st.sampled_from(["0", "1"]), st.booleans(),
                          st.sampled_from(["", "shape"])), min_size=1, max_size=12))
@example([("hi", 0, "c1", "0", True, ""), ('"},"logprobs":null,"finish_reason":null,'
                                            '"token_ids":null}]}', 2, "c1", "0", True, "")])
@example([("hi", 0, "c1", "0", True, ""), ("", 2, "c1", "0", True, "shape")])
def test_generated_streams_read_the_same_with_the_head_kept(
        chunks: list[tuple[str, int, str, str, bool, str]]) -> None:
    """Chunks of one stream (mostly one head, with texts that are anything, raw or
    escaped, other ids and indexes, both tails, and other shapes between): one parser
    answers each as ``parse_chunk`` does alone."""
    payloads = []
    for text, how, chunk_id, index, token_ids, shape in chunks:
        data = plain(escape(text, how), id=chunk_id, index=index,
                     tail=',"token_ids":null' if token_ids else "")
        if shape:  # a chunk of another shape with the same head: a finish
            data = data.replace(',"finish_reason":null', ',"finish_reason":"stop"')
        payloads.append(data)
    assert stream_answers(payloads) == [answer(data) for data in payloads]
