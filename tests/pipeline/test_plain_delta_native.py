"""The plain text delta's C function (``gateway/pipeline/_plain_delta_native.c``) against
the pure one (``_plain_delta.plain_blocks``, rule 7 there): the same answer, value and
type, or the same exception, for every read.

Over every recorded read of every vLLM family, with the kept bytes the stream had then
(through ``PlainDelta``, as the handler reads: both functions are asked and the pure
one's answer goes on), each also cut, bitten and spliced by hypothesis; over
hypothesis-built reads of hostile bytes (truncated UTF-8, surrogates and overlongs
encoded as UTF-8, code points past U+10FFFF, NUL, quotes, backslashes, a prefix and a
suffix that overlap or hold each other, empty texts, any length cap); over huge blocks;
and over arguments of the wrong type. The C function is the compiled build's
(``make compiled``): without it these tests skip and say so, except under
``NNRP_TESTS_COMPILED=1`` (the compiled leg), where its absence fails them.
``tests/fuzz``'s ``plain_blocks`` target runs the same comparison under atheris
(``make fuzz-native``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from gateway.pipeline._plain_delta import NATIVE_BLOCKS, PlainBlocks, plain_blocks
from gateway.tools.replay import FAMILIES
from tests.pipeline.test_plain_delta import reads_taken, streams
from tests.support.tiers import examples

REQUIRED = os.environ.get("NNRP_TESTS_COMPILED") == "1"

pytestmark = pytest.mark.skipif(
    NATIVE_BLOCKS is None and not REQUIRED,
    reason="the C plain text delta is built by the compiled build only (make compiled)")


def native() -> PlainBlocks:
    assert NATIVE_BLOCKS is not None, (
        "NNRP_TESTS_COMPILED=1, but gateway.pipeline._plain_delta_native did not import: "
        "the compiled build lost its C plain text delta (hatch_build.py)")
    return NATIVE_BLOCKS


def answer(blocks: PlainBlocks, *args: Any) -> object:
    """What ``blocks`` gives: its value, or its exception's type and words."""
    try:
        return blocks(*args)
    except (TypeError, ValueError) as error:
        return type(error), str(error)


def same(raw: bytes, prefix: bytes, suffix: bytes, longest: int, event_tail: bytes) -> object:
    """Both functions' answer, checked to be the same, types included."""
    expected = answer(plain_blocks, raw, prefix, suffix, longest, event_tail)
    got = answer(native(), raw, prefix, suffix, longest, event_tail)
    assert got == expected, (raw, prefix, suffix, longest, event_tail)
    if isinstance(expected, tuple) and isinstance(expected[0], list):
        assert isinstance(got, tuple) and type(got[0]) is list and type(got[1]) is tuple
        assert [type(text) for text in got[0]] == [str] * len(expected[0])
        assert [type(body) for body in got[1]] == [type(body) for body in expected[1]]
    return expected


# --------------------------------------------------------------------------- recorded


#: The (raw, prefix, suffix, longest, event_tail) every recorded read was offered with.
RECORDED: list[tuple[bytes, bytes, bytes, int, bytes]] = []


def recorded() -> list[tuple[bytes, bytes, bytes, int, bytes]]:
    """Every read of every recorded stream as ``PlainDelta`` offers it, once."""
    if not RECORDED:
        def both(*args: Any) -> Any:
            RECORDED.append(args)
            return same(*args)

        for family in FAMILIES:
            for transcript in streams(family).values():
                if transcript.status == 200:
                    reads_taken(transcript, both)
    return RECORDED


def test_every_recorded_read_gets_the_same_answer() -> None:
    reads = recorded()
    taken = sum(plain_blocks(*args) is not None for args in reads)
    assert taken >= 100, taken  # not only refusals: the reads the fused path takes
    assert len({args[1] for args in reads}) >= 10  # many streams' heads


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cut=st.integers(0, 1 << 16), bite=st.integers(0, 1 << 16),
       splice=st.binary(max_size=6), how=st.sampled_from(["cut", "bite", "splice",
                                                          "double", "longest"]))
def test_recorded_reads_changed_get_the_same_answer(data: st.DataObject, cut: int, bite: int,
                                                    splice: bytes, how: str) -> None:
    reads = recorded()
    raw, prefix, suffix, longest, tail = reads[data.draw(st.integers(0, len(reads) - 1))]
    at = cut % (len(raw) + 1)
    if how == "cut":  # a read that ends (or starts) mid-event
        raw = raw[:at] if bite % 2 else raw[at:]
    elif how == "bite":  # a byte lost
        raw = raw[:at] + raw[at + 1:]
    elif how == "splice":  # hostile bytes anywhere, a block boundary included
        raw = raw[:at] + splice + raw[at:]
    elif how == "double":  # the read twice, and a block's worth more
        raw = raw + raw[:at] + raw
    else:  # the cap at and around the blocks' lengths
        longest = len(raw) - len(suffix) + (bite % 5) - 2
    same(raw, prefix, suffix, longest, tail)


# --------------------------------------------------------------------------- hostile

#: Pieces of text: UTF-8 and what strict UTF-8 refuses (a surrogate encoded, overlongs,
#: a truncated sequence, past U+10FFFF, a lone continuation byte), and the bytes the
#: bare test refuses (NUL, a control byte, CR, LF, a quote, a backslash); DEL and
#: U+2028 are bare.
PIECES = [b"a", b" quick", b"\xc3\xa9", b"\xe2\x80\xa8", b"\xf0\x9f\x98\x80", b"\x7f",
          b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\xaf",
          b"\xf0\x80\x80\x80", b"\xe2\x82", b"\xf0\x9f\x98", b"\xf4\x90\x80\x80", b"\x80",
          b"\xff", b"\x00", b"\x1f", b"\r", b"\n", b'"', b"\\", b""]

prefixes = st.sampled_from([b'data: {"c":"', b"data: ", b"", b"ab", b"a", b"\n\n",
                            b'"}\n\n'])
suffixes = st.sampled_from([b'"}\n\n', b"\n\n", b"\n", b"a", b"ab", b"ba", b"aa", b"",
                            b'"},"token_ids":null}]}\n\n', b'data: {"c":"'])


@settings(max_examples=examples(600), deadline=None)
@given(prefix=prefixes, suffix=suffixes,
       texts=st.lists(st.lists(st.sampled_from(PIECES), max_size=5), min_size=1, max_size=5),
       before=st.sampled_from([b"", b"x", b"a", b'"', b"\xc3"]),
       after=st.sampled_from([b"", b"x", b"a", b"\n\n"]),
       longest=st.integers(-2, 120) | st.sampled_from([1 << 70, -(1 << 70), 1 << 62]),
       event_tail=st.binary(max_size=8))
@example(prefix=b"ab", suffix=b"ba", texts=[[b"a"], [b""]], before=b"", after=b"",
         longest=40, event_tail=b"")  # the prefix and the suffix overlap
@example(prefix=b"", suffix=b"\n", texts=[[b"\n"]], before=b"", after=b"\n", longest=9,
         event_tail=b"")  # a suffix that split() cuts short of the read's end
@example(prefix=b"a", suffix=b"", texts=[[b'"']], before=b"", after=b"", longest=9,
         event_tail=b"")  # several, with an empty suffix: split()'s ValueError
def test_hostile_reads_get_the_same_answer(prefix: bytes, suffix: bytes, texts: list[list[bytes]],
                                           before: bytes, after: bytes, longest: int,
                                           event_tail: bytes) -> None:
    raw = before + b"".join(prefix + b"".join(text) + suffix for text in texts) + after
    same(raw, prefix, suffix, longest, event_tail)


#: Few bytes, so that a prefix and a suffix recur in a read: each class of the rules'
#: (bare, not bare, UTF-8 lead, continuation, surrogate lead) and any byte.
def few_bytes(max_size: int) -> st.SearchStrategy[bytes]:
    return st.lists(st.sampled_from(b'ab\n"\\\x00\x1f\x7f\xc3\xa9\xed\xa0\x80 ') | st.integers(0, 255),
                    max_size=max_size).map(bytes)


@settings(max_examples=examples(600), deadline=None)
@given(raw=few_bytes(40), prefix=few_bytes(3), suffix=few_bytes(3), longest=st.integers(-2, 50),
       event_tail=st.binary(max_size=4))
def test_any_bytes_get_the_same_answer(raw: bytes, prefix: bytes, suffix: bytes, longest: int,
                                       event_tail: bytes) -> None:
    same(raw, prefix, suffix, longest, event_tail)


@pytest.mark.parametrize("text", [b"x" * (1 << 20), "é".encode() * (1 << 19),
                                  b"x" * (1 << 20) + b"\xe2\x82"])
@pytest.mark.parametrize("blocks", [1, 3])
def test_huge_blocks_get_the_same_answer(text: bytes, blocks: int) -> None:
    prefix, suffix = b'data: {"c":"', b'"}\n\n'
    raw = (prefix + text + suffix) * blocks
    size = len(prefix) + len(text)
    for longest in (size - 1, size, 1 << 62):
        same(raw, prefix, suffix, longest, b'","index":0}')


def test_arguments_of_another_type_are_refused() -> None:
    """Bytes only (where Python's would take some other buffers), and an int."""
    args = (b'data: "a"}\n\n', b'data: "', b'"}\n\n', 99, b"}")
    assert same(*args) == (["a"], (b'{"delta":"a}',))
    for at, wrong in ((0, "text"), (1, bytearray(b"data: ")), (2, None), (4, memoryview(b""))):
        changed = (*args[:at], wrong, *args[at + 1:])
        with pytest.raises(TypeError, match=f"argument {at + 1} must be bytes"):
            native()(*changed)
    with pytest.raises(TypeError):
        native()(*args[:4])  # type: ignore[call-arg]
    assert same(args[0], args[1], args[2], True, args[4]) is None  # an int, as in Python
    with pytest.raises(TypeError):
        native()(args[0], args[1], args[2], 9.5, args[4])  # type: ignore[arg-type]


def test_no_reference_or_memory_is_kept_by_a_call() -> None:
    """Each way out (taken, refused, not UTF-8, an exception) releases what it made."""
    prefix, suffix, tail = b'data: "', b'"}\n\n', b'"}'
    reads = [(prefix + b"ab" + suffix) * 3, prefix + b"a" + suffix + prefix + b'"' + suffix,
             prefix + b"a" + suffix + prefix + b"\xed\xa0\x80" + suffix,
             prefix + b"\xc0\x80" + suffix, prefix + suffix]
    kept = [sys.getrefcount(obj) for obj in (*reads, prefix, suffix, tail)]
    call = native()

    def calls() -> None:
        for _ in range(2000):
            for raw in reads:
                call(raw, prefix, suffix, 99, tail)
            with contextlib.suppress(ValueError):
                call(b"ab\\", b"a", b"", 9, tail)

    calls()  # what the first calls make once (interned, cached), then measured
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        calls()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 16_384, grown  # 12,000 calls: a byte a call would show
    assert [sys.getrefcount(obj) for obj in (*reads, prefix, suffix, tail)] == kept
