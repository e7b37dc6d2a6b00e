"""``bench live --streams N``: the gateway's CPU per streamed event beside vLLM's
API-server CPU per SSE chunk, against a real vLLM on this machine.

Three phases in one run, each ``N`` concurrent streams of the same greedy request
(``ignore_eos``, so every request makes exactly ``tokens`` tokens):

1. **the chunk count**, one request a stream through the gateway with the ``nnrp``
   policy ``include_openai_chunk`` (every event carries its chunk; a chunk that makes
   no event comes as ``response.openai_chunk``): how many of vLLM's chunks a request
   makes no event (its role-only first chunk, a finish chunk without text). It warms
   both processes up too; its CPU is not counted (it carries the chunks);
2. **through the gateway**, ``requests`` requests a stream, plain: the gateway's CPU and
   the API server's, and the events the NNRP clients received (PARTIAL_RESULTs), by type;
3. **direct**: the same requests straight to vLLM over HTTP/SSE from this process (with
   ``stream_options.include_usage``, as the gateway sends them): the API server's CPU
   and the SSE chunks it sent (``data:`` events, ``[DONE]`` apart), counted here one by
   one. A cross-check, not the ratio's denominator (rule 4).

Rules:

1. CPU comes from the kernel's per-process CPU clocks (``_procs.process_cpu_seconds``:
   the exact scheduler clock, /proc/PID/stat's utime + stime where it cannot be read),
   read just before and just after each phase.
2. vLLM's API server is every process that holds the socket listening on vLLM's port
   (``_procs.listening_socket_owners``): one for ``vllm serve`` as run here, several
   with ``--api-server-count``. The engine core is another process and holds no such
   socket: it is not counted (its work, the model, is the same on both paths). So vLLM
   must run on this machine: a URL whose host is not a loopback address is refused.
3. The gateway is the process tree ``bench live`` started, or, with ``--endpoint``, every
   process holding the socket that listens on the endpoint's port (workers included).
4. The ratio (``rows.LIVE_RATIO``) is phase 2's alone: the gateway's CPU per event over
   the API server's CPU per chunk, the same streams in the same seconds. Phase 2's
   chunks are its text deltas (for one choice of plain text, the translator makes one
   ``response.output_text.delta`` per chunk with text: pipeline/_translate.py rule 1)
   plus phase 1's chunks without an event, per request. They are not phase 3's: how
   many tokens vLLM puts in a chunk depends on how fast its reader drains it (its
   ``RequestOutputCollector`` merges outputs not yet sent), and the first run here had
   26 % more chunks a request through the gateway than direct, at the same API-server
   CPU a request.
5. Events versus chunks is reported beside the ratio, with the reasons they differ read
   from the counts (``events_versus_chunks``); phase 3's chunks a request are quoted
   beside them.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import attrs
import httpx

from gateway import nnrp
from gateway.upstream import SSEDecoder

from ._procs import listening_socket_owners, tree_cpu_seconds
from ._stack import Progress, fan_out, open_sessions
from .rows import LIVE_RATIO, row_figure
from .stats import Figure

#: Hosts that name this machine's loopback (rule 2).
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class LiveCostUnavailable(Exception):
    """The processes to measure cannot be found on this machine (rules 2 and 3)."""


def local_port(url: str, what: str) -> int:
    """The port of ``url`` when its host is this machine's loopback (rule 2)."""
    parts = urlsplit(url)
    if parts.hostname not in LOOPBACK_HOSTS:
        raise LiveCostUnavailable(
            f"{what} must be on this machine's loopback (its CPU clock is read from /proc), "
            f"not {parts.hostname!r}")
    if parts.port is None:
        return 443 if parts.scheme in ("https", "tcps", "wss") else 80
    return parts.port


def owners(port: int, what: str) -> list[int]:
    """The processes holding the socket listening on ``port`` (rules 2 and 3)."""
    found = listening_socket_owners(port)
    if not found:
        raise LiveCostUnavailable(f"no process on this machine listens on port {port} "
                                  f"({what})")
    return found


@attrs.define
class Tally:
    """What one phase saw."""

    requests: int = 0
    events: Counter[str] = attrs.Factory(Counter)  # PARTIAL_RESULTs by event type
    #: Chunks counted one by one: direct (phase 3), or carried by the events (phase 1).
    chunks_with_output: int = 0
    chunks_without_output: int = 0
    gateway_cpu: float = 0.0
    api_cpu: float = 0.0

    @property
    def chunks(self) -> int:
        return self.chunks_with_output + self.chunks_without_output


def events_versus_chunks(events: float, text_events: float, chunks: float,
                         chunks_with_text: float, tokens: int) -> str:
    """Whether the gateway's events and vLLM's chunks differ, a request's worth, and why
    (rule 5): pure, from the counts."""
    said = [f"{events:.1f} events and {chunks:.1f} SSE chunks a request ({tokens} tokens)"]
    if round(events, 1) == round(chunks, 1):
        said.append("the same count")
        return "; ".join(said)
    without = chunks - chunks_with_text
    if without > 0:
        said.append(f"{without:.1f} chunks a request carry no text (vLLM's role-only first "
                    "chunk, the usage chunk the gateway asks for, a finish_reason chunk "
                    "without text) and make no event of their own")
    other = events - text_events
    if other > 0:
        said.append(f"{other:.1f} events a request are not text deltas")
    if abs(text_events - chunks_with_text) >= 0.05:
        said.append(f"text deltas {text_events:.1f} against chunks with text "
                    f"{chunks_with_text:.1f} a request")
    if chunks_with_text < tokens:
        said.append(f"vLLM sent {tokens / max(chunks_with_text, 1e-9):.2f} tokens a chunk "
                    "with text (a token that adds no text, a special token skipped in "
                    "detokenizing or part of a UTF-8 character held back, makes no chunk; "
                    "vLLM's RequestOutputCollector merges outputs its API server has not "
                    "yet sent)")
    return "; ".join(said)


def carries_output(chunk: dict[str, Any]) -> bool:
    """Whether a chunk holds output the gateway turns into an event: the role-only first
    chunk (content "") does not, so counting it would flatter direct HTTP's TTFT whenever
    vLLM holds back an incomplete UTF-8 token (seen at 3-5 ms on the live CPU build)."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content") \
                or delta.get("reasoning"):
            return True
    return False


#: How long the direct phase's client keeps an idle connection to vLLM (see ``live_cost``).
DIRECT_KEEPALIVE_S = 2.0


async def _phase(streams: int, requests: int, one: Callable[[int, Tally], Awaitable[None]],
                 tally: Tally, gateway_pids: list[int], api_pids: list[int]) -> None:
    """``streams`` tasks, each making ``requests`` requests in turn; CPU around it."""
    async def stream(index: int) -> None:
        for _ in range(requests):
            await one(index, tally)
            tally.requests += 1

    gateway_before, api_before = tree_cpu_seconds(gateway_pids), tree_cpu_seconds(api_pids)
    await fan_out(streams, stream)
    gateway_after, api_after = tree_cpu_seconds(gateway_pids), tree_cpu_seconds(api_pids)
    tally.gateway_cpu = sum(gateway_after.get(p, t) - t for p, t in gateway_before.items())
    tally.api_cpu = sum(api_after.get(p, t) - t for p, t in api_before.items())


async def live_cost(vllm_url: str, endpoint: str, gateway_pids: list[int], body: dict[str, Any],
                    streams: int, requests: int, progress: Progress) -> list[Figure]:
    """Both phases (the module's docstring); ``body`` a streamed, greedy, ``ignore_eos``
    chat request of ``body["max_tokens"]`` tokens."""
    api_pids = owners(local_port(vllm_url, "vLLM"), f"vLLM's API server at {vllm_url}")
    tokens = int(body["max_tokens"])
    envelope = {"schema_version": "openai-compatible/1",
                "operation": "chat.completions.create", "body": body}
    submitted = json.dumps(envelope).encode()
    with_chunks = json.dumps({**envelope, "nnrp": {"include_openai_chunk": True}}).encode()
    # What the gateway sends vLLM for the same request: usage asked for on every stream
    # (pipeline/_request.py), one chunk more, so vLLM does the same work on both paths.
    direct_body = {**body, "stream_options": {"include_usage": True}}
    counted, gateway, direct = Tally(), Tally(), Tally()
    async with contextlib.AsyncExitStack() as exits:
        sessions = await exits.enter_async_context(open_sessions(endpoint, streams))
        # Idle connections expire well before vLLM's keep-alive timeout (uvicorn's, 5 s
        # by default: VLLM_HTTP_TIMEOUT_KEEP_ALIVE): the direct phase comes after a
        # gateway phase of many seconds, and a connection vLLM closed meanwhile would be
        # reused and fail ("Server disconnected without sending a response", 64 streams).
        # A vLLM started with a keep-alive under DIRECT_KEEPALIVE_S would bring it back.
        http = await exits.enter_async_context(httpx.AsyncClient(
            trust_env=False, timeout=None,
            limits=httpx.Limits(max_connections=streams, keepalive_expiry=DIRECT_KEEPALIVE_S)))

        async def via_gateway(index: int, tally: Tally, request: bytes = submitted) -> None:
            operation = await sessions[index].submit(request)
            async for event in operation.events():
                if isinstance(event, nnrp.PartialReceived):
                    payload = json.loads(event.body)
                    kind = payload.get("type", "?")
                    tally.events[kind] += 1
                    if kind == "response.openai_chunk":  # a chunk that made no event
                        tally.chunks_without_output += 1
                    elif "openai_chunk" in payload:  # one event a chunk (one choice)
                        tally.chunks_with_output += 1

        async def counting_chunks(index: int, tally: Tally) -> None:
            await via_gateway(index, tally, with_chunks)

        async def via_http(_: int, tally: Tally) -> None:
            decoder = SSEDecoder()
            async with http.stream("POST", f"{vllm_url.rstrip('/')}/v1/chat/completions",
                                   json=direct_body) as response:
                response.raise_for_status()
                async for raw in response.aiter_raw():
                    for event in decoder.feed(raw):
                        if event.is_done:
                            continue
                        if carries_output(json.loads(event.data)):
                            tally.chunks_with_output += 1
                        else:
                            tally.chunks_without_output += 1

        progress(f"live cost: {streams} streams, each chunk carried (the chunk count)")
        await _phase(streams, 1, counting_chunks, counted, gateway_pids, api_pids)
        await via_http(0, Tally())  # the direct path warmed up too
        progress(f"live cost: {streams} streams x {requests} requests through the gateway")
        await _phase(streams, requests, via_gateway, gateway, gateway_pids, api_pids)
        progress(f"live cost: {streams} streams x {requests} requests direct")
        start = time.perf_counter()
        await _phase(streams, requests, via_http, direct, gateway_pids, api_pids)
        direct_wall = time.perf_counter() - start
    return cost_figures(streams, tokens, counted, gateway, direct, api_pids, direct_wall)


def cost_figures(streams: int, tokens: int, counted: Tally, gateway: Tally, direct: Tally,
                 api_pids: list[int], direct_wall: float) -> list[Figure]:
    """The phases' tallies as figures (rules 4 and 5)."""
    requests = max(gateway.requests, 1)
    events = sum(gateway.events.values())
    text_events = gateway.events["response.output_text.delta"]
    without_event = counted.chunks_without_output / max(counted.requests, 1)
    chunks = text_events + without_event * gateway.requests  # rule 4
    per_event = gateway.gateway_cpu / max(events, 1) * 1e6
    per_chunk = gateway.api_cpu / max(chunks, 1) * 1e6
    direct_requests = max(direct.requests, 1)
    direct_per_chunk = direct.api_cpu / max(direct.chunks, 1) * 1e6
    label = f"{streams} streams, real vLLM"
    types = ", ".join(f"{count / requests:.1f} {kind}"
                      for kind, count in sorted(gateway.events.items()))
    pids = ", ".join(map(str, api_pids))
    return [
        Figure(f"gateway CPU per streamed event, {label}", per_event, "us",
               spread=f"{gateway.gateway_cpu:.3f} CPU s for {events} events "
                      f"({gateway.requests} requests); a request's events: {types}"),
        Figure(f"vLLM API-server CPU per SSE chunk, {label}", per_chunk, "us",
               spread=f"{gateway.api_cpu:.3f} CPU s for {chunks:.0f} chunks through the "
                      f"gateway ({text_events} with text + {without_event:.2f} a request "
                      f"without, counted in phase 1); API server pid(s) {pids}, the engine "
                      "core not counted"),
        row_figure(LIVE_RATIO, per_event / per_chunk if per_chunk else float("inf"),
                   f"{streams} streams: {per_event:.1f} us per event / {per_chunk:.1f} us "
                   "per chunk, the same streams, one run"),
        Figure(f"events per SSE chunk, {label}", events / max(chunks, 1e-9), "x",
               spread=events_versus_chunks(
                   events / requests, text_events / requests, chunks / requests,
                   text_events / requests, tokens)
               + f"; direct, the same requests came in {direct.chunks / direct_requests:.1f} "
                 "chunks a request (a chunk carries every token ready since the last one: "
                 "how many is timing)"),
        Figure(f"vLLM API-server CPU per SSE chunk, direct, {label}", direct_per_chunk, "us",
               baseline=per_chunk, baseline_name="through the gateway",
               spread=f"{direct.api_cpu:.3f} CPU s for {direct.chunks} chunks "
                      f"({direct.requests} requests, "
                      f"{direct.chunks / max(direct_wall, 1e-9):.0f} chunks/s); per request "
                      f"{direct.api_cpu / direct_requests * 1e3:.2f} CPU ms direct against "
                      f"{gateway.api_cpu / requests * 1e3:.2f} through the gateway"),
    ]
