# Run: PYTHONPATH=<worktree>:<worktree>/.venv/lib/python3.11/site-packages <a venv with orjson 3.13.0 and msgspec 0.23.0>/bin/python ab_json.py
"""The parse step alone, same process, alternating: json.loads + checks (main), the
plain-text pattern (this branch), orjson.loads + checks, msgspec.json.decode + checks;
and the event encode: encode_text_delta against orjson.dumps (sorted keys)."""
import json, statistics, timeit
import orjson, msgspec
from gateway.upstream import parse_chunk
from gateway.upstream._chunks import _parse_in_general, check_chunk
from gateway.profile import events as ev

TEXT = ('{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1796034842,'
        '"model":"example-model","choices":[{"index":0,"delta":{"content":" quick"},'
        '"logprobs":null,"finish_reason":null,"token_ids":null}]}')
dec = msgspec.json.Decoder()
def oj(): c = orjson.loads(TEXT); check_chunk(c)
def ms(): c = dec.decode(TEXT.encode()); check_chunk(c)
variants = {"json.loads+checks": lambda: _parse_in_general(TEXT), "pattern": lambda: parse_chunk(TEXT),
            "orjson+checks": oj, "msgspec+checks": ms,
            "encode_text_delta": lambda: ev.encode_text_delta(0, " quick"),
            "orjson.dumps sorted": lambda: orjson.dumps({"type": "response.output_text.delta", "index": 0, "delta": " quick"}, option=orjson.OPT_SORT_KEYS)}
runs = {k: [] for k in variants}
for i in range(30):
    for k, fn in variants.items():
        runs[k].append(timeit.timeit(fn, number=5000) / 5000 * 1e6)
base = statistics.median(runs["json.loads+checks"])
for k, v in runs.items():
    print(f"{k:22s} min {min(v):5.2f} median {statistics.median(v):5.2f} us  median/json.loads+checks {statistics.median(v)/base:.2f}")
