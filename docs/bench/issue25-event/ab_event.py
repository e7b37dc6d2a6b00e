"""Run from the worktree: ``.venv/bin/python docs/bench/issue25-event/ab_event.py [replay]``
(``replay``: the chunk the bench's replay backend sends, a longer id, else a short one).

Same process, same seconds: the general path (what main runs: json.loads + checks,
feed + encode_event, active by a fresh Window) against the fused path, alternating
batches of 2,000 events 60 times; per-variant min and median of the batch means."""
import statistics, timeit
from gateway import nnrp
from gateway.nnrp._flow import FlowControl, Window
from gateway.pipeline import Translator, token_count
from gateway.profile import events as ev
from gateway.upstream import BINDINGS, SSEDecoder, parse_chunk
from gateway.upstream._chunks import _parse_in_general

import sys
TEXT = (b'data: {"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1796034842,'
        b'"model":"example-model","choices":[{"index":0,"delta":{"content":" quick"},'
        b'"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n')
if sys.argv[1:] == ["replay"]:
    TEXT = TEXT.replace(b"chatcmpl-abc", b"chatcmpl-replay:timestamped:16:10000:abc-1").replace(
        b'" quick"', b'"12345678901234567"')
ROLE = (b'data: {"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1796034842,'
        b'"model":"example-model","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
        b'"logprobs":null,"finish_reason":null}],"prompt_token_ids":null}\n\n')

def setup():
    decoder = SSEDecoder()
    translator = Translator(BINDINGS[-1], usage_requested=False)
    for sse in decoder.feed(ROLE):
        translator.feed(parse_chunk(sse.data))
    return decoder, translator, FlowControl(clock=lambda: 0.0)

d1, t1, f1 = setup()
d2, t2, f2 = setup()

def before() -> None:
    for sse in d1.feed(TEXT):
        chunk = _parse_in_general(sse.data)
        token_count(chunk)
        for e in t1.feed(chunk):
            body = ev.encode_event(e)
            bool(f1.sessions or f1.operations) or f1.connection != Window()
            nnrp.encode_partial_result(1, 1, 1, 5, body)

def after() -> None:
    for sse in d2.feed(TEXT):
        chunk = parse_chunk(sse.data)
        token_count(chunk)
        for body in t2.feed_encoded(chunk):
            f2.active
            nnrp.encode_partial_result(1, 1, 1, 5, body)

n, rounds = 2000, 60
runs = {"before": [], "after": []}
for i in range(rounds):
    for name, fn in (("before", before), ("after", after))[:: 1 if i % 2 else -1]:
        runs[name].append(timeit.timeit(fn, number=n) / n * 1e6)
    t1.choices[0].content.clear(); t2.choices[0].content.clear()
b, a = runs["before"], runs["after"]
print(f"{sys.argv[1:] or ['short']} before: min {min(b):.2f} median {statistics.median(b):.2f} us; "
      f"after: min {min(a):.2f} median {statistics.median(a):.2f} us; "
      f"after/before: min {min(a)/min(b):.2f} median {statistics.median(a)/statistics.median(b):.2f}; "
      f"paired median {statistics.median(x/y for x, y in zip(a, b)):.2f}")
