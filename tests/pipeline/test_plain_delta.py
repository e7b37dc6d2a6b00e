"""The plain text delta fused (``gateway.pipeline._plain_delta``) against the general path.

The referee is what a client receives: every byte after its session opened, through the
operation's terminal and the session's close, from a gateway with the fused path on and
one with it off (``ChatPipeline.plain_blocks``), both over real sockets in front of
the same replayed vLLM. Over every recorded stream of every vLLM family (the bundled
transcripts and the raw 0.32 captures of /work/shared when present), as recorded and
re-split at random points, and over hypothesis-generated streams (any text, escaped or
raw, empty deltas, lone surrogates, both tails, several events per read, any split),
the bytes are the same. A direct test shows the fused reader is not dead weight: it
reads most reads of the recorded streams, and declines what it must.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, example, given, settings, strategies as st

from gateway import nnrp
from gateway.app import Gateway, GatewayConfig
from gateway.errors import ConfigError
from gateway.pipeline import PipelineLimits, Translator
from gateway.pipeline._plain_delta import (
    NATIVE_BLOCKS,
    PlainBlocks,
    PlainDelta,
    plain_blocks,
    plain_blocks_of,
    plain_delta_mode,
)
from gateway.tools.replay import (
    FAMILIES,
    ReplayServer,
    Transcript,
    family_transcripts,
    load_transcript,
)
from gateway.upstream import (
    ChunkParser,
    ChunkStream,
    SSEDecoder,
    SSEError,
    UpstreamMalformed,
    select_binding,
)
from gateway.upstream._stream import LEAD_CHUNKS, WASTED_SPLITS
from tests.support.stack import envelope
from tests.support.tiers import examples
from tests.support.waits import until, until_steady

CAPTURES = Path(os.environ.get("NNRP_TESTS_CAPTURES", "/work/shared/vllm-captures/0.32.0"))


def captured() -> dict[str, Transcript]:
    """The raw 0.32 captures, where this machine has them (the bundled ``*_032``
    transcripts are recordings of the same build in any case)."""
    if not CAPTURES.is_dir():
        return {}
    return {f"capture_{path.stem}": load_transcript(path)
            for path in sorted(CAPTURES.glob("*.jsonl"))}


def streams(family: str) -> dict[str, Transcript]:
    """Every streamed transcript ``family`` plays (0.32 on: the raw captures too)."""
    found = dict(family_transcripts(family))
    if family in ("0.32", "0.33"):
        found.update(captured())
    return {name: transcript for name, transcript in sorted(found.items())
            if transcript.streaming}


# --------------------------------------------------------------------------- the stack


async def start_gateway(nursery: trio.Nursery, url: str, *, blocks: PlainBlocks | None
                        ) -> Gateway:
    gateway = Gateway(GatewayConfig(
        listen=("tcp://127.0.0.1:0",), vllm_url=url, probe_interval=0.05,
        health_interval=0.2, allow_untested_vllm=True,
        pipeline=PipelineLimits(first_chunk_timeout=3.0, idle_timeout=2.0)))
    gateway.pipeline.plain_blocks = blocks
    await nursery.start(gateway.run)
    with trio.fail_after(5):
        await gateway.probed.wait()
    return gateway


async def received(gateway: Gateway, payload: bytes) -> bytes:
    """Every byte the gateway sends after the session opened (a resumable one, so its
    journal keeps every event), through the terminal and the close's answer. Asked
    once vLLM is ready again (a recorded engine death makes it unready a while)."""
    with trio.fail_after(5):
        await until(lambda: gateway.ready_info() is not None)
    uri = next(e.uri for e in gateway.endpoints if e.transport == "tcp")
    host, port = uri.removeprefix("tcp://").rsplit(":", 1)
    client = nnrp.ClientConnection()
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(client.hello())
        session_id = 0
        while not session_id:
            for event in client.receive_data(await stream.receive_some()):
                if isinstance(event, nnrp.HelloAcked):
                    await stream.send_all(client.open_session(resume=True))
                elif isinstance(event, nnrp.SessionOpenAnswered):
                    assert event.opened, event
                    session_id = event.session_id
        await stream.send_all(client.submit(session_id, 1, 1, payload))
        seen = bytearray()
        ended = closed = False
        with trio.fail_after(20):
            while not closed:
                data = await stream.receive_some()
                assert data, "the gateway closed the connection"
                seen += data
                for event in client.receive_data(data):
                    if isinstance(event, nnrp.ResultReceived | nnrp.DropReceived):
                        ended = True
                        await stream.send_all(client.close_session(session_id))
                    closed = closed or isinstance(event, nnrp.SessionCloseAcked)
        assert ended
        return bytes(seen)


#: Longer than two of the gateways' health intervals (0.2 s, ``start_gateway``).
HEALTH_SETTLED = 0.5


async def revived(replay: ReplayServer, *gateways: Gateway) -> None:
    """After a recorded engine death, vLLM restarted, and every gateway ready again for
    ``HEALTH_SETTLED`` seconds in a row: a health check in flight when vLLM came back may
    still land "unhealthy" after ``ready_info`` said ready, and fail the next request
    fast (``backend_unavailable``): a race of the test's, not a difference of the ways."""
    if not replay.engine_dead:
        return
    replay.revive()

    def ready() -> list[bool]:
        return [gateway.ready_info() is not None for gateway in gateways]

    with trio.fail_after(10):
        while True:
            await until(lambda: all(ready()))
            await until_steady(ready, HEALTH_SETTLED)
            if all(ready()):
                return


async def both_ways(replay: ReplayServer, requests: list[tuple[str, dict[str, Any]]]
                    ) -> int:
    """Each request once through a fused gateway and once through a general one; the
    bytes must be the same. How many operations streamed at least one event."""
    async with trio.open_nursery() as nursery:
        url = await nursery.start(replay.serve)
        # The default's reader: the C function where this build has it (rule 6).
        fused = await start_gateway(nursery, url, blocks=plain_blocks_of("fused"))
        general = await start_gateway(nursery, url, blocks=None)
        streamed = 0
        for name, body in requests:
            payload = envelope(body, request_id=f"replay:{name}:same")
            expected = await received(general, payload)
            await revived(replay, fused, general)
            got = await received(fused, payload)
            await revived(replay, fused, general)
            assert got == expected, name
            streamed += b'"response.output_text.delta"' in expected
        nursery.cancel_scope.cancel()
    return streamed


def request_of(transcript: Transcript) -> dict[str, Any]:
    body = dict(transcript.request_body)
    return body if "messages" in body else {**body, "messages": [
        {"role": "user", "content": "Hello"}]}


def in_one_read(transcript: Transcript) -> Transcript:
    """The whole answer as one HTTP chunk: what an instant backend, or a stream the
    gateway fell behind on, gives one read (``_stream``'s splitting rules)."""
    return attrs.evolve(transcript, chunks=((0.0, transcript.body),))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rechunk", [None, 7, "whole"])
async def test_every_recorded_stream_reaches_the_client_the_same_either_way(
        family: str, rechunk: int | str | None) -> None:
    replay = ReplayServer(family=family, speed=100,
                          rechunk_seed=rechunk if isinstance(rechunk, int) else None)
    found = streams(family)
    if rechunk == "whole":
        found = {name: in_one_read(transcript) for name, transcript in found.items()}
    replay.transcripts.update(found)
    requests = [(name, request_of(transcript)) for name, transcript in found.items()]
    assert len(requests) >= 20
    assert await both_ways(replay, requests) >= 10


# --------------------------------------------------------------------------- generated

_SSE_HEADERS = (("content-type", "text/event-stream; charset=utf-8"),)
_ID, _CREATED, _MODEL = "chatcmpl-generated", 1796034842, "example-model"

#: Text a token may be: any code point, surrogates included (escaped: see ``delta``).
texts = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF),
                max_size=6)


def delta(text: str, how: int, *, index: int, token_ids: bool) -> bytes:
    """One SSE event of vLLM's plain text delta: the text as vLLM writes it (UTF-8 as
    is), all ASCII, or raw (a control character or quote left bare: not JSON)."""
    if how == 0:
        content = json.dumps(text, ensure_ascii=False)
    elif how == 1:
        content = json.dumps(text, ensure_ascii=True)
    else:
        content = '"' + text + '"'
    tail = ',"token_ids":null' if token_ids else ""
    chunk = (f'{{"id":"{_ID}","object":"chat.completion.chunk","created":{_CREATED},'
             f'"model":"{_MODEL}","choices":[{{"index":{index},"delta":{{"content":'
             f'{content}}},"logprobs":null,"finish_reason":null{tail}}}]}}')
    return b"data: " + chunk.encode("utf-8", "surrogatepass") + b"\n\n"


def generated_stream(events: list[tuple[str, int, int, bool]], cuts: list[int]) -> bytes:
    role = {"id": _ID, "object": "chat.completion.chunk", "created": _CREATED,
            "model": _MODEL, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                              "content": ""},
                                          "logprobs": None, "finish_reason": None}]}
    finish = {**role, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                   "finish_reason": "stop", "stop_reason": None}]}
    body = b"data: " + json.dumps(role, separators=(",", ":")).encode() + b"\n\n"
    for text, how, index, token_ids in events:
        body += delta(text, how, index=index, token_ids=token_ids)
    body += b"data: " + json.dumps(finish, separators=(",", ":")).encode() + b"\n\n"
    return body + b"data: [DONE]\n\n"


def split(body: bytes, cuts: list[int], how: str) -> tuple[tuple[float, bytes], ...]:
    """The body as HTTP chunks: at the given points (``cuts``), a few whole events per
    chunk (``events``), so that several plain deltas arrive in one read, or all of it
    in one (``whole``)."""
    if how == "whole":
        return ((0.0, body),)
    if how == "events":
        events = [event + b"\n\n" for event in body.split(b"\n\n")[:-1]]
        sizes = [1 + cut % 3 for cut in cuts] or [1]
        pieces, at = [], 0
        while at < len(events):
            size = sizes[len(pieces) % len(sizes)]
            pieces.append(b"".join(events[at:at + size]))
            at += size
    else:
        points = sorted({cut % len(body) for cut in cuts} - {0})
        pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    return tuple((2.0 * i, piece) for i, piece in enumerate(pieces))


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(st.tuples(texts, st.sampled_from([0, 0, 0, 1, 2]),
                                 st.sampled_from([0, 0, 0, 1]), st.booleans()),
                       min_size=1, max_size=12),
       cuts=st.lists(st.integers(0, 1 << 16), max_size=8),
       how=st.sampled_from(["cuts", "events", "whole"]))
@example(events=[("a", 0, 0, True), ("", 0, 0, True), ("é\u2028\x7f", 0, 0, True),
                 ('q"b\\', 0, 0, True), ("x", 0, 0, False)], cuts=[1, 2], how="events")
@example(events=[("hi", 0, 0, True), ("\ud800", 1, 0, True), ("z", 0, 0, True)], cuts=[],
         how="events")
@example(events=[("hi", 0, 0, True), ("a\tb", 2, 0, True), ("z", 0, 0, True)], cuts=[5],
         how="cuts")
@example(events=[("hi", 0, 0, True), ("a", 0, 0, True), ("q\"", 0, 0, True),
                 ("z", 0, 0, True), ("", 0, 0, True)], cuts=[], how="whole")
@example(events=[("hi", 0, 0, True), ("a", 0, 0, True), ("b", 0, 0, False),
                 ("c", 0, 0, True)], cuts=[], how="whole")
def test_generated_streams_reach_the_client_the_same_either_way(
        events: list[tuple[str, int, int, bool]], cuts: list[int], how: str) -> None:
    body = generated_stream(events, cuts)
    transcript = Transcript("generated", "0.26.0", 200, _SSE_HEADERS,
                            split(body, cuts, how),
                            {"model": _MODEL, "stream": True,
                             "messages": [{"role": "user", "content": "Hello"}]})
    replay = ReplayServer(family="0.26", speed=1.0)
    replay.transcripts["generated"] = transcript
    trio.run(both_ways, replay, [("generated", dict(transcript.request_body))])


# --------------------------------------------------------------------------- the reader


def reads_taken(transcript: Transcript, blocks: PlainBlocks = plain_blocks
                ) -> tuple[int, int]:
    """A transcript's recorded reads through one stream's decoder and parser, each
    offered to the fused reader first, as ``ChunkStream.fused`` does: how many it took,
    and how many it left that it should have taken, judged from the general path's
    view: one event, a plain text delta of a choice already seen, with the head and tail
    kept before it and a text that needs no escape."""
    binding, _ = select_binding(transcript.vllm_version)
    translator = Translator(binding, usage_requested=False)
    reader, decoder, parser = PlainDelta(translator, blocks), SSEDecoder(), ChunkParser()
    taken = missed = 0
    for _, raw in transcript.chunks:
        kept, seen = parser.kept, set(translator.choices)
        part = reader(raw, decoder, parser)
        if part is not None:
            taken += 1
            raw = raw[part[1]:]  # what follows the run goes the general way (rule 8)
            if not raw:
                continue
        try:
            events = decoder.feed(raw)
            for event in events:
                if event.is_done:
                    return taken, missed
                chunk = parser(event.data)
                translator.feed_encoded(chunk)
                missed += (len(events) == 1 and kept is not None and is_plain(chunk, seen)
                           and event.data.startswith(kept[0])
                           and event.data.endswith(kept[1])
                           and bare(chunk["choices"][0]["delta"]["content"]))
        except (SSEError, UpstreamMalformed):
            break  # the stream ends here
    return taken, missed


def bare(text: str) -> bool:
    """The text is its own JSON string (as vLLM writes it)."""
    return json.dumps(text, ensure_ascii=False) == f'"{text}"'


def is_plain(chunk: dict[str, Any], seen: set[int]) -> bool:
    if list(chunk) != ["id", "object", "created", "model", "choices"]:
        return False
    if len(chunk["choices"]) != 1:
        return False
    choice = chunk["choices"][0]
    return (choice["index"] in seen and choice["delta"].keys() == {"content"}
            and choice.keys() <= {"index", "delta", "logprobs", "finish_reason", "token_ids"}
            and all(choice.get(key) is None for key in ("logprobs", "finish_reason",
                                                        "token_ids")))


#: Rule 7's two functions; the C one where this build has it (test_plain_delta_native.py
#: compares them read by read, and says why it is not here where it is not).
BLOCKS = [pytest.param(plain_blocks, id="python"),
          pytest.param(NATIVE_BLOCKS, id="c", marks=pytest.mark.skipif(
              NATIVE_BLOCKS is None, reason="the C plain delta is the compiled build's"))]


@pytest.mark.parametrize("blocks", BLOCKS)
def test_the_fused_reader_takes_every_read_it_may_in_the_recorded_streams(
        blocks: PlainBlocks) -> None:
    taken = missed = 0
    for family in FAMILIES:
        for transcript in streams(family).values():
            if transcript.status == 200:
                counts = reads_taken(transcript, blocks)
                taken, missed = taken + counts[0], missed + counts[1]
    assert missed == 0 and taken >= 100, (taken, missed)


@pytest.mark.parametrize("blocks", BLOCKS)
def test_the_fused_reader_declines_what_the_general_path_must_read(blocks: PlainBlocks
                                                                   ) -> None:
    binding, _ = select_binding("0.26.0")
    translator = Translator(binding, usage_requested=False)
    reader, decoder, parser = PlainDelta(translator, blocks), SSEDecoder(), ChunkParser()
    first = generated_stream([("a", 0, 0, True)], []).split(b"\n\n")
    role, plain = first[0] + b"\n\n", first[1] + b"\n\n"
    assert reader(plain, decoder, parser) is None  # no head kept yet
    for event in decoder.feed(role + plain):
        translator.feed_encoded(parser(event.data))
    b = delta("b", 0, index=0, token_ids=True)
    assert reader(b, decoder, parser) == (
        (b'{"delta":"b","index":0,"type":"response.output_text.delta"}',), len(b))
    empty = delta("", 0, index=0, token_ids=True)
    assert reader(empty, decoder, parser) == ((None,), len(empty))
    # Rule 8: a run, then what the general way reads (the end, another tail).
    c = delta("c", 0, index=0, token_ids=True)
    for after in (b"data: [DONE]\n\n", delta("x", 0, index=0, token_ids=False),
                  delta("x", 0, index=0, token_ids=True)[:-1]):
        assert reader(c + after, decoder, parser) == (
            (b'{"delta":"c","index":0,"type":"response.output_text.delta"}',), len(c))
    for declined in (delta("a\nb", 0, index=0, token_ids=True),  # an escape
                     delta("x", 0, index=0, token_ids=False),  # the other tail
                     delta("x", 0, index=1, token_ids=True),  # another head
                     delta("x", 0, index=0, token_ids=True)[:-1],  # no blank line
                     delta("q\"", 0, index=0, token_ids=True) + c,  # all or nothing
                     delta("é", 0, index=0, token_ids=True).replace(b"\xa9", b"("),
                     delta("x", 0, index=0, token_ids=True).replace(b"\n\n", b"\r\n\r\n")):
        assert reader(declined, decoder, parser) is None, declined
    two = delta("p", 0, index=0, token_ids=True) + delta("q", 0, index=0, token_ids=True)
    assert reader(two, decoder, parser) is not None
    assert translator.choices[0].content == ["a", "b", "c", "c", "c", "p", "q"]
    decoder.feed(b"data: {")  # part of an event held: the decoder is not between events
    assert reader(delta("x", 0, index=0, token_ids=True), decoder, parser) is None


class Reads:
    """A response body's reads, as given (``_stream.ByteChunks``); a read given as
    (seconds, bytes) comes that long after the call."""

    def __init__(self, reads: list[bytes | tuple[float, bytes]]) -> None:
        self._reads = reads

    def __aiter__(self) -> Reads:
        return self

    async def __anext__(self) -> bytes:
        await trio.lowlevel.checkpoint()
        if not self._reads:
            raise StopAsyncIteration
        read = self._reads.pop(0)
        if isinstance(read, tuple):
            await trio.sleep(read[0])
            return read[1]
        return read

    def abort(self) -> bool:
        return False


async def batches(reads: list[bytes | tuple[float, bytes]], *, fused: bool,
                  reader: Any = None, idle: float = 5) -> list[Any]:
    """What a stream of ``reads`` hands its consumer, read by read, with the fused
    reader (feeding a translator as the handler does; ``reader`` wraps it) or without
    it."""
    stream = ChunkStream(Reads(list(reads)), first_chunk_deadline=trio.current_time() + idle,
                         first_chunk_timeout=idle, idle_timeout=idle, max_event=1 << 20)
    translator = Translator(select_binding("0.26.0")[0], usage_requested=False)
    plain = PlainDelta(translator)
    got: list[Any] = []
    async with stream.clocks():
        async for batch in stream.fused(reader(plain) if reader else plain) if fused else stream:
            if isinstance(batch, list):
                for chunk in batch:
                    translator.feed_encoded(chunk)
            got.append(batch)
    return got


def texts_of(got: list[Any]) -> list[str]:
    """The texts the batches carry, fused or not, in order."""
    out: list[str] = []
    for batch in got:
        for item in batch:
            if isinstance(item, dict):
                out.extend(choice["delta"].get("content") or "" for choice in item["choices"])
            else:
                out.append("" if item is None else json.loads(item)["delta"])
    return [text for text in out if text]


async def test_a_whole_answer_in_one_read_is_split_for_the_reader() -> None:
    """``_stream``'s splitting rules: the role chunk and the first delta the general
    way (the parser has no head before them), the other deltas as one fused run, the
    finish and [DONE] the general way; the same texts as without the reader."""
    words = [f"w{n} " for n in range(50)]
    body = generated_stream([(word, 0, 0, True) for word in words], [])
    got = await batches([body], fused=True)
    assert [len(batch) if isinstance(batch, list) else ("fused", len(batch))
            for batch in got] == [1, 1, ("fused", 49), 1]
    assert texts_of(got) == texts_of(await batches([body], fused=False)) == words


async def test_a_read_that_completes_an_event_is_split_after_it() -> None:
    """A read that begins inside an event (the read before ended in it): its first
    event the general way, then the run; each later read the same."""
    words = [f"t{n}" for n in range(30)]
    body = generated_stream([(word, 0, 0, True) for word in words], [])
    third = len(body) // 3
    reads = [body[:third], body[third:2 * third], body[2 * third:]]
    got = await batches(reads, fused=True)
    assert sum(len(batch) for batch in got if isinstance(batch, tuple)) >= len(words) - 6
    assert texts_of(got) == texts_of(await batches(reads, fused=False)) == words


async def test_a_stream_the_reader_never_takes_is_split_a_bounded_number_of_times() -> None:
    """Splitting rule 2 gives up after ``LEAD_CHUNKS``: a stream whose chunks never
    give the parser a head (here each delta has a key the pattern does not know) is
    not cut into a batch per event."""
    words = [f"x{n}" for n in range(40)]
    plain = generated_stream([(word, 0, 0, True) for word in words], [])
    body = plain.replace(b'"finish_reason":null', b'"finish_reason":null,"x":1')
    got = await batches([body], fused=True)
    assert all(isinstance(batch, list) for batch in got)
    assert len(got) <= LEAD_CHUNKS + 1
    assert texts_of(got) == words


def shape(got: list[Any]) -> list[int | tuple[str, int]]:
    return [len(batch) if isinstance(batch, list) else ("fused", len(batch)) for batch in got]


async def test_an_escaped_text_ends_the_run_and_the_reader_takes_what_follows() -> None:
    """Rule 8's second half, and splitting rule 2's third place: a newline in a text
    (JSON-escaped) ends the run before it, the stream reads that event the general way
    and offers the reader the rest."""
    words = ["a", "b", "line\n", "c", "d", "say \"x\"", "e"]
    body = generated_stream([(word, 0, 0, True) for word in words], [])
    got = await batches([body], fused=True)
    assert shape(got) == [1, 1, ("fused", 1), 1, ("fused", 2), 1, ("fused", 1), 1]
    assert texts_of(got) == texts_of(await batches([body], fused=False)) == words


async def test_a_read_is_split_a_bounded_number_of_times() -> None:
    """Splitting rule 2's bound: before the parser keeps a head, a read of many blank
    lines (or comments) is not cut once per line, each cut copying the rest."""
    offered: list[int] = []

    def counting(plain: PlainDelta) -> Any:
        def read(raw: bytes, decoder: SSEDecoder, parser: ChunkParser) -> Any:
            offered.append(len(raw))
            return plain(raw, decoder, parser)
        return read

    body = generated_stream([("a", 0, 0, True), ("b", 0, 0, True)], [])
    flood = b": keep-alive\n\n" * 5000
    got = await batches([flood + body], fused=True, reader=counting)
    assert len(offered) <= LEAD_CHUNKS + 1, len(offered)
    assert texts_of(got) == ["a", "b"]


async def test_splits_that_never_pay_stop_after_a_few() -> None:
    """Splitting rule 2: a stream the reader never takes (here two choices, taking
    turns: the kept head names one) whose reads each begin inside an event is split
    ``WASTED_SPLITS`` times at most, not at every read."""
    words = [f"x{n}" for n in range(60)]
    body = generated_stream([(word, 0, n % 2, True) for n, word in enumerate(words)], [])
    reads = [body[at:at + 601] for at in range(0, len(body), 601)]  # 2-3 events a read
    general = await batches(reads, fused=False)
    fused = await batches(reads, fused=True)
    assert texts_of(fused) == texts_of(general) == words
    assert len(fused) <= len(general) + WASTED_SPLITS + LEAD_CHUNKS, (len(fused), len(general))


def test_a_split_read_restarts_the_idle_clock_as_the_whole_read_would() -> None:
    """Splitting rule 4: a read that brought a delta and a keep-alive comment (the
    reader takes the delta, the comment is a piece of its own) restarts the idle clock:
    the next read, 50 s later under a 60 s idle limit, is on time, with the reader and
    without it. Before, the comment's piece carried the read's deadline on."""
    body = generated_stream([("a", 0, 0, True)], [])
    events = [event + b"\n\n" for event in body.split(b"\n\n")[:-1]]
    reads: list[bytes | tuple[float, bytes]] = [
        b"".join(events[:2]),  # role and "a": the parser keeps a head
        (50.0, delta("b", 0, index=0, token_ids=True) + b": keep-alive\n\n"),
        (50.0, b"".join(events[2:]))]  # finish and [DONE]

    async def both() -> None:
        for fused in (False, True):
            got = await batches(list(reads), fused=fused, idle=60)
            assert texts_of(got) == ["a", "b"]

    trio.run(both, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_a_reader_that_takes_nothing_is_a_bug_not_a_loop() -> None:
    """The reader's contract (``FusedReader``): a part it answers has bytes; one that
    took none would be offered the same piece again and again, without a checkpoint."""
    calls: list[int] = []

    def once_empty(plain: PlainDelta) -> Any:
        def read(raw: bytes, decoder: SSEDecoder, parser: ChunkParser) -> Any:
            calls.append(1)
            answer = plain(raw, decoder, parser)
            return answer if answer is None or len(calls) > 3 else ((), 0)
        return read

    body = generated_stream([("a", 0, 0, True), ("b", 0, 0, True), ("c", 0, 0, True)], [])
    with pytest.raises(RuntimeError, match="a fused reader took 0 of"):
        await batches([body], fused=True, reader=once_empty)


def test_the_switch() -> None:
    """Rule 6: ``fused`` is the C function where it is built, the pure one elsewhere;
    ``python`` the pure one; ``general`` none."""
    assert plain_delta_mode({}) == "fused"
    assert plain_delta_mode({"NNRP_GATEWAY_PLAIN_DELTA": "Fused"}) == "fused"
    assert plain_delta_mode({"NNRP_GATEWAY_PLAIN_DELTA": " python "}) == "python"
    assert plain_delta_mode({"NNRP_GATEWAY_PLAIN_DELTA": "general"}) == "general"
    assert plain_blocks_of("fused") is (NATIVE_BLOCKS or plain_blocks)
    assert plain_blocks_of("python") is plain_blocks
    assert plain_blocks_of("general") is None
    with pytest.raises(ConfigError, match="NNRP_GATEWAY_PLAIN_DELTA is 'off', not one of "
                       "fused, python, general"):
        plain_delta_mode({"NNRP_GATEWAY_PLAIN_DELTA": "off"})
