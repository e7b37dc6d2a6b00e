"""What the observation record reads of one operation beyond what the engine notes.

The engine notes its own figures in each operation's ``OperationNotes`` (arrival, events,
bytes, resumes) and knows nothing more. The gateway gives every operation a
``RecordNotes`` instead (``GatewayServer(notes=RecordNotes)``, wired in ``gateway.app``):
the engine's figures, plus what the vLLM pipeline learns as it handles the operation
(the model, vLLM's status, timings and usage, a refusal, what vLLM's answer named) and
the span tracing decided for it (``GatewaySpan``). The pipeline fills them in as it
goes; ``build_record`` reads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from gateway.server import OperationNotes

if TYPE_CHECKING:
    from gateway.server import Operation


@attrs.frozen
class GatewaySpan:
    """The ids of the gateway's span for one operation (OpenTelemetry's sizes: a 128-bit
    trace id, a 64-bit span id), decided once, when the upstream request is built, so
    the ``traceparent`` vLLM gets and the exported span agree. ``parent_span_id`` is the
    client's NNRP span when it sent a TRACE_CONTEXT; ``sampled`` is the sampler's word
    (an unsampled span is never exported). ``upstream_span_id`` is its CLIENT child's,
    the request to vLLM: decided with it, so that when the gateway starts the trace,
    vLLM's ``traceparent`` can name that child and vLLM's spans sit under the request."""

    trace_id: int
    span_id: int
    parent_span_id: int | None
    sampled: bool
    upstream_span_id: int


@attrs.define
class RecordNotes(OperationNotes):
    """The engine's notes of one operation, and what its handler learned (the pipeline
    fills it in as it goes)."""

    model: str | None = None
    operation: str | None = None
    request_id: str | None = None
    stream: bool | None = None
    traceparent: str | None = None
    upstream_status: int | None = None
    upstream_started: float | None = None
    upstream_first_byte: float | None = None
    upstream_closed: float | None = None
    usage: dict[str, Any] | None = None
    diagnostics: bool = False
    backend: dict[str, str] | None = None
    #: vLLM's per-request ``metrics`` (0.32+, ``--enable-per-request-metrics``), as sent.
    backend_metrics: dict[str, Any] | None = None
    #: An overload refusal: who refused ("vllm", or "gateway" for load-aware admission)
    #: and why (the counter's reason label).
    refusal_source: str | None = None
    refusal_reason: str | None = None
    #: What vLLM's answer named (the completed body's ``model``, ``id`` and each
    #: choice's ``finish_reason``): the trace span's GenAI attributes.
    response_model: str | None = None
    response_id: str | None = None
    finish_reasons: tuple[str, ...] | None = None
    #: The gateway's own span, when tracing decided one at dispatch (or later).
    span: GatewaySpan | None = None


def notes_of(op: Operation) -> RecordNotes:
    """``op``'s notes as the pipeline and the record use them. An operation of a server
    not given ``notes=RecordNotes`` has only the engine's: a wiring error, said here."""
    notes = op.notes
    if not isinstance(notes, RecordNotes):
        raise TypeError(f"operation {op.operation_id} has {type(notes).__name__}, not "
                        f"RecordNotes: serve it with GatewayServer(notes=RecordNotes)")
    return notes
