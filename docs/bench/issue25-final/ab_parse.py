"""Run from the repository: ``.venv/bin/python docs/bench/issue25-final/ab_parse.py``.

Issue 25, rule 4 of ``gateway/upstream/_chunks.py``: one plain text delta parsed alone
(``parse_chunk``: the pattern) against a stream's ``ChunkParser`` (the head kept from
the stream's previous chunk), then the same for the whole per-event path as
``bench codec`` runs it (SSE bytes to an encoded PARTIAL_RESULT); one process, the two
alternating in batches of 2,000 events, 40 times; min and median of the batch means."""
import statistics
import sys
import timeit

sys.path.insert(0, ".")
from gateway import nnrp  # noqa: E402
from gateway.pipeline import Translator, token_count  # noqa: E402
from gateway.upstream import BINDINGS, ChunkParser, SSEDecoder, parse_chunk  # noqa: E402

TEXT = (b'data: {"id":"chatcmpl-replay:timestamped:200:0:c1796034842123-5",'
        b'"object":"chat.completion.chunk","created":1796034842,"model":"example-model",'
        b'"choices":[{"index":0,"delta":{"content":"1234567890123456789"},"logprobs":null,'
        b'"finish_reason":null}]}\n\n')
ROLE = (b'data: {"id":"chatcmpl-replay:timestamped:200:0:c1796034842123-5",'
        b'"object":"chat.completion.chunk","created":1796034842,"model":"example-model",'
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
        b'"finish_reason":null}],"prompt_token_ids":null}\n\n')
DATA = TEXT[6:-2].decode()


def path(parse):  # noqa: ANN001, ANN201
    decoder = SSEDecoder()
    translator = Translator(BINDINGS[-1], usage_requested=False)
    translator.feed(parse(ROLE[6:-2].decode()))

    def one() -> None:
        for sse in decoder.feed(TEXT):
            chunk = parse(sse.data)
            token_count(chunk)
            for body in translator.feed_encoded(chunk):
                nnrp.encode_partial_result(1, 1, 1, 5, body)
    return one, translator


def compare(name: str, before, after, reset) -> None:  # noqa: ANN001
    n, rounds = 2000, 40
    runs: dict[str, list[float]] = {"before": [], "after": []}
    for i in range(rounds):
        for side, fn in (("before", before), ("after", after))[:: 1 if i % 2 else -1]:
            runs[side].append(timeit.timeit(fn, number=n) / n * 1e6)
        reset()
    b, a = runs["before"], runs["after"]
    paired = statistics.median(x / y for x, y in zip(a, b))
    print(f"{name}: before min {min(b):.2f} median {statistics.median(b):.2f} us; after min "
          f"{min(a):.2f} median {statistics.median(a):.2f} us; after / before (paired "
          f"median) {paired:.2f}")


parser = ChunkParser()
parser(DATA)  # the stream's first plain chunk: the pattern reads it, the head is kept
compare("the chunk's parse", lambda: parse_chunk(DATA), lambda: parser(DATA), lambda: None)
one_before, t1 = path(parse_chunk)
one_after, t2 = path(ChunkParser())


def reset() -> None:
    t1.choices[0].content.clear()
    t2.choices[0].content.clear()


compare("SSE bytes to PARTIAL_RESULT", one_before, one_after, reset)
