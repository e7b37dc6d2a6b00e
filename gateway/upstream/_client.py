"""The vLLM HTTP client.

    chunks(body, headers, ...)     a streamed completion as checked chunks (``_stream``)
    completion(body, headers, ...) a non-streaming completion as a checked body
    probe(), health_check()        GET /version, /v1/models, /health on their own pool

Which HTTP carries what (rules; docs/architecture.md, "The upstream path"):

1. An http:// vLLM's completion requests, the gateway's hot path, go over the project's
   own HTTP/1.1 client (``_transport`` over the sans-IO ``_http1``): no httpx between
   the socket and the SSE decoder. Measured against httpx and httpcore on the same path
   (the replay vLLM, runs alternating, docs/benchmarks.md "The upstream path decided"):
   1.17-1.55 times less gateway CPU per paced event at 16 and 256 streams, a fourteenth
   of the added latency at 256 streams x 100 events/s (p50), a third of a non-streaming
   request's, and none of httpcore's pool rescans (``_slots``).
2. An https:// vLLM's completion requests go through httpx (``_https``): TLS, and not the
   loopback case the project optimises for.
3. The probes (/version, /v1/models, /health, /metrics, /load) go through httpx for both
   schemes, on a pool of their own: a few requests a second, where httpx's API pays.
4. Each request path has its own tests on the branch production takes: the http:// one
   against real sockets (tests/upstream/test_transport.py, and h11 as the referee of
   ``_http1`` in tests/upstream/test_http1_differential.py), the https:// one through
   respx under the slot's httpx client; the client's own behaviour on both
   (tests/upstream/test_client_faults.py). ``VllmClient``'s ``transport`` (a test's mock)
   reaches httpx's clients only: the https:// slots and the probe pool.
5. Both request paths answer alike (``_Slot``, ``ResponseBody``): the same failures under
   httpx's names (``_transport.TransportError``), the same body readers, so this module
   reads every response one way.

Timeouts: a request has no per-read timeout; the first-chunk and idle deadlines are the
stream's clocks (``_stream.ChunkStream.clocks``), the total deadline a scope owned by
the caller (docs/reference/conventions.md A4). A request keeps a connect timeout, which surfaces as
``UpstreamOverloaded`` (vLLM is there but does not accept in time), and a write bound
(``WRITE_TIMEOUT``). Probes have their own bounded timeouts (``probe_timeout``); a probe
that times out is ``UpstreamUnavailable``.

Cancellation: leaving ``chunks`` early (a cancelled scope, an exception) closes the
response before it is fully read, so its socket is closed instead of kept for reuse, and
vLLM aborts the request on disconnect (docs/reference/vllm-http.md section 3).

Reuse: a stream that reached ``data: [DONE]`` reads the rest of its body (the chunked
terminator) on the way out of ``chunks``, so its connection goes back to its slot
(``_slots.ConnectionSlots``) for the next request.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import AsyncIterator, Callable
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
from ._http1 import RequestBody, body_length, request_bytes
from ._https import HttpxRequests, HttpxResponse, HttpxSlot
from ._reads import BodyChunks, BodyPulse, ResponseBody
from ._slots import ConnectionSlots, SlotHolder
from ._sse import DEFAULT_MAX_EVENT
from ._stream import ChunkStream
from ._transport import (
    BodyTooLarge,
    ConnectError,
    ConnectTimeout,
    Http1Connection,
    LocalProtocolError,
    TransportError,
)
from ._versions import Binding, select_binding

#: Largest error body read from vLLM (its error JSON is small; a proxy page might not be).
MAX_ERROR_BODY = 64 * 1024
MAX_JSON_BODY = 64 * 1024 * 1024
#: Idle connections are closed before vLLM's server would (uvicorn's keep-alive timeout,
#: 5 s in vLLM), so a request is never sent on a connection the server is closing.
KEEPALIVE_EXPIRY = 4.0
#: A request's bytes must be written within this (a big one waits for vLLM to read it).
WRITE_TIMEOUT = 30.0


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
    """Loopback HTTP/1.1 client for vLLM's OpenAI server. ``transport`` (a test's mock)
    goes under httpx's clients only: the probe pool, an https:// vLLM's slots (rule 4)."""

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

        # Probes get their own pool: behind busy request slots a /health call would queue
        # and time out, and a busy vLLM would be declared dead (found by the 1,000-stream
        # soak). A bounded read timeout, so a hung /health cannot stall the watch loop.
        self._probe_client = pool(httpx.Timeout(config.probe_timeout,
                                                connect=config.connect_timeout), 2)
        # Requests: no read or pool timeout; waiting for a slot counts against the
        # operation's own first-chunk, idle and total deadlines (trio scopes). A connect
        # timeout, and a bound on writing the request. Each slot is one connection: the
        # project's own for http:// (rule 1), an httpx client's for https:// (rule 2).
        url = httpx.URL(config.base_url)
        static = _static_headers(url, self._probe_client.headers)
        new_slot: Callable[[], _Slot]
        if url.scheme == "http":
            requests = Http1Requests(config.base_url, static)
            new_slot = lambda: Http1Slot(requests, Http1Connection(  # noqa: E731
                url.host, url.port or 80, connect_timeout=config.connect_timeout,
                write_timeout=WRITE_TIMEOUT, keepalive_expiry=KEEPALIVE_EXPIRY))
        else:
            timeout = httpx.Timeout(connect=config.connect_timeout, read=None,
                                    write=WRITE_TIMEOUT, pool=None)
            https = HttpxRequests(config.base_url, static, timeout)
            new_slot = lambda: HttpxSlot(pool(timeout, 1), https)  # noqa: E731
        self._slots: ConnectionSlots[_Slot] = ConnectionSlots(
            config.pool_size, new_slot, detached_share=config.detached_share)
        self._pulse = BodyPulse()
        self._refused = trio.Event()

    async def aclose(self) -> None:
        await self._slots.aclose()
        await self._probe_client.aclose()

    @property
    def body_reads(self) -> int:
        """How many reads of response bodies have delivered bytes so far: a busy vLLM
        that is slow to answer /health but streamed meanwhile is alive (a count, not a
        time: stamping the clock on every read was 5 % of the gateway's CPU at 32
        streams, docs/benchmarks.md)."""
        return self._pulse.reads

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
                                         await _read_bounded(HttpxResponse(response)))
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
                     holder: SlotHolder | None = None, content: RequestBody | None = None
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
                         content: RequestBody | None = None) -> Completion:
        """POST a non-streaming completion; the checked answer: ``chat.completion`` from
        /v1/chat/completions, ``text_completion`` from /v1/completions. vLLM answers only
        when it has finished: the caller's scope bounds the wait. The body is read
        whole (one read where it has arrived: ``_transport``), checked as one piece
        (``parse_completion``), and kept as the bytes vLLM sent beside its decoded value."""
        async with self._response(body, headers, math.inf, math.inf, path,
                                  holder=holder, content=content) as response:
            data = await _read_whole(response, MAX_JSON_BODY)
            self._pulse.reads += 1
            return Completion(data, parse_completion(data, _KINDS[path]))

    @asynccontextmanager
    async def _response(self, body: dict[str, Any], headers: dict[str, str], deadline: float,
                        first_chunk: float, path: str = CHAT_PATH, *,
                        holder: SlotHolder | None = None, content: RequestBody | None = None
                        ) -> AsyncIterator[ResponseBody]:
        """A slot, the request sent, and a 200 response whose body is not yet read, by
        ``deadline`` (the first-chunk clock, ``first_chunk`` seconds). ``content``: the
        body already encoded (a request with media: ``gateway.pipeline._media``)."""
        if content is None:
            content = json.dumps(body).encode()
        response: ResponseBody | None = None
        async with self._slots.checkout(self.config.queue_timeout, holder) as slot:
            with trio.move_on_at(deadline):
                try:
                    response = await slot.send(path, content, headers)
                except ConnectTimeout as exc:  # alive but not accepting in time
                    raise UpstreamOverloaded(
                        f"vLLM did not accept a connection within "
                        f"{self.config.connect_timeout} s") from exc
                except TransportError as exc:
                    if isinstance(exc, ConnectError):
                        self.recheck()
                    raise UpstreamUnavailable(f"{exc.name}: {exc}") from exc
            if response is None:
                raise UpstreamTimeout("first_chunk", first_chunk)
            try:
                if response.status != 200:
                    raise UpstreamStatus(response.status, await _read_bounded(response))
                yield response
            finally:
                # Closing an unfinished response closes its socket: that is vLLM's abort.
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await response.aclose()


class _Slot(Protocol):
    """One request at a time on one connection (``_slots``)."""

    async def send(self, path: str, body: RequestBody, headers: dict[str, str]
                   ) -> ResponseBody:
        """POST ``body`` to ``path``: the response, its body not yet read."""
        ...

    async def aclose(self) -> None: ...


def _static_headers(url: httpx.URL, client_headers: httpx.Headers
                    ) -> list[tuple[bytes, bytes]]:
    """The headers every completion request carries, as httpx's client would send them:
    its defaults and the gateway's, the content type, and credentials in the URL
    (http://user:pass@host) as Basic auth (over an API key's header, as httpx's client
    does). Built once per client (build once what can be)."""
    defaults = httpx.Headers(client_headers)
    defaults["content-type"] = "application/json"
    if url.username or url.password:
        credentials = f"{url.username}:{url.password}".encode()
        defaults["authorization"] = "Basic " + base64.b64encode(credentials).decode()
    return list(defaults.raw)


class Http1Requests:
    """An http:// client's request bytes, as httpx would write the same request
    (tests/upstream/test_transport.py compares): ``Host`` first, the static headers, the
    request's own, then ``Content-Length``. A path's target and the headers before the
    request's own are built once."""

    def __init__(self, base_url: str, static: list[tuple[bytes, bytes]]) -> None:
        self._base = base_url.rstrip("/")
        self._first = [(b"Host", httpx.URL(base_url).netloc), *static]
        self._targets: dict[str, bytes] = {}

    def encode(self, path: str, body: RequestBody, headers: dict[str, str]) -> RequestBody:
        target = self._targets.get(path)
        if target is None:
            target = self._targets[path] = httpx.URL(self._base + path).raw_path
        fields = self._first + [(name.encode(), value.encode())
                                for name, value in headers.items()]
        fields.append((b"Content-Length", str(body_length(body)).encode()))
        try:
            return request_bytes("POST", target, fields, body)
        except ValueError as exc:  # a header that would split the request
            raise LocalProtocolError(str(exc)) from exc


class Http1Slot:
    """One request slot of an http:// vLLM: one of the project's own connections."""

    def __init__(self, requests: Http1Requests, connection: Http1Connection) -> None:
        self._requests = requests
        self._connection = connection

    async def send(self, path: str, body: RequestBody, headers: dict[str, str]
                   ) -> ResponseBody:
        return await self._connection.send("POST", self._requests.encode(path, body, headers))

    async def aclose(self) -> None:
        await self._connection.aclose()


async def _read_whole(response: ResponseBody, max_bytes: int) -> bytes:
    """A 200 answer's whole body, at most ``max_bytes`` (``read_all``: in one piece from
    the project's own connection where it has arrived)."""
    try:
        return await response.read_all(max_bytes)
    except BodyTooLarge as exc:
        raise UpstreamMalformed(f"completion body exceeds {max_bytes >> 20} MiB") from exc
    except TransportError as exc:
        # A reset mid-body: the answer is broken, not merely unavailable (as a stream's).
        raise UpstreamMalformed(
            f"vLLM connection broke mid-response: {exc.name}",
            kind="connection_lost") from exc


async def _read_bounded(response: ResponseBody) -> bytes:
    data = bytearray()
    try:
        async for chunk in response:
            data += chunk
            if len(data) >= MAX_ERROR_BODY:
                break
    except TransportError:
        pass  # the status is what matters; keep what arrived
    return bytes(data[:MAX_ERROR_BODY])
