"""The wire scenarios a server target is checked with (the suite as client), run as the
Rust wire runner runs them and validated as strictly as its ``validate-wire-results``.

Scenarios (``EXECUTORS``; the bytes are the runner's, nnrp-rs ``wire_external.rs``, pinned
against nnrp-py's encoding in tests/conformance):

- ``wire.profile.openai-compatible.level1`` (and ``.ipc``, ``.websocket``): one FRAME_SUBMIT
  (operation 901, frame 1) with the frozen envelope for model ``reference-model``; then
  PARTIAL_RESULTs whose bodies are one raw JSON event each (no typed prelude, no SSE
  ``data:``), and a typed terminal RESULT_PUSH (status 200, bitmap 16, one
  STRUCTURED_EVENT frame, profile 0, schema 0/0, SNAPSHOT) holding ``response.completed``.
  PROGRESS is skipped, as the runner's executor skips it.
- ``wire.control.cancel-abort.client`` (and ``.ipc-client``): the runner's token-chunk
  FRAME_SUBMIT (operation 101, frame 1), then at once CANCEL (control_sequence 101, reason
  1, cooperative), in two writes as the runner does. Only TRACE_CONTEXT (header frame_id 0,
  on the session) and RESULT_DROP_REASON (code 3, operation 101) may come back.
- ``wire.control.deadline-before-submit.client``: DEADLINE (operation 151, frame 1,
  control_sequence 1, 4e12 ms) before its FRAME_SUBMIT; the first frame back must be the
  terminal RESULT_PUSH on frame 1, and (stricter than the runner) a success.

The runner's request is NNRP's token profile, which the gateway serves as a text
completion (``gateway.profile._token``): a real generation, so the CANCEL meets it
running, as it would meet any request.

QUIC (``quic://``). The suite's case files have no openai-compatible scenario for QUIC,
and its two QUIC scenarios are not the gateway's to claim:

- ``wire.control.capability-route-cache.client`` needs ``control.route_execution_hint``
  and ``cache.reference`` (the gateway routes nowhere and caches nothing; it answers
  CACHE_REFERENCE with CACHE_MISS but does not claim the token) and a RESULT_PUSH whose
  body is exactly the raw bytes ``wire-external-result``, while the gateway answers a
  token request with a real generation.
- ``wire.control.priority-deadline.proxy`` is ``suite_as_proxy`` (the manifest's only mode
  is ``suite_as_client``) and needs ``control.priority_update``, claimed only with
  ``--vllm-priority-scheduling``.

So over QUIC the probe runs the TCP scenarios' executors and expectations unchanged
(``VARIANTS``) and reports them under the project's own ids (``gateway.wire.quic.*``),
never under a suite id: they show that everything the TCP cases prove holds on QUIC, not
that a suite QUIC case passed. TLS over TCP (``tcps://``) is the same: the suite's
scenarios have no TLS tcp transport (its target schema holds tcp with ``tls: false``
only), so the TCP cases run over tcps under ``gateway.wire.tcps.*``. wss is the suite's
websocket transport with ``tls: true``: its websocket scenario runs there under its own
id. QUIC, tcps and wss endpoints are trusted through ``Trust`` (``--ca-file``).

Each scenario ends with SESSION_CLOSE, whose answer must be the very next frame.

Inconclusive (``_validate``). cancel-abort's CANCEL follows its submit at once, so it
meets the operation running unless the backend answered before the gateway read it (a
backend faster than a cancel). A RESULT_PUSH in place of the drop that comes within
``crossing_window_ms`` of the CANCEL (four hello round trips, at least 50 ms) may have
crossed it: the case is ``skipped`` with an ``inconclusive:`` message, never failed; a
later one came from a gateway that had read the CANCEL, and fails.

Validation (``validate_wire_case``), the runner's rules: the terminal is the case's; every observed
frame is in ``allowed_frames``; ``expect.frames`` is an ordered subsequence of the observed
frames; every ``frame_payload_invariants`` entry holds for every matching frame; every drop
has ``result_drop_reason_code``. Each receive waits at most the case's step timeout
(1000 ms), and the whole case at most that plus 5 s, as the runner allows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from gateway import nnrp
from gateway.manifest import SUITE_VERSION, transport_of
from gateway.tools.client import Trust
from gateway.transport import PacketTransport, connect as connect_transport

from ._suite import load_json, suite_dir
from ._validate import INCONCLUSIVE, crossing_window_ms

ENVELOPE = (b'{"schema_version":"openai-compatible/1","operation":"chat.completions.create",'
            b'"request_id":"req_wire_1","body":{"model":"reference-model","messages":'
            b'[{"role":"user","content":"ping"}],"stream":true}}')
#: The runner's request body for the runtime-control scenarios (one token chunk).
RUNNER_REQUEST = b"wire-external-request"
CASE_FILES = ("openai-compatible-e2e.json", "runtime-control-e2e.json")
#: The runner's whole-case allowance on top of the longest step timeout.
CASE_SLACK_MS = 5000
#: Before the first receive step the runner has only connected: hello and session open
#: count against the case, not a step.
HANDSHAKE_TIMEOUT_MS = 5000


#: The project's runs of suite scenarios that exist for plain TCP only, by the listener
#: scheme they run over (module docstring): the same executor and expectations, reported
#: under the project's id.
_TCP_CASES = {"openai-compatible.level1": "wire.profile.openai-compatible.level1",
              "cancel-abort": "wire.control.cancel-abort.client",
              "deadline-before-submit": "wire.control.deadline-before-submit.client"}
VARIANTS = {scheme: {f"gateway.wire.{scheme}.{name}": original
                     for name, original in _TCP_CASES.items()}
            for scheme in ("quic", "tcps")}
QUIC_VARIANTS = VARIANTS["quic"]


def scenarios() -> dict[str, dict[str, Any]]:
    """Every wire scenario of the vendored case files, by id, and the project's QUIC
    variants (marked ``adapted_from``: the suite scenario they copy)."""
    path = suite_dir() / "wire-conformance" / "nnrp-1-preview4" / "cases"
    found: dict[str, dict[str, Any]] = {}
    for name in CASE_FILES:
        for scenario in load_json(path / name)["scenarios"]:
            found[scenario["id"]] = scenario
    for scheme, variants in VARIANTS.items():
        for variant, original in variants.items():
            found[variant] = {**found[original], "id": variant,
                              "transport": transport_of(f"{scheme}://"),
                              "scheme": scheme, "adapted_from": original}
    return found


def runner_token_submit(operation_id: int) -> tuple[nnrp.FrameSubmit, bytes]:
    """The runner's FRAME_SUBMIT: one partial token chunk of ``RUNNER_REQUEST`` on the
    token profile (nnrp-rs ``token_submit``: latency budget 25 ms, loss tolerance strict)."""
    meta = nnrp.FrameSubmit(latency_budget_ms=25, operation_id=operation_id,
                            loss_tolerance=int(nnrp.LossTolerance.STRICT),
                            payload_kind_bitmap=int(nnrp.PayloadKind.TOKEN_CHUNK),
                            payload_frame_count=1)
    body = nnrp.pack_single_frame(
        RUNNER_REQUEST, profile_id=int(nnrp.StandardProfile.TOKEN),
        kind=int(nnrp.PayloadKind.TOKEN_CHUNK), flags=int(nnrp.DescriptorFlag.PARTIAL),
        schema_id=nnrp.TOKEN_SCHEMA_ID, schema_version=nnrp.TOKEN_SCHEMA_VERSION,
        stream_semantics=int(nnrp.StreamSemantics.APPEND))
    return meta, body


class CaseFailed(Exception):
    """The target broke the scenario; the message says how."""


class CaseInconclusive(Exception):
    """The scenario's precondition did not happen (module docstring); the message says
    what was seen instead. ``terminal`` is the terminal observed."""

    def __init__(self, message: str, terminal: str) -> None:
        super().__init__(message)
        self.terminal = terminal


class Exchange:
    """One scenario's connection: sends, receives with the step timeout, and the
    runner-built list of observed frames."""

    def __init__(self, transport: PacketTransport, step_timeout_ms: int, *,
                 auth: bytes = b"") -> None:
        self.transport = transport
        self.auth = auth
        self.client = nnrp.ClientConnection()
        self.step_timeout_ms = step_timeout_ms
        self.observed: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self._pending: list[nnrp.ClientEvent] = []
        self._start = time.perf_counter()
        #: The hello's round trip (``open``), for ``crossing_window_ms``.
        self.round_trip_ms = 0.0

    def note(self, direction: str, frame: str, **payload: Any) -> None:
        self.observed.append({"direction": direction, "frame": frame, "payload": payload,
                              "timestamp_us": int((time.perf_counter() - self._start) * 1e6)})

    async def send(self, *packets: bytes) -> None:
        await self.transport.send(list(packets))

    async def receive(self, timeout_ms: int | None = None) -> nnrp.ClientEvent:
        """The next event, within the step timeout (``timeout_ms`` overrides it)."""
        limit = (timeout_ms or self.step_timeout_ms) / 1000
        try:
            with trio.fail_after(limit):
                while not self._pending:
                    data = await self.transport.receive()
                    if data is None:
                        raise CaseFailed("the target closed the connection")
                    self._pending.extend(
                        self.client.receive_message(data, given_away=True)
                        if self.transport.message_based else self.client.receive_data(data))
        except trio.TooSlowError:
            raise CaseFailed(f"nothing arrived within {limit * 1000:.0f} ms") from None
        return self._pending.pop(0)

    async def open(self) -> int:
        sent = time.perf_counter()
        await self.send(self.client.hello())
        await self.receive(HANDSHAKE_TIMEOUT_MS)
        self.round_trip_ms = (time.perf_counter() - sent) * 1000
        await self.send(self.client.open_session(auth=self.auth))
        opened = await self.receive(HANDSHAKE_TIMEOUT_MS)
        if not isinstance(opened, nnrp.SessionOpenAnswered) or not opened.opened:
            raise CaseFailed("the target did not open a session")
        return opened.session_id

    async def close(self, session_id: int) -> None:
        """SESSION_CLOSE as the runner sends it; the answer must be the next frame."""
        await self.send(self.client.close_session(session_id, drain_timeout_ms=0,
                                                  close_tag=session_id))
        closed = await self.receive()
        if not isinstance(closed, nnrp.SessionCloseAcked):
            raise CaseFailed(f"SESSION_CLOSE was answered with {_name(closed)}, not "
                             "SESSION_CLOSE_ACK")


def _name(event: nnrp.ClientEvent) -> str:
    if isinstance(event, nnrp.OtherReceived):
        return event.packet.msg_type.name
    return {nnrp.PartialReceived: "PARTIAL_RESULT", nnrp.ResultReceived: "RESULT_PUSH",
            nnrp.DropReceived: "RESULT_DROP_REASON", nnrp.ErrorReceived: "ERROR",
            nnrp.SessionCloseAcked: "SESSION_CLOSE_ACK"}.get(type(event), type(event).__name__)


# --------------------------------------------------------------------------- executors


async def openai_level1(x: Exchange) -> str:
    session_id = await x.open()
    await x.send(x.client.submit(session_id, 901, 1, ENVELOPE))
    x.note("sent", "REQUEST", payload_frame_count=1, payload_kind="structured_event",
           payload_kind_bitmap=16, profile_id=0, schema_id=0, schema_version=0,
           stream_semantics="snapshot", stream_semantics_value=1,
           payload_encoding="utf-8-json", envelope_schema_version="openai-compatible/1")
    while True:
        event = await x.receive()
        if isinstance(event, nnrp.PartialReceived):
            x.note("received", "PARTIAL_RESULT", **_partial_fields(event))
        elif isinstance(event, nnrp.ResultReceived):
            x.note("received", "RESULT_PUSH", **_result_fields(event))
            break
        elif isinstance(event, nnrp.OtherReceived) and \
                event.packet.msg_type is nnrp.MsgType.PROGRESS:
            continue  # the runner's executor skips PROGRESS
        else:
            x.note("received", _name(event))
            raise CaseFailed(f"{_name(event)} before the terminal")
    await x.close(session_id)
    return "success"


def _partial_fields(event: nnrp.PartialReceived) -> dict[str, Any]:
    text = event.body.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        body = None
    raw_event = isinstance(body, dict) and not text.startswith("data:")
    framing = "sse" if text.startswith("data:") else "raw" if raw_event else "other"
    return {"body_encoding": "utf-8-json-event" if raw_event else "other",
            "body_framing": framing,
            "events_per_frame": 1 if raw_event else 0,
            "typed_payload_envelope": False, "sse_delimiters_allowed": False,
            "event_type": body.get("type") if isinstance(body, dict) else None,
            "result_sequence": event.sequence}


def _result_fields(event: nnrp.ResultReceived) -> dict[str, Any]:
    meta, typed = event.meta, event.typed_body
    frame = typed.frames[0] if typed is not None and len(typed.frames) == 1 else None
    descriptor = frame.descriptor if frame is not None else None
    final: Any = None
    if frame is not None:
        try:
            final = json.loads(bytes(frame.payload))
        except json.JSONDecodeError:
            final = None
    semantics = {1: "snapshot", 2: "append"}
    return {"status_code": meta.status_code, "payload_frame_count": meta.payload_frame_count,
            "payload_kind": "structured_event" if descriptor is not None
            and descriptor.payload_kind == nnrp.PayloadKind.STRUCTURED_EVENT else "other",
            "payload_kind_bitmap": meta.payload_kind_bitmap,
            "profile_id": descriptor.profile_id if descriptor else None,
            "schema_id": descriptor.schema_id if descriptor else None,
            "schema_version": descriptor.schema_version if descriptor else None,
            "stream_semantics": semantics.get(descriptor.stream_semantics, "other")
            if descriptor else None,
            "stream_semantics_value": descriptor.stream_semantics if descriptor else None,
            "payload_encoding": "utf-8-json" if final is not None else "other",
            "event_type": final.get("type") if isinstance(final, dict) else None}


async def cancel_abort(x: Exchange) -> str:
    session_id = await x.open()
    operation_id = 101
    meta, body = runner_token_submit(operation_id)
    # Two writes, as the runner: submit_encoded_nowait, then cancel_operation.
    await x.send(x.client.submit_frame(session_id, 1, meta, body))
    x.note("sent", "REQUEST", session_id=session_id, frame_id=1, operation_id=operation_id)
    await x.send(x.client.cancel(session_id, operation_id, frame_id=1,
                                 control_sequence=operation_id, reason=1))
    cancelled = time.perf_counter()
    x.note("sent", "CANCEL", session_id=session_id, operation_id=operation_id)
    trace = drop = False
    while not (trace and drop):
        event = await x.receive()
        if isinstance(event, nnrp.OtherReceived) and \
                event.packet.msg_type is nnrp.MsgType.TRACE_CONTEXT:
            packet = event.packet
            assert isinstance(packet.message, nnrp.TraceContext)
            if packet.session_id != session_id:
                # The runner routes by header.session_id: its session never sees this.
                raise CaseFailed(f"TRACE_CONTEXT on session {packet.session_id}, not "
                                 f"{session_id}")
            x.note("received", "TRACE_CONTEXT", session_id=packet.session_id,
                   frame_id=packet.frame_id, trace_id=packet.message.trace_id,
                   span_id=packet.message.span_id, body_bytes=len(packet.body))
            trace = True
        elif isinstance(event, nnrp.DropReceived):
            x.note("received", "RESULT_DROP_REASON", session_id=event.session_id,
                   operation_id=event.operation_id, drop_reason_code=event.drop_reason,
                   diagnostic_bytes=len(event.diagnostic))
            if event.operation_id != operation_id:
                raise CaseFailed("the drop reason is for another operation")
            drop = True
        elif isinstance(event, nnrp.ResultReceived) and event.operation_id == operation_id \
                and not drop:
            x.note("received", "RESULT_PUSH", session_id=event.session_id,
                   operation_id=event.operation_id, status_code=event.meta.status_code)
            after_ms = (time.perf_counter() - cancelled) * 1000
            window_ms = crossing_window_ms(x.round_trip_ms)
            if after_ms > window_ms:
                raise CaseFailed(f"RESULT_PUSH {after_ms:.0f} ms after the CANCEL, later "
                                 f"than it could have crossed it ({window_ms:.0f} ms): the "
                                 "gateway read the CANCEL and still answered")
            raise CaseInconclusive(
                f"the operation's RESULT_PUSH came {after_ms:.1f} ms after its CANCEL, "
                f"within the {window_ms:.0f} ms a CANCEL may take to reach the gateway "
                "and its effect to come back: the backend answered before the CANCEL "
                "reached the gateway (a backend faster than a cancel); cancellation is "
                "neither proven nor disproven",
                "success" if event.meta.status_code == 200 else "error")
        else:
            x.note("received", _name(event))
            raise CaseFailed(f"expected TRACE_CONTEXT or RESULT_DROP_REASON, got "
                             f"{_name(event)}")
    await x.close(session_id)
    return "cancelled"


async def deadline_before_submit(x: Exchange) -> str:
    session_id = await x.open()
    operation_id, deadline_ms = 151, 4_000_000_000_000
    await x.send(x.client.deadline(session_id, operation_id, deadline_ms, frame_id=1,
                                   control_sequence=1))
    x.note("sent", "DEADLINE", session_id=session_id, operation_id=operation_id,
           frame_id=1, unix_ms=deadline_ms)
    meta, body = runner_token_submit(operation_id)
    await x.send(x.client.submit_frame(session_id, 1, meta, body))
    x.note("sent", "REQUEST", session_id=session_id, frame_id=1, operation_id=operation_id)
    event = await x.receive()
    if not isinstance(event, nnrp.ResultReceived) or event.frame_id != 1:
        x.note("received", _name(event))
        raise CaseFailed(f"the first frame back is {_name(event)}, not the terminal "
                         "RESULT_PUSH on frame 1")
    x.note("received", "RESULT_PUSH", session_id=session_id,
           operation_id=event.operation_id, status_code=event.meta.status_code)
    if event.meta.status_code != 200:
        # The runner counts any result; the scenario's intent is the request served with
        # its reserved deadline, so the probe asks for success.
        raise CaseFailed(f"the result is status {event.meta.status_code}, not 200")
    await x.close(session_id)
    return "success"


Executor = Callable[[Exchange], Awaitable[str]]
EXECUTORS: dict[str, Executor] = {
    "wire.profile.openai-compatible.level1": openai_level1,
    "wire.profile.openai-compatible.level1.ipc": openai_level1,
    "wire.profile.openai-compatible.level1.websocket": openai_level1,
    "wire.control.cancel-abort.client": cancel_abort,
    "wire.control.cancel-abort.ipc-client": cancel_abort,
    "wire.control.deadline-before-submit.client": deadline_before_submit,
}
EXECUTORS.update({variant: EXECUTORS[original] for variants in VARIANTS.values()
                  for variant, original in variants.items()})


# --------------------------------------------------------------------------- validation


def validate_wire_case(scenario: dict[str, Any], terminal: str,
             observed: list[dict[str, Any]]) -> list[str]:
    """The runner's ``validate-wire-results`` rules for one case."""
    expect = scenario["expect"]
    problems = []
    if terminal != expect["terminal"]:
        problems.append(f"terminal {terminal}, expected {expect['terminal']}")
    frames = [entry["frame"] for entry in observed]
    allowed = set(expect["allowed_frames"])
    problems += [f"frame {frame} is not allowed" for frame in dict.fromkeys(frames)
                 if frame not in allowed]
    remaining = iter(frames)
    if not all(any(seen == wanted for seen in remaining) for wanted in expect["frames"]):
        problems.append(f"frames {frames} do not contain {expect['frames']} in order")
    for invariant in expect.get("frame_payload_invariants", ()):
        for entry in observed:
            if (entry["frame"], entry["direction"]) != (invariant["frame"],
                                                        invariant["direction"]):
                continue
            for field, wanted in invariant["fields"].items():
                if entry["payload"].get(field) != wanted:
                    problems.append(f"{entry['frame']} ({entry['direction']}) {field} is "
                                    f"{entry['payload'].get(field)!r}, expected {wanted!r}")
    if "result_drop_reason_code" in expect:
        codes = [entry["payload"].get("drop_reason_code") for entry in observed
                 if entry["frame"] == "RESULT_DROP_REASON"]
        if not codes or any(code != expect["result_drop_reason_code"] for code in codes):
            problems.append(f"drop reason codes {codes}, expected "
                            f"{expect['result_drop_reason_code']}")
    return list(dict.fromkeys(problems))


# --------------------------------------------------------------------------- running


def scenarios_for(endpoint: str) -> list[dict[str, Any]]:
    """The scenarios the probe runs against ``endpoint``: the suite-as-client cases of its
    transport that have an executor (for quic:// and tcps://, the project's variants)."""
    scheme = endpoint.split("://", 1)[0]
    if scheme in VARIANTS:
        return [s for s in scenarios().values() if s.get("scheme") == scheme]
    transport = transport_of(endpoint)
    return [s for s in scenarios().values() if s["mode"] == "suite_as_client"
            and s["transport"] == transport and "scheme" not in s and s["id"] in EXECUTORS]


async def probe(endpoint: str, scenario_id: str | None = None, *,
                trust: Trust | None = None) -> dict[str, Any]:
    """Run one scenario (the level-1 one of the endpoint's transport by default) against
    one endpoint; a ``wire-conformance-case-results`` entry."""
    trust = trust or Trust()
    if scenario_id is None:
        scenario = next(s for s in scenarios_for(endpoint)
                        if EXECUTORS[s["id"]] is openai_level1)
    else:
        scenario = scenarios()[scenario_id]
    step_timeout_ms = max((step.get("timeout_ms", 0) for step in scenario["steps"]),
                          default=0) or 1000
    terminal, problems, observed = "error", [], []
    inconclusive: CaseInconclusive | None = None
    async with trio.open_nursery() as nursery:
        exchange: Exchange | None = None
        try:
            with trio.fail_after((step_timeout_ms + CASE_SLACK_MS) / 1000):
                transport = await connect_transport(endpoint, nursery, trust.ssl_context(),
                                                    quic=trust.quic())
                exchange = Exchange(transport, step_timeout_ms, auth=trust.auth)
                try:
                    terminal = await EXECUTORS[scenario["id"]](exchange)
                finally:
                    await transport.aclose()
        except trio.TooSlowError:
            problems.append(f"the case took longer than the runner's "
                            f"{step_timeout_ms + CASE_SLACK_MS} ms")
        except CaseFailed as failure:
            problems.append(str(failure))
        except CaseInconclusive as unproven:
            inconclusive = unproven
        except (nnrp.ProtocolError, OSError, trio.BrokenResourceError) as exc:
            # A failed TLS handshake is a BrokenResourceError whose cause says why.
            problems.append(f"{type(exc).__name__}: {exc.__cause__ or exc}")
        finally:
            nursery.cancel_scope.cancel()
        if exchange is not None:
            observed = exchange.observed
    if inconclusive is not None and not problems:
        return {"id": scenario["id"], "outcome": "skipped",
                "terminal": inconclusive.terminal, "observed_frames": observed,
                "message": INCONCLUSIVE + str(inconclusive)}
    problems += validate_wire_case(scenario, terminal, observed) if not problems else []
    result: dict[str, Any] = {"id": scenario["id"],
                              "outcome": "passed" if not problems else "failed",
                              "terminal": terminal if not problems else "error",
                              "observed_frames": observed}
    if problems:
        result["message"] = "; ".join(dict.fromkeys(problems))
    elif "adapted_from" in scenario:
        original = scenarios()[scenario["adapted_from"]]
        result["message"] = (f"not a suite scenario: {original['id']} (the suite has it "
                             f"for plain {original['transport']} only) run over "
                             f"{scenario['scheme']} by the gateway's probe")
    return result


async def run_wire_probe(endpoints: list[str], *, target_name: str,
                         trust: Trust | None = None) -> dict[str, Any]:
    """Every scenario with an executor, on every endpoint's transport (every endpoint
    has some: an endpoint probed by nothing would pass by saying nothing)."""
    for endpoint in endpoints:
        if not scenarios_for(endpoint):
            raise ValueError(f"no wire scenario runs on {endpoint}")
    results = [await probe(endpoint, scenario["id"], trust=trust)
               for endpoint in endpoints for scenario in scenarios_for(endpoint)]
    return {"$schema": "../schemas/wire-conformance-case-results.schema.json",
            "protocol_version": "nnrp-1-preview4", "suite_version": SUITE_VERSION,
            "target_name": target_name, "results": results}
