"""Record transcripts from a real vLLM: each scenario's request, status, headers and
every body chunk with its arrival time (the JSONL format of ``_transcripts``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

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
