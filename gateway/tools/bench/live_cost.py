"""``bench live --streams N``: the gateway's CPU per streamed event beside vLLM's
API-server CPU per SSE chunk, against a real vLLM on this machine (issue 25, item 2).

Two phases in one run, each ``N`` concurrent streams of the same greedy request
(``ignore_eos``, so every request makes exactly ``tokens`` tokens), after one warm-up
request on each path:

1. **through the gateway**: the gateway's CPU and the API server's, and the events the
   NNRP clients received (PARTIAL_RESULTs), by type;
2. **direct**: the same requests straight to vLLM over HTTP/SSE from this process: the
   API server's CPU and the SSE chunks it sent (``data:`` events, ``[DONE]`` apart),
   counted here one by one.

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
4. The chunks are counted on the direct phase, where this process reads them: the
   gateway's reads are its own business (counting them inside would change what is
   measured). The API server's CPU per request through the gateway over direct, same
   run, says whether it did the same work on both paths (near 1: it did), which is what
   lets the direct phase's CPU per chunk stand for the gateway phase's.
5. The ratio (``rows.LIVE_RATIO``) is the gateway's CPU per event (phase 1) over the API
   server's CPU per chunk (phase 2). Events versus chunks is reported beside it with
   the reason they differ, read from the counts (``events_versus_chunks``).
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
    chunks_with_output: int = 0
    chunks_without_output: int = 0
    gateway_cpu: float = 0.0
    api_cpu: float = 0.0

    @property
    def chunks(self) -> int:
        return self.chunks_with_output + self.chunks_without_output


def events_versus_chunks(events_per_stream: float, text_events_per_stream: float,
                         chunks_per_stream: float, output_chunks_per_stream: float,
                         tokens: int) -> str:
    """Whether the gateway's events and vLLM's chunks differ, a stream's worth, and why
    (rule 5): pure, from the counts."""
    said = [f"{events_per_stream:.1f} events a stream through the gateway, "
            f"{chunks_per_stream:.1f} SSE chunks a stream direct ({tokens} tokens)"]
    if round(events_per_stream, 1) == round(chunks_per_stream, 1):
        said.append("the same count")
        return "; ".join(said)
    without = chunks_per_stream - output_chunks_per_stream
    if without > 0:
        said.append(f"{without:.1f} chunks a stream carry no output (vLLM's role-only "
                    "first chunk, the finish_reason chunk) and make no event of their own")
    other = events_per_stream - text_events_per_stream
    if other > 0:
        said.append(f"{other:.1f} events a stream are not text deltas")
    if output_chunks_per_stream < tokens:
        said.append(f"vLLM sent {tokens / max(output_chunks_per_stream, 1e-9):.2f} tokens an "
                    "output chunk (its API server merges the outputs it has not yet sent)")
    if abs(text_events_per_stream - output_chunks_per_stream) >= 0.05:
        said.append(f"text deltas {text_events_per_stream:.1f} against output chunks "
                    f"{output_chunks_per_stream:.1f} a stream: the two phases' chunking "
                    "differed (timing)")
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
    submitted = json.dumps({"schema_version": "openai-compatible/1",
                            "operation": "chat.completions.create", "body": body}).encode()
    gateway, direct = Tally(), Tally()
    async with contextlib.AsyncExitStack() as exits:
        sessions = await exits.enter_async_context(open_sessions(endpoint, streams))
        http = await exits.enter_async_context(httpx.AsyncClient(
            trust_env=False, timeout=None, limits=httpx.Limits(max_connections=streams)))

        async def via_gateway(index: int, tally: Tally) -> None:
            operation = await sessions[index].submit(submitted)
            async for event in operation.events():
                if isinstance(event, nnrp.PartialReceived):
                    tally.events[json.loads(event.body).get("type", "?")] += 1

        async def via_http(_: int, tally: Tally) -> None:
            decoder = SSEDecoder()
            async with http.stream("POST", f"{vllm_url.rstrip('/')}/v1/chat/completions",
                                   json=body) as response:
                response.raise_for_status()
                async for raw in response.aiter_raw():
                    for event in decoder.feed(raw):
                        if event.is_done:
                            continue
                        if carries_output(json.loads(event.data)):
                            tally.chunks_with_output += 1
                        else:
                            tally.chunks_without_output += 1

        progress("live cost: warming up both paths")
        await via_gateway(0, Tally())
        await via_http(0, Tally())
        progress(f"live cost: {streams} streams x {requests} requests through the gateway")
        await _phase(streams, requests, via_gateway, gateway, gateway_pids, api_pids)
        progress(f"live cost: {streams} streams x {requests} requests direct")
        start = time.perf_counter()
        await _phase(streams, requests, via_http, direct, gateway_pids, api_pids)
        direct_wall = time.perf_counter() - start
    return cost_figures(streams, tokens, gateway, direct, api_pids, direct_wall)


def cost_figures(streams: int, tokens: int, gateway: Tally, direct: Tally,
                 api_pids: list[int], direct_wall: float) -> list[Figure]:
    """The phases' tallies as figures (rule 5)."""
    events = sum(gateway.events.values())
    per_event = gateway.gateway_cpu / max(events, 1) * 1e6
    per_chunk = direct.api_cpu / max(direct.chunks, 1) * 1e6
    label = f"{streams} streams, real vLLM"
    through = gateway.api_cpu / max(gateway.requests, 1)
    straight = direct.api_cpu / max(direct.requests, 1)
    per_stream = max(gateway.requests, 1)
    per_direct = max(direct.requests, 1)
    types = ", ".join(f"{count / per_stream:.1f} {kind}"
                      for kind, count in sorted(gateway.events.items()))
    return [
        Figure(f"gateway CPU per streamed event, {label}", per_event, "us",
               spread=f"{gateway.gateway_cpu:.3f} CPU s for {events} events "
                      f"({gateway.requests} requests); a request's events: {types}"),
        Figure(f"vLLM API-server CPU per SSE chunk, {label}", per_chunk, "us",
               spread=f"{direct.api_cpu:.3f} CPU s for {direct.chunks} chunks ({direct.requests} "
                      f"requests direct, {direct.chunks / max(direct_wall, 1e-9):.0f} "
                      f"chunks/s); API server pid(s) {', '.join(map(str, api_pids))}, the "
                      "engine core not counted"),
        row_figure(LIVE_RATIO, per_event / per_chunk if per_chunk else float("inf"),
                   f"{streams} streams: {per_event:.1f} us per event / {per_chunk:.1f} us "
                   "per chunk, one run"),
        Figure(f"vLLM API-server CPU per request through the gateway, over direct, {label}",
               through / straight if straight else float("inf"), "x",
               baseline=None, spread=f"{through * 1e3:.2f} against {straight * 1e3:.2f} CPU "
                                     "ms a request (near 1: vLLM did the same work on both "
                                     "paths)"),
        Figure(f"events per SSE chunk, {label}",
               events / per_stream / max(direct.chunks / per_direct, 1e-9), "x",
               spread=events_versus_chunks(
                   events / per_stream, gateway.events["response.output_text.delta"]
                   / per_stream, direct.chunks / per_direct,
                   direct.chunks_with_output / per_direct, tokens)),
    ]
