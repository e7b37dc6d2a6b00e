"""The vLLM HTTP client, on httpx. Of the upstream's modules only this one and
``_transport`` (each plain-HTTP request slot's connection, an httpx transport) import
httpx (who else does, and why: the package docstring).

    chunks(body, headers, ...)     a streamed completion as checked chunks (``_stream``)
    completion(body, headers, ...) a non-streaming completion as a checked body
    probe(), health_check()        GET /version, /v1/models, /health on their own pool

Timeouts: a request's httpx per-read timeout is off (``read=None``); the first-chunk and
idle deadlines are the stream's clocks (``_stream.ChunkStream.clocks``), the total
deadline a scope owned by the caller (conventions.md A4). httpx keeps the connect
timeout, which on a request surfaces as ``UpstreamOverloaded`` (vLLM is there but does
not accept in time), and a write bound. Probes have their own bounded timeouts
(``probe_timeout``); a probe that times out is ``UpstreamUnavailable``.

Cancellation: leaving ``chunks`` early (a cancelled scope, an exception) closes the
response before it is fully read, so httpx closes the socket instead of pooling it, and
vLLM aborts the request on disconnect (vllm-http.md section 3).

Reuse: a stream that reached ``data: [DONE]`` reads the rest of its body (the chunked
terminator) on the way out of ``chunks``, so its connection goes back to its slot
(``_slots.ConnectionSlots``) for the next request.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import attrs
import httpx
import trio

from ._chunks import parse_completion
from ._errors import (
    UpstreamError,
    UpstreamMalformed,
    UpstreamOverloaded,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from ._slots import ConnectionSlots, SlotHolder
from ._sse import DEFAULT_MAX_EVENT
from ._stream import ChunkStream
from ._transport import BODY_EXTENSION, BodyTooLarge, LoopbackBody, LoopbackTransport
from ._versions import Binding, select_binding

#: Largest error body read from vLLM (its error JSON is small; a proxy page might not be).
MAX_ERROR_BODY = 64 * 1024
MAX_JSON_BODY = 64 * 1024 * 1024
#: How long a finished stream waits for the rest of its body (vLLM sends the chunked
#: terminator right after [DONE]); past it, the connection is closed, not pooled.
TRAILER_WAIT = 0.25
#: Idle connections are closed before vLLM's server would (uvicorn's keep-alive timeout,
#: 5 s in vLLM), so a request is never sent on a connection the server is closing.
KEEPALIVE_EXPIRY = 4.0


CHAT_PATH = "/v1/chat/completions"
TEXT_COMPLETION_PATH = "/v1/completions"
#: The ``object`` each completion endpoint answers with.
_KINDS = {CHAT_PATH: "chat.completion", TEXT_COMPLETION_PATH: "text_completion"}


@attrs.frozen
class UpstreamConfig:
    base_url: str
    api_key: str | None = attrs.field(default=None, repr=False)
    connect_timeout: float = 2.0
    pool_size: int = 256
    probe_timeout: float = 5.0
    #: How long a request waits for one of the ``pool_size`` upstream connections before
    #: it is refused as overload (recoverable) instead of queueing on.
    queue_timeout: float = 10.0
    #: The share of the connections operations of detached sessions may keep while a
    #: live request waits for one (``_slots`` rule 2).
    detached_share: float = 0.5


@attrs.frozen
class Completion:
    """A checked non-streaming answer: its JSON text exactly as vLLM sent it (strict
    UTF-8, no lone surrogate: what reaches the client, ``profile.events.completed_text``)
    and the same decoded (what the gateway reads of it: usage, metrics, text)."""

    text: bytes
    body: dict[str, Any]


@attrs.frozen
class VllmInfo:
    """What the start-up probe learned."""

    version: str
    binding: Binding
    untested: bool
    models: tuple[str, ...]


@attrs.frozen
class PoolFigures:
    """The upstream request slots at one moment (``_slots.ConnectionSlots``): how many
    there are, held, idle with an open connection, requests waiting for one, and
    checkouts that gave up waiting (``--upstream-queue-timeout``: backend_overload)."""

    size: int
    in_use: int
    idle: int
    waiting: int
    wait_timeouts: int
    #: Holders for a client that was not there that gave their slot to a waiting request.
    given_way: int = 0


class VllmClient:
    """Loopback HTTP/1.1 client for vLLM's OpenAI server."""

    def __init__(self, config: UpstreamConfig,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        # identity: raw bytes on loopback, so the SSE decoder sees exactly what vLLM wrote.
        headers = {"user-agent": "nnrp-vllm-gateway", "accept-encoding": "identity"}
        if config.api_key:
            headers["authorization"] = f"Bearer {config.api_key}"

        # One TLS context for every client: httpx builds one per client otherwise (44 ms
        # and most of a MiB each, for an https:// vLLM URL that loopback rarely uses).
        tls = httpx.create_ssl_context()

        def pool(timeout: httpx.Timeout, connections: int) -> httpx.AsyncClient:
            return httpx.AsyncClient(
                base_url=config.base_url.rstrip("/"), timeout=timeout, verify=tls,
                limits=httpx.Limits(max_connections=connections,
                                    max_keepalive_connections=connections,
                                    keepalive_expiry=KEEPALIVE_EXPIRY),
                headers=headers, trust_env=False, transport=transport)

        # Requests: no httpx read or pool timeout; waiting for a slot counts against the
        # operation's own first-chunk, idle and total deadlines (trio scopes). Each slot's
        # one connection is a LoopbackTransport for http:// (the hot path, ``_transport``).
        request_timeout = httpx.Timeout(connect=config.connect_timeout, read=None,
                                        write=30.0, pool=None)
        # A plain-HTTP slot is the loopback transport itself, called without httpx's
        # client around it (auth, redirects, cookies: none apply to vLLM on loopback).
        plain = transport is None and httpx.URL(config.base_url).scheme == "http"
        self._slots: ConnectionSlots[_Slot] = ConnectionSlots(
            config.pool_size,
            (lambda: LoopbackTransport(KEEPALIVE_EXPIRY)) if plain
            else (lambda: _ClientSlot(pool(request_timeout, 1))),
            detached_share=config.detached_share)
        self._pulse = _Pulse()
        self._refused = trio.Event()
        # Probes get their own pool: behind busy request slots a /health call would queue
        # and time out, and a busy vLLM would be declared dead (found by the 1,000-stream
        # soak). A bounded read timeout, so a hung /health cannot stall the watch loop.
        self._probe_client = pool(httpx.Timeout(config.probe_timeout,
                                                connect=config.connect_timeout), 2)
        self._requests = _RequestTemplate(config.base_url, self._probe_client.headers,
                                          request_timeout)

    async def aclose(self) -> None:
        await self._slots.aclose()
        await self._probe_client.aclose()

    @property
    def last_stream_byte(self) -> float:
        """When (trio clock) a response body last delivered bytes: a busy vLLM that is
        slow to answer /health but still streaming is alive."""
        return self._pulse.last

    def make_room(self) -> None:
        """A holder of a slot paused for a client that is not there: a waiting request
        may have its slot (``_slots`` rule 3)."""
        self._slots.make_room()

    @property
    def slots_in_use(self) -> int:
        """Requests holding an upstream connection now."""
        return self._slots.in_use

    @property
    def slots_idle(self) -> int:
        """Upstream connections kept open for reuse."""
        return self._slots.idle

    def pool_figures(self) -> PoolFigures:
        """The request slots now (the metrics' upstream pool)."""
        slots = self._slots
        return PoolFigures(size=slots.size, in_use=slots.in_use, idle=slots.idle,
                           waiting=slots.waiting, wait_timeouts=slots.wait_timeouts,
                           given_way=slots.given_way)

    async def prune_idle(self) -> int:
        """Close upstream connections idle long enough that vLLM may close them first
        (``_slots.ConnectionSlots.prune``); how many were closed."""
        return await self._slots.prune(KEEPALIVE_EXPIRY)

    # ------------------------------------------------------------------ probes

    async def get_json(self, path: str) -> Any:
        try:
            response = await self._probe_client.get(path)
        except httpx.TransportError as exc:
            raise UpstreamUnavailable(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise UpstreamStatus(response.status_code, response.content[:MAX_ERROR_BODY])
        try:
            return response.json()
        except json.JSONDecodeError as exc:
            raise UpstreamError(f"GET {path}: not JSON") from exc

    async def get_text(self, path: str, *, max_bytes: int = 16 << 20) -> str:
        """``get_bounded``'s body as text: a scrape of vLLM's /metrics or /load
        (``_admission``)."""
        return (await self.get_bounded(path, max_bytes=max_bytes)).decode("utf-8", "replace")

    async def get_bounded(self, path: str, *, max_bytes: int) -> bytes:
        """GET ``path`` on the probe pool, read as it comes and refused past ``max_bytes``
        (a body is never held whole before its size is known). Raises UpstreamTimeout
        when vLLM is silent past the probe timeout, UpstreamUnavailable when it does not
        answer, UpstreamStatus for a status but 200, UpstreamError past the bound."""
        data = bytearray()
        try:
            async with self._probe_client.stream("GET", path) as response:
                if response.status_code != 200:
                    raise UpstreamStatus(response.status_code,
                                         await _read_bounded(response))
                async for chunk in response.aiter_raw():
                    data += chunk
                    if len(data) > max_bytes:
                        raise UpstreamError(f"GET {path}: more than {max_bytes} bytes")
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout("probe", self.config.probe_timeout) from exc
        except httpx.TransportError as exc:
            raise UpstreamUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return bytes(data)

    async def health(self) -> bool:
        """vLLM's /health: 200 when the engine is alive, 503 once it is dead."""
        return await self.health_check() is True

    async def health_check(self) -> bool | None:
        """True: healthy. False: vLLM is not serving: it answered that it is not, or its
        port refused or reset the connection (nothing listens: not ready at once). None:
        no answer in time (a busy vLLM, or a dead one: the caller counts these)."""
        try:
            response = await self._probe_client.get("/health")
        except httpx.TimeoutException:
            return None
        except httpx.TransportError:  # refused, reset, closed without an answer
            return False
        return response.status_code == 200

    async def refused(self) -> None:
        """Returns when a request's connection is refused from now on (vLLM went away
        between health checks), or ``recheck`` is called: the caller rechecks at once."""
        await self._refused.wait()

    def recheck(self) -> None:
        """Wake ``refused()`` now: a request learned that vLLM is unwell (its dead-engine
        answer), so the health loop should look without waiting for its interval."""
        self._refused.set()
        self._refused = trio.Event()

    async def probe(self, *, allow_untested: bool = False) -> VllmInfo:
        """GET /version (selects the binding) and GET /v1/models."""
        version = str((await self.get_json("/version")).get("version", ""))
        binding, untested = select_binding(version, allow_untested=allow_untested)
        models_doc = await self.get_json("/v1/models")
        models = tuple(str(m.get("id")) for m in models_doc.get("data", [])
                       if isinstance(m, dict) and m.get("id"))
        return VllmInfo(version, binding, untested, models)

    # ------------------------------------------------------------------ chat

    @asynccontextmanager
    async def chunks(self, body: dict[str, Any], headers: dict[str, str], *,
                     first_chunk: float, idle: float, max_event: int = DEFAULT_MAX_EVENT,
                     holder: SlotHolder | None = None, content: bytes | None = None
                     ) -> AsyncIterator[ChunkStream]:
        """POST a streaming /v1/chat/completions; yield its checked chunks (``_stream``).

        ``first_chunk`` bounds the wait for a slot, the status line and the first body
        bytes together; ``idle`` each later read. Raises UpstreamStatus for a non-200
        answer, UpstreamUnavailable when no response arrives, UpstreamTimeout. ``holder``
        may be asked to give its slot back (``_slots`` rule 2).
        """
        deadline = trio.current_time() + first_chunk
        async with self._response(body, headers, deadline, first_chunk,
                                  holder=holder, content=content) as response:
            raw = BodyChunks(response, self._pulse)
            stream = ChunkStream(raw, first_chunk_deadline=deadline,
                                 first_chunk_timeout=first_chunk, idle_timeout=idle,
                                 max_event=max_event)
            async with stream.clocks():
                yield stream
            if stream.done:
                await raw.read_trailer()

    async def completion(self, body: dict[str, Any], headers: dict[str, str], *,
                         path: str = CHAT_PATH, holder: SlotHolder | None = None,
                         content: bytes | None = None) -> Completion:
        """POST a non-streaming completion; the checked answer: ``chat.completion`` from
        /v1/chat/completions, ``text_completion`` from /v1/completions. vLLM answers only
        when it has finished: the caller's scope bounds the wait. The body is read
        whole (one read where it has arrived: ``_transport``), checked as one piece
        (``parse_completion``), and kept as the bytes vLLM sent beside its decoded value."""
        async with self._response(body, headers, math.inf, math.inf, path,
                                  holder=holder, content=content) as response:
            data = await _read_whole(response, MAX_JSON_BODY)
            self._pulse.last = trio.current_time()
            return Completion(data, parse_completion(data, _KINDS[path]))

    @asynccontextmanager
    async def _response(self, body: dict[str, Any], headers: dict[str, str], deadline: float,
                        first_chunk: float, path: str = CHAT_PATH, *,
                        holder: SlotHolder | None = None, content: bytes | None = None
                        ) -> AsyncIterator[httpx.Response]:
        """A slot, the request sent, and a 200 response whose body is not yet read, by
        ``deadline`` (the first-chunk clock, ``first_chunk`` seconds). ``content``: the
        body already encoded (a request with media: ``gateway.pipeline._media``)."""
        if content is None:
            content = json.dumps(body).encode()
        request = self._requests.build(path, content, headers)
        response: httpx.Response | None = None
        async with self._slots.checkout(self.config.queue_timeout, holder) as slot:
            with trio.move_on_at(deadline):
                try:
                    response = await slot.send(request)
                except httpx.ConnectTimeout as exc:  # alive but not accepting in time
                    raise UpstreamOverloaded(
                        f"vLLM did not accept a connection within "
                        f"{self.config.connect_timeout} s") from exc
                except httpx.TransportError as exc:
                    if isinstance(exc, httpx.ConnectError):
                        self.recheck()
                    raise UpstreamUnavailable(f"{type(exc).__name__}: {exc}") from exc
            if response is None:
                raise UpstreamTimeout("first_chunk", first_chunk)
            try:
                if response.status_code != 200:
                    raise UpstreamStatus(response.status_code, await _read_bounded(response))
                yield response
            finally:
                # Closing an unfinished response closes its socket: that is vLLM's abort.
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await response.aclose()


class _Slot(Protocol):
    """One request at a time on one connection (``_slots``)."""

    async def send(self, request: httpx.Request) -> httpx.Response:
        """The response, its body not yet read."""
        ...

    async def aclose(self) -> None: ...


class _ClientSlot:
    """A slot on an httpx client of its own (https://, or a transport given for tests)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def send(self, request: httpx.Request) -> httpx.Response:
        return await self._client.send(request, stream=True)

    async def aclose(self) -> None:
        await self._client.aclose()


class _RequestTemplate:
    """What every completion request shares, built once: the URL per path, the static
    headers (the clients' defaults and the content type) and the timeouts. httpx's
    ``build_request`` merges all three again for every request, about half of a
    request's construction (build once what can be)."""

    def __init__(self, base_url: str, client_headers: httpx.Headers, timeout: httpx.Timeout
                 ) -> None:
        self._base = base_url.rstrip("/")
        self._urls: dict[str, httpx.URL] = {}
        defaults = httpx.Headers(client_headers)  # httpx's defaults and the gateway's
        defaults["content-type"] = "application/json"
        url = httpx.URL(base_url)
        if url.username or url.password:
            # Credentials in the URL (http://user:pass@host) are Basic auth, as httpx's
            # client made them (over an API key's header, as there); the requests go to
            # the transport without that client.
            credentials = f"{url.username}:{url.password}".encode()
            defaults["authorization"] = "Basic " + base64.b64encode(credentials).decode()
        self._static = list(defaults.raw)
        self._timeout = timeout.as_dict()

    def build(self, path: str, content: bytes, headers: dict[str, str]) -> httpx.Request:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self._base + path)
        return httpx.Request("POST", url, content=content, extensions={
            "timeout": self._timeout}, headers=self._static + [
                (name.encode(), value.encode()) for name, value in headers.items()])


@attrs.define
class _Pulse:
    """When a response body last delivered bytes (shared by every stream of a client)."""

    last: float = -math.inf


class BodyChunks:
    """The response body's raw chunks; a reset mid-body becomes UpstreamMalformed.

    A plain iterator, not an async generator: leaving it early must not leave a
    suspended generator for trio to finalize (the pipeline leaves early on purpose).
    """

    def __init__(self, response: httpx.Response, pulse: _Pulse) -> None:
        # The loopback transport's own body iterator when there is one (no httpx layers
        # per read); httpx's otherwise (https://, a mock transport).
        body: AsyncIterator[bytes] | None = response.extensions.get(BODY_EXTENSION)
        self._chunks = body if body is not None else response.aiter_raw()
        self._pulse = pulse
        self._response = response

    def abort(self) -> bool:
        """Close the response's socket now, synchronously, from any task: vLLM sees the
        disconnect (and aborts the request) without waiting for the reading task to be
        scheduled, which at 256 busy streams can take many milliseconds. The
        socket comes from the response's ``network_stream`` extension (httpx's convention,
        which ``LoopbackTransport`` and httpcore both follow); the reading
        task's pending read then fails, and closing the response later is harmless.
        False when there is no socket to close (a mock transport)."""
        network_stream = self._response.extensions.get("network_stream")
        sock = network_stream.get_extra_info("socket") if network_stream else None
        if sock is None:
            return False
        # It runs in the connection's reader task: a failure here must not end that.
        with contextlib.suppress(OSError):
            sock.close()
        return True

    async def read_trailer(self, *, max_bytes: int = 4096) -> bool:
        """After ``data: [DONE]``: read the little that is left (the chunked-encoding
        terminator) so the connection goes back to the pool. Breaking off at [DONE]
        instead left every response unfinished, so httpx closed its socket and each
        request paid a new connect; 1,000 streams reconnecting together then met connect
        timeouts (1,000-stream soak). More than ``max_bytes`` or a slower end and the
        connection is closed as before. True when the body ended cleanly."""
        received = 0
        with trio.move_on_after(TRAILER_WAIT):
            try:
                async for chunk in self._chunks:
                    received += len(chunk)
                    if received > max_bytes:
                        return False
            except httpx.TransportError:
                return False
            return True
        return False

    def __aiter__(self) -> BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._chunks.__anext__()
            self._pulse.last = trio.current_time()
            return chunk
        except httpx.TransportError as exc:
            # A reset mid-body: the stream is broken, not merely unavailable.
            raise UpstreamMalformed(
                f"vLLM connection broke mid-response: {type(exc).__name__}",
                kind="connection_lost") from exc


async def _read_whole(response: httpx.Response, max_bytes: int) -> bytes:
    """A 200 answer's whole body, at most ``max_bytes``: in one piece from the loopback
    transport (``LoopbackBody.read_all``), else gathered from httpx's chunks."""
    whole: LoopbackBody | None = response.extensions.get(BODY_EXTENSION)
    try:
        if whole is not None:
            return await whole.read_all(max_bytes)
        pieces, size = [], 0
        async for chunk in response.aiter_raw():
            pieces.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge(f"body exceeds {max_bytes} bytes")
        return b"".join(pieces)
    except BodyTooLarge as exc:
        raise UpstreamMalformed(f"completion body exceeds {max_bytes >> 20} MiB") from exc
    except httpx.TransportError as exc:
        # A reset mid-body: the answer is broken, not merely unavailable (as a stream's).
        raise UpstreamMalformed(
            f"vLLM connection broke mid-response: {type(exc).__name__}",
            kind="connection_lost") from exc


async def _read_bounded(response: httpx.Response) -> bytes:
    data = bytearray()
    try:
        async for chunk in response.aiter_raw():
            data += chunk
            if len(data) >= MAX_ERROR_BODY:
                break
    except httpx.TransportError:
        pass  # the status is what matters; keep what arrived
    return bytes(data[:MAX_ERROR_BODY])
