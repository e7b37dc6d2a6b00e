"""Record transcripts from a real vLLM: each scenario's request, status, headers and
every body chunk with its arrival time (the JSONL format of ``_transcripts``)."""

from __future__ import annotations

import time
from collections.abc import Callable
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

#: Scenarios of docs/reference/vllm-http.md section 7 that a real server can be asked for directly.
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
    # The field-fidelity rule (docs/protocol.md): what vLLM adds beyond OpenAI's fields, and the lax
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


def record_one(client: httpx.Client, name: str, body: dict[str, Any], version: str,
               on_chunk: Callable[[int], None] | None = None) -> Transcript:
    """One exchange; ``on_chunk(count)`` runs after each body chunk arrives."""
    headers = {"x-request-id": f"cap-{name}", "accept-encoding": "identity"}
    start = time.perf_counter()
    chunks = []
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        for data in response.iter_raw():
            chunks.append(((time.perf_counter() - start) * 1000, data))
            if on_chunk is not None:
                on_chunk(len(chunks))
        status = response.status_code
        response_headers = tuple((k.lower(), v) for k, v in response.headers.items())
    return Transcript(name, version, status, response_headers, tuple(chunks), body,
                      tuple(headers.items()), f"recorded from vLLM {version} by nnrp-gateway "
                                              "record")


#: The load and refusal scenarios, recorded from a vLLM 0.32 started with
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
        path.write_text(attrs.evolve(transcript, scenario=name,
                                     note=f"recorded from vLLM {version} {note}").to_jsonl())
        written.append(path)

    with httpx.Client(base_url=vllm_url, timeout=httpx.Timeout(120, connect=5),
                      trust_env=False) as client:
        for name, extra in METRICS_SCENARIOS.items():
            save(record_one(client, name, {"model": model, "messages": _HELLO, **extra},
                            version), name, "with --enable-per-request-metrics")
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
             "with --sse-keep-alive-interval 1, queued behind a 400-token stream "
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
                 f"with --max-num-queued-reqs 3: {len(refused)} of {crowd} "
                 "concurrent requests (half streamed) refused before the first byte")
        if in_stream:
            save(in_stream[0], "stream_refused_in_stream",
                 f"with --max-num-queued-reqs 3: {len(in_stream)} of {crowd} "
                 "concurrent requests (half streamed) refused after the 200, as the "
                 "stream's only event")
    return written


# ----------------------------------------------------- shapes forced out of a tiny model

#: Scenarios first written by hand in 0.26's shape (``_synthesize``), recorded live from
#: vLLM 0.32 by forcing a random-weight model into them; each is saved as
#: ``<scenario>_032`` and played, as ``<scenario>``, by the 0.32 and 0.33 families
#: (``_transcripts.family_transcripts``). Older families keep the 0.26 shape.
RECORDED_SUFFIX = "_032"

#: ``strict: true`` pins the arguments to the schema (vLLM 0.32's structural tags, default
#: ``VLLM_ENFORCE_STRICT_TOOL_CALLING``; without it only the call envelope is forced and a
#: random model writes junk arguments, as ``stream_tools_named`` shows).
STRICT_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
STRICT_TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time", "strict": True,
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
_USAGE = {"stream_options": {"include_usage": True}}

#: Recorded from serve.sh's server (``--enable-auto-tool-choice --tool-call-parser
#: hermes``) started with ``VLLM_SERVER_DEV_MODE=1`` (for ``POST /pause``):
#: ``tool_choice: "required"`` makes vLLM's grammar write ``<tool_call>`` blocks, which
#: the hermes parser streams as tool-call deltas; the seeds were picked for one call, and
#: for three in a row (two tools offered, ``parallel_tool_calls`` left on).
TOOL_SCENARIOS: dict[str, dict[str, Any]] = {
    "stream_tool_call_single": {"stream": True, **_USAGE, "max_tokens": 100, "seed": 7,
                                "tools": [STRICT_WEATHER], "tool_choice": "required",
                                "parallel_tool_calls": False},
    "nonstream_tool_call": {"max_tokens": 100, "seed": 7, "tools": [STRICT_WEATHER],
                            "tool_choice": "required", "parallel_tool_calls": False},
    "stream_tool_call_parallel": {"stream": True, **_USAGE, "max_tokens": 300, "seed": 1,
                                  "tools": [STRICT_WEATHER, STRICT_TIME],
                                  "tool_choice": "required"},
    "stream_n2_interleaved": {"stream": True, **_USAGE, "n": 2, "max_tokens": 6,
                              "seed": 7},
}
#: ``POST /pause?mode=abort`` (a dev-mode route, vllm/entrypoints/rl/online) lands while
#: this stream runs: vLLM ends it with ``finish_reason: "abort"``.
ABORT_SCENARIO = {"stream": True, **_USAGE, "max_tokens": 400, "ignore_eos": True,
                  "seed": 7}
#: ``</think>`` (token 7 of the tiny model), favoured so that a random model ends its
#: reasoning after a few tokens. The tiny tokenizer marks it special: without
#: ``skip_special_tokens: false`` the text has no ``</think>``, and the non-streaming
#: parser (which reads text, not token ids) calls the whole answer reasoning.
_END_THINK = {"logit_bias": {"7": 3.0}, "skip_special_tokens": False}

#: Recorded from serve.sh's server plus ``--reasoning-parser deepseek_r1`` (what comes
#: before ``</think>`` is reasoning, no ``<think>`` needed).
REASONING_SCENARIOS: dict[str, dict[str, Any]] = {
    "stream_reasoning": {"stream": True, **_USAGE, "max_tokens": 16, "seed": 7,
                         **_END_THINK},
    "nonstream_reasoning": {"max_tokens": 16, "seed": 7, **_END_THINK},
    "stream_reasoning_hidden": {"stream": True, **_USAGE, "max_tokens": 16, "seed": 7,
                                "include_reasoning": False, **_END_THINK},
    "stream_reasoning_then_tool_call": {"stream": True, **_USAGE, "max_tokens": 100,
                                        "seed": 8, "tools": [STRICT_WEATHER],
                                        "tool_choice": "required", **_END_THINK},
}


def _how(name: str, extra: dict[str, Any]) -> str:
    """How a forced scenario was obtained, for its note."""
    if name in REASONING_SCENARIOS:
        how = "--reasoning-parser deepseek_r1, </think> favoured by logit_bias"
        return how + (", tool_choice required (hermes)" if "tools" in extra else "")
    if "tools" in extra:
        return ("--enable-auto-tool-choice --tool-call-parser hermes, tool_choice "
                "required with strict schemas")
    return f"n={extra.get('n', 1)}, seeded"


def record_forced(vllm_url: str, out: Path, model: str, *, reasoning: bool = False
                  ) -> list[Path]:
    """Record ``TOOL_SCENARIOS`` and ``stream_finish_abort`` (or, with ``reasoning``,
    ``REASONING_SCENARIOS``) as ``<scenario>_032``; each needs the server flags named
    at its table."""
    import threading

    out.mkdir(parents=True, exist_ok=True)
    version = httpx.get(f"{vllm_url}/version", timeout=10).json().get("version", "")
    written: list[Path] = []

    def save(transcript: Transcript, name: str, note: str) -> None:
        recorded = name + RECORDED_SUFFIX
        path = out / f"{recorded}.jsonl"
        path.write_text(attrs.evolve(transcript, scenario=recorded,
                                     note=f"recorded from vLLM {version}: {note}").to_jsonl())
        written.append(path)

    table = REASONING_SCENARIOS if reasoning else TOOL_SCENARIOS
    with httpx.Client(base_url=vllm_url, timeout=httpx.Timeout(300, connect=5),
                      trust_env=False) as client:
        for name, extra in table.items():
            body = {"model": model, "messages": _HELLO, **extra}
            save(record_one(client, name, body, version), name, _how(name, extra))
        if reasoning:
            return written
        streaming = threading.Event()

        def seen(count: int) -> None:
            if count >= 4:
                streaming.set()

        results: list[Transcript] = []
        runner = threading.Thread(target=lambda: results.append(record_one(
            client, "stream_finish_abort", {"model": model, "messages": _HELLO,
                                            **ABORT_SCENARIO}, version, seen)))
        runner.start()
        streaming.wait(120)
        with httpx.Client(base_url=vllm_url, timeout=60, trust_env=False) as admin:
            admin.post("/pause", params={"mode": "abort"}).raise_for_status()
            runner.join()
            admin.post("/resume").raise_for_status()
        save(results[0], "stream_finish_abort",
             "VLLM_SERVER_DEV_MODE=1, POST /pause?mode=abort after the 4th chunk")
    return written
