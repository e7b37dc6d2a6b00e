"""The same checks against a real vLLM, when ``NNRP_GATEWAY_LIVE_VLLM_URL`` is set (not in CI).

    ../shared/tools/real-vllm/setup.sh
    ../shared/tools/real-vllm/serve.sh 8011 --max-num-seqs 1 --max-num-queued-reqs 3 \
        --enable-per-request-metrics --sse-keep-alive-interval 1 \
        --scheduling-policy priority &
    NNRP_GATEWAY_LIVE_VLLM_URL=http://127.0.0.1:8011 .venv/bin/pytest -m live

The flags are issue 23's: vLLM's own admission control (one request running, three
unfinished at most, the rest refused), per-request metrics, keep-alive comments every
second while a stream is idle, and priority scheduling. The older checks do not mind
them (they send one request at a time).

The CPU build that installs on these machines is vLLM 0.32.0, bound as the 0.32.x family
(issue 23): the gateway serves it without allow_untested_vllm.

``test_live_parity`` is the fidelity rule against the real thing: 50 requests, each sent
directly over HTTP and through the gateway, answers compared field by field.

Media (issue 36), against a second vLLM serving a tiny random-weight vision model
(Idefics3: why that class is in deploy/live/make_tiny_vlm.py), run on its own (one vLLM
at a time on these machines; the text checks skip without their variable):

    HF_HUB_OFFLINE=1 /tmp/real-vllm/venv/bin/python deploy/live/make_tiny_vlm.py \
        /tmp/real-vllm/tiny-vlm
    mkdir -p /tmp/vlm-media
    REAL_VLLM_MODEL=/tmp/real-vllm/tiny-vlm ../shared/tools/real-vllm/serve.sh 8071 \
        --allowed-local-media-path /tmp/vlm-media &
    NNRP_GATEWAY_LIVE_VLM_URL=http://127.0.0.1:8071 \
        NNRP_GATEWAY_LIVE_VLM_MEDIA_DIR=/tmp/vlm-media .venv/bin/pytest -m live -k vlm

An image goes through the gateway as an ``nnrp:frame/1`` media frame, once as a data
URI and once as a file in ``--media-dir``. The model's text is noise; what is checked
is that the request completed and that vLLM counted the image's tokens.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway import nnrp
from gateway.app import Gateway, GatewayConfig
from gateway.pipeline import PipelineLimits
from gateway.tools.client import connect
from tests.support.media import OPAQUE, image_part, media_submit, with_parts
from tests.support.stack import chat, envelope, run_operation
from tests.support.waits import until_async

LIVE_URL = os.environ.get("NNRP_GATEWAY_LIVE_VLLM_URL")
#: The vision model's vLLM, and the directory it was started to read
#: (``--allowed-local-media-path``), which the gateway is given as ``--media-dir``.
VLM_URL = os.environ.get("NNRP_GATEWAY_LIVE_VLM_URL")
_media_dir = os.environ.get("NNRP_GATEWAY_LIVE_VLM_MEDIA_DIR")
VLM_MEDIA_DIR = Path(_media_dir).resolve() if _media_dir else None
pytestmark = [pytest.mark.live, pytest.mark.skipif(
    not (LIVE_URL or VLM_URL),
    reason="neither NNRP_GATEWAY_LIVE_VLLM_URL nor NNRP_GATEWAY_LIVE_VLM_URL is set")]
needs_text_vllm = pytest.mark.skipif(not LIVE_URL,
                                     reason="NNRP_GATEWAY_LIVE_VLLM_URL is not set")


@pytest.fixture
async def live_client(nursery: trio.Nursery) -> Any:
    """A gateway on the live vLLM (priority scheduling declared), its records, a client."""
    assert LIVE_URL is not None
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",), vllm_url=LIVE_URL,
                                    probe_interval=0.2,
                                    pipeline=PipelineLimits(priority_scheduling=True,
                                                            overload_retry_after_ms=1500)))
    records: list[Any] = []
    observe = gateway.metrics.observe

    def spy(record: Any) -> None:
        records.append(record)
        observe(record)

    gateway.metrics.observe = spy  # type: ignore[method-assign]
    endpoints = await nursery.start(gateway.run)
    with trio.fail_after(60):
        await gateway.probed.wait()
    async with connect(endpoints[0].uri) as client:
        yield gateway, records, client


@pytest.fixture
async def live_session(live_client: Any) -> Any:
    """The older checks' view of the same gateway: it and one open session."""
    gateway, _records, client = live_client
    return gateway, await client.open_session()


@needs_text_vllm
async def test_live_stream_usage_and_completed(live_session: Any) -> None:
    gateway, session = live_session
    assert gateway.info.binding.family == "0.32.x"
    assert not gateway.info.untested
    assert gateway.capabilities()["backend"]["evidence"] == "live_cpu"
    outcome = await run_operation(session, envelope(chat(
        "tiny", stream=True, max_tokens=8, stream_options={"include_usage": True})))
    assert outcome.final["type"] == "response.completed"
    assert outcome.types[-1] == "response.usage"
    assert outcome.partials[-1]["usage"]["completion_tokens"] == 8
    text = "".join(p["delta"] for p in outcome.partials if p["type"].endswith("text.delta"))
    assert outcome.final["body"]["choices"][0]["message"]["content"] == text


@needs_text_vllm
async def test_live_non_streaming_and_errors(live_session: Any) -> None:
    _, session = live_session
    unary = await run_operation(session, envelope(chat("example-model", max_tokens=4)))
    assert unary.final["body"]["object"] == "chat.completion"
    missing = await run_operation(session, envelope(chat("no-such-model", max_tokens=4)))
    assert missing.final["error"]["code"] == "unsupported_model"
    bad = await run_operation(session, envelope(chat("tiny", max_tokens=4, temperature=-1)))
    assert bad.final["error"]["code"] == "invalid_backend_request"
    assert bad.final["diagnostics"]["backend_status"] == 400


@needs_text_vllm
async def test_live_cancel_mid_stream(live_session: Any) -> None:
    _, session = live_session
    operation = await session.submit(envelope(chat("tiny", stream=True, max_tokens=400,
                                                   ignore_eos=True)))
    seen: list[Any] = []
    with trio.fail_after(30):
        async for event in operation.events():
            seen.append(event)
            if len(seen) == 3:
                await operation.cancel()
    assert type(seen[-1]).__name__ == "DropReceived"
    assert len(seen) < 400


#: Sampling and output options of vLLM's chat API, each sent streaming and not. Seeded
#: (or greedy): vLLM then generates the same tokens both ways, so the gateway's stream must
#: rebuild exactly vLLM's own non-streaming body.
OPTIONS: dict[str, dict[str, Any]] = {
    "plain": {}, "greedy": {"temperature": 0}, "logprobs": {"logprobs": True, "top_logprobs": 2},
    "logprobs_only": {"logprobs": True}, "top_logprobs_0": {"logprobs": True, "top_logprobs": 0},
    "n2": {"n": 2}, "n2_logprobs": {"n": 2, "logprobs": True, "top_logprobs": 3},
    "token_ids": {"return_token_ids": True},
    "greedy_logprobs_token_ids": {"temperature": 0, "logprobs": True, "top_logprobs": 1,
                                  "return_token_ids": True},
    "stop_string": {"stop": ["in", "e"]}, "stop_token_ids": {"stop_token_ids": [21, 30]},
    "max_completion_tokens": {"max_completion_tokens": 3},
    "penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.5},
    "repetition_penalty": {"repetition_penalty": 1.2}, "top_p_k": {"top_p": 0.5, "top_k": 5},
    "min_p": {"min_p": 0.1}, "min_tokens": {"min_tokens": 5}, "ignore_eos": {"ignore_eos": True},
    "json_object": {"response_format": {"type": "json_object"}},
    "unicode": {"messages": [{"role": "user", "content": "héllo 世界 🙂"}]},
    "system": {"messages": [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Hi"}]},
    "kv_transfer_params": {"kv_transfer_params": {"do_remote_decode": False}},
    "special_tokens": {"skip_special_tokens": False},
    "other_seed": {"seed": 123},
    "lax_values": {"logprobs": "yes", "top_logprobs": 2.0, "n": "1"},
    # Newer fields (issue 23): the rendered prompt on the first chunk, a session identity.
    "prompt_text": {"return_prompt_text": True},
    "session_id": {"session_id": "conversation-42", "return_prompt_text": True},
}
#: vLLM's refusals: the gateway must give vLLM's status, message and param.
ERRORS: dict[str, dict[str, Any]] = {
    "top_logprobs_21": {"logprobs": True, "top_logprobs": 21},
    "n2_greedy": {"n": 2, "temperature": 0}, "max_tokens_over": {"max_tokens": 600},
    "tools_empty": {"tools": []}, "tool_choice_without_tools": {"tool_choice": "auto"},
    "stream_prompt_logprobs": {"stream": True, "prompt_logprobs": 1},
}


def _request(options: dict[str, Any], *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}],
                            "max_tokens": 6, "temperature": 1.0, "seed": 7, **options}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def _fields(body: dict[str, Any]) -> dict[str, Any]:
    # vLLM's per-request metrics are each request's own timings (--enable-per-request-
    # metrics): never equal between two requests (their presence is checked apart).
    return {k: v for k, v in body.items() if k not in ("id", "created", "metrics")}


@needs_text_vllm
async def test_live_parity(live_session: Any) -> None:
    assert LIVE_URL is not None
    _, session = live_session
    compared = 0
    async with httpx.AsyncClient(base_url=LIVE_URL, timeout=120) as http:
        for name, options in OPTIONS.items():
            direct = (await http.post("/v1/chat/completions",
                                      json=_request(options, stream=False))).json()
            for stream in (False, True):
                outcome = await run_operation(session, envelope(_request(options,
                                                                         stream=stream)))
                assert outcome.final is not None, name
                assert outcome.final["type"] == "response.completed", (name, outcome.final)
                assert _fields(outcome.final["body"]) == _fields(direct), (name, stream)
                assert (outcome.final["body"].get("metrics") is None) == (
                    direct.get("metrics") is None), (name, stream)
                if stream:
                    for choice in direct["choices"]:
                        text = "".join(p["delta"] for p in outcome.partials
                                       if p["type"] == "response.output_text.delta"
                                       and p["index"] == choice["index"])
                        assert text == choice["message"]["content"], name
                compared += 1
        for name, options in ERRORS.items():
            body = _request(options, stream=bool(options.get("stream")))
            answer = await http.post("/v1/chat/completions", json=body)
            outcome = await run_operation(session, envelope(body))
            assert outcome.final is not None and outcome.final["type"] == "response.error"
            error = answer.json()["error"]
            assert outcome.status == answer.status_code, name
            assert outcome.final["error"]["message"] == error["message"], name
            assert outcome.final["error"].get("param") == error["param"], name
            compared += 1
    assert compared >= 40
    print(json.dumps({"compared": compared}))


@needs_text_vllm
async def test_live_token_profile(live_session: Any) -> None:
    """NNRP's token profile against a real vLLM: a text completion of the chunks."""
    from gateway.tools.conformance import runner_token_submit

    _, session = live_session
    meta, body = runner_token_submit(77)
    operation = await session.submit_frame(meta, body)
    with trio.fail_after(60):
        (result,) = [event async for event in operation.events()]
    assert isinstance(result, nnrp.ResultReceived) and result.meta.status_code == 200
    (frame,) = result.typed_body.frames
    assert frame.descriptor.payload_kind == nnrp.PayloadKind.TOKEN_CHUNK
    assert frame.payload  # vLLM's (random-weight) completion text


# --------------------------------------------------------------------------- issue 23
# These need the vLLM flags named in the module docstring.

async def _admission_rejections(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:admission_rejections_total{"))


@needs_text_vllm
async def test_live_vllm_refusals_are_retry_hints_and_nothing_is_lost(live_client: Any
                                                                      ) -> None:
    """12 concurrent operations (half streamed) against one running slot and three
    unfinished at most: vLLM refuses the rest, before its 200 or in the stream; each
    refusal reaches the client as backend_overload with ERROR_RECOVERABLE + RETRY_AFTER,
    every operation ends exactly once, and vLLM's own count of refusals is the
    gateway's."""
    assert LIVE_URL is not None
    _, records, client = live_client
    async with httpx.AsyncClient(base_url=LIVE_URL, timeout=30) as http:
        before = await _admission_rejections(http)
        session = await client.open_session()
        outcomes: dict[int, Any] = {}

        async def one(index: int) -> None:
            stream = index % 2 == 0
            extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
            outcomes[index] = await run_operation(session, envelope(chat(
                "tiny", max_tokens=40, ignore_eos=True, **extra)))

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for index in range(12):
                    nursery.start_soon(one, index)
        after = await _admission_rejections(http)
    finals = [o.final for o in outcomes.values()]
    assert len(finals) == 12 and all(f is not None for f in finals)
    refused = [f for f in finals if f["type"] == "response.error"]
    completed = [f for f in finals if f["type"] == "response.completed"]
    assert refused, "vLLM refused nothing: is it running with --max-num-queued-reqs 3?"
    assert len(refused) + len(completed) == 12
    assert {f["error"]["code"] for f in refused} == {"backend_overload"}
    assert {f["diagnostics"]["backend_refusal"] for f in refused} == {"max_num_queued_reqs"}
    assert after - before == len(refused)  # vLLM counted each refusal once, as did we
    hints = [e.packet.message.retry_after_ms for e in client.others
             if isinstance(e, nnrp.OtherReceived)
             and e.packet.msg_type is nnrp.MsgType.RETRY_AFTER]
    assert hints == [1500] * len(refused)
    assert len(records) == 12 and len({r.operation_id for r in records}) == 12
    assert sum(1 for r in records if r.refusal_source == "vllm") == len(refused)
    print(json.dumps({"refused": len(refused), "in_stream": sum(
        1 for f in refused if f["diagnostics"].get("backend_error_family") == "in_stream_error"
    )}))


@needs_text_vllm
async def test_live_per_request_metrics_reach_the_record_and_the_body(live_client: Any
                                                                      ) -> None:
    _, records, client = live_client
    session = await client.open_session()
    for extra in ({"stream": True, "stream_options": {"include_usage": True}}, {}):
        outcome = await run_operation(session, envelope(
            chat("tiny", max_tokens=6, **extra), nnrp_policy={"diagnostics": True}))
        assert outcome.final is not None
        metrics = outcome.final["body"]["metrics"]
        assert {"time_to_first_token_ms", "queue_time_ms", "generation_time_ms",
                "mean_itl_ms", "tokens_per_second"} <= set(metrics)
        record = records[-1]
        assert record.backend_ttft_ms == pytest.approx(metrics["time_to_first_token_ms"],
                                                       abs=1e-3)
        assert record.backend_queue_ms == pytest.approx(metrics["queue_time_ms"], abs=1e-3)
        (event,) = [p for p in outcome.partials if p["type"] == "response.diagnostics"]
        assert event["diagnostics"]["backend_ttft_ms"] == record.backend_ttft_ms


async def _long_stream_running(session: Any) -> Any:
    """A stream that holds vLLM's one running slot for seconds (400 tokens on CPU), once
    it has produced its first event."""
    operation = await session.submit(envelope(chat("tiny", stream=True, max_tokens=400,
                                                   ignore_eos=True)))
    events = operation.events()
    with trio.fail_after(60):
        await events.__anext__()
    return operation, events


@needs_text_vllm
async def test_live_keep_alive_comments_change_nothing_for_a_slow_stream(
        live_client: Any) -> None:
    """Queued behind a running 400-token stream, a stream waits seconds for its first
    token while vLLM writes ``: keep-alive`` every second: the client sees an ordinary
    stream, its text equal to the completed body."""
    _, records, client = live_client
    session = await client.open_session()
    _, events = await _long_stream_running(session)
    queued = await run_operation(session, envelope(chat(
        "tiny", stream=True, max_tokens=6, stream_options={"include_usage": True})))
    async for _ in events:
        pass
    assert queued.final is not None and queued.final["type"] == "response.completed"
    text = "".join(p["delta"] for p in queued.partials
                   if p["type"] == "response.output_text.delta")
    assert queued.final["body"]["choices"][0]["message"]["content"] == text
    # (The long one ran to its end first: vLLM runs one request at a time here.)
    (record,) = [r for r in records if r.stream and (r.usage or {}).get(
        "completion_tokens") == 6]
    # It waited past the keep-alive interval, so vLLM wrote comments meanwhile.
    assert record.backend_queue_ms is not None and record.backend_queue_ms > 1000


async def _at_least(value: Any, minimum: float) -> bool:
    return bool(await value() >= minimum)


@needs_text_vllm
async def test_live_priority_header_is_sent_and_honoured(live_client: Any) -> None:
    """Behind a running stream, a background operation (priority +10) queued first and an
    interactive one (-10) queued second: vLLM, scheduling by priority from the gateway's
    X-Vllm-Priority header, runs the interactive one first."""
    from tests.support.native import native_connection, openai_submit, poll_until

    pytest.importorskip("nnrp.client.native")
    from nnrp.client.native import NativeClientSessionOptions, NativeSessionPriorityClass

    assert LIVE_URL is not None
    gateway, _, client = live_client
    uri = next(e.uri for e in gateway.endpoints if e.transport == "tcp")
    finished: dict[str, float] = {}

    def submit(name: str, priority: Any, frame: int) -> None:
        import asyncio
        import time

        options = NativeClientSessionOptions(priority_class=priority)
        with native_connection("tcp", uri) as connection:
            native = asyncio.run(connection.open_session(options))
            native.submit_operation(openai_submit(frame, frame, envelope(chat(
                "tiny", stream=True, max_tokens=4))))
            events = poll_until(native, lambda events: any(
                e["kind"] == "RESULT_PUSH" for e in events), timeout=90)
            finished[name] = time.monotonic()
            native.close()
            assert next(e for e in events if e["kind"] == "RESULT_PUSH")["status"] == 200

    session = await client.open_session()
    long, events = await _long_stream_running(session)
    async with httpx.AsyncClient(base_url=LIVE_URL, timeout=10) as http, \
            trio.open_nursery() as nursery:

        async def waiting() -> float:
            text = (await http.get("/metrics")).text
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("vllm:num_requests_waiting{"))

        nursery.start_soon(trio.to_thread.run_sync, submit, "background",
                           NativeSessionPriorityClass.BACKGROUND, 1)
        with trio.fail_after(30):  # vLLM's own state: the background one is queued
            await until_async(lambda: _at_least(waiting, 1))
        nursery.start_soon(trio.to_thread.run_sync, submit, "interactive",
                           NativeSessionPriorityClass.INTERACTIVE, 1)
        with trio.fail_after(30):
            await until_async(lambda: _at_least(waiting, 2))
        await long.cancel()
    async for _ in events:
        pass
    assert finished["interactive"] < finished["background"]


@needs_text_vllm
def test_live_bench_streams_sets_the_gateways_cpu_beside_the_api_servers() -> None:
    """Issue 25's last row against the real thing: two streams (the tier's vLLM admits
    three unfinished requests), the API server found as its listening socket's owner."""
    from urllib.parse import urlsplit

    from typer.testing import CliRunner

    from cli.main import app
    from gateway.tools.bench import rows
    from gateway.tools.bench._procs import listening_socket_owners

    assert LIVE_URL is not None
    result = CliRunner().invoke(app, ["bench", "live", "--vllm-url", LIVE_URL, "--streams",
                                      "2", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    figures = {f["name"]: f for f in json.loads(result.stdout)["figures"]}
    ratio = figures[rows.LIVE_RATIO.name]
    assert ratio["value"] > 0 and ratio["goal"] == 0.5
    (api_server,) = listening_socket_owners(urlsplit(LIVE_URL).port or 80)
    per_chunk = figures["vLLM API-server CPU per SSE chunk, 2 streams, real vLLM"]
    assert f"pid(s) {api_server}," in per_chunk["spread"] and per_chunk["value"] > 0
    # Every chunk with text is one event; the role and usage chunks make none.
    versus = figures["events per SSE chunk, 2 streams, real vLLM"]
    assert 0 < versus["value"] < 1
    assert "chunks a request carry no text" in versus["spread"]


# --------------------------------------------------------------------------- issue 36
# An image as a media frame, to the vision model's vLLM (module docstring).

def _png(width: int, height: int) -> bytes:
    """A real (decodable) RGB PNG, a gradient, made with the standard library."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    rows = b"".join(b"\x00" + b"".join(bytes((x * 4 % 256, y * 4 % 256, 128))
                                        for x in range(width)) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


async def _vlm_gateway(nursery: trio.Nursery, media_dir: Path | None) -> tuple[Gateway, Any]:
    if VLM_URL is None:
        pytest.skip("NNRP_GATEWAY_LIVE_VLM_URL is not set")
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",), vllm_url=VLM_URL,
                                    probe_interval=0.2, media_dir=media_dir))
    endpoints = await nursery.start(gateway.run)
    with trio.fail_after(60):
        await gateway.probed.wait()
    return gateway, endpoints[0].uri


async def _image_against_text(uri: str, *, stream: bool) -> tuple[dict[str, Any],
                                                                  dict[str, Any]]:
    """The same request without and with an image (an ``nnrp:frame/1`` OPAQUE frame):
    both answers' final documents."""
    extra: dict[str, Any] = {"max_tokens": 4}
    if stream:
        extra.update(stream=True, stream_options={"include_usage": True})
    async with connect(uri) as client:
        session = await client.open_session()
        with trio.fail_after(120):
            text = await run_operation(session, envelope(chat("tiny", **extra)))
            meta, body = media_submit(101, envelope(with_parts(
                chat("tiny", **extra), image_part("nnrp:frame/1"))), [(OPAQUE, _png(64, 48))])
            operation = await session.submit_frame(meta, body)
            events = [event async for event in operation.events()]
    assert text.final is not None
    terminal = events[-1]
    assert isinstance(terminal, nnrp.ResultReceived), terminal
    assert terminal.typed_body is not None
    image: dict[str, Any] = json.loads(terminal.typed_body.frames[0].payload)
    return text.final, image


def _media_files(directory: Path) -> list[Path]:
    return list(directory.glob("nnrp-media-*"))


def _usage(final: dict[str, Any]) -> dict[str, Any]:
    assert final["type"] == "response.completed", final
    usage: dict[str, Any] = final["body"]["usage"]
    return usage


async def test_live_vlm_image_frame_as_a_data_uri(nursery: trio.Nursery) -> None:
    gateway, uri = await _vlm_gateway(nursery, None)
    assert gateway.capabilities()["media"]["delivery"] == "data_uri"
    text, image = await _image_against_text(uri, stream=False)
    without, with_image = _usage(text), _usage(image)
    assert image["body"]["choices"][0]["finish_reason"] == "length"
    # vLLM put the image's 64 tokens (and the three around them) in the prompt.
    assert with_image["prompt_tokens"] >= without["prompt_tokens"] + 64
    print(json.dumps({"delivery": "data_uri", "prompt_tokens_without": without[
        "prompt_tokens"], "prompt_tokens_with_image": with_image["prompt_tokens"]}))


async def test_live_vlm_image_frame_through_the_media_dir(nursery: trio.Nursery) -> None:
    if VLM_MEDIA_DIR is None:
        pytest.skip("NNRP_GATEWAY_LIVE_VLM_MEDIA_DIR is not set")
    gateway, uri = await _vlm_gateway(nursery, VLM_MEDIA_DIR)
    assert gateway.capabilities()["media"]["delivery"] == "file"
    text, image = await _image_against_text(uri, stream=True)
    without, with_image = _usage(text), _usage(image)
    assert with_image["prompt_tokens"] >= without["prompt_tokens"] + 64
    # vLLM read the file while the request lived; it is gone now.
    assert not _media_files(VLM_MEDIA_DIR)
    print(json.dumps({"delivery": "file", "prompt_tokens_without": without["prompt_tokens"],
                      "prompt_tokens_with_image": with_image["prompt_tokens"]}))
