"""The pipeline end to end: recorded vLLM bytes in, profile events out, over real sockets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway import nnrp
from gateway.app import Gateway, GatewayConfig
from gateway.pipeline import PipelineLimits
from gateway.tools.client import connect
from gateway.tools.replay import ReplayServer
from gateway.upstream import UnsupportedVersion, UpstreamMalformed
from tests.support.scenarios import CHAT_SCENARIOS, EXPECTED_TERMINAL, TRANSCRIPTS, request_for
from tests.support.stack import (
    Stack,
    chat,
    envelope,
    run_operation,
    scenario_id,
    start_stack,
)
from tests.support.transcripts import translate
from tests.support.waits import until


@pytest.mark.parametrize("name", CHAT_SCENARIOS)
async def test_every_transcript_through_the_gateway(stack: Stack, session: Any, name: str
                                                    ) -> None:
    outcome = await run_operation(session, envelope(request_for(name),
                                                    request_id=scenario_id(name)))
    assert outcome.final is not None
    expected_error = EXPECTED_TERMINAL.get(name)
    if expected_error is not None:
        assert outcome.final["type"] == "response.error"
        assert outcome.final["error"]["code"] == expected_error
        assert outcome.status == nnrp_status(expected_error)
    else:
        assert outcome.final["type"] == "response.completed", outcome.final
        assert outcome.status == 200
        body = outcome.final["body"]
        assert body["object"] == "chat.completion"
        assert body["id"].startswith("chatcmpl-replay:")
        # Streamed or not, the body has the fields of vLLM's non-streaming answer.
        assert stack.gateway.info is not None
        shape = stack.gateway.info.binding.shape
        assert set(body) == {"id", "object", "created", "model", "choices", *shape.body}
        for choice in body["choices"]:
            assert set(choice) == {"index", "message", *shape.choice}
    if TRANSCRIPTS[name].streaming and expected_error is None:
        # Through the wire, the events equal the pure translator's (usage only if asked).
        asked = bool((request_for(name).get("stream_options") or {}).get("include_usage"))
        expected, _ = translate(name, usage_requested=asked)
        assert outcome.partials == expected
    if name == "engine_death_mid_stream":
        stack.replay.revive()


def nnrp_status(code: str) -> int:
    from gateway.profile import ProfileError

    return ProfileError(code, "").status


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_rechunking_gives_identical_events(nursery: trio.Nursery,
                                                        socket_dir: Path, seed: int) -> None:
    plain = await start_stack(nursery, socket_dir)
    rechunked = await start_stack(nursery, _subdir(socket_dir, seed),
                                  replay=ReplayServer(speed=50.0, rechunk_seed=seed))
    # Non-streaming bodies too: split over many reads, they are read whole all the same.
    for name in ("stream_tool_call_parallel", "stream_usage", "stream_n2_interleaved",
                 "stream_logprobs", "stream_reasoning", "nonstream_length",
                 "nonstream_tool_call", "nonstream_reasoning"):
        results = []
        for target in (plain, rechunked):
            async with connect(target.uri()) as client:
                session = await client.open_session()
                results.append(await run_operation(session, envelope(
                    request_for(name), request_id=f"replay:{name}:same")))
        assert results[0].partials == results[1].partials
        assert results[0].final == results[1].final


def _subdir(base: Path, seed: int) -> Path:
    path = base / f"r{seed}"
    path.mkdir()
    return path


async def test_default_routes_of_the_replay_backend(session: Any) -> None:
    text = await run_operation(session, envelope(chat(stream=True, max_tokens=7,
                                                      stream_options={"include_usage": True})))
    assert text.types == ["response.output_text.delta"] * 7 + ["response.usage"]
    tools = await run_operation(session, envelope(chat(stream=False, tools=[{
        "type": "function", "function": {"name": "get_weather"}}])))
    message = tools.final["body"]["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    backend = await run_operation(session, envelope(chat("backend-error")))
    assert backend.final["error"]["code"] == "backend_error"
    backend_stream = await run_operation(session, envelope(chat("backend-error", stream=True)))
    assert backend_stream.final["error"]["code"] == "backend_error"
    assert backend_stream.final["diagnostics"]["backend_error_family"] == "in_stream_error"


async def test_streams_in_a_row_share_one_upstream_connection(stack: Stack, session: Any
                                                              ) -> None:
    # The terminal goes out at [DONE]; the trailer is read after it, so the pooled
    # connection is reused rather than reopened per request (1,000-stream soak).
    probes = stack.replay.connections  # the probe pool's own connection
    for _ in range(4):
        outcome = await run_operation(session, envelope(chat(stream=True, max_tokens=3)))
        assert outcome.final["type"] == "response.completed"
        with trio.fail_after(10):  # let the operation read its trailer and release the slot
            await until(lambda: not stack.gateway.client.slots_in_use)
    assert stack.replay.connections == probes + 1


# --------------------------------------------------------------------------- error table


async def test_upstream_401(nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, replay=ReplayServer(api_key="k-secret"))
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(chat()))
    assert outcome.final["error"]["code"] == "backend_auth_failed"
    assert "k-secret" not in json.dumps(outcome.final)


async def test_upstream_api_key_is_sent(nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, replay=ReplayServer(api_key="k-secret"),
                              upstream_api_key="k-secret")
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(chat()))
    assert outcome.final["type"] == "response.completed"
    assert stack.replay.requests[-1].headers["authorization"] == "Bearer k-secret"


async def test_connection_refused_is_backend_unavailable(nursery: trio.Nursery,
                                                         socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir)
    # Point a second gateway at a port nothing listens on, with a probe result in hand.
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    dead_port = listener.getsockname()[1]
    listener.close()
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",),
                                    vllm_url=f"http://127.0.0.1:{dead_port}"))
    gateway.info, gateway.upstream_healthy = stack.gateway.info, True
    endpoints = await nursery.start(gateway.run)
    async with connect(endpoints[0].uri) as client:
        session = await client.open_session()
        with trio.fail_after(5):
            outcome = await run_operation(session, envelope(chat(stream=True)))
    assert outcome.final["error"]["code"] == "backend_unavailable"
    assert outcome.status == 503


async def test_not_ready_fails_fast(nursery: trio.Nursery) -> None:
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",),
                                    vllm_url="http://127.0.0.1:9"))
    endpoints = await nursery.start(gateway.run)
    async with connect(endpoints[0].uri) as client:
        session = await client.open_session()
        # A bound against a hang only (nothing here waits on a clock), with room for a busy
        # host; the answer is what the test checks.
        with trio.fail_after(10):
            outcome = await run_operation(session, envelope(chat()))
    assert outcome.final["error"]["code"] == "backend_unavailable"


@pytest.mark.parametrize(("scenario", "extra", "kind"), [
    ("stall_first_chunk", {}, "first_chunk"),
    ("stall_mid_stream", {}, "idle"),
    ("long_stream", {"nnrp_policy": {"timeout_ms": 300}}, "total"),
])
async def test_timeouts_are_request_timeout_and_abort_upstream(
        nursery: trio.Nursery, socket_dir: Path, scenario: str, extra: dict[str, Any],
        kind: str) -> None:
    stack = await start_stack(nursery, socket_dir, pipeline=PipelineLimits(
        first_chunk_timeout=0.3, idle_timeout=0.3))
    # The 0.3 s timeouts, not the defaults (a minute and more), end it: a bound that says
    # so on any host, and the diagnostics name which one.
    with trio.fail_after(20):
        async with connect(stack.uri()) as client:
            session = await client.open_session()
            outcome = await run_operation(session, envelope(
                chat(stream=True), request_id=scenario_id(scenario), **extra))
    assert outcome.final["error"]["code"] == "request_timeout"
    assert outcome.final["diagnostics"]["timeout"] == kind
    assert outcome.status == 504
    with trio.fail_after(10):
        await until(lambda: bool(stack.replay.disconnects))
    assert stack.replay.disconnects[-1].scenario == scenario


async def test_reset_mid_body_is_backend_error(stack: Stack, session: Any) -> None:
    outcome = await run_operation(session, envelope(chat(stream=True),
                                                    request_id=scenario_id("reset_mid_body")))
    assert outcome.final["error"]["code"] == "backend_error"
    assert outcome.final["diagnostics"]["backend_error_family"] == "connection_lost"


async def test_engine_death_then_refused_then_recovery(stack: Stack, session: Any) -> None:
    dying = await run_operation(session, envelope(
        request_for("engine_death_mid_stream"),
        request_id=scenario_id("engine_death_mid_stream")))
    assert dying.final["error"]["code"] == "backend_error"
    assert "EngineCore" in dying.final["error"]["message"]
    with trio.fail_after(3):
        await until(lambda: not stack.gateway.upstream_healthy)
    refused = await run_operation(session, envelope(chat()))
    assert refused.final["error"]["code"] == "backend_unavailable"
    stack.replay.revive()
    with trio.fail_after(5):
        await until(lambda: stack.gateway.upstream_healthy)
    assert (await run_operation(session, envelope(chat()))).final["type"] == "response.completed"


# --------------------------------------------------------------------------- cancellation


@pytest.mark.parametrize("how", ["cancel", "frame_cancel", "abort"])
async def test_cancel_closes_the_upstream_socket(stack: Stack, session: Any, how: str) -> None:
    operation = await session.submit(envelope(chat(stream=True),
                                              request_id=scenario_id("long_stream")))
    seen: list[Any] = []
    cancelled_at = None
    async for event in operation.events():
        seen.append(event)
        if len(seen) == 3:
            await operation.cancel(how)
            cancelled_at = trio.current_time()
    assert isinstance(seen[-1], nnrp.DropReceived)
    assert seen[-1].drop_reason == nnrp.DropReason.PEER_CANCELLED
    assert cancelled_at is not None
    # long_stream never ends by itself: any disconnect the replay sees is the cancel's
    # close, and none is a hang, not a slow pass. (A 0.25 s clock stood here: one stream
    # on an idle gateway unwinds within a tick with or without the synchronous abort, so
    # it passed with that abort removed and failed only on a busy host. The abort before
    # the task has run is proven by order in tests/server/test_operation.py,
    # test_a_cancel_aborts_the_upstream_at_once_and_only_while_it_streams.)
    with trio.fail_after(10):
        await until(lambda: bool(stack.replay.disconnects))
    disconnect = stack.replay.disconnects[-1]
    assert disconnect.scenario == "long_stream"


async def test_cancel_non_streaming_request_aborts_upstream(stack: Stack, session: Any) -> None:
    operation = await session.submit(envelope(chat(stream=False),
                                              request_id=scenario_id("stall_first_chunk")))
    with trio.fail_after(10):
        await until(lambda: any(r.scenario == "stall_first_chunk"
                                 for r in stack.replay.requests))
    await operation.cancel()
    (terminal,) = [event async for event in operation.events()]
    assert terminal.drop_reason == nnrp.DropReason.PEER_CANCELLED
    with trio.fail_after(10):
        await until(lambda: bool(stack.replay.disconnects))


async def test_each_upstream_read_is_written_before_the_next_is_awaited(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    # The events of one upstream read are deferred and flushed together (issue 16): a
    # flush left out would hold them until the next write (the terminal, here 0.6 s
    # later), and the stream would still complete. So: arrival times, at real speed.
    stack = await start_stack(nursery, socket_dir, replay=ReplayServer())
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        operation = await session.submit(envelope(
            chat(stream=True), request_id="replay:timestamped:3:300000:flush"))
        arrivals = [(trio.current_time(), event) async for event in operation.events()]
    partial_times = [at for at, event in arrivals if isinstance(event, nnrp.PartialReceived)]
    terminal_at, terminal = arrivals[-1]
    assert isinstance(terminal, nnrp.ResultReceived)
    assert len(partial_times) >= 3
    assert terminal_at - partial_times[0] > 0.4  # the first token did not wait for the end
    assert partial_times[-1] - partial_times[0] > 0.4


async def test_abort_closes_the_upstream_socket_from_another_task(stack: Stack) -> None:
    """Issue 16: an NNRP cancel closes vLLM's socket synchronously, in the task that
    reads the CANCEL (``Operation.aborts_upstream``); this is that close on a real httpx
    response: the backend sees the disconnect at once, and the stream's reads fail
    once what the connection had already buffered is used up."""
    request_id = scenario_id("long_stream")
    client = stack.gateway.client

    async def abort_mid_stream() -> None:
        async with client.chunks(chat(stream=True), {"x-request-id": request_id},
                                 first_chunk=5, idle=5) as stream:
            assert await stream.__anext__()
            assert stream.abort()
            with trio.fail_after(5):
                await until(lambda: bool(stack.replay.disconnects))
                while True:  # the long stream has far more than any buffer holds
                    await stream.__anext__()

    with pytest.raises(UpstreamMalformed) as failed:
        await abort_mid_stream()
    assert failed.value.kind == "connection_lost"
    with trio.fail_after(5):  # the backend sees the close after us
        await until(lambda: stack.replay.disconnects)
    assert stack.replay.disconnects[0].request_id == request_id


# --------------------------------------------------------------------------- trace and ids


async def test_traceparent_is_byte_exact_and_frozen(stack: Stack) -> None:
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        await session.trace_context(trace_id=0xABCDEF0123456789, span_id=0x1122334455667788,
                                    trace_flags=0x3, attributes=b"secret=attr")
        outcome = await run_operation(session, envelope(chat(), request_id="trace-1"))
        assert outcome.final["type"] == "response.completed"
        plain = await client.open_session()
        await run_operation(plain, envelope(chat(), request_id="trace-2"), trace_id=0x77)
    headers = {r.headers["x-request-id"]: r.headers for r in stack.replay.requests
               if r.method == "POST"}
    assert headers["trace-1"]["traceparent"] == (
        "00-0000000000000000abcdef0123456789-1122334455667788-01")
    assert "traceparent" not in headers["trace-2"]  # a header trace_id alone has no span
    body = next(r.json() for r in stack.replay.requests if r.headers.get("x-request-id")
                == "trace-1")
    # Exactly what the client sent: no trace context (ids or attributes) in the body.
    assert body == chat()


async def test_derived_request_id_and_include_usage(stack: Stack, session: Any) -> None:
    await run_operation(session, envelope(chat(stream=True, max_tokens=2)))
    request = stack.replay.requests[-1]
    assert request.headers["x-request-id"].startswith("nnrp-")
    assert request.json()["stream_options"] == {"include_usage": True}


# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize("family", ["0.18", "0.22", "0.26", "0.32"])
async def test_version_selection_and_equal_events(nursery: trio.Nursery, socket_dir: Path,
                                                  family: str) -> None:
    stack = await start_stack(nursery, socket_dir, allow_untested_vllm=family == "0.32",
                              replay=ReplayServer(family=family, speed=50))
    assert stack.gateway.info is not None
    assert stack.gateway.info.binding.family == f"{family}.x"
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(
            request_for("stream_tool_call_single"),
            request_id="replay:stream_tool_call_single:x"))
        unary = await run_operation(session, envelope(chat(stream=False)))
    # 0.32 plays its own recording of the scenario; older families the 0.26 shape.
    expected, _ = translate("stream_tool_call_single", "0.32" if family == "0.32" else "0.26",
                            usage_requested=False)
    assert outcome.partials == expected
    message = unary.final["body"]["choices"][0]["message"]
    # vLLM's body as vLLM sent it: 0.18/0.22 write an empty tool list, later ones do not.
    assert message.get("tool_calls", "absent") == ([] if family in ("0.18", "0.22")
                                                   else "absent")


async def test_untested_version_refused_or_allowed(nursery: trio.Nursery) -> None:
    replay = ReplayServer(version="0.20.1")
    url = await nursery.start(replay.serve)
    gateway = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",), vllm_url=url))
    with pytest.raises(UnsupportedVersion, match=r"0\.20\.1"):
        await gateway.probe_once()
    allowed = Gateway(GatewayConfig(listen=("tcp://127.0.0.1:0",), vllm_url=url,
                                    allow_untested_vllm=True))
    info = await allowed.probe_once()
    assert (info.binding.family, info.untested) == ("0.18.x", True)
    await gateway.client.aclose()
    await allowed.client.aclose()


# --------------------------------------------------------------------------- extras


async def test_capabilities_over_nnrp_and_diagnostics(stack: Stack, session: Any) -> None:
    outcome = await run_operation(session, json.dumps({
        "schema_version": "openai-compatible/1", "operation": "gateway.capabilities"}).encode())
    document = outcome.final["body"]
    assert document["compatibility_levels"] == [1]
    assert [m["id"] for m in document["models"]] == ["tiny", "example-model", "reference-model"]
    assert document["operations"][0]["tool_calls"] is False
    diagnosed = await run_operation(session, envelope(chat(stream=True, max_tokens=2),
                                                      nnrp_policy={"diagnostics": True}))
    # Built from the observation record, just before the terminal: timings and usage in it.
    assert diagnosed.types == ["response.output_text.delta"] * 2 + ["response.diagnostics"]
    record = diagnosed.partials[-1]["diagnostics"]
    assert record["backend_family"] == "0.26.x"
    assert record["selected_model"] == "example-model"
    assert record["outcome"] == "ok"
    assert record["events"] == 2
    assert record["upstream_status"] == 200
    assert record["usage"]["completion_tokens"] == 2
    assert record["transport"] == "tcp"
    assert "first_event_ms" in record


async def test_profile_errors_do_not_reach_vllm(stack: Stack, session: Any) -> None:
    before = len(stack.replay.requests)
    missing = await run_operation(session, envelope({"model": "m"}))
    unsupported = await run_operation(session, json.dumps({
        "schema_version": "openai-compatible/1", "operation": "responses.create",
        "body": {"model": "m", "input": "x"}}).encode())
    assert missing.final["error"]["code"] == "missing_messages"
    assert unsupported.final["error"]["code"] == "unsupported_operation"
    assert missing.status == 400
    assert len(stack.replay.requests) == before


@pytest.mark.parametrize("transport", ["ipc", "websocket"])
async def test_other_transports_carry_the_pipeline(stack: Stack, transport: str) -> None:
    async with connect(stack.uri(transport)) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(chat(stream=True, max_tokens=4)))
    assert outcome.types == ["response.output_text.delta"] * 4
    assert outcome.final["type"] == "response.completed"


async def test_pipeline_limits_are_configurable(nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, pipeline=PipelineLimits(max_envelope_bytes=64))
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(chat()))
    assert outcome.final["error"]["code"] == "invalid_body"
    assert "64-byte limit" in outcome.final["error"]["message"]


def _close_wait_sockets(port: int) -> int:
    """Sockets of this host in CLOSE-WAIT (state 08) towards ``port`` (/proc/net/tcp)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        count += remote_port == port and fields[3] == "08"
    return count


async def test_idle_upstream_connections_are_closed_before_vllm_closes_them(
        nursery: trio.Nursery, socket_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17: vLLM (uvicorn) closes a keep-alive connection idle for 5 s; a connection
    left in the gateway's pool would then sit in CLOSE-WAIT until reused. The gateway closes
    idle ones first (scaled down here: vLLM 1 s, the gateway 0.3 s)."""
    from gateway.upstream import _client

    monkeypatch.setattr(_client, "KEEPALIVE_EXPIRY", 0.3)
    stack = await start_stack(nursery, socket_dir,
                              replay=ReplayServer(speed=50, keep_alive_timeout=1.0))
    # A burst of eight at once (held until all eight are at vLLM: eight connections).
    burst_held = stack.replay.hold(lambda request: request.method == "POST")
    async with connect(stack.uri()) as client:
        sessions = [await client.open_session() for _ in range(8)]
        async with trio.open_nursery() as burst:
            for session in sessions:
                burst.start_soon(run_operation, session, envelope(chat(stream=True,
                                                                       max_tokens=4)))
            with trio.fail_after(5):
                await stack.replay.wait_for_requests(8)
            burst_held.release()
    with trio.fail_after(5):  # the burst left connections for reuse, then the clock prunes
        await until(lambda: stack.gateway.client.slots_idle >= 2)
        await until(lambda: not stack.gateway.client.slots_idle)
    await trio.sleep(1.5)  # past the replay's keep-alive: nothing left for it to close
    assert _close_wait_sockets(stack.replay.port) == 0


async def test_a_full_upstream_pool_is_recoverable_overload(nursery: trio.Nursery,
                                                            socket_dir: Path) -> None:
    """Issue 17: when the gateway cannot take more (every upstream connection busy past
    the queue wait), a new operation is refused recoverably with a retry time, instead
    of waiting out its first-chunk clock and failing."""
    stack = await start_stack(nursery, socket_dir, upstream_pool_size=1,
                              upstream_queue_timeout=0.2)
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        long = await session.submit(envelope(chat(stream=True),
                                             request_id="replay:long_stream:hold"))
        events = long.events()
        await events.__anext__()  # it holds the only upstream connection now
        outcome = await run_operation(session, envelope(chat(stream=True)))
        # The pool as /metrics shows it (issue 24's pool panel): full, one gave up.
        sample = stack.gateway.metrics.registry.get_sample_value
        assert sample("nnrp_gateway_upstream_pool_size") == 1
        assert sample("nnrp_gateway_upstream_pool_in_use") == 1
        assert sample("nnrp_gateway_upstream_pool_waiting") == 0
        assert sample("nnrp_gateway_upstream_pool_wait_timeouts_total") == 1
        await long.cancel()
    assert outcome.status == 503
    assert outcome.final["error"]["code"] == "backend_overload"
    assert "busy" in outcome.final["error"]["message"]
    retry = [e.packet.message for e in client.others
             if isinstance(e, nnrp.OtherReceived)
             and e.packet.msg_type is nnrp.MsgType.RETRY_AFTER]
    assert retry and retry[0].retry_after_ms > 0
