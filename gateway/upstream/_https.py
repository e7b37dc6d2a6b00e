"""The request slots of an https:// vLLM: httpx, one client (one connection) per slot,
answering as the project's own http:// connection does (``_transport``), so that
``_client`` has one way to read every response.

    slot = HttpxSlot(client, requests)
    response = await slot.send(path, body, headers)   # an HttpxResponse, body not read
    async for raw in response: ...      # or: await response.read_all(max_bytes)
    await response.aclose()

httpx's failures become ``_transport``'s ``TransportError``s under httpx's own names
(``ConnectTimeout``, ``ConnectError``, ``ReadError``...), so a failure reads the same
whichever scheme it came by. Tests reach this module through respx (a mock transport
under the slot's httpx client): it is the only request path where a mock fits, since
it is the only one on httpx.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import httpx

from ._transport import (
    BodyTooLarge,
    ConnectError,
    ConnectTimeout,
    LocalProtocolError,
    ReadError,
    RemoteProtocolError,
    TransportError,
    WriteError,
    WriteTimeout,
)

if TYPE_CHECKING:
    from ._http1 import RequestBody

#: The ``_transport`` error each httpx error becomes; any other httpx transport error is a
#: plain ``TransportError`` under its httpx name.
_ERRORS: dict[type[httpx.TransportError], type[TransportError]] = {
    httpx.ConnectTimeout: ConnectTimeout, httpx.ConnectError: ConnectError,
    httpx.WriteTimeout: WriteTimeout, httpx.WriteError: WriteError,
    httpx.ReadError: ReadError, httpx.RemoteProtocolError: RemoteProtocolError,
    httpx.LocalProtocolError: LocalProtocolError}


def translated(exc: httpx.TransportError) -> TransportError:
    """``exc`` as a ``_transport`` error of the same name."""
    own = _ERRORS.get(type(exc), TransportError)
    return own(str(exc), name=type(exc).__name__)


class HttpxRequests:
    """What every completion request of a client shares, built once: the URL per path,
    the static headers and the timeouts (httpx's ``build_request`` merges all three again
    for every request)."""

    def __init__(self, base_url: str, static: list[tuple[bytes, bytes]],
                 timeout: httpx.Timeout) -> None:
        self._base = base_url.rstrip("/")
        self._urls: dict[str, httpx.URL] = {}
        self._static = static
        self._timeout = timeout.as_dict()

    def build(self, path: str, content: RequestBody, headers: dict[str, str]
              ) -> httpx.Request:
        """httpx takes one buffer (an iterable would go chunked): a body in pieces is
        joined here, the https:// path's one copy of a big request."""
        if not isinstance(content, bytes):
            content = b"".join(content)
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self._base + path)
        return httpx.Request("POST", url, content=content, extensions={
            "timeout": self._timeout}, headers=self._static + [
                (name.encode(), value.encode()) for name, value in headers.items()])


class HttpxSlot:
    """One request slot on an httpx client of its own (one connection)."""

    def __init__(self, client: httpx.AsyncClient, requests: HttpxRequests) -> None:
        self._client = client
        self._requests = requests

    async def send(self, path: str, body: RequestBody, headers: dict[str, str]) -> HttpxResponse:
        """POST ``body`` to ``path``; the response, its body not yet read."""
        request = self._requests.build(path, body, headers)
        try:
            return HttpxResponse(await self._client.send(request, stream=True))
        except httpx.TransportError as exc:
            raise translated(exc) from exc

    async def aclose(self) -> None:
        await self._client.aclose()


class HttpxResponse:
    """An httpx response read as ``_transport.Http1Response`` is: ``status``, its raw
    body by iterating or ``read_all``, ``abort`` and ``aclose``."""

    def __init__(self, response: httpx.Response) -> None:
        self.status = response.status_code
        self._response = response
        self._raw = response.aiter_raw()

    def __aiter__(self) -> HttpxResponse:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk: bytes = await self._raw.__anext__()
        except httpx.TransportError as exc:
            raise translated(exc) from exc
        return chunk

    async def read_all(self, max_bytes: int) -> bytes:
        """The whole body; more than ``max_bytes`` raises ``BodyTooLarge``."""
        pieces, size = [], 0
        async for chunk in self:
            pieces.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge(f"body exceeds {max_bytes} bytes")
        return b"".join(pieces)

    def abort(self) -> bool:
        """Close the response's socket now, synchronously, from any task (httpcore's
        ``network_stream`` extension gives it). False when there is none (a mock)."""
        network_stream: Any = self._response.extensions.get("network_stream")
        sock = network_stream.get_extra_info("socket") if network_stream else None
        if sock is None:
            return False
        with contextlib.suppress(OSError):  # it runs in another connection's task
            sock.close()
        return True

    async def aclose(self) -> None:
        await self._response.aclose()
