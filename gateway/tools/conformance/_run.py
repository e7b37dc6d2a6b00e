"""Run a plan's cases over real NNRP sessions and write the suite's case results.

Each case's recipe request becomes one envelope sent as one typed FRAME_SUBMIT. Partial
results are collected in order; the terminal RESULT_PUSH adds its final event; a
RESULT_DROP_REASON becomes ``response.cancelled`` (terminal ``cancelled``).

Runner directives live in ``request.nnrp`` and are never forwarded to the gateway:
``cancel_after_events`` (the suite's: a real CANCEL after N events), and the project's
``x_request_id`` (chooses a replay scenario), ``x_trace_context`` (a session
TRACE_CONTEXT sent first) and ``x_expect_upstream`` (checked against the replay
backend's log: ``traceparent``, ``disconnected``, ``requests``).

Clients: ``builtin`` is the project's trio client; ``native`` is nnrp-py's Rust-backed
client (only when nnrp-py is installed; it is a test/conformance tool, never imported by
the serving path).

A cancel's precondition is that the CANCEL reaches the operation while it runs. Against
a backend faster than a cancel (a GPU vLLM answers a short prompt in a few ms) it may not
happen, and the case is inconclusive (``_validate``: reported ``skipped`` with the
reason), never a crash or a failure:

1. The client already holds the operation's terminal when event N arrives: the CANCEL
   is not sent (nnrp-py's native client refuses it then: ``NativeInvalidStateError``,
   "CANCEL references inactive operation").
2. The CANCEL was sent and a terminal other than its drop came back that may have been
   on its way already. The built-in client knows: it sends a PING right after the
   CANCEL, and a server reads them in order, so a terminal received before the PONG was
   sent before the CANCEL was read (inconclusive), one after it by a server that had
   read the CANCEL (failed). nnrp-py's native client has no PING: a terminal within
   ``crossing_window_ms`` of the CANCEL (four session-open round trips, at least 50 ms)
   is inconclusive, a later one failed.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from gateway import nnrp
from gateway.tools.client import ClientError, ClientSession, Trust, connect

from ._native import (
    CA_ANCHOR_REFUSED,
    native_client_options,
    native_openai_submit,
    self_signed_ca,
)
from ._validate import INCONCLUSIVE, check_case, crossing_window_ms

#: How long a CANCEL nnrp-py refused as for an inactive operation may wait for that
#: operation's terminal before the operation counts as lost (``run_native``).
LOST_OPERATION_WAIT = 2.0
#: Events taken per poll of nnrp-py's native session. Its ``poll_events`` without
#: ``max_events`` returns only once nothing more is pending: against a stream that
#: outpaces the reader it never returns, and no deadline or CANCEL of the loop runs
#: (a conformance run hung so for minutes behind a long answer).
NATIVE_POLL_BATCH = 256
RUNNER_KEYS = ("cancel_after_events", "x_request_id", "x_trace_context", "x_expect_upstream")
_TERMINALS = {"response.completed": "success", "response.error": "error",
              "response.cancelled": "cancelled"}


@attrs.define
class Observation:
    frames: list[dict[str, Any]] = attrs.field(factory=list)
    events: list[dict[str, Any]] = attrs.field(factory=list)
    terminal: str = "error"
    status: int | None = None
    problem: str | None = None
    started: float = 0.0
    elapsed_ms: float = 0.0
    #: Why the case's precondition did not happen (module docstring): inconclusive.
    inconclusive: str | None = None


@attrs.frozen
class CaseRequest:
    case_id: str
    envelope: bytes
    request_id: str
    cancel_after: int | None
    trace: dict[str, int] | None
    expect_upstream: dict[str, Any] | None


def case_request(case: dict[str, Any], number: int, run_token: str) -> CaseRequest:
    """The envelope for one case. Request ids carry ``run_token`` so evidence from a
    long-lived backend is never mixed up between runs."""
    request = case["request"]
    directives = dict(request.get("nnrp") or {})
    policy = {k: v for k, v in directives.items() if k not in RUNNER_KEYS}
    slug = re.sub(r"[^A-Za-z0-9]+", "-", case["id"]).strip("-")[-60:]
    chosen = directives.get("x_request_id")
    request_id = (f"{chosen}:{run_token}" if chosen
                  else f"conf-{run_token}-{number}-{slug}")
    envelope: dict[str, Any] = {"schema_version": "openai-compatible/1",
                                "operation": case["operation"], "request_id": request_id,
                                "body": request["body"]}
    if policy:
        envelope["nnrp"] = policy
    return CaseRequest(case["id"], json.dumps(envelope).encode(), request_id,
                       directives.get("cancel_after_events"), directives.get("x_trace_context"),
                       directives.get("x_expect_upstream"))


def _not_sent(after: int) -> str:
    return (f"the stream ended before its CANCEL could be sent: the client already held "
            f"the operation's terminal when event {after} arrived (a backend faster than "
            "a cancel); cancellation is neither proven nor disproven")


def _crossed(how: str) -> str:
    return (f"the operation's terminal crossed its CANCEL ({how}): the stream ended before "
            "the CANCEL reached the gateway (a backend faster than a cancel); "
            "cancellation is neither proven nor disproven")


def _finish_terminal(observation: Observation, final: dict[str, Any] | None,
                     dropped: bool, drop_reason: int | None) -> None:
    if dropped:
        observation.terminal = "cancelled"
        observation.events.append({"type": "response.cancelled", "reason": "peer_cancelled",
                                   "drop_reason": drop_reason})
    elif final is not None:
        observation.terminal = _TERMINALS.get(final.get("type", ""), "error")
        observation.events.append(final)


# --------------------------------------------------------------------------- builtin client


async def _run_builtin_case(session: ClientSession, request: CaseRequest) -> Observation:
    observation = Observation(started=time.time())
    start = trio.current_time()
    if request.trace:
        await session.trace_context(trace_id=request.trace["trace_id"],
                                    span_id=request.trace["span_id"],
                                    trace_flags=request.trace.get("flags", 1))
    final = None
    dropped = False
    drop_reason = None
    partials = 0
    pong_at: list[int | None] = []

    async def ping_after_cancel() -> None:
        pong_at.append(await session.client.ping())
        observation.frames.append({"frame": "PONG", "t_ms": round(
            (trio.current_time() - start) * 1000, 3), "received_at": pong_at[0]})

    async with trio.open_nursery() as nursery:
        operation = await session.submit(request.envelope)
        async for event in operation.events():
            t_ms = round((trio.current_time() - start) * 1000, 3)
            if isinstance(event, nnrp.PartialReceived):
                partials += 1
                body = json.loads(event.body)
                observation.events.append(body)
                observation.frames.append({"frame": "PARTIAL_RESULT",
                                           "sequence": event.sequence,
                                           "t_ms": t_ms, "type": body.get("type")})
                if request.cancel_after is not None and partials == request.cancel_after:
                    if operation.terminal_at is not None:  # precondition 1 (module doc)
                        observation.inconclusive = _not_sent(partials)
                        observation.frames.append({"frame": "CANCEL",
                                                   "direction": "not sent", "t_ms": t_ms})
                    else:
                        await operation.cancel()
                        observation.frames.append({"frame": "CANCEL", "direction": "sent",
                                                   "t_ms": t_ms})
                        nursery.start_soon(ping_after_cancel)
            elif isinstance(event, nnrp.ResultReceived):
                observation.status = event.meta.status_code
                assert event.typed_body is not None
                final = json.loads(bytes(event.typed_body.frames[0].payload))
                observation.frames.append({"frame": "RESULT_PUSH",
                                           "status": observation.status, "t_ms": t_ms,
                                           "type": final.get("type"),
                                           "received_at": operation.terminal_at})
            else:
                dropped, drop_reason = True, event.drop_reason
                observation.frames.append({"frame": "RESULT_DROP_REASON", "t_ms": t_ms,
                                           "drop_reason": event.drop_reason,
                                           "diagnostic": event.diagnostic.decode(
                                               "ascii", "replace")})
    # Precondition 2: a terminal that came before the PONG crossed the CANCEL.
    if (final is not None and pong_at and pong_at[0] is not None
            and operation.terminal_at is not None and operation.terminal_at < pong_at[0]):
        observation.inconclusive = _crossed(
            "it came before the PONG to a PING sent right after the CANCEL")
    _finish_terminal(observation, final, dropped, drop_reason)
    observation.elapsed_ms = round((trio.current_time() - start) * 1000, 3)
    return observation


def _backend_kind(case_endpoint: str, endpoint: str) -> str:
    return "main" if case_endpoint == endpoint else "scripted"


async def run_builtin(endpoint: str, requests: list[CaseRequest], trust: Trust
                      ) -> list[Observation]:
    observations = []
    async with connect(endpoint, ssl_context=trust.ssl_context(), quic=trust.quic()) as client:
        session = await client.open_session(auth=trust.auth)
        for request in requests:
            with trio.fail_after(60):
                observations.append(await _run_builtin_case(session, request))
        await session.close()
    return observations


# --------------------------------------------------------------------------- native client


def run_native(endpoint: str, requests: list[CaseRequest], trust: Trust) -> list[Observation]:
    """Blocking: drive nnrp-py's native client (call from a worker thread). It cannot
    present a session auth token (``NativeClientSessionOptions`` has none)."""
    if trust.auth:
        raise ValueError("nnrp-py's native client cannot present a session auth token")
    import asyncio

    from nnrp.client.native import NativeClientSessionOptions, connect_native_client_connection
    from nnrp.core.enums import MessageType
    from nnrp.native import NativeInvalidStateError, NativeRuntimeError
    from nnrp.runtime.types import TraceContextMetadata

    observations = []
    anchor = trust.certificate_der()
    options = native_client_options(endpoint, trusted_der=anchor)
    with contextlib.ExitStack() as scope:
        try:
            connection = scope.enter_context(connect_native_client_connection(options))
        except NativeRuntimeError as exc:
            # The handshake's own reason does not cross nnrp-py's FFI (an internal
            # error, detail_code 106): name the one cause the trust anchor shows.
            if anchor is not None and self_signed_ca(anchor):
                raise ClientError(CA_ANCHOR_REFUSED) from exc
            raise ClientError(f"nnrp-py's native client could not connect ({exc})") from exc
        opening = time.perf_counter()
        session = asyncio.run(connection.open_session(NativeClientSessionOptions()))
        # No PING here: a terminal this soon after a CANCEL may have crossed it.
        window_ms = crossing_window_ms((time.perf_counter() - opening) * 1000)
        for number, request in enumerate(requests, start=1):
            observation = Observation(started=time.time())
            start = time.perf_counter()
            if request.trace:
                session.send_trace_context(TraceContextMetadata(
                    request.trace["trace_id"], request.trace["span_id"], 0, 0,
                    request.trace.get("flags", 1), 0), b"")
            session.submit_operation(native_openai_submit(number, number, request.envelope))
            final, dropped, drop_reason, partials = None, False, None, 0
            cancelled_at: float | None = None
            not_sent_at: float | None = None
            cancel_ms: float | None = None
            terminal_ms: float | None = None
            deadline = time.monotonic() + 60
            done = False
            while not done and time.monotonic() < deadline:
                batch = session.poll_events(max_events=NATIVE_POLL_BATCH, timeout_ms=20)
                for index, event in enumerate(batch):
                    header = getattr(event, "header", None)
                    if header is None or header.frame_id != number:
                        continue
                    t_ms = round((time.perf_counter() - start) * 1000, 3)
                    kind = header.message_type
                    if kind is MessageType.PARTIAL_RESULT:
                        partials += 1
                        body = json.loads(bytes(event.tail.body))
                        observation.events.append(body)
                        observation.frames.append({
                            "frame": "PARTIAL_RESULT", "t_ms": t_ms, "type": body.get("type"),
                            "sequence": event.metadata.value.result_sequence})
                        if request.cancel_after is not None and partials == request.cancel_after:
                            if _native_sent_cancel(connection, session, number,
                                                   batch[index + 1:],
                                                   NativeInvalidStateError):
                                cancelled_at = time.monotonic()
                                cancel_ms = t_ms
                                observation.frames.append({"frame": "CANCEL",
                                                           "direction": "sent", "t_ms": t_ms})
                            else:  # precondition 1 (module docstring)
                                not_sent_at = time.monotonic()
                                observation.inconclusive = _not_sent(partials)
                                observation.frames.append({"frame": "CANCEL",
                                                           "direction": "not sent",
                                                           "t_ms": t_ms})
                    elif kind is MessageType.RESULT_PUSH:
                        meta = event.metadata.value
                        observation.status = meta.status_code
                        typed = nnrp.parse_typed_body(
                            bytes(event.tail.body),
                            payload_kind_bitmap=int(meta.payload_kind_bitmap),
                            payload_frame_count=meta.payload_frame_count)
                        final = json.loads(bytes(typed.frames[0].payload))
                        observation.frames.append({"frame": "RESULT_PUSH", "t_ms": t_ms,
                                                   "status": meta.status_code,
                                                   "type": final.get("type")})
                        terminal_ms = t_ms
                        done = True
                    elif kind is MessageType.RESULT_DROP_REASON:
                        dropped = True
                        drop_reason = int(event.metadata.value.drop_reason_code)
                        observation.frames.append({"frame": "RESULT_DROP_REASON", "t_ms": t_ms,
                                                   "drop_reason": drop_reason})
                        done = True
                # nnrp-py hides results of operations it cancelled; its drop is the terminal.
                if cancelled_at is not None and not done and time.monotonic() - cancelled_at > 2:
                    dropped, done = True, True
                # nnrp-py refused the CANCEL as one for an inactive operation, yet no
                # terminal follows: it lost the operation (seen under a flood of events),
                # and the stream would run on for the rest of the run. The case is
                # inconclusive; the session is closed (the gateway ends the stream) and
                # the next case gets a new one.
                if (not_sent_at is not None and not done
                        and time.monotonic() - not_sent_at > LOST_OPERATION_WAIT):
                    observation.inconclusive = (
                        "nnrp-py's native client refused the CANCEL as one for an inactive "
                        "operation while its stream still ran (it lost the operation); "
                        "cancellation is neither proven nor disproven")
                    session.close()
                    session = asyncio.run(connection.open_session(NativeClientSessionOptions()))
                    done = True
            if not done:
                observation.problem = "no terminal within 60 s"
            if (final is not None and cancel_ms is not None and terminal_ms is not None
                    and terminal_ms - cancel_ms <= window_ms):  # precondition 2
                observation.inconclusive = _crossed(
                    f"it came {terminal_ms - cancel_ms:.1f} ms after the CANCEL, within "
                    f"the {window_ms:.0f} ms a CANCEL may take to reach the gateway and "
                    "its effect to come back")
            _finish_terminal(observation, final, dropped, drop_reason)
            observation.elapsed_ms = round((time.perf_counter() - start) * 1000, 3)
            observations.append(observation)
        session.close()
    return observations


def _native_sent_cancel(connection: Any, session: Any, number: int, rest: Any,
                        invalid_state: type[Exception]) -> bool:
    """Send operation ``number``'s CANCEL; False (not sent) when its terminal is already
    in hand: later in the batch polled (``rest``), or held by nnrp-py's runtime, which
    then refuses the CANCEL as one for an inactive operation."""
    from nnrp.core.enums import MessageType

    for event in rest:
        header = getattr(event, "header", None)
        if header is not None and header.frame_id == number and header.message_type in (
                MessageType.RESULT_PUSH, MessageType.RESULT_DROP_REASON):
            return False
    try:
        connection.cancel_runtime_operation(session, operation_id=number,
                                            control_sequence=1, reason_code=1)
    except invalid_state as exc:
        if "inactive operation" not in str(exc):
            raise
        return False
    return True


# --------------------------------------------------------------------------- plan execution


async def _backend_log(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        response = await client.get(f"{url.rstrip('/')}/__replay/log")
        response.raise_for_status()
        document: dict[str, Any] = response.json()
        return document


#: How long the backend may take to record the disconnects the cases expect.
DISCONNECT_WAIT_S = 5.0


async def _backend_log_with_disconnects(url: str, request_ids: list[str]) -> dict[str, Any]:
    """The backend's log once it has recorded a disconnect for each of ``request_ids``
    (it notices the gateway's abort on its own time, possibly after the client has its
    terminal), or as it is after ``DISCONNECT_WAIT_S``, when the check will say which
    is missing."""
    log = await _backend_log(url)
    with trio.move_on_after(DISCONNECT_WAIT_S):
        while not {d["request_id"] for d in log["disconnects"]} >= set(request_ids):
            await trio.sleep(0.05)  # the log is fetched, not pushed: poll it
            log = await _backend_log(url)
    return log


def _upstream_evidence(log: dict[str, Any] | None, request_id: str) -> dict[str, Any] | None:
    if log is None:
        return None
    requests = [r for r in log["requests"] if r["headers"].get("x-request-id") == request_id]
    disconnects = [d for d in log["disconnects"] if d["request_id"] == request_id]
    return {"requests": [{"path": r["path"], "headers": r["headers"], "scenario": r["scenario"],
                          "body": json.loads(r["body"]) if r["body"] else None}
                         for r in requests],
            "disconnects": disconnects}


def _check_upstream(expect: dict[str, Any], evidence: dict[str, Any] | None) -> str | None:
    if evidence is None:
        return "x_expect_upstream needs --backend-log (the replay backend's URL)"
    requests = evidence["requests"]
    if "requests" in expect and len(requests) != expect["requests"]:
        return f"upstream saw {len(requests)} request(s), expected {expect['requests']}"
    if "traceparent" in expect:
        sent = [r["headers"].get("traceparent") for r in requests]
        if sent != [expect["traceparent"]]:
            return f"upstream traceparent {sent}, expected {[expect['traceparent']]}"
    if expect.get("disconnected") and not evidence["disconnects"]:
        return "the upstream request was not aborted (no disconnect recorded)"
    return None


def _write_evidence(folder: Path, files: list[tuple[str, dict[str, Any]]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, document in files:
        (folder / name).write_text(json.dumps(document, indent=2) + "\n")


#: Suite recipes a real vLLM cannot answer as written, and why: with a scripted endpoint
#: (a gateway in front of the replay vLLM) they run there, and the results say so.
NEEDS_SCRIPTED_BACKEND = {
    "openai-compatible.chat.backend-error":
        "needs a backend that fails on demand (its model `backend-error`)",
    "openai-compatible.chat.tool-call-delta":
        "needs a model that follows automatic tool choice (the request cannot force one)",
}


async def run_plan(plan: dict[str, Any], endpoint: str, *, client: str = "builtin",
                   evidence_dir: Path | None = None, backend_log: str | None = None,
                   adapter: str = "nnrp-vllm-gateway",
                   scripted_endpoint: str | None = None, trust: Trust | None = None
                   ) -> dict[str, Any]:
    """Run every case; return an ``api-profile-case-results`` document. With
    ``scripted_endpoint``, the cases in ``NEEDS_SCRIPTED_BACKEND`` run there instead.
    ``trust`` is what a TLS endpoint (tcps, wss, quic) is checked against."""
    trust = trust or Trust()
    run_token = secrets.token_hex(4)
    requests = [case_request(case, number, run_token)
                for number, case in enumerate(plan["cases"], 1)]
    endpoints = [scripted_endpoint if scripted_endpoint is not None
                 and case["id"] in NEEDS_SCRIPTED_BACKEND else endpoint
                 for case in plan["cases"]]
    by_index: dict[int, Observation] = {}
    for target in dict.fromkeys(endpoints):
        indexes = [i for i, e in enumerate(endpoints) if e == target]
        batch = [requests[i] for i in indexes]
        if client == "native":
            observed = await trio.to_thread.run_sync(run_native, target, batch, trust)
        else:
            observed = await run_builtin(target, batch, trust)
        by_index.update(zip(indexes, observed, strict=True))
    observations = [by_index[i] for i in range(len(requests))]
    log = None
    if backend_log:
        log = await _backend_log_with_disconnects(backend_log, [
            r.request_id for r in requests
            if r.expect_upstream is not None and r.expect_upstream.get("disconnected")])
    results = []
    evidence_files: list[tuple[str, dict[str, Any]]] = []
    for number, (case, request, observation, case_endpoint) in enumerate(
            zip(plan["cases"], requests, observations, endpoints, strict=True), start=1):
        evidence = _upstream_evidence(log, request.request_id)
        # A precondition that did not happen leaves the expectations unjudged; a case
        # that broke on its own (no terminal) still fails.
        inconclusive = observation.inconclusive if observation.problem is None else None
        problem = observation.problem
        if problem is None and inconclusive is None:
            problem = check_case(case["expect"], observation.terminal, observation.events)
            if problem is None and request.expect_upstream is not None:
                problem = _check_upstream(request.expect_upstream, evidence)
        outcome = ("failed" if problem is not None
                   else "inconclusive" if inconclusive is not None else "passed")
        result: dict[str, Any] = {"id": case["id"],
                                  "outcome": "skipped" if outcome == "inconclusive"
                                  else outcome,
                                  "terminal": observation.terminal,
                                  "events": observation.events,
                                  "diagnostics": {"client": client, "endpoint": case_endpoint,
                                                  "backend": _backend_kind(case_endpoint,
                                                                           endpoint),
                                                  "status": observation.status,
                                                  "elapsed_ms": observation.elapsed_ms}}
        if problem is not None:
            result["message"] = problem
        if inconclusive is not None:
            result["message"] = INCONCLUSIVE + inconclusive
            result["diagnostics"]["inconclusive"] = inconclusive
        results.append(result)
        slug = re.sub(r"[^A-Za-z0-9]+", "-", case["id"]).strip("-")
        evidence_files.append((f"{number:03d}-{slug}.json", {
            "case": case["id"], "client": client, "endpoint": case_endpoint,
            "backend": _backend_kind(case_endpoint, endpoint),
            "why_scripted": NEEDS_SCRIPTED_BACKEND.get(case["id"])
            if case_endpoint != endpoint else None,
            "request_id": request.request_id,
            "envelope": json.loads(request.envelope), "frames": observation.frames,
            "terminal": observation.terminal, "status": observation.status,
            "elapsed_ms": observation.elapsed_ms, "upstream": evidence,
            "outcome": outcome, "message": problem or inconclusive}))
    if evidence_dir is not None:
        await trio.to_thread.run_sync(_write_evidence, evidence_dir, evidence_files)
    return {"$schema": "../schemas/api-profile-case-results.schema.json",
            "profile": "openai-compatible", "schema_version": "openai-compatible/1",
            "adapter": adapter, "results": results}
