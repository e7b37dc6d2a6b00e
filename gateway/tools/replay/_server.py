"""A loopback fake vLLM (trio + h11) that plays recorded transcripts byte for byte.

It answers like vLLM's OpenAI server: ``/health``, ``/ping``, ``/version`` (per the
chosen family), ``/v1/models`` and ``POST /v1/chat/completions``. A chat request is
answered from a transcript chosen by the request (``choose``), with the recorded chunk
boundaries and timing (scaled by ``speed``), the response ``id`` rebuilt from the
request's ``X-Request-Id`` and ``model`` set to the requested model, as vLLM does.

For tests and conformance evidence it records every request (headers included) and
every client disconnect before the end of a response (when, after how many chunks).
``GET /__replay/log`` returns both as JSON.

Failure modes: HTTP errors from the error transcripts (400, 401 with an API key, 404,
500), an in-stream error, a stalled stream (first chunk or mid-stream), a reset
mid-body, engine death (the recorded in-stream error, then ``/health`` 503 and
refused connections until ``revive()``), and ``long_stream``, which never ends until
the client leaves. Bytes that cannot start an HTTP request (an NNRP hello, dialled at
vLLM's port by mistake) are answered 400 at once and the connection closed, as vLLM's
uvicorn does (``NOT_HTTP_ANSWER``).

Load (``GET /metrics``): the text recorded from a busy vLLM 0.32.0
(``transcripts/metrics_busy.prom``) with its three load gauges set from ``load``
(``set_load``: waiting, running, KV-cache use; the default is the replay's own count of
replies in progress as running, none waiting). ``metrics_status`` scripts a failing
scrape (any status but 200, answered with an empty body), ``metrics_silent`` one that
never finishes. Every scrape is counted (``metrics_scrapes``) and wakes ``wait_until``.

Holds: ``hold(matches, after=N)`` makes every reply to a matching request wait after its
Nth chunk (N = 0: before its status line, as vLLM sends nothing of a non-streamed answer
until it is generated) until ``Hold.release()``, or until the client leaves, which is
recorded as any disconnect is. A test that must act while a reply is still running (a
cancel, a budget, a drain, a kill) holds it there instead of hoping to be faster than the
replay: whatever the host's speed, the reply cannot end first. ``wait_until`` and
``wait_for_requests`` wake when a request is routed (a held one too), reaches a hold,
completes or ends in a disconnect.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import random
import secrets
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import attrs
import h11
import structlog
import trio

from . import _synthesize as synth
from ._transcripts import FAMILIES, VERSIONS, Transcript, family_transcripts

log = structlog.get_logger("gateway.tools.replay")

SERVED_MODELS = ("tiny", "example-model", "reference-model")
#: Replaced by the send time (monotonic ns) as a timestamped chunk is written.
TIMESTAMP = b"@@MONOTONIC_NS@@"
BACKEND_ERROR_MODEL = "backend-error"
#: Scenarios that are behaviours rather than transcripts.
SPECIAL = ("stall_first_chunk", "stall_mid_stream", "reset_mid_body", "reset_before_response",
           "long_stream")


@attrs.frozen
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    scenario: str | None = None

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@attrs.frozen
class Disconnect:
    """The client closed before the response ended (the gateway's upstream abort)."""

    request_id: str
    scenario: str
    at: float
    chunks_sent: int
    at_ns: int = 0  # time.monotonic_ns(): comparable with other processes on the host


@attrs.define
class _Progress:
    sent: int = 0
    reset: bool = False


@attrs.define(eq=False)
class Hold:
    """Replies to the requests ``matches`` accepts wait after ``after`` chunks (0: before
    the status line) until ``release()``; a released hold holds nothing more. Made by
    ``ReplayServer.hold``."""

    matches: Callable[[RecordedRequest], bool]
    after: int = 0
    #: Request ids of the replies waiting at the hold now.
    waiting: list[str] = attrs.field(factory=list)
    _released: trio.Event = attrs.field(factory=trio.Event, init=False)

    @property
    def released(self) -> bool:
        return self._released.is_set()

    def release(self) -> None:
        self._released.set()

    async def wait(self) -> None:
        """Until released."""
        await self._released.wait()


@attrs.frozen
class Reply:
    status: int
    headers: tuple[tuple[str, str], ...]
    chunks: tuple[tuple[float, bytes], ...]
    scenario: str
    streaming: bool = False
    stall_after: int | None = None  # chunks sent before stalling forever
    reset_after: int | None = None  # chunks sent before resetting the connection
    kill_engine: bool = False
    no_response: bool = False  # hang up before the status line (a reset before a response)
    #: After ``chunks``, these are sent in turn forever, one every ``endless_interval_ms``:
    #: a stream that never ends by itself, however fast the host, so a cancel, deadline,
    #: drain or cut always lands while it is still running.
    endless: tuple[bytes, ...] = ()
    endless_interval_ms: float = 0.0


class ReplayServer:
    def __init__(self, *, family: str = "0.26", speed: float = 1.0,
                 api_key: str | None = None, served_models: tuple[str, ...] = SERVED_MODELS,
                 default_tokens: int = 48, token_interval_ms: float = 10.0,
                 echo_request_id: bool = True, version: str | None = None,
                 rechunk_seed: int | None = None,
                 keep_alive_timeout: float | None = None,
                 long_answers: bool = True) -> None:
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {', '.join(FAMILIES)}")
        self.family = family
        self.version = version or VERSIONS[family]
        #: Re-split every body at random points (same bytes, other chunk boundaries).
        self.rechunk = random.Random(rechunk_seed) if rechunk_seed is not None else None
        self.speed = speed
        self.api_key = api_key
        self.served_models = served_models
        self.default_tokens = default_tokens
        self.token_interval_ms = token_interval_ms
        self.echo_request_id = echo_request_id
        #: Close a keep-alive connection idle this long, as vLLM's uvicorn does (5 s).
        self.keep_alive_timeout = keep_alive_timeout
        #: A stream asking for a long answer is ``long_stream`` (``choose_scenario``);
        #: False answers it as any other prompt, as a fast GPU vLLM whose model stops
        #: early does: a client's cancel can then come after the end.
        self.long_answers = long_answers
        self.transcripts = family_transcripts(family)
        self.requests: list[RecordedRequest] = []
        self.disconnects: list[Disconnect] = []
        self.completed: list[str] = []
        #: Replies being written, by request id: how far each has got (chunks sent), so a
        #: test sees backpressure reach this socket (the count stops moving).
        self.playing: dict[str, _Progress] = {}
        #: TCP connections accepted: how tests see that the gateway reuses its pool.
        self.connections = 0
        self.engine_dead = False
        #: A busy server: /health never finishes answering (a scripted stall).
        self.health_silent = False
        #: /health answers 503 while the API server still takes requests (a dead engine
        #: seen before the process exits).
        self.health_unhealthy = False
        #: Scripted load for GET /metrics (module docstring); None: the replay's own.
        self.load: tuple[float, float, float] | None = None
        self.metrics_status = 200
        self.metrics_silent = False
        self.metrics_scrapes = 0
        self.port = 0
        self.host = "127.0.0.1"
        self._listeners: list[trio.SocketListener] = []
        self._revived = trio.Event()
        self.holds: list[Hold] = []
        #: Set and replaced whenever the record changes (``_changed``).
        self._change = trio.Event()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------ lifecycle

    async def serve(self, host: str = "127.0.0.1", port: int = 0, *,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``kill_engine`` closes the listener, ``revive`` reopens it."""
        self.host = host
        started = False
        async with trio.open_nursery() as nursery:
            while True:
                self._listeners = await trio.open_tcp_listeners(self.port or port, host=host)
                self.port = self._listeners[0].socket.getsockname()[1]
                if not started:
                    started = True
                    log.info("replay vLLM listening", url=self.url, family=self.family)
                    task_status.started(self.url)
                self._revived = trio.Event()
                with trio.CancelScope() as accept_scope:
                    self._accept_scope = accept_scope
                    await trio.serve_listeners(self._connection, self._listeners,
                                               handler_nursery=nursery)
                for listener in self._listeners:
                    await listener.aclose()
                await self._revived.wait()

    def kill_engine(self) -> None:
        """Engine death: /health 503 for live connections, then refused connections."""
        self.engine_dead = True
        self._accept_scope.cancel()

    def set_load(self, waiting: float, running: float = 1.0, kv_cache_usage: float = 0.0
                 ) -> None:
        """What GET /metrics reports from now on (vLLM's three load gauges)."""
        self.load = (waiting, running, kv_cache_usage)

    def revive(self) -> None:
        self.engine_dead = False
        self._revived.set()

    def hold(self, matches: Callable[[RecordedRequest], bool], *, after: int = 0) -> Hold:
        """Hold the replies to the requests ``matches`` accepts after ``after`` chunks (0:
        before the response starts) until the returned hold is released (module doc)."""
        hold = Hold(matches, after)
        self.holds.append(hold)
        return hold

    async def wait_until(self, condition: Callable[[], object]) -> None:
        """Until ``condition()`` is true, checked whenever a request is routed, reaches a
        hold, completes or ends in a disconnect."""
        while not condition():
            await self._change.wait()

    async def wait_for_requests(self, count: int) -> None:
        """Until ``count`` POST requests have been routed (answered or not: a held one
        counts as soon as it has arrived)."""
        await self.wait_until(
            lambda: len([r for r in self.requests if r.method == "POST"]) >= count)

    def _changed(self) -> None:
        self._change.set()
        self._change = trio.Event()

    # ------------------------------------------------------------------ HTTP

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        connection = h11.Connection(h11.SERVER)
        try:
            first = True
            while True:
                wait = (math.inf if first or self.keep_alive_timeout is None
                        else self.keep_alive_timeout)
                request = None
                with trio.move_on_after(wait):
                    request = await self._read_request(connection, stream)
                if request is None:
                    return  # the client left, or the connection idled past keep-alive
                first = False
                reply = self._route(request)
                hold = next((h for h in self.holds if not h.released
                             and h.matches(attrs.evolve(request, scenario=reply.scenario))),
                            None)
                self._changed()
                await self._play(connection, stream, request, reply, hold)
                if connection.our_state is h11.MUST_CLOSE or reply.reset_after is not None:
                    return
                try:
                    connection.start_next_cycle()
                except h11.LocalProtocolError:
                    return
        except* _NotHttp:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(NOT_HTTP_ANSWER)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            pass  # the client went away (a disconnect mid-response is recorded by _play)
        finally:
            await trio.aclose_forcefully(stream)

    async def _read_request(self, connection: h11.Connection, stream: trio.SocketStream
                            ) -> RecordedRequest | None:
        head: h11.Request | None = None
        body = bytearray()
        start = b""  # the request's first bytes, until they are a method and a space
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if head is None and connection.their_state is h11.IDLE and b" " not in start:
                    start += data[:16]
                    if not _starts_a_request(start):
                        raise _NotHttp
                connection.receive_data(data)
                if not data and connection.their_state is h11.IDLE:
                    return None
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                headers = {k.decode().lower(): v.decode() for k, v in head.headers}
                return RecordedRequest(head.method.decode(), head.target.decode(), headers,
                                       bytes(body), trio.current_time())
            elif isinstance(event, h11.ConnectionClosed):
                return None

    def _route(self, request: RecordedRequest) -> Reply:
        path = request.path.split("?")[0]
        if request.method == "GET" and path in ("/health", "/ping"):
            if self.health_silent and path == "/health":
                # A busy server: the status line comes, the body never does.
                return Reply(200, (), (), "health", streaming=True, stall_after=0)
            unhealthy = self.engine_dead or (self.health_unhealthy and path == "/health")
            return _json_reply(503 if unhealthy else 200, b"", "health")
        if request.method == "GET" and path == "/version":
            return _json_reply(200, json.dumps({"version": self.version}).encode(), "version")
        if request.method == "GET" and path == "/metrics":
            self.metrics_scrapes += 1
            self._changed()
            if self.metrics_silent:
                return Reply(200, (), (), "metrics", streaming=True, stall_after=0)
            if self.metrics_status != 200:
                return _json_reply(self.metrics_status, b"", "metrics")
            return Reply(200, (("content-type", "text/plain; version=0.0.4; charset=utf-8"),),
                         ((0.0, self._metrics_text()),), "metrics")
        if request.method == "GET" and path == "/load":
            self.metrics_scrapes += 1
            self._changed()
            load = (self.load[0] if self.load is not None
                    else len(self.requests) - len(self.completed))
            return _json_reply(200, json.dumps({"server_load": load}).encode(), "load")
        if request.method == "GET" and path == "/v1/models":
            return _json_reply(200, self._models(), "models")
        if request.method == "GET" and path == "/__replay/log":
            return _json_reply(200, json.dumps(self.log_document()).encode(), "log")
        if request.method == "POST" and path == "/v1/chat/completions":
            reply = self._chat(request)
            self.requests.append(attrs.evolve(request, scenario=reply.scenario))
            return reply
        if request.method == "POST" and path == "/v1/completions":
            reply = self._text_completion(request)
            self.requests.append(attrs.evolve(request, scenario=reply.scenario))
            return reply
        self.requests.append(request)
        return _json_reply(404, b'{"detail":"Not Found"}', "not_found")

    def log_document(self) -> dict[str, Any]:
        return {"requests": [{"method": r.method, "path": r.path, "headers": r.headers,
                              "body": r.body.decode("utf-8", "replace"), "at": r.at,
                              "scenario": r.scenario} for r in self.requests],
                "disconnects": [attrs.asdict(d) for d in self.disconnects],
                "completed": self.completed,
                "playing": {rid: progress.sent for rid, progress in self.playing.items()}}

    def _metrics_text(self) -> bytes:
        waiting, running, kv = self.load or (0.0, float(len(self.playing)), 0.0)
        values = {"vllm:num_requests_waiting{": waiting, "vllm:num_requests_running{": running,
                  "vllm:kv_cache_usage_perc{": kv}
        lines = []
        for line in _metrics_template().splitlines():
            for prefix, value in values.items():
                if line.startswith(prefix):
                    line = f"{line.rsplit(' ', 1)[0]} {float(value)!r}"
            lines.append(line)
        return ("\n".join(lines) + "\n").encode()

    def _models(self) -> bytes:
        return json.dumps({"object": "list", "data": [
            {"id": model, "object": "model", "created": synth.CREATED, "owned_by": "vllm",
             "root": "tiny", "parent": None, "max_model_len": 512, "permission": []}
            for model in self.served_models]}).encode()

    # ------------------------------------------------------------------ choosing a reply

    def _chat(self, request: RecordedRequest) -> Reply:
        if self.api_key is not None and request.headers.get("authorization") != (
                f"Bearer {self.api_key}"):
            return _json_reply(401, b'{"error":"Unauthorized"}', "error_401")
        if self.engine_dead:
            return _engine_dead_reply()
        request_id = request.headers.get("x-request-id") or secrets.token_hex(8)
        try:
            body = json.loads(request.body)
        except json.JSONDecodeError:
            body = None
        name = choose_scenario(request.headers, body, self.served_models,
                               long_answers=self.long_answers)
        model = body.get("model") if isinstance(body, dict) else None
        return self._reply(name, request_id, model, body if isinstance(body, dict) else {})

    def _text_completion(self, request: RecordedRequest) -> Reply:
        """``/v1/completions``, not streamed (what the gateway's token profile asks): the
        body comes when the whole completion would have, one token interval per token."""
        if self.engine_dead:
            return self._engine_failure("", stream=False)
        try:
            body = json.loads(request.body)
        except json.JSONDecodeError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            return _json_reply(400, json.dumps({"error": {
                "message": "prompt must be a string", "type": "BadRequestError",
                "param": "prompt", "code": 400}}).encode(), "text_completion_error")
        tokens = body.get("max_tokens")
        tokens = tokens if isinstance(tokens, int) and tokens > 0 else self.default_tokens
        request_id = request.headers.get("x-request-id") or secrets.token_hex(8)
        answer = synth.text_completion(request_id, str(body.get("model")), body["prompt"],
                                       tokens)
        return Reply(200, (("content-type", "application/json"),),
                     ((tokens * self.token_interval_ms, answer),), "text_completion")

    def _reply(self, name: str, request_id: str, model: Any, body: dict[str, Any]) -> Reply:
        """The reply for a chosen scenario: a behaviour, or a transcript played back."""
        if name == "timestamped":
            return self._timestamped(request_id, model, body.get("stream") is True)
        if name == "text_stream":
            tokens = body.get("max_tokens") or body.get("max_completion_tokens")
            return self._text_stream(request_id, model, tokens if isinstance(tokens, int)
                                     else self.default_tokens)
        if name == "backend_error":
            return self._engine_failure(request_id, body.get("stream") is True)
        if name == "engine_dead":  # EngineDeadError's 500, the process not yet gone
            return _engine_dead_reply()
        if name == "error_404_model":
            message = (f"The model `{model}` does not exist. Valid aliases: "
                       f"{', '.join(self.served_models)}.")
            return _json_reply(404, json.dumps({"error": {
                "message": message, "type": "NotFoundError", "param": "model",
                "code": 404}}, separators=(",", ":")).encode(), "error_404_model")
        if name == "long_stream":
            return self._endless_stream(request_id, model)
        if name == "stall_first_chunk":
            return Reply(200, synth.SSE_HEADERS, (), name, streaming=True, stall_after=0)
        if name == "stall_mid_stream":
            reply = self._text_stream(request_id, model, 20)
            return attrs.evolve(reply, stall_after=3, scenario=name)
        if name == "reset_before_response":
            return Reply(0, (), (), name, no_response=True)
        if name == "reset_mid_body":
            reply = self._text_stream(request_id, model, 20)
            return attrs.evolve(reply, reset_after=3, scenario=name)
        if name not in self.transcripts:
            return _json_reply(400, json.dumps({"error": {
                "message": f"unknown replay scenario {name!r}", "type": "BadRequestError",
                "param": "x-replay-scenario", "code": 400}}).encode(), "unknown")
        reply = self._transcript_reply(name, request_id, model)
        if name == "engine_death_mid_stream":
            reply = attrs.evolve(reply, kill_engine=True)
        return reply

    def _timestamped(self, request_id: str, model: Any, stream: bool) -> Reply:
        """Benchmarks: ``replay:timestamped:<tokens>:<interval_us>:<id>``. Each token's text
        is the backend's ``time.monotonic_ns()`` at the moment it is written, so a client on
        the same host can measure emit-to-receive latency across processes."""
        parts = request_id.split(":")
        tokens = int(parts[2]) if len(parts) > 2 else 16
        interval_ms = int(parts[3]) / 1000 if len(parts) > 3 else 0.0
        if not stream:
            reply = self._transcript_reply("nonstream_length", request_id, model)
            return attrs.evolve(reply, scenario="timestamped")
        chunks = synth.text_stream(request_id, str(model), tokens, interval_ms, ttft_ms=0.0,
                                   word=TIMESTAMP.decode())
        stamped = chunks
        if interval_ms == 0:
            # An instant backend: 64 events per write, as vLLM's --stream-interval does, so
            # the Python replay server is not what a throughput benchmark measures.
            stamped = [(0.0, b"".join(data for _, data in chunks[i:i + 64]))
                       for i in range(0, len(chunks), 64)]
        return Reply(200, synth.SSE_HEADERS, tuple(stamped), "timestamped", streaming=True)

    def _engine_failure(self, request_id: str, stream: bool) -> Reply:
        error = {"error": {"message": "Internal server error", "type": "InternalServerError",
                           "param": None, "code": 500}}
        if not stream:
            return _json_reply(500, json.dumps(error).encode(), "backend_error")
        # Nothing produced yet: the error is the first event, then [DONE] (seen live).
        chunks = ((5.0, b"data: " + json.dumps(error).encode() + b"\n\n"),
                  (5.0, synth.DONE))
        return Reply(200, synth.SSE_HEADERS, chunks, "backend_error_stream", streaming=True)

    def _text_stream(self, request_id: str, model: Any, tokens: int) -> Reply:
        chunks = synth.text_stream(request_id, str(model), tokens, self.token_interval_ms)
        if self.family == "0.18":
            chunks = [(t, data.replace(b',"prompt_text":null', b"")
                       .replace(f',"system_fingerprint":"{synth.FINGERPRINT}"'.encode(), b""))
                      for t, data in chunks]
        return Reply(200, synth.SSE_HEADERS, tuple(chunks), "text_stream", streaming=True)

    def _endless_stream(self, request_id: str, model: Any) -> Reply:
        """``long_stream``: text tokens at the replay's pace until the client leaves. Any
        cancel, deadline, timeout or drain lands mid-stream, on a quiet machine too (a long
        but finite stream was finished in the time a fast client took to react)."""
        tokens = tuple(synth.delta_chunk(request_id, str(model), {"content": word})
                       for word in synth.WORDS)
        return Reply(200, synth.SSE_HEADERS, ((5.0, synth.role_chunk(request_id, str(model))),),
                     "long_stream", streaming=True, endless=tokens,
                     endless_interval_ms=self.token_interval_ms)

    def _transcript_reply(self, name: str, request_id: str, model: Any) -> Reply:
        transcript = self.transcripts[name]
        return Reply(transcript.status, _headers(transcript),
                     tuple(_rewrite(transcript, data, request_id, model)
                           for data in transcript.chunks), name, streaming=transcript.streaming)

    # ------------------------------------------------------------------ playback

    def _rechunked(self, reply: Reply) -> Reply:
        assert self.rechunk is not None
        data = b"".join(chunk for _, chunk in reply.chunks)
        if len(data) < 2:
            return reply
        cuts = sorted(self.rechunk.sample(range(1, len(data)), min(len(data) - 1,
                                                                    self.rechunk.randint(1, 40))))
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        end = reply.chunks[-1][0]
        return attrs.evolve(reply, chunks=tuple((end * i / len(pieces), piece)
                                                for i, piece in enumerate(pieces)))

    async def _play(self, connection: h11.Connection, stream: trio.SocketStream,
                    request: RecordedRequest, reply: Reply, hold: Hold | None) -> None:
        if reply.no_response:
            await trio.aclose_forcefully(stream)
            raise trio.ClosedResourceError("hung up before responding (scripted)")
        if (self.rechunk is not None and reply.chunks and reply.stall_after is None
                and not reply.endless):
            reply = self._rechunked(reply)
        request_id = request.headers.get("x-request-id", "")
        headers = [(k, v) for k, v in reply.headers if k != "x-request-id"]
        if self.echo_request_id and request_id:
            headers.append(("x-request-id", request_id))
        if not reply.streaming:
            size = sum(len(data) for _, data in reply.chunks)
            headers = [(k, v) for k, v in headers if k not in ("content-length",
                                                               "transfer-encoding")]
            headers.append(("content-length", str(size)))
        head = connection.send(h11.Response(status_code=reply.status, headers=headers))
        progress = _Progress()
        self.playing[request_id] = progress
        disconnected = False
        # When the disconnect was seen, stamped there: the cancel benchmark measures up to
        # it, not up to this task's unwinding after it (docs/benchmarks.md).
        seen_ns = 0
        async with trio.open_nursery() as nursery:

            async def watch_for_disconnect() -> None:
                nonlocal disconnected, seen_ns
                while True:
                    try:
                        data = await stream.receive_some(65536)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""  # a reset is a disconnect too
                    if not data:
                        disconnected, seen_ns = True, time.monotonic_ns()
                        nursery.cancel_scope.cancel()
                        return
                    connection.receive_data(data)  # a pipelined request: keep it

            if reply.chunks or reply.stall_after is not None or hold is not None:
                nursery.start_soon(watch_for_disconnect)
            try:
                if hold is not None and hold.after == 0:
                    await self._wait_at(hold, request_id)
                await stream.send_all(head)
                await self._send_chunks(connection, stream, reply, progress, hold, request_id)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                # The write noticed the close before the watcher did.
                disconnected, seen_ns = True, seen_ns or time.monotonic_ns()
            nursery.cancel_scope.cancel()
        self.playing.pop(request_id, None)
        if reply.kill_engine:
            self.kill_engine()  # the engine died whether or not the client stayed to the end
        if disconnected:
            self.disconnects.append(Disconnect(request_id, reply.scenario, trio.current_time(),
                                               progress.sent, seen_ns))
            log.info("client disconnected mid-response", request_id=request_id,
                     scenario=reply.scenario, chunks_sent=progress.sent)
            self._changed()
            raise trio.ClosedResourceError("client went away")
        if progress.reset:
            return
        self.completed.append(request_id)
        self._changed()

    async def _wait_at(self, hold: Hold | None, request_id: str) -> float:
        """Wait at ``hold`` until it is released; how long it held (the chunks after it
        keep their pace from the release, as an engine resumed)."""
        assert hold is not None
        if hold.released:
            return 0.0
        began = trio.current_time()
        hold.waiting.append(request_id)
        self._changed()
        try:
            await hold.wait()
        finally:
            hold.waiting.remove(request_id)
        return trio.current_time() - began

    async def _send_chunks(self, connection: h11.Connection, stream: trio.SocketStream,
                           reply: Reply, progress: _Progress, hold: Hold | None = None,
                           request_id: str = "") -> None:
        """Send the reply's chunks with their recorded timing, counting them in ``progress``.

        Each chunk is due at its own offset from the reply's start, as an engine produces
        tokens at its own pace: a write that was late (a busy host, a paused reader) does
        not push every later one back, so a 1,000-stream soak measures the gateway, not
        this server's accumulated drift."""
        start = trio.current_time()
        # The chunk count a hold waits at (None: no hold, or one before the status line).
        held_at = hold.after if hold is not None and hold.after > 0 else None
        for t_ms, data in reply.chunks:
            if progress.sent == held_at:
                start += await self._wait_at(hold, request_id)
            if reply.stall_after is not None and progress.sent >= reply.stall_after:
                await trio.sleep_forever()
            if reply.reset_after is not None and progress.sent >= reply.reset_after:
                # RST instead of FIN: linger 0, then close.
                stream.socket.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER,
                                         b"\x01\x00\x00\x00\x00\x00\x00\x00")
                await trio.aclose_forcefully(stream)
                progress.reset = True
                return
            if t_ms:
                await trio.sleep_until(start + t_ms / 1000 / self.speed)
            if TIMESTAMP in data:
                data = data.replace(TIMESTAMP, str(time.monotonic_ns()).encode())
            await stream.send_all(connection.send(h11.Data(data=data)))
            progress.sent += 1
        if reply.endless:
            t_ms = reply.chunks[-1][0] if reply.chunks else 0.0
            for data in itertools.cycle(reply.endless):
                if progress.sent == held_at:
                    start += await self._wait_at(hold, request_id)
                t_ms += reply.endless_interval_ms
                await trio.sleep_until(start + t_ms / 1000 / self.speed)
                await stream.send_all(connection.send(h11.Data(data=data)))
                progress.sent += 1
        if reply.stall_after is not None:
            await trio.sleep_forever()
        await stream.send_all(connection.send(h11.EndOfMessage()))


#: vLLM's answer (uvicorn with httptools) to bytes that cannot start an HTTP request,
#: sent at once, before it closes the connection.
NOT_HTTP_ANSWER = (b"HTTP/1.1 400 Bad Request\r\nserver: uvicorn\r\n"
                   b"content-type: text/plain; charset=utf-8\r\ncontent-length: 30\r\n"
                   b"connection: close\r\n\r\nInvalid HTTP request received.")


class _NotHttp(Exception):
    """A connection's first bytes are not an HTTP request's."""


def _starts_a_request(start: bytes) -> bool:
    """Whether ``start`` can begin a request line: a method in capitals, then a space
    (an NNRP hello starts ``NNRP\\x01``)."""
    method = start.split(b" ", 1)[0]
    return all(0x41 <= byte <= 0x5A for byte in method)


def choose_scenario(headers: dict[str, str], body: Any, served_models: tuple[str, ...],
                    *, long_answers: bool = True) -> str:
    """Which reply a chat request gets; the first rule that matches decides:

    1. header ``x-replay-scenario: NAME`` (tests that call the replay server directly);
    2. ``x-request-id: replay:NAME:...`` (through the gateway, which forwards only the id);
    3. model ``backend-error``: vLLM's engine failure (the suite's backend-error recipe);
    4. the request itself, answered as vLLM would: a body that is not JSON, an unknown
       model, no messages, ``stream_options`` without a stream are its errors; then tool
       calls, ``n = 2``; a stream whose last message asks for a long answer (the suite's
       cancellation recipe: "Start a long answer.") is ``long_stream``, because a vLLM
       asked for a long answer is still generating when the client's cancel lands, and a
       fast replay of a short one could end first (unless ``long_answers`` is False: a
       fast backend's short answer, which a cancel may miss); then a text stream, or a
       plain completion.
    """
    named = headers.get("x-replay-scenario")
    request_id = headers.get("x-request-id", "")
    if named is None and request_id.startswith("replay:"):
        named = request_id.split(":")[1]
    if named:
        return named
    if not isinstance(body, dict):
        return "error_400_bad_json"
    if body.get("model") == BACKEND_ERROR_MODEL:
        return "backend_error"
    if body.get("model") not in served_models:
        return "error_404_model"
    stream = body.get("stream") is True
    if not isinstance(body.get("messages"), list):
        return "error_400_missing_messages"
    if "stream_options" in body and not stream:
        return "error_400_stream_options_without_stream"
    tools = body.get("tools")
    if tools:
        if not stream:
            return "nonstream_tool_call"
        return "stream_tool_call_parallel" if len(tools) > 1 else "stream_tool_call_single"
    if stream and body.get("n") == 2:
        return "stream_n2_interleaved"
    if stream and long_answers and _asks_for_a_long_answer(body["messages"]):
        return "long_stream"
    return "text_stream" if stream else "nonstream_length"


def _asks_for_a_long_answer(messages: list[Any]) -> bool:
    last = messages[-1] if messages else None
    content = last.get("content") if isinstance(last, dict) else None
    return isinstance(content, str) and "long answer" in content.lower()


def _engine_dead_reply() -> Reply:
    """vLLM's answer once its engine died: EngineDeadError's fixed message on a 500
    (vllm/v1/engine/exceptions.py; 0.33 answers it so on every path)."""
    return _json_reply(500, json.dumps({"error": {
        "message": "EngineCore encountered an issue. See stack trace (above) for the root "
                   "cause.", "type": "InternalServerError", "param": None,
        "code": 500}}).encode(), "engine_dead")


@functools.cache
def _metrics_template() -> str:
    """GET /metrics of a busy vLLM 0.32.0 (CPU build), as recorded."""
    return resources.files("gateway.tools.replay").joinpath(
        "transcripts", "metrics_busy.prom").read_text()


def _json_reply(status: int, body: bytes, scenario: str) -> Reply:
    return Reply(status, (("content-type", "application/json"),), ((0.0, body),) if body else (),
                 scenario)


def _headers(transcript: Transcript) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in transcript.response_headers
                 if k not in ("date", "server", "vary"))


def _rewrite(transcript: Transcript, chunk: tuple[float, bytes], request_id: str,
             model: Any) -> tuple[float, bytes]:
    """vLLM builds ``id`` from X-Request-Id and echoes the requested model name."""
    t_ms, data = chunk
    recorded_id = dict(transcript.request_headers).get("x-request-id")
    if recorded_id:
        data = data.replace(f'"chatcmpl-{recorded_id}"'.encode(),
                            f'"chatcmpl-{request_id}"'.encode())
    recorded_model = transcript.request_body.get("model")
    if isinstance(model, str) and isinstance(recorded_model, str) and model != recorded_model:
        data = data.replace(f'"model":"{recorded_model}"'.encode(),
                            json.dumps({"model": model}, separators=(",", ":"))[1:-1].encode())
    return t_ms, data


