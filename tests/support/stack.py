"""The whole stack on loopback: replay vLLM (trio + h11) and the gateway on free ports."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from gateway import nnrp
from gateway.app import Gateway, GatewayConfig
from gateway.tools.replay import ReplayServer

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gateway.observe import ObservationRecord
    from gateway.server import Operation
    from gateway.tools.client import ClientSession, NnrpClient

_ids = itertools.count(1)


def envelope(body: dict[str, Any], *, request_id: str | None = None,
             nnrp_policy: dict[str, Any] | None = None) -> bytes:
    document: dict[str, Any] = {"schema_version": "openai-compatible/1",
                                "operation": "chat.completions.create", "body": body}
    if request_id is not None:
        document["request_id"] = request_id
    if nnrp_policy is not None:
        document["nnrp"] = nnrp_policy
    return json.dumps(document).encode()


def chat(model: str = "example-model", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello"}], **extra}


def scenario_id(name: str) -> str:
    """A request id that makes the replay server play ``name``."""
    return f"replay:{name}:{next(_ids)}"


@attrs.define
class Outcome:
    partials: list[dict[str, Any]]
    terminal: Any
    status: int | None
    final: dict[str, Any] | None

    @property
    def types(self) -> list[str]:
        return [p["type"] for p in self.partials]


async def run_operation(session: ClientSession, payload: bytes, **kw: Any) -> Outcome:
    operation = await session.submit(payload, **kw)
    partials, terminal = [], None
    async for event in operation.events():
        if isinstance(event, nnrp.PartialReceived):
            partials.append(json.loads(event.body))
        else:
            terminal = event
    final = status = None
    if isinstance(terminal, nnrp.ResultReceived):
        status = terminal.meta.status_code
        assert terminal.typed_body is not None
        final = json.loads(terminal.typed_body.frames[0].payload)
    return Outcome(partials, terminal, status, final)


@attrs.define
class Stack:
    replay: ReplayServer
    gateway: Gateway
    nursery: trio.Nursery

    def uri(self, transport: str = "tcp") -> str:
        return next(e.uri for e in self.gateway.endpoints if e.transport == transport)


async def start_stack(nursery: trio.Nursery, socket_dir: Path, *,
                      replay: ReplayServer | None = None, extra_listen: tuple[str, ...] = (),
                      **config: Any) -> Stack:
    """``extra_listen``: more listeners, e.g. ``quic://127.0.0.1:0`` (with ``tls=``)."""
    replay = replay or ReplayServer(speed=50.0)
    url = await nursery.start(replay.serve)
    gateway = Gateway(GatewayConfig(
        listen=("tcp://127.0.0.1:0", f"unix://{socket_dir}/gw.sock", "ws://127.0.0.1:0/nnrp",
                *extra_listen),
        vllm_url=url, **{"probe_interval": 0.05, "health_interval": 0.2, **config}))
    await nursery.start(gateway.run)
    with trio.fail_after(5):
        await gateway.probed.wait()
    return Stack(replay, gateway, nursery)


def live_operations(gateway: Gateway) -> list[Operation]:
    """The operations ``gateway`` is running now, on every connection and session."""
    return [operation for connection in gateway.server.connections
            for session in connection.sessions.values()
            for operation in session.operations.values()]


def records_of(stack: Stack) -> list[ObservationRecord]:
    """Every observation record the gateway makes from now on (it still logs and counts)."""
    records: list[ObservationRecord] = []
    observe = stack.gateway.metrics.observe

    def spy(record: ObservationRecord) -> None:
        records.append(record)
        observe(record)

    stack.gateway.metrics.observe = spy  # type: ignore[method-assign]
    return records


def metric_samples(registry: CollectorRegistry
                   ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample in ``registry`` by (name, sorted labels)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in registry.collect() for s in family.samples}


async def stream_through_signal(client: NnrpClient, pid: int, signum: int, *,
                                max_tokens: int = 60, after: int = 5) -> list[Any]:
    """Stream ``max_tokens`` tokens on a new session, sending ``signum`` to ``pid`` once
    ``after`` events have arrived; every event, the terminal last."""
    session = await client.open_session()
    operation = await session.submit(envelope(chat(stream=True, max_tokens=max_tokens)))
    events = []
    async for event in operation.events():
        events.append(event)
        if len(events) == after:
            os.kill(pid, signum)
    return events


def registry_of(stack: Stack) -> Any:
    """The gateway's resumable sessions (resume must be on)."""
    registry = stack.gateway.server.registry
    assert registry is not None
    return registry
