"""The non-streaming step that issue 25 item 5 changed, before and after, in one process:
vLLM's body bytes to the encoded response.completed (checks included), min of 7 x 5,000."""
import timeit

from gateway.profile import events as ev
from gateway.tools.replay import bundled_transcripts
from gateway.upstream import parse_completion

T = bundled_transcripts()
for name in ["nonstream_length", "nonstream_pair_logprobs_n2"]:
    raw = T[name].body
    n = 5000
    # Before: gathered into a bytearray, decoded and checked, encoded again (sorted keys).
    old = lambda: ev.encode_event(ev.completed(parse_completion(bytes(bytearray(raw)))))  # noqa: E731
    # After: decoded and checked once, the bytes passed through.
    new = lambda: ev.completed_text(raw) if parse_completion(raw) else None  # noqa: E731
    o = min(timeit.repeat(old, number=n, repeat=7)) / n * 1e6
    w = min(timeit.repeat(new, number=n, repeat=7)) / n * 1e6
    print(f"{name} {len(raw)} B: before {o:.1f} us, after {w:.1f} us, ratio {w / o:.2f}")
