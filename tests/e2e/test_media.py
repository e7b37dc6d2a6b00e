"""Media frames end to end (gateway/profile/_media.py, gateway/pipeline/_media.py): a
submit carries the envelope and binary frames; vLLM (the replay server, which records
what it receives) gets the exact bytes as a data URI or as a file in --media-dir, which
is gone when the operation ends, whatever the end; every refusal leaves the session
serving."""

from __future__ import annotations

import base64
import gc
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import pytest
import trio

from gateway import nnrp
from gateway.pipeline import PipelineLimits
from gateway.profile._literals import CUT_THRESHOLD
from gateway.tools.client import ClientSession, connect
from tests.support.media import (
    AUDIO,
    OPAQUE,
    PNG,
    VIDEO,
    WAV,
    data_uri_bytes,
    image_part,
    media_submit,
    sent_content,
    with_parts,
)
from tests.support.native import (
    native_connection,
    negotiate_tokens,
    open_session,
    openai_submit,
    poll_until,
)
from tests.support.scenarios import request_for
from tests.support.stack import Stack, envelope, run_operation, start_stack

STREAM = "stream_pair_plain"
UNARY = "nonstream_pair_plain"


def _media_envelope(scenario: str, *parts: dict[str, Any], tag: str = "media") -> bytes:
    return envelope(with_parts(request_for(scenario), *parts),
                    request_id=f"replay:{scenario}:{tag}")


async def _submit(session: ClientSession, operation_id: int, payload: bytes,
                  frames: list[tuple[int, bytes]]) -> tuple[list[Any], Any]:
    meta, body = media_submit(operation_id, payload, frames)
    operation = await session.submit_frame(meta, body)
    with trio.fail_after(10):
        events = [event async for event in operation.events()]
    return events[:-1], events[-1]


def _final(terminal: Any) -> dict[str, Any]:
    assert isinstance(terminal, nnrp.ResultReceived), terminal
    assert terminal.typed_body is not None
    document: dict[str, Any] = json.loads(terminal.typed_body.frames[0].payload)
    return document


def _posts(stack: Stack) -> list[Any]:
    return [r for r in stack.replay.requests if r.method == "POST"]


async def test_an_image_frame_reaches_vllm_as_its_exact_bytes(stack: Stack,
                                                              session: ClientSession) -> None:
    payload = _media_envelope(STREAM, image_part("nnrp:frame/1"),
                              image_part("nnrp:frame/1;type=image/x-custom"))
    partials, terminal = await _submit(session, 1, payload, [(OPAQUE, PNG)])
    assert _final(terminal)["type"] == "response.completed"
    assert partials
    (sent,) = _posts(stack)
    parts = sent_content(sent)
    assert parts[0] == {"type": "text", "text": "Hello"}
    assert data_uri_bytes(parts[1]["image_url"]["url"]) == ("image/png", PNG)
    assert data_uri_bytes(parts[2]["image_url"]["url"]) == ("image/x-custom", PNG)
    assert b"nnrp:" not in sent.body and b"nnrp-media-" not in sent.body


async def test_an_audio_frame_as_input_audio_is_base64_with_its_format(
        stack: Stack, session: ClientSession) -> None:
    part = {"type": "input_audio", "input_audio": {"data": "nnrp:frame/1"}}
    _, terminal = await _submit(session, 1, _media_envelope(UNARY, part), [(AUDIO, WAV)])
    assert _final(terminal)["type"] == "response.completed"
    (sent,) = _posts(stack)
    audio = sent_content(sent)[1]["input_audio"]
    assert audio["format"] == "wav"
    assert data_uri_bytes(f"data:audio/wav;base64,{audio['data']}")[1] == WAV


async def test_nnrp_pys_native_client_sends_an_image_and_an_audio_frame(stack: Stack) -> None:
    pytest.importorskip("nnrp.client.native")
    from nnrp.core.enums import PayloadKind

    payload = _media_envelope(STREAM, image_part("nnrp:frame/1"),
                              {"type": "audio_url", "audio_url": {"url": "nnrp:frame/2"}},
                              tag="native")
    uri = stack.uri()

    def scenario() -> list[dict[str, Any]]:
        with native_connection("tcp", uri) as connection:
            session = open_session(connection)
            session.submit_operation(openai_submit(1, 1, payload, media=[
                (PayloadKind.OPAQUE_BYTES, PNG), (PayloadKind.AUDIO_CHUNK, WAV)]))
            events = poll_until(session, lambda events: any(
                e["kind"] == "RESULT_PUSH" for e in events), timeout=15)
            session.close()
            return events

    with trio.fail_after(60):
        events = await trio.to_thread.run_sync(scenario)
    (result,) = [e for e in events if e["kind"] == "RESULT_PUSH"]
    assert result["status"] == 200
    assert result["payload"]["type"] == "response.completed"
    (sent,) = _posts(stack)
    parts = sent_content(sent)
    assert data_uri_bytes(parts[1]["image_url"]["url"]) == ("image/png", PNG)
    assert data_uri_bytes(parts[2]["audio_url"]["url"]) == ("audio/wav", WAV)


@pytest.mark.parametrize(("parts", "frames", "code", "says"), [
    ([image_part("nnrp:frame/1")], [(OPAQUE, PNG), (OPAQUE, PNG)], "invalid_submit_body",
     "media frame 2 is not referenced"),
    ([image_part("nnrp:frame/2")], [(OPAQUE, PNG)], "invalid_body",
     "messages[0].content[1].image_url.url: nnrp:frame/2 names a media frame"),
    ([image_part("nnrp:frame/1")], [(AUDIO, WAV)], "invalid_body",
     "frame 1 is AUDIO; a image part takes OPAQUE"),
    ([image_part("nnrp:frame/1")], [(OPAQUE, b"what am I")], "invalid_body",
     "add ;type=TYPE/SUBTYPE"),
    ([{"type": "video_url", "video_url": {"url": "nnrp:frame/1"}}], [(VIDEO, PNG)],
     "invalid_body", "frame 1 is image/png; a video part takes video/*"),
    ([image_part("nnrp:frame/1")], [(OPAQUE, PNG * 200)], "invalid_submit_body",
     "exceed the 4096-byte limit"),
])
async def test_each_refusal_names_its_cause_and_the_session_serves_on(
        nursery: trio.Nursery, socket_dir: Path, parts: list[dict[str, Any]],
        frames: list[tuple[int, bytes]], code: str, says: str) -> None:
    stack = await start_stack(nursery, socket_dir,
                              pipeline=PipelineLimits(max_media_bytes=4096))
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        _, terminal = await _submit(session, 1, _media_envelope(STREAM, *parts), frames)
        error = _final(terminal)
        assert error["type"] == "response.error"
        assert error["error"]["code"] == code
        assert says in error["error"]["message"]
        assert _posts(stack) == []  # refused before vLLM was called
        outcome = await run_operation(session, envelope(request_for(STREAM)))
        assert outcome.final is not None and outcome.final["type"] == "response.completed"


# ------------------------------------------------------------------ --media-dir


@pytest.fixture
def media_dir(tmp_path: Path) -> Path:
    path = tmp_path / "media"
    path.mkdir()
    (path / "nnrp-media-left-by-a-crash.png").write_bytes(b"old")
    (path / "someone-elses.txt").write_bytes(b"kept")
    return path.resolve()


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def _media_stack(nursery: trio.Nursery, socket_dir: Path, media_dir: Path) -> Stack:
    return await start_stack(nursery, socket_dir, media_dir=media_dir,
                             pipeline=PipelineLimits(first_chunk_timeout=3.0, idle_timeout=2.0))


def _sent_file(stack: Stack) -> Path:
    (sent,) = _posts(stack)
    url = sent_content(sent)[1]["image_url"]["url"]
    assert url.startswith("file:///"), url
    return Path(urlsplit(url).path)


async def _held_request(stack: Stack, session: ClientSession, scenario: str, image: bytes
                        ) -> tuple[Any, Path]:
    """A request with ``image`` as frame 1, once vLLM has it: its operation, and the
    file vLLM was given (which holds the image)."""
    meta, body = media_submit(1, _media_envelope(scenario, image_part("nnrp:frame/1")),
                              [(OPAQUE, image)])
    operation = await session.submit_frame(meta, body)
    with trio.fail_after(10):
        await stack.replay.wait_for_requests(1)
    path = _sent_file(stack)
    assert path.read_bytes() == image
    return operation, path


async def test_media_dir_files_live_as_long_as_the_request(
        nursery: trio.Nursery, socket_dir: Path, media_dir: Path) -> None:
    stack = await _media_stack(nursery, socket_dir, media_dir)
    # The start swept what an earlier run left, and only that.
    assert _listing(media_dir) == ["someone-elses.txt"]
    hold = stack.replay.hold(lambda request: request.method == "POST")
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        meta, body = media_submit(1, _media_envelope(STREAM, image_part("nnrp:frame/1"),
                                                     image_part("nnrp:frame/1")),
                                  [(OPAQUE, PNG)])
        operation = await session.submit_frame(meta, body)
        with trio.fail_after(5):
            await stack.replay.wait_for_requests(1)
        path = _sent_file(stack)
        assert path.parent == media_dir and path.suffix == ".png"
        assert path.read_bytes() == PNG  # while vLLM works on it
        assert oct(path.stat().st_mode & 0o777) == "0o640"
        (sent,) = _posts(stack)
        assert sent_content(sent)[2]["image_url"]["url"] == path.as_uri()  # written once
        hold.release()
        with trio.fail_after(10):
            events = [event async for event in operation.events()]
        assert _final(events[-1])["type"] == "response.completed"
    assert not path.exists()
    assert _listing(media_dir) == ["someone-elses.txt"]


@pytest.mark.parametrize("end", ["cancel", "vllm_error", "connection_dropped", "drain"])
async def test_media_dir_files_are_gone_whatever_the_end(
        nursery: trio.Nursery, socket_dir: Path, media_dir: Path, end: str) -> None:
    stack = await _media_stack(nursery, socket_dir, media_dir)
    scenario = "error_400_temperature" if end == "vllm_error" else STREAM
    hold = stack.replay.hold(lambda request: request.method == "POST",
                             after=0 if end == "vllm_error" else 1)
    async with connect(stack.uri()) as client, trio.open_nursery() as background:
        session = await client.open_session()
        operation, path = await _held_request(stack, session, scenario, PNG)
        if end == "cancel":
            await operation.cancel()
        elif end == "vllm_error":
            hold.release()
        elif end == "drain":
            background.start_soon(stack.gateway.drain)
            hold.release()
        if end != "connection_dropped":
            with trio.fail_after(10):
                events = [event async for event in operation.events()]
            assert not path.exists()  # gone before the operation's end was sent
            if end == "vllm_error":
                assert _final(events[-1])["error"]["code"] == "invalid_backend_request"
    # connection_dropped: the client left with the request in flight (and vLLM held).
    with trio.fail_after(10):
        while path.exists():  # noqa: ASYNC110 - a file, not a trio event
            await trio.sleep(0.01)
    assert _listing(media_dir) == ["someone-elses.txt"]


@pytest.mark.parametrize("end", ["completed", "cancel", "connection_dropped", "vllm_error",
                                 "engine_death", "engine_death_in_one_read"])
async def test_a_big_image_is_read_into_the_media_dir_and_given_back_whatever_the_end(
        nursery: trio.Nursery, socket_dir: Path, media_dir: Path, end: str) -> None:
    """_media D5: a 6 MiB image arrives over many reads into a spill of the directory
    (counted under --media-dir-bytes, in no listing), reaches vLLM as its exact bytes,
    and the spill is gone with its operation: no reference to the request outlives it,
    not even in a cycle waiting for the collector (which is off here: a cancelled
    stream's exceptions once held its operation, and so the image, in one; so did a
    stream that vLLM ended with an error, through the watchdog's Cancelled and the
    frame that raised the error, or that kept it for the next read when good chunks
    came before it in the same read). ``vllm_error`` is vLLM's refusal before any
    stream (a 400)."""
    gc.disable()
    try:
        await _a_big_image_given_back(nursery, socket_dir, media_dir, end)
    finally:
        gc.enable()


async def _a_big_image_given_back(nursery: trio.Nursery, socket_dir: Path, media_dir: Path,
                                  end: str) -> None:
    stack = await _media_stack(nursery, socket_dir, media_dir)
    directory = stack.gateway.media.directory
    assert directory is not None
    image = PNG + bytes(range(256)) * ((6 << 20) // 256)
    scenario = {"vllm_error": "error_400_temperature", "engine_death": "engine_death_mid_stream",
                "engine_death_in_one_read": "engine_death_mid_stream"}.get(end, STREAM)
    if end == "engine_death_in_one_read":
        # Its good chunks and its error chunk in one read, read the general way (as a
        # stream the fused reader does not take): the error is kept for the stream's
        # next call. (This stack's replay and gateway only.)
        death = stack.replay.transcripts[scenario]
        stack.replay.transcripts[scenario] = attrs.evolve(death, chunks=((0.0, death.body),))
        stack.gateway.pipeline.plain_blocks = None
    hold = stack.replay.hold(lambda request: request.method == "POST",
                             after=1 if end in ("cancel", "connection_dropped") else 0)
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        operation, path = await _held_request(stack, session, scenario, image)
        assert directory.spilled > len(image)  # the packet, held in the directory
        assert _listing(media_dir) == sorted(["someone-elses.txt", path.name])
        if end == "cancel":
            await operation.cancel()
        hold.release()
        if end != "connection_dropped":
            with trio.fail_after(10):
                events = [event async for event in operation.events()]
            if end == "completed":
                assert _final(events[-1])["type"] == "response.completed"
            elif end != "cancel":
                assert _final(events[-1])["error"]["code"] == (
                    "invalid_backend_request" if end == "vllm_error" else "backend_error")
    with trio.fail_after(10):
        while directory.spilled or path.exists():  # noqa: ASYNC110 - not a trio event
            await trio.sleep(0.01)
    assert _listing(media_dir) == ["someone-elses.txt"]


async def test_nnrp_pys_native_client_sends_a_big_image_through_the_spill_and_goes_on(
        nursery: trio.Nursery, socket_dir: Path, media_dir: Path) -> None:
    """nnrp-py's native client: a 6 MiB image frame is read into a spill of the media
    directory and reaches vLLM as its exact bytes; its session then serves another
    request, and the spill is given back."""
    pytest.importorskip("nnrp.client.native")
    from nnrp.core.enums import PayloadKind

    stack = await _media_stack(nursery, socket_dir, media_dir)
    directory = stack.gateway.media.directory
    assert directory is not None
    image = PNG + bytes(range(256)) * ((6 << 20) // 256)
    big = _media_envelope(STREAM, image_part("nnrp:frame/1"), tag="native-big")
    after = _media_envelope(STREAM, tag="native-after")
    hold = stack.replay.hold(lambda request: request.method == "POST")
    uri = stack.uri()

    def scenario() -> list[list[dict[str, Any]]]:
        answered: list[list[dict[str, Any]]] = []
        with native_connection("tcp", uri) as connection:
            session = open_session(connection)
            for operation_id, payload, media in ((1, big, [(PayloadKind.OPAQUE_BYTES, image)]),
                                                 (2, after, [])):
                session.submit_operation(openai_submit(operation_id, operation_id, payload,
                                                       media=media))
                answered.append(poll_until(session, lambda events: any(
                    e["kind"] == "RESULT_PUSH" for e in events), timeout=30))
            session.close()
        return answered

    results: list[list[list[dict[str, Any]]]] = []

    async def run() -> None:
        results.append(await trio.to_thread.run_sync(scenario))

    with trio.fail_after(60):
        async with trio.open_nursery() as client:
            client.start_soon(run)
            await stack.replay.wait_for_requests(1)
            path = _sent_file(stack)
            assert path.read_bytes() == image
            assert directory.spilled > len(image)  # read into the directory
            hold.release()
    for events in results[0]:
        (result,) = [e for e in events if e["kind"] == "RESULT_PUSH"]
        assert (result["status"], result["payload"]["type"]) == (200, "response.completed")
    with trio.fail_after(10):
        while directory.spilled or path.exists():  # noqa: ASYNC110 - not a trio event
            await trio.sleep(0.01)


async def test_the_capability_document_says_how_media_travel(
        nursery: trio.Nursery, socket_dir: Path, media_dir: Path) -> None:
    by_default = await start_stack(nursery, socket_dir)
    document = by_default.gateway.capabilities()
    assert "gateway.media" in [extension["name"] for extension in document["extensions"]]
    media = document["media"]
    assert media["delivery"] == "data_uri"
    assert media["reference"] == (
        "nnrp:frame/N, nnrp:object/ID[@VERSION] or nnrp:cache/NS/KEY, then [;type=TYPE/SUBTYPE]")
    assert "image_url.url" in media["parts"] and "input_audio.data" in media["parts"]
    assert "image/png" in media["recognised_types"]
    assert (media["max_bytes"], media["max_frames"]) == (64 << 20, 64)
    (socket_dir / "files").mkdir()  # a listener of its own for the second gateway
    with_files = await _media_stack(nursery, socket_dir / "files", media_dir)
    assert with_files.gateway.capabilities()["media"]["delivery"] == "file"


async def test_a_big_base64_envelope_reaches_vllm_as_the_client_wrote_it(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """The frozen profile's way: the image as a data URI inside the JSON. Past the cut
    threshold its base64 is never parsed or re-encoded (gateway/profile/_literals.py),
    yet vLLM receives the very bytes."""
    image = PNG * (2 * CUT_THRESHOLD // len(PNG))
    uri = "data:image/png;base64," + base64.b64encode(image).decode()
    stack = await start_stack(nursery, socket_dir,
                              pipeline=PipelineLimits(max_envelope_bytes=8 << 20),
                              server=nnrp.ServerConfig(max_packet=8 << 20))
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, _media_envelope(STREAM, image_part(uri)))
    assert outcome.final is not None and outcome.final["type"] == "response.completed"
    (sent,) = _posts(stack)
    assert f'"url": "{uri}"'.encode() in sent.body
    assert data_uri_bytes(sent_content(sent)[1]["image_url"]["url"]) == ("image/png", image)


async def test_a_submit_over_the_packet_limit_is_refused_alone(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """Its bytes are read and dropped; the stream beside it on the same connection and
    session runs to its end, and the session serves the next request."""
    stack = await start_stack(nursery, socket_dir, server=nnrp.ServerConfig(max_packet=65536))
    hold = stack.replay.hold(lambda request: request.method == "POST", after=2)
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        streaming = await session.submit(envelope(request_for(STREAM)))
        with trio.fail_after(5):
            await stack.replay.wait_for_requests(1)
        _, terminal = await _submit(session, 50, _media_envelope(
            STREAM, image_part("nnrp:frame/1")), [(OPAQUE, PNG * 100)])
        error = _final(terminal)
        assert error["error"]["code"] == "invalid_submit_body"
        assert "exceeds this server's packet limit" in error["error"]["message"]
        hold.release()
        with trio.fail_after(10):
            events = [event async for event in streaming.events()]
        assert _final(events[-1])["type"] == "response.completed"
        outcome = await run_operation(session, envelope(request_for(UNARY)))
        assert outcome.final is not None and outcome.final["type"] == "response.completed"
    assert len(_posts(stack)) == 2  # the refused one never reached vLLM


# ------------------------------------------------------------------ session objects


def _objects_once_used_twice(uri: str, payloads: list[bytes], release_payload: bytes
                             ) -> dict[str, list[dict[str, Any]]]:
    """nnrp-py's native client: negotiate objects, send the image once as object 7
    (OBJECT_DECLARE, one replace-region OBJECT_PATCH), name it from two requests, then
    release it (invalidating) while a third request that read it still streams."""
    from nnrp.runtime.types import (
        ObjectDeltaMetadata,
        ObjectDescriptorMetadata,
        ObjectReleaseMetadata,
    )

    tokens = ("object.cost", "object.delta", "object.lifecycle", "object.ownership")
    with native_connection("tcp", uri) as connection:
        session = open_session(connection)
        granted = negotiate_tokens(connection, session, tokens)
        (sid,) = {e["session_id"] for e in granted if e["kind"] == "CAPABILITY_NEGOTIATION"}
        session.declare_object(ObjectDescriptorMetadata(7, 7, 1, 2, sid, len(PNG), 3, 1, 3,
                                                         0, 0))
        session.patch_object(ObjectDeltaMetadata(7, 1, 0, len(PNG), len(PNG), 0x01, 0), PNG)
        results: dict[str, list[dict[str, Any]]] = {}
        for number, payload in enumerate(payloads, start=1):
            session.submit_operation(openai_submit(number, number, payload))
            results[f"op{number}"] = poll_until(session, lambda events, n=number: any(
                e.get("frame_id") == n and e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON")
                for e in events), timeout=15)
        last = len(payloads) + 1
        session.submit_operation(openai_submit(last, last, release_payload))
        started = poll_until(session, lambda events: any(
            e["kind"] == "PARTIAL_RESULT" for e in events), timeout=15)
        session.release_object(ObjectReleaseMetadata(7, 0, 4, 1, 0x03, 0))  # invalidating
        results["released"] = started + poll_until(session, lambda events: any(
            e.get("frame_id") == last and e["kind"] in ("RESULT_PUSH", "RESULT_DROP_REASON")
            for e in events), timeout=15)
        session.close()
    return results


async def test_an_object_sent_once_serves_two_requests_and_its_release_drops_a_third(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    pytest.importorskip("nnrp.client.native")
    from gateway.tools.replay import ReplayServer

    # 25 ms a token: the third request still streams when the release lands.
    stack = await start_stack(nursery, socket_dir, replay=ReplayServer(token_interval_ms=25.0))
    payloads = [_media_envelope(UNARY, image_part("nnrp:object/7"), tag="first"),
                _media_envelope(STREAM, image_part("nnrp:object/7@1"), tag="second")]
    long = envelope(with_parts({"model": "example-model", "stream": True, "max_tokens": 40,
                                "messages": [{"role": "user", "content": "Hello"}]},
                               image_part("nnrp:object/7")), request_id="replay:long_stream:r")
    with trio.fail_after(60):
        results = await trio.to_thread.run_sync(_objects_once_used_twice, stack.uri(),
                                                payloads, long)
    for name in ("op1", "op2"):
        (end,) = [e for e in results[name] if e["kind"] == "RESULT_PUSH"]
        assert end["payload"]["type"] == "response.completed", end
    (dropped,) = [e for e in results["released"] if e["kind"] == "RESULT_DROP_REASON"]
    assert dropped["drop_reason"] == int(nnrp.DropReason.OBJECT_INVALIDATED)
    sent = _posts(stack)
    assert len(sent) == 3
    for request in sent:  # the bytes crossed the client's link once, and reached vLLM thrice
        assert data_uri_bytes(sent_content(request)[1]["image_url"]["url"]) == ("image/png",
                                                                                  PNG)
    with trio.fail_after(5):
        await stack.replay.wait_until(lambda: stack.replay.disconnects)  # vLLM's call aborted


async def test_an_object_a_request_cannot_read_refuses_it_naming_the_part(
        stack: Stack, session: ClientSession) -> None:
    _, terminal = await _submit(session, 1, _media_envelope(
        STREAM, image_part("nnrp:object/5")), [])
    error = _final(terminal)
    assert error["error"]["code"] == "invalid_body"
    assert error["error"]["message"] == (
        "messages[0].content[1].image_url.url: nnrp:object/5: object 5 is not declared in "
        "this session")


@pytest.mark.parametrize("transport", ["ws", "tcp"])
async def test_a_big_media_submit_works_over_websocket_too_and_one_over_the_limit_alone(
        nursery: trio.Nursery, socket_dir: Path, transport: str) -> None:
    """A 3 MiB image over ws:// (trio-websocket's default message cap is 1 MiB: it once
    closed the connection), and over every carrier a submit past --max-frame-bytes is
    refused on its own operation, the session serving on."""
    image = PNG * ((3 << 20) // len(PNG))
    stack = await start_stack(nursery, socket_dir,
                              server=nnrp.ServerConfig(max_packet=4 << 20))
    async with connect(stack.uri("websocket" if transport == "ws" else "tcp")) as client:
        session = await client.open_session()
        _, terminal = await _submit(session, 1, _media_envelope(
            UNARY, image_part("nnrp:frame/1")), [(OPAQUE, image)])
        assert _final(terminal)["type"] == "response.completed"
        _, terminal = await _submit(session, 2, _media_envelope(
            UNARY, image_part("nnrp:frame/1")), [(OPAQUE, image + image)])
        assert _final(terminal)["error"]["code"] == "invalid_submit_body"
        outcome = await run_operation(session, envelope(request_for(UNARY)))
        assert outcome.final is not None and outcome.final["type"] == "response.completed"
    (first, *_) = _posts(stack)
    assert data_uri_bytes(sent_content(first)[1]["image_url"]["url"])[1] == image
