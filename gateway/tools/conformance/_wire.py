"""The ``wire.profile.openai-compatible.level1`` scenario, as the vendored case describes it,
and the wire target manifest a suite runner polls for.

The probe is the suite as client: one FRAME_SUBMIT (operation 901, frame 1) with the frozen
envelope for model ``reference-model``; then PARTIAL_RESULTs whose bodies are one raw JSON
event each (no typed prelude, no SSE ``data:``), at least one output_text.delta, and a
typed terminal RESULT_PUSH (status 200, bitmap 16, one STRUCTURED_EVENT frame, profile 0,
schema 0/0, SNAPSHOT) holding ``response.completed``. PROGRESS is ignored; any other frame
before the terminal fails the case. The session is then closed (SESSION_CLOSE_ACK).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from gateway import nnrp
from gateway.transport import connect as connect_transport

from ._suite import load_json, suite_dir

SUITE_VERSION = "0.1.0"
ENVELOPE = (b'{"schema_version":"openai-compatible/1","operation":"chat.completions.create",'
            b'"request_id":"req_wire_1","body":{"model":"reference-model","messages":'
            b'[{"role":"user","content":"ping"}],"stream":true}}')
_SCENARIO_BY_TRANSPORT = {"tcp": "wire.profile.openai-compatible.level1",
                          "ipc": "wire.profile.openai-compatible.level1.ipc",
                          "websocket": "wire.profile.openai-compatible.level1.websocket"}


def scenarios() -> dict[str, dict[str, Any]]:
    path = suite_dir() / "wire-conformance" / "nnrp-1-preview4" / "cases"
    document = load_json(path / "openai-compatible-e2e.json")
    return {scenario["id"]: scenario for scenario in document["scenarios"]}


def transport_of(endpoint: str) -> str:
    return {"tcp": "tcp", "unix": "ipc", "ws": "websocket"}[endpoint.split("://")[0]]


async def probe(endpoint: str) -> dict[str, Any]:
    """Run the scenario against one endpoint; a ``wire-conformance-case-results`` entry."""
    transport_name = transport_of(endpoint)
    scenario = scenarios()[_SCENARIO_BY_TRANSPORT[transport_name]]
    observed: list[dict[str, Any]] = []
    problems: list[str] = []
    start = time.perf_counter()

    def note(direction: str, frame: str, **payload: Any) -> None:
        observed.append({"direction": direction, "frame": frame, "payload": payload,
                         "timestamp_us": int((time.perf_counter() - start) * 1e6)})

    terminal = "error"
    async with trio.open_nursery() as nursery:
        transport = await connect_transport(endpoint, nursery)
        client = nnrp.ClientConnection()
        pending: list[nnrp.ClientEvent] = []

        async def next_event(timeout_ms: int) -> nnrp.ClientEvent:
            with trio.fail_after(timeout_ms / 1000):
                while not pending:
                    data = await transport.receive()
                    if data is None:
                        raise EOFError("the target closed the connection")
                    pending.extend(client.receive_message(data) if transport.message_based
                                   else client.receive_data(data))
            return pending.pop(0)

        try:
            await transport.send([client.hello()])
            await next_event(5000)
            await transport.send([client.open_session()])
            opened = await next_event(5000)
            if not isinstance(opened, nnrp.SessionOpenAnswered) or not opened.opened:
                raise EOFError("the target did not open a session")
            session_id = opened.session_id
            await transport.send([client.submit(session_id, 901, 1, ENVELOPE)])
            note("sent", "REQUEST", payload_frame_count=1, payload_kind="structured_event",
                 payload_kind_bitmap=16, profile_id=0, schema_id=0, schema_version=0,
                 stream_semantics="snapshot", stream_semantics_value=1,
                 payload_encoding="utf-8-json", envelope_schema_version="openai-compatible/1")
            deltas = 0
            first_timeout = 5000  # the model's first token; later frames use the case's 1000 ms
            while True:
                event = await next_event(first_timeout if not deltas else 1000)
                if isinstance(event, nnrp.PartialReceived):
                    text = event.body.decode("utf-8", "replace")
                    try:
                        body = json.loads(text)
                    except json.JSONDecodeError:
                        body = None
                    if text.startswith("data:") or not isinstance(body, dict):
                        problems.append("PARTIAL_RESULT body is not one raw JSON event "
                                        f"(starts {text[:20]!r})")
                        body = {}
                    deltas += body.get("type") == "response.output_text.delta"
                    note("received", "PARTIAL_RESULT", body_encoding="utf-8-json-event",
                         body_framing="raw", events_per_frame=1, typed_payload_envelope=False,
                         sse_delimiters_allowed=False, event_type=body.get("type"),
                         result_sequence=event.sequence)
                elif isinstance(event, nnrp.ResultReceived):
                    problems += _check_terminal(event)
                    final = (json.loads(event.typed_body.frames[0].payload)
                             if event.typed_body else {})
                    descriptor = event.typed_body.frames[0].descriptor if event.typed_body else None
                    note("received", "RESULT_PUSH", status_code=event.meta.status_code,
                         payload_frame_count=event.meta.payload_frame_count,
                         payload_kind="structured_event", payload_kind_bitmap=
                         event.meta.payload_kind_bitmap,
                         profile_id=descriptor.profile_id if descriptor else None,
                         schema_id=descriptor.schema_id if descriptor else None,
                         schema_version=descriptor.schema_version if descriptor else None,
                         stream_semantics="snapshot", stream_semantics_value=
                         descriptor.stream_semantics if descriptor else None,
                         payload_encoding="utf-8-json", event_type=final.get("type"))
                    if final.get("type") != "response.completed":
                        problems.append(f"terminal event is {final.get('type')}")
                    terminal = "success" if not problems else "error"
                    break
                elif isinstance(event, nnrp.OtherReceived) and \
                        event.packet.msg_type is nnrp.MsgType.PROGRESS:
                    continue  # allowed and ignored
                else:
                    name = type(event).__name__
                    problems.append(f"undeclared frame before the terminal: {name}")
                    note("received", name)
                    break
            if deltas == 0:
                problems.append("no response.output_text.delta before the terminal")
            await transport.send([client.close_session(session_id)])
            closed = await next_event(5000)
            if not isinstance(closed, nnrp.SessionCloseAcked):
                problems.append("SESSION_CLOSE was not acknowledged")
        except (TimeoutError, trio.TooSlowError):
            problems.append("timed out waiting for the target")
        except (EOFError, nnrp.ProtocolError, OSError) as exc:
            problems.append(f"{type(exc).__name__}: {exc}")
        finally:
            await transport.aclose()
            nursery.cancel_scope.cancel()
    expected = [f for f in scenario["expect"]["frames"]]
    frames = [entry["frame"] for entry in observed]
    if [f for f in frames if f in expected][:1] != expected[:1] or not set(expected) <= set(frames):
        problems.append(f"frames {frames} lack the expected sequence {expected}")
    allowed = set(scenario["expect"]["allowed_frames"])
    problems += [f"frame {f} is not allowed" for f in frames if f not in allowed]
    result: dict[str, Any] = {"id": scenario["id"],
                              "outcome": "passed" if not problems else "failed",
                              "terminal": terminal if not problems else "error",
                              "observed_frames": observed}
    if problems:
        result["message"] = "; ".join(dict.fromkeys(problems))
    return result


def _check_terminal(event: nnrp.ResultReceived) -> list[str]:
    problems = []
    meta = event.meta
    if meta.status_code != 200:
        problems.append(f"RESULT_PUSH status {meta.status_code}, expected 200")
    if meta.payload_kind_bitmap != 16 or meta.payload_frame_count != 1:
        problems.append("RESULT_PUSH is not one STRUCTURED_EVENT frame")
    if event.typed_body is None or len(event.typed_body.frames) != 1:
        problems.append("RESULT_PUSH has no typed body")
        return problems
    descriptor = event.typed_body.frames[0].descriptor
    if (descriptor.profile_id, descriptor.payload_kind, descriptor.schema_id,
            descriptor.schema_version, descriptor.stream_semantics) != (0, 16, 0, 0, 1):
        problems.append(f"RESULT_PUSH descriptor {descriptor} is not the frozen mapping")
    return problems


async def run_wire_probe(endpoints: list[str], *, target_name: str) -> dict[str, Any]:
    results = [await probe(endpoint) for endpoint in endpoints]
    return {"$schema": "../schemas/wire-conformance-case-results.schema.json",
            "protocol_version": "nnrp-1-preview4", "suite_version": SUITE_VERSION,
            "target_name": target_name, "results": results}


def target_manifest(endpoints: list[str], *, target_name: str, max_frame_bytes: int,
                    max_in_flight: int) -> dict[str, Any]:
    """The wire target manifest (schema wire-conformance-target) for bound listeners."""
    transports = []
    for endpoint in endpoints:
        name = transport_of(endpoint)
        locator = endpoint.removeprefix("tcp://") if name == "tcp" else endpoint
        transports.append({"name": name, "endpoint": locator, "tls": False})
    return {"$schema": "../schemas/wire-conformance-target.schema.json",
            "target_name": target_name, "protocol_version": "nnrp-1-preview4",
            "suite_version": SUITE_VERSION,
            "wire_conformance": {"modes": ["suite_as_client"], "transports": transports,
                                 "capabilities": ["profile.openai-compatible.level1.wire"],
                                 "limits": {"max_frame_bytes": max_frame_bytes,
                                            "max_in_flight": max_in_flight}}}


def write_atomically(path: Path, document: dict[str, Any]) -> None:
    """Readers polling for ``path`` (the suite's readiness signal) never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False,
                                     suffix=".tmp") as handle:
        handle.write(json.dumps(document, indent=2) + "\n")
        temporary = handle.name
    os.replace(temporary, path)
