"""The vLLM HTTP client: the only module that touches httpx.

Timeouts: httpx's own per-read timeout is off (``read=None``); first-chunk, idle and
total deadlines are cancel scopes owned by the pipeline (conventions.md A4). Only the
connect timeout is httpx's.

Cancellation: leaving ``stream_chat`` early (a cancelled scope, an exception) closes
the response before it is fully read, so httpx closes the socket instead of pooling
it, and vLLM aborts the request on disconnect (vllm-http.md section 3).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from ._errors import UpstreamError, UpstreamMalformed, UpstreamStatus, UpstreamUnavailable
from ._versions import Binding, select_binding

#: Largest error body read from vLLM (its error JSON is small; a proxy page might not be).
MAX_ERROR_BODY = 64 * 1024
MAX_JSON_BODY = 64 * 1024 * 1024


@attrs.frozen
class UpstreamConfig:
    base_url: str
    api_key: str | None = attrs.field(default=None, repr=False)
    connect_timeout: float = 2.0
    pool_size: int = 256
    probe_timeout: float = 5.0


@attrs.frozen
class VllmInfo:
    """What the start-up probe learned."""

    version: str
    binding: Binding
    untested: bool
    models: tuple[str, ...]


class VllmClient:
    """Loopback HTTP/1.1 client for vLLM's OpenAI server."""

    def __init__(self, config: UpstreamConfig,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        # identity: raw bytes on loopback, so the SSE decoder sees exactly what vLLM wrote.
        headers = {"user-agent": "nnrp-vllm-gateway", "accept-encoding": "identity"}
        if config.api_key:
            headers["authorization"] = f"Bearer {config.api_key}"

        def pool(timeout: httpx.Timeout, connections: int) -> httpx.AsyncClient:
            return httpx.AsyncClient(
                base_url=config.base_url.rstrip("/"), timeout=timeout,
                limits=httpx.Limits(max_connections=connections,
                                    max_keepalive_connections=connections),
                headers=headers, trust_env=False, transport=transport)

        # Requests: no httpx read or pool timeout; waiting for a pooled connection counts
        # against the operation's own first-chunk, idle and total deadlines (trio scopes).
        self._client = pool(httpx.Timeout(connect=config.connect_timeout, read=None,
                                          write=30.0, pool=None), config.pool_size)
        self._slots = trio.CapacityLimiter(config.pool_size)
        # Probes get their own pool: behind a full request pool a /health call would queue
        # and time out, and a busy vLLM would be declared dead (found by the 1,000-stream
        # soak). A bounded read timeout, so a hung /health cannot stall the watch loop.
        self._probe_client = pool(httpx.Timeout(config.probe_timeout,
                                                connect=config.connect_timeout), 2)

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._probe_client.aclose()

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

    async def health(self) -> bool:
        """vLLM's /health: 200 when the engine is alive, 503 once it is dead."""
        return await self.health_check() is True

    async def health_check(self) -> bool | None:
        """True: healthy; False: vLLM answered that it is not; None: no answer (down, or
        too busy to answer within the probe timeout)."""
        try:
            response = await self._probe_client.get("/health")
        except httpx.TransportError:
            return None
        return response.status_code == 200

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
    async def stream_chat(self, body: dict[str, Any], headers: dict[str, str]
                          ) -> AsyncIterator[AsyncIterator[bytes]]:
        """POST /v1/chat/completions; yields the response body's byte chunks.

        Raises UpstreamStatus for a non-200 answer (its bounded body parsed) and
        UpstreamUnavailable when no response arrives.
        """
        request = self._client.build_request(
            "POST", "/v1/chat/completions", content=json.dumps(body).encode(),
            headers={"content-type": "application/json", **headers})
        # Queue here, not in httpcore: its pool rescans every waiting request on each
        # change, and 750 requests queued behind 256 connections held the gateway at 100 %
        # CPU with nothing completing (1,000-stream soak). A trio limiter queues in FIFO
        # order at O(1), and the wait still counts against the operation's deadlines.
        async with self._slots:
            try:
                response = await self._client.send(request, stream=True)
            except httpx.TransportError as exc:
                raise UpstreamUnavailable(f"{type(exc).__name__}: {exc}") from exc
            try:
                if response.status_code != 200:
                    raise UpstreamStatus(response.status_code, await _read_bounded(response))
                yield _BodyChunks(response)
            finally:
                # Closing an unfinished response closes its socket: that is vLLM's abort.
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await response.aclose()


class _BodyChunks:
    """The response body's raw chunks; a reset mid-body becomes UpstreamMalformed.

    A plain iterator, not an async generator: leaving it early must not leave a
    suspended generator for trio to finalize (the pipeline leaves early on purpose).
    """

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_raw()

    def __aiter__(self) -> _BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except httpx.TransportError as exc:
            # A reset mid-body: the stream is broken, not merely unavailable.
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
