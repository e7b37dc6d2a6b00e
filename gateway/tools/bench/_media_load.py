"""What ``bench media`` (``bench.media``) sends, and the two processes it runs besides
the gateways, each its own Python process so that neither's work lands in the process
that measures:

* **the requests**, three ways for one image: binary media frames beside the envelope
  (``MediaRequest.typed_body``), base64 inside the envelope (``envelope_body``), and
  base64 in a JSON POST straight to vLLM (``direct_body``). The image is a PNG
  signature and then bytes that are not all alike (base64 costs the same whatever they
  are; the gateway reads the type from the signature).
* **the sink** (``MediaSink``): the replay vLLM, which also stamps when each chat
  request's last byte came (``time.monotonic_ns()``: one clock for every process of the
  host), how big it was, and, for a request naming ``file://`` media, how many bytes
  those files held at that moment (vLLM has the whole request only if they are there).
  It keeps no body over ``KEEP_BODY`` and never parses one: copying or parsing 84 MiB
  here would stall the paced streams it plays, and that would be charged to the gateway.
* **the load** (``send_load``): one NNRP connection that submits the same big request
  back to back, each after the last one's result, until its stdin closes (the streams it
  runs beside have ended); it then prints how many it sent and how long each took.

Run as ``python -m gateway.tools.bench._media_load sink PORT`` or ``... load ENDPOINT
WAY MIB`` (WAY: ``frames`` or ``envelope``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import sys
import time
from typing import Any

import attrs
import h11
import trio

from gateway import nnrp
from gateway.tools.client import connect
from gateway.tools.replay import RecordedRequest, ReplayServer
from gateway.tools.replay._server import Reply

MIB = 1 << 20
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MODEL = "example-model"
#: The reply every request gets: vLLM's recorded non-streamed answer (chosen by the
#: request id alone, so the sink never needs the body: ``choose_scenario`` rule 2).
SCENARIO = "nonstream_length"
#: Bodies up to this are kept whole (a media-dir request's body is small); a bigger one is
#: counted, not kept.
KEEP_BODY = 1 << 20
ARRIVALS_PATH = "/__media/arrivals"
#: The load prints this once connected, its request built: the measured run may start.
READY = "ready"
_FILE_URL = re.compile(rb'"file://(/[^"]+)"')
_PLACEHOLDER = "@@MEDIA@@"


def image(mib: float) -> bytes:
    """``mib`` MiB: a PNG signature, then a repeated pattern of every byte value."""
    size = int(mib * MIB)
    pattern = bytes(range(256))
    return (PNG_SIGNATURE + pattern * (size // 256 + 1))[:size]


def chat_document(request_id: str, url: str) -> dict[str, Any]:
    """The openai-compatible/1 envelope: one user message, a text and an image part."""
    return {"schema_version": "openai-compatible/1", "operation": "chat.completions.create",
            "request_id": request_id,
            "body": {"model": MODEL, "stream": False, "max_tokens": 6, "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "What is in this picture?"},
                    {"type": "image_url", "image_url": {"url": url}}]}]}}


def _spliced(document: dict[str, Any], data: bytes) -> bytes:
    """``document`` as JSON with ``data`` as a base64 data URI where its placeholder is
    (base64 needs no JSON escaping; the media never pass through ``json.dumps``)."""
    before, _, after = json.dumps(document).encode().partition(_PLACEHOLDER.encode())
    return b"".join((before, b"data:image/png;base64,", base64.b64encode(data), after))


def request_id(tag: str) -> str:
    return f"replay:{SCENARIO}:{tag}"


def envelope_body(tag: str, data: bytes) -> bytes:
    """The frozen profile's way: the image as a data URI inside the envelope."""
    return _spliced(chat_document(request_id(tag), _PLACEHOLDER), data)


def direct_body(tag: str, data: bytes) -> bytes:
    """The same request as a client would POST it to vLLM."""
    return _spliced(chat_document(request_id(tag), _PLACEHOLDER)["body"], data)


@attrs.frozen
class MediaRequest:
    """A FRAME_SUBMIT with the envelope (frame 0) and, when ``data``, the image as a
    binary OPAQUE frame it names as ``nnrp:frame/1``; or, with ``inline``, the image as
    base64 inside the envelope and no other frame."""

    tag: str
    data: bytes = attrs.field(repr=False, default=b"")
    inline: bool = False

    @property
    def typed_body(self) -> bytes:
        if self.inline:
            return nnrp.pack_typed_body([(nnrp.TypedDescriptor(),
                                          envelope_body(self.tag, self.data))])
        if not self.data:
            text = chat_document(request_id(self.tag), "")
            text["body"]["messages"][0]["content"] = "What is in this picture?"
            return nnrp.pack_typed_body([(nnrp.TypedDescriptor(), json.dumps(text).encode())])
        envelope = json.dumps(chat_document(request_id(self.tag), "nnrp:frame/1")).encode()
        opaque = nnrp.TypedDescriptor(payload_kind=int(nnrp.PayloadKind.OPAQUE),
                                      stream_semantics=0)
        return nnrp.pack_typed_body([(nnrp.TypedDescriptor(), envelope), (opaque, self.data)])

    def meta(self, operation_id: int) -> nnrp.FrameSubmit:
        binary = bool(self.data) and not self.inline
        bitmap = int(nnrp.PayloadKind.STRUCTURED_EVENT)
        if binary:
            bitmap |= int(nnrp.PayloadKind.OPAQUE)
        return nnrp.FrameSubmit(operation_id=operation_id, payload_kind_bitmap=bitmap,
                                payload_frame_count=2 if binary else 1)


def packet_bytes(request: MediaRequest, typed_body: bytes) -> int:
    """What the FRAME_SUBMIT is on the client's link: header, metadata, typed body."""
    return len(nnrp.encode(nnrp.Packet(request.meta(1), session_id=1, frame_id=1,
                                       body=typed_body)))


# --------------------------------------------------------------------------- the sink


class MediaSink(ReplayServer):
    """The replay vLLM, recording each POST's arrival (module docstring); ``GET
    /__media/arrivals`` returns them and forgets them."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[dict[str, Any]] = []

    async def _read_request(self, connection: h11.Connection, stream: trio.SocketStream
                            ) -> RecordedRequest | None:
        head: h11.Request | None = None
        kept = bytearray()
        size = 0
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(1 << 18)
                connection.receive_data(data)
                if not data and connection.their_state is h11.IDLE:
                    return None
            elif isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size <= KEEP_BODY:
                    kept += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                arrived = time.monotonic_ns()
                headers = {k.decode().lower(): v.decode() for k, v in head.headers}
                body = bytes(kept) if size <= KEEP_BODY else b""
                if head.method == b"POST":
                    self.arrivals.append({
                        "request_id": headers.get("x-request-id", ""), "at_ns": arrived,
                        "bytes": size, "file_bytes": _file_bytes(body)})
                return RecordedRequest(head.method.decode(), head.target.decode(), headers,
                                       body, trio.current_time())
            elif isinstance(event, h11.ConnectionClosed):
                return None

    def _route(self, request: RecordedRequest) -> Reply:
        if request.method == "GET" and request.path == ARRIVALS_PATH:
            arrivals, self.arrivals = self.arrivals, []
            return Reply(200, (("content-type", "application/json"),),
                         ((0.0, json.dumps(arrivals).encode()),), "arrivals")
        return super()._route(request)

    def _chat(self, request: RecordedRequest) -> Reply:
        if not request.body:  # not kept: the request id names the reply (``SCENARIO``)
            request = attrs.evolve(request, body=json.dumps(
                {"model": MODEL, "messages": [], "stream": False}).encode())
        return super()._chat(request)


def _file_bytes(body: bytes) -> int:
    """The bytes the ``file://`` media a body names hold now (0: it names none)."""
    total = 0
    for match in _FILE_URL.finditer(body):
        # Not there: vLLM would fail the request, and the bench sees 0.
        with contextlib.suppress(OSError):
            total += os.stat(match.group(1).decode()).st_size
    return total


# --------------------------------------------------------------------------- the load


async def send_load(endpoint: str, request: MediaRequest) -> None:
    """Submit ``request`` back to back until stdin closes; then print a JSON summary."""
    typed_body = request.typed_body
    seconds: list[float] = []
    failures: list[str] = []
    stop = trio.Event()

    async def until_stdin_closes() -> None:
        await trio.to_thread.run_sync(sys.stdin.buffer.read, abandon_on_cancel=True)
        stop.set()

    async with connect(endpoint) as client, trio.open_nursery() as nursery:
        session = await client.open_session()
        print(READY, flush=True)
        nursery.start_soon(until_stdin_closes)
        number = 0
        while not stop.is_set():
            number += 1
            start = time.perf_counter()
            operation = await session.submit_frame(request.meta(number), typed_body,
                                                   frame_id=number)
            terminal = None
            async for event in operation.events():
                terminal = event
            seconds.append(time.perf_counter() - start)
            if not isinstance(terminal, nnrp.ResultReceived) or terminal.meta.status_code != 200:
                failures.append(repr(terminal)[:300])
        nursery.cancel_scope.cancel()
    print(json.dumps({"submits": len(seconds), "seconds": seconds, "failures": failures}),
          flush=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["sink"] and len(argv) == 2:
        trio.run(MediaSink().serve, "127.0.0.1", int(argv[1]))
    elif argv[:1] == ["load"] and len(argv) == 4 and argv[2] in ("frames", "envelope"):
        request = MediaRequest("load", image(float(argv[3])), inline=argv[2] == "envelope")
        trio.run(send_load, argv[1], request)
    else:
        raise SystemExit(f"usage: {__name__} sink PORT | load ENDPOINT frames|envelope MIB")


if __name__ == "__main__":
    main(sys.argv[1:])
