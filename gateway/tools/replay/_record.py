"""Record transcripts from a real vLLM: each scenario's request, status, headers and
every body chunk with its arrival time (the JSONL format of ``_transcripts``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import httpx

from ._transcripts import Transcript

_HELLO = [{"role": "user", "content": "Hello"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}

#: Scenarios of vllm-http.md section 7 that a real server can be asked for directly.
SCENARIOS: dict[str, dict[str, Any]] = {
    "stream_length": {"stream": True, "max_tokens": 8},
    "stream_usage": {"stream": True, "max_tokens": 5, "stream_options": {"include_usage": True}},
    "stream_continuous_usage": {"stream": True, "max_tokens": 5, "stream_options": {
        "include_usage": True, "continuous_usage_stats": True}},
    "stream_stop_string": {"stream": True, "max_tokens": 16, "stop": ["e"]},
    "stream_n2": {"stream": True, "max_tokens": 4, "n": 2},
    "stream_logprobs": {"stream": True, "max_tokens": 3, "logprobs": True, "top_logprobs": 2},
    "stream_tools_named": {"stream": True, "max_tokens": 12, "tools": [WEATHER_TOOL],
                           "tool_choice": {"type": "function",
                                           "function": {"name": "get_weather"}}},
    "nonstream_length": {"max_tokens": 6},
    "error_400_max_tokens": {"max_tokens": 100_000},
    "error_400_temperature": {"max_tokens": 4, "temperature": -1},
    "error_400_stream_options_without_stream": {"max_tokens": 4,
                                                "stream_options": {"include_usage": True}},
    "error_404_model": {"model": "no-such-model", "max_tokens": 4},
    # The field-fidelity rule (README): what vLLM adds beyond OpenAI's fields, and the lax
    # request forms vLLM's pydantic model accepts. Seeded, so output is repeatable.
    "nonstream_prompt_logprobs": {"max_tokens": 4, "temperature": 0, "prompt_logprobs": 2},
    "stream_lax_true_string": {"stream": "true", "max_tokens": 4, "temperature": 1.0,
                               "seed": 7},
    "stream_lax_int_1": {"stream": 1, "max_tokens": 4, "temperature": 1.0, "seed": 7},
    "stream_lax_yes": {"stream": "yes", "max_tokens": 4, "temperature": 1.0, "seed": 7},
    "nonstream_lax_false_string": {"stream": "false", "max_tokens": 4, "temperature": 1.0,
                                   "seed": 7},
    "error_400_lax_stream_maybe": {"stream": "maybe", "max_tokens": 4},
}

#: Requests recorded both ways (``stream_<name>`` as the gateway sends a stream, with
#: include_usage, and ``nonstream_<name>``): the rebuilt completed body of the one must
#: equal the other, field by field (ids and timestamps aside).
PAIRS: dict[str, dict[str, Any]] = {
    "pair_plain": {"max_tokens": 6, "temperature": 1.0, "seed": 7},
    "pair_logprobs": {"max_tokens": 4, "temperature": 1.0, "seed": 7, "logprobs": True,
                      "top_logprobs": 2},
    "pair_logprobs_greedy": {"max_tokens": 4, "temperature": 0, "logprobs": True,
                             "top_logprobs": 2},
    "pair_logprobs_n2": {"max_tokens": 4, "n": 2, "temperature": 1.0, "seed": 7,
                         "logprobs": True, "top_logprobs": 2},
    "pair_token_ids": {"max_tokens": 4, "temperature": 1.0, "seed": 7,
                       "return_token_ids": True},
    "pair_logprobs_token_ids": {"max_tokens": 4, "temperature": 0, "logprobs": True,
                                "top_logprobs": 1, "return_token_ids": True},
    "pair_stop_string": {"max_tokens": 16, "temperature": 1.0, "seed": 7, "stop": ["in"]},
    "pair_stop_token_ids": {"max_tokens": 16, "temperature": 1.0, "seed": 7,
                            "stop_token_ids": [21]},
    "pair_kv_transfer_params": {"max_tokens": 4, "temperature": 0,
                                "kv_transfer_params": {"do_remote_decode": False}},
}


def scenario_requests() -> dict[str, dict[str, Any]]:
    """Every scenario's request body extras, the pairs expanded."""
    requests = dict(SCENARIOS)
    for name, extra in PAIRS.items():
        requests[f"stream_{name}"] = {"stream": True,
                                      "stream_options": {"include_usage": True}, **extra}
        requests[f"nonstream_{name}"] = dict(extra)
    return requests


def record_all(vllm_url: str, out: Path, model: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    version = httpx.get(f"{vllm_url}/version", timeout=10).json().get("version", "")
    written = []
    with httpx.Client(base_url=vllm_url, timeout=httpx.Timeout(60, connect=5),
                      trust_env=False) as client:
        for name, extra in scenario_requests().items():
            body = {"model": model, "messages": _HELLO, **extra}
            transcript = record_one(client, name, body, version)
            path = out / f"{name}.jsonl"
            path.write_text(transcript.to_jsonl())
            written.append(path)
    return written


def record_one(client: httpx.Client, name: str, body: dict[str, Any], version: str
               ) -> Transcript:
    headers = {"x-request-id": f"cap-{name}", "accept-encoding": "identity"}
    start = time.perf_counter()
    chunks = []
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        for data in response.iter_raw():
            chunks.append(((time.perf_counter() - start) * 1000, data))
        status = response.status_code
        response_headers = tuple((k.lower(), v) for k, v in response.headers.items())
    return Transcript(name, version, status, response_headers, tuple(chunks), body,
                      tuple(headers.items()), "recorded by nnrp-gateway record")


#: Issue 23's scenarios, recorded from a vLLM 0.32 started with
#: ``--max-num-seqs 1 --max-num-queued-reqs 3 --enable-per-request-metrics
#: --sse-keep-alive-interval 1 --scheduling-policy priority`` (``record_admission``):
#: per-request metrics on the final chunk and on the body, keep-alive comments while a
#: stream waits behind a long one, and vLLM's admission refusals (a 503 before the first
#: byte and, when the race gives one, the same refusal as a 200 stream's only event).
METRICS_SCENARIOS: dict[str, dict[str, Any]] = {
    "stream_metrics": {"stream": True, "max_tokens": 5, "temperature": 1.0, "seed": 7,
                       "stream_options": {"include_usage": True}},
    "nonstream_metrics": {"max_tokens": 5, "temperature": 1.0, "seed": 7},
}
_LONG = {"stream": True, "max_tokens": 400, "ignore_eos": True}


def record_admission(vllm_url: str, out: Path, model: str, *, crowd: int = 12
                     ) -> list[Path]:
    """Record ``METRICS_SCENARIOS``, ``stream_keep_alive`` (a short stream queued behind a
    long one: vLLM writes ``: keep-alive`` while it waits) and the refusals of ``crowd``
    concurrent streams (``error_503_queue_full``, ``stream_refused_in_stream`` when one
    came in-stream). Needs the server flags named at ``METRICS_SCENARIOS``."""
    import threading

    out.mkdir(parents=True, exist_ok=True)
    version = httpx.get(f"{vllm_url}/version", timeout=10).json().get("version", "")
    written: list[Path] = []

    def save(transcript: Transcript, name: str, note: str) -> None:
        path = out / f"{name}.jsonl"
        path.write_text(attrs.evolve(transcript, scenario=name, note=note).to_jsonl())
        written.append(path)

    with httpx.Client(base_url=vllm_url, timeout=httpx.Timeout(120, connect=5),
                      trust_env=False) as client:
        for name, extra in METRICS_SCENARIOS.items():
            save(record_one(client, name, {"model": model, "messages": _HELLO, **extra},
                            version), name, "recorded with --enable-per-request-metrics")
        results: dict[str, Transcript] = {}

        def run(name: str, body: dict[str, Any]) -> None:
            with httpx.Client(base_url=vllm_url, timeout=httpx.Timeout(120, connect=5),
                              trust_env=False) as own:
                results[name] = record_one(own, name, body, version)

        long_runner = threading.Thread(target=run, args=(
            "long", {"model": model, "messages": _HELLO, **_LONG}))
        long_runner.start()
        time.sleep(0.5)  # the long one is running (max-num-seqs 1): the next one waits
        waiting = {"model": model, "messages": _HELLO, "stream": True, "max_tokens": 4,
                   "temperature": 1.0, "seed": 7, "stream_options": {"include_usage": True}}
        results["stream_keep_alive"] = record_one(client, "stream_keep_alive", waiting,
                                                  version)
        long_runner.join()
        save(results["stream_keep_alive"], "stream_keep_alive",
             "recorded with --sse-keep-alive-interval 1, queued behind a 400-token stream "
             "(--max-num-seqs 1): keep-alive comments while it waits")
        # Seen live: a crowd of streams is refused in-stream (the second check, in
        # add_request, after the 200), a crowd of non-streamed requests with the 503.
        threads = [threading.Thread(target=run, args=(f"crowd{i}", {
            "model": model, "messages": _HELLO, **_LONG, "max_tokens": 40,
            "stream": i % 2 == 0})) for i in range(crowd)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        crowd_results = [results[f"crowd{i}"] for i in range(crowd)]
        refused = [t for t in crowd_results if t.status == 503]
        in_stream = [t for t in crowd_results if t.status == 200
                     and b'"code": 503' in t.body and b"chat.completion.chunk" not in t.body]
        if refused:
            save(refused[0], "error_503_queue_full",
                 f"recorded with --max-num-queued-reqs 3: {len(refused)} of {crowd} "
                 "concurrent requests (half streamed) refused before the first byte")
        if in_stream:
            save(in_stream[0], "stream_refused_in_stream",
                 f"recorded with --max-num-queued-reqs 3: {len(in_stream)} of {crowd} "
                 "concurrent requests (half streamed) refused after the 200, as the "
                 "stream's only event")
    return written
