"""vLLM as deployed today (issue 23), through the real gateway and a real NNRP client,
against the replay vLLM playing recorded 0.32.0 bytes (and synthesized 0.33 ones):
vLLM's own refusals as retry hints, a dead engine and readiness, per-request metrics,
keep-alive comments, 0.33's additions, and load-aware admission against scripted
``/metrics``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway import nnrp
from gateway.app import LoadSettings
from gateway.pipeline import PipelineLimits
from gateway.tools.client import ClientError, NnrpClient, connect
from gateway.tools.replay import ReplayServer, bundled_transcripts
from tests.support.stack import (
    chat,
    envelope,
    metric_samples,
    records_of,
    run_operation,
    scenario_id,
    start_stack,
)
from tests.support.waits import until

TRANSCRIPTS = bundled_transcripts()


def retry_hints(client: NnrpClient) -> tuple[list[int], list[int]]:
    """The retry times of the RETRY_AFTER and ERROR_RECOVERABLE packets received."""
    retry, recoverable = [], []
    for event in client.others:
        if not isinstance(event, nnrp.OtherReceived):
            continue
        if event.packet.msg_type is nnrp.MsgType.RETRY_AFTER:
            retry.append(event.packet.message.retry_after_ms)
        elif event.packet.msg_type is nnrp.MsgType.ERROR_RECOVERABLE:
            recoverable.append(event.packet.message.retry_after_ms)
    return retry, recoverable


def refusals(stack: Any) -> dict[tuple[str, str], float]:
    return {(dict(labels)["source"], dict(labels)["reason"]): value
            for (name, labels), value in metric_samples(stack.gateway.metrics.registry).items()
            if name == "nnrp_gateway_overload_refusals_total"}


# --------------------------------------------------------------------------- vLLM refuses


@pytest.mark.parametrize(("scenario", "stream", "reason"), [
    ("error_503_queue_full", False, "max_num_queued_reqs"),  # recorded, 0.32.0
    ("error_503_queued_tokens", False, "max_num_queued_tokens"),  # from vLLM's source
    ("error_503_retryable", False, "retryable"),
    ("stream_refused_in_stream", True, "max_num_queued_reqs"),  # recorded: 200, then it
])
async def test_vllm_refusals_are_retry_hints(nursery: trio.Nursery, socket_dir: Path,
                                             scenario: str, stream: bool, reason: str) -> None:
    stack = await start_stack(nursery, socket_dir, replay=ReplayServer(family="0.32",
                                                                       speed=50),
                              pipeline=PipelineLimits(overload_retry_after_ms=1700))
    records = records_of(stack)
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        refused = await run_operation(session, envelope(
            chat(stream=stream), request_id=scenario_id(scenario)))
        after = await run_operation(session, envelope(chat(stream=True)))  # session intact
    assert refused.status == 503
    assert refused.final is not None
    error = refused.final["error"]
    assert error["code"] == "backend_overload"
    assert error["message"] == json.loads(
        TRANSCRIPTS[scenario].body.split(b"\n\n")[0].removeprefix(b"data: "))["error"][
        "message"]  # vLLM's own words
    assert refused.types == []  # nothing was produced, nothing half-sent
    assert retry_hints(client) == ([1700], [1700])  # the configured default: no sample
    assert after.final is not None and after.final["type"] == "response.completed"
    assert [r.refusal_reason for r in records] == [reason, None]
    assert refusals(stack) == {("vllm", reason): 1.0}


async def test_a_dead_engine_fails_readiness_until_health_recovers(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    # A long health interval: what takes readiness away is the 500 itself.
    stack = await start_stack(nursery, socket_dir, replay=ReplayServer(family="0.32"),
                              health_interval=3600)
    stack.replay.health_unhealthy = True  # the engine is dead; the process still answers
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        dead = await run_operation(session, envelope(chat(),
                                                     request_id=scenario_id("engine_dead")))
        assert dead.status == 500 and dead.final is not None
        assert dead.final["error"]["code"] == "backend_error"
        assert "vLLM health check failed" in stack.gateway.readiness()
        fast = await run_operation(session, envelope(chat()))
        assert fast.final is not None
        assert fast.final["error"]["code"] == "backend_unavailable"
        stack.replay.health_unhealthy = False
        with trio.fail_after(10):
            await until(lambda: not stack.gateway.readiness())
        again = await run_operation(session, envelope(chat()))
    assert again.final is not None and again.final["type"] == "response.completed"
    assert len([r for r in stack.replay.requests if r.method == "POST"]) == 2


# --------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("stream", [True, False])
async def test_vllm_per_request_metrics_reach_record_log_event_and_histograms(
        nursery: trio.Nursery, socket_dir: Path, stream: bool) -> None:
    scenario = "stream_metrics" if stream else "nonstream_metrics"
    stack = await start_stack(nursery, socket_dir, replay=ReplayServer(family="0.32",
                                                                       speed=50))
    records = records_of(stack)
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(
            chat(**extra), request_id=scenario_id(scenario),
            nnrp_policy={"diagnostics": True}))
    body = TRANSCRIPTS[scenario].body
    recorded = [json.loads(line.removeprefix(b"data: ")) for line in body.split(b"\n\n")
                if line.startswith(b"data: {")] if stream else [json.loads(body)]
    sent = next(c["metrics"] for c in recorded if "metrics" in c)  # as vLLM sent them
    assert outcome.final is not None
    assert outcome.final["body"]["metrics"] == sent  # the completed body keeps the field
    (event,) = [p for p in outcome.partials if p["type"] == "response.diagnostics"]
    diagnostics = event["diagnostics"]
    (record,) = records
    for name, field in (("backend_queue_ms", "queue_time_ms"),
                        ("backend_ttft_ms", "time_to_first_token_ms"),
                        ("backend_generation_ms", "generation_time_ms"),
                        ("backend_mean_itl_ms", "mean_itl_ms")):
        assert getattr(record, name) == pytest.approx(sent[field], abs=1e-3)
        assert diagnostics[name] == pytest.approx(sent[field], abs=1e-3)
        assert record.as_dict()[name] == getattr(record, name)  # the canonical log line
    assert record.first_event_ms is not None  # the gateway's own timing, beside vLLM's
    samples = metric_samples(stack.gateway.metrics.registry)
    model = (("model_name", "example-model"),)
    assert samples[("nnrp_gateway_backend_queue_seconds_count", model)] == 1
    assert samples[("nnrp_gateway_backend_ttft_seconds_count", model)] == 1
    assert samples[("nnrp_gateway_backend_ttft_seconds_sum", model)] == pytest.approx(
        sent["time_to_first_token_ms"] / 1000, abs=1e-6)


async def test_keep_alive_comments_change_nothing_for_the_client(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    """``stream_keep_alive`` was recorded queued behind a long stream: two ``: keep-alive``
    comments, then tokens. The client sees what it sees of the same stream without them."""
    stack = await start_stack(nursery, socket_dir, replay=ReplayServer(family="0.32",
                                                                       speed=50))
    body = TRANSCRIPTS["stream_keep_alive"].body
    assert body.count(b": keep-alive\n\n") >= 1
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(
            chat(stream=True, stream_options={"include_usage": True}),
            request_id=scenario_id("stream_keep_alive")))
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in body.split(b"\n\n")
              if e.startswith(b"data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert outcome.final is not None and outcome.final["type"] == "response.completed"
    assert "".join(p["delta"] for p in outcome.partials
                   if p["type"] == "response.output_text.delta") == text
    assert outcome.final["body"]["choices"][0]["message"]["content"] == text
    assert outcome.types[-1] == "response.usage"


# --------------------------------------------------------------------------- 0.33


@pytest.mark.parametrize(("scenario", "stream", "field"), [
    ("stream_kv_transfer_params_033", True, "kv_transfer_params"),
    ("stream_weight_versions_033", True, "weight_versions"),
    ("nonstream_weight_versions_033", False, "weight_versions"),
])
async def test_0_33_additions_are_kept(nursery: trio.Nursery, socket_dir: Path,
                                       scenario: str, stream: bool, field: str) -> None:
    stack = await start_stack(nursery, socket_dir, replay=ReplayServer(family="0.33",
                                                                       speed=50))
    assert stack.gateway.info is not None
    assert (stack.gateway.info.version, stack.gateway.info.binding.family) == ("0.33.0",
                                                                               "0.32.x")
    assert not stack.gateway.info.untested
    transcript = TRANSCRIPTS[scenario]
    request = {k: v for k, v in transcript.request_body.items() if k not in ("model",)}
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(
            chat(**request), request_id=scenario_id(scenario)))
    sent = [json.loads(e.removeprefix(b"data: ")) for e in transcript.body.split(b"\n\n")
            if e.startswith(b"data: {")] if stream else [json.loads(transcript.body)]
    expected = next(c[field] for c in sent if field in c)
    assert outcome.final is not None
    assert outcome.final["body"][field] == expected
    # The request field that asks for it reached vLLM as the client wrote it.
    (posted,) = [r for r in stack.replay.requests if r.method == "POST"]
    for key in ("return_weight_versions", "kv_transfer_params"):
        if key in request:
            assert posted.json()[key] == request[key]


# --------------------------------------------------------------------------- load-aware


def _load_settings(**changes: Any) -> LoadSettings:
    defaults: dict[str, Any] = {"admission": True, "interval": 0.05, "max_waiting": 4,
                                "max_kv_cache_usage": 0.9, "stale_after": 3600,
                                "retry_after_ms": 700}
    return LoadSettings(**{**defaults, **changes})


async def _next_scrape(stack: Any) -> None:
    """Until a scrape that began after now has finished."""
    assert stack.gateway.load is not None
    with trio.fail_after(10):
        await stack.gateway.load.scraped()
        await stack.gateway.load.scraped()


async def test_load_aware_admission_refuses_before_vllm_and_recovers(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, load=_load_settings())
    records = records_of(stack)
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        stack.replay.set_load(waiting=10, running=2)
        await _next_scrape(stack)
        full = await run_operation(session, envelope(chat(stream=True)))
        assert full.status == 503 and full.final is not None
        assert full.final["error"]["code"] == "scheduler_rejected"
        assert full.final["diagnostics"]["admission_reason"] == "waiting_requests"
        # 700 ms per turn of the queue: 10 waiting over 2 running slots is 5 more turns.
        assert retry_hints(client) == ([4200], [4200])
        assert not [r for r in stack.replay.requests if r.method == "POST"]  # never asked

        stack.replay.set_load(waiting=1, running=2, kv_cache_usage=0.95)
        await _next_scrape(stack)
        cache = await run_operation(session, envelope(chat()))
        assert cache.final is not None
        assert cache.final["diagnostics"]["admission_reason"] == "kv_cache_usage"

        stack.replay.set_load(waiting=1, running=2, kv_cache_usage=0.2)  # recovered
        await _next_scrape(stack)
        fine = await run_operation(session, envelope(chat(stream=True)))
        assert fine.final is not None and fine.final["type"] == "response.completed"
    assert [(r.refusal_source, r.refusal_reason) for r in records] == [
        ("gateway", "waiting_requests"), ("gateway", "kv_cache_usage"), (None, None)]
    assert refusals(stack) == {("gateway", "waiting_requests"): 1.0,
                               ("gateway", "kv_cache_usage"): 1.0}


async def test_a_failing_scrape_admits_and_shows_in_the_metrics(
        nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, load=_load_settings())
    stack.replay.set_load(waiting=50, running=1)
    await _next_scrape(stack)
    assert stack.gateway.load is not None and stack.gateway.load.decision().refused
    stack.replay.metrics_status = 500
    await _next_scrape(stack)
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(chat(stream=True)))
    assert outcome.final is not None and outcome.final["type"] == "response.completed"
    samples = metric_samples(stack.gateway.metrics.registry)
    assert samples[("nnrp_gateway_load_scrapes_total", (("result", "failed"),))] >= 1
    assert samples[("nnrp_gateway_load_state", (("state", "scrape_failing"),))] == 1
    assert not refusals(stack)


async def test_the_load_endpoint_as_the_source(nursery: trio.Nursery,
                                               socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, load=_load_settings(source="load"))
    stack.replay.set_load(waiting=6)  # /load's server_load
    await _next_scrape(stack)
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(chat()))
    assert outcome.final is not None
    assert outcome.final["diagnostics"]["admission_reason"] == "waiting_requests"
    assert [r.path for r in stack.replay.requests if r.path in ("/metrics", "/load")] == []


async def test_a_stale_sample_admits(nursery: trio.Nursery, socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, load=_load_settings(stale_after=0.2))
    stack.replay.set_load(waiting=50, running=1)
    await _next_scrape(stack)
    stack.replay.metrics_silent = True  # the next scrape hangs: the sample only ages
    assert stack.gateway.load is not None
    with trio.fail_after(10):
        await until(lambda: stack.gateway.load is not None
                    and stack.gateway.load.decision().state == "stale")
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(chat()))
    assert outcome.final is not None and outcome.final["type"] == "response.completed"


async def test_load_aware_admission_can_refuse_new_sessions(nursery: trio.Nursery,
                                                            socket_dir: Path) -> None:
    stack = await start_stack(nursery, socket_dir, load=_load_settings(refuse_sessions=True))
    async with connect(stack.uri()) as client:
        opened = await client.open_session()  # before the load rises
        stack.replay.set_load(waiting=10, running=2)
        await _next_scrape(stack)
        with pytest.raises(ClientError) as refused:
            await client.open_session()
        assert refused.value.retry_later
        assert "retry after 4200 ms" in str(refused.value)
        stack.replay.set_load(waiting=0, running=2)
        await _next_scrape(stack)
        again = await client.open_session()
        outcome = await run_operation(again, envelope(chat()))
        kept = await run_operation(opened, envelope(chat()))
    assert outcome.final is not None and outcome.final["type"] == "response.completed"
    assert kept.final is not None and kept.final["type"] == "response.completed"
    assert refusals(stack) == {("gateway_session", "waiting_requests"): 1.0}


# --------------------------------------------------------------------------- newer fields


@pytest.mark.parametrize("scenario", ["stream_prompt_text", "nonstream_prompt_text_session"])
async def test_newer_request_and_response_fields_are_kept(nursery: trio.Nursery,
                                                          socket_dir: Path,
                                                          scenario: str) -> None:
    """``return_prompt_text`` (the rendered prompt, on a stream's first chunk) and
    ``session_id`` (a request field vLLM 0.32 reads), recorded live: the request reaches
    vLLM as the client wrote it, the completed body keeps the prompt text."""
    stack = await start_stack(nursery, socket_dir, replay=ReplayServer(family="0.32",
                                                                       speed=50))
    transcript = TRANSCRIPTS[scenario]
    request = {k: v for k, v in transcript.request_body.items() if k != "model"}
    async with connect(stack.uri()) as client:
        session = await client.open_session()
        outcome = await run_operation(session, envelope(chat(**request),
                                                        request_id=scenario_id(scenario)))
    assert outcome.final is not None
    assert outcome.final["body"]["prompt_text"] == "<|user|>Hello</s><|assistant|>"
    (posted,) = [r for r in stack.replay.requests if r.method == "POST"]
    for key in ("return_prompt_text", "session_id"):
        assert posted.json().get(key) == request.get(key)
