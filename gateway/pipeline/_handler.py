"""The chat pipeline: one NNRP operation -> one vLLM request -> profile events.

    typed body ─▶ envelope ─▶ upstream request ─▶ httpx stream ─▶ SSE decode ─▶ chunk checks
        ─▶ translate ─▶ PARTIAL_RESULT per event ─▶ one terminal RESULT_PUSH

Time (architecture.md rule 2): the total timeout (``nnrp.timeout_ms`` or the configured
total) and the first-chunk / idle timeouts are cancel scopes; the idle clock is paused
while the gateway itself waits on a slow NNRP reader, so backpressure is never mistaken
for a stalled vLLM. An NNRP cancel or deadline cancels the operation's scope from
outside: the httpx stream is left, its socket closes, and vLLM aborts the request; the
connection then sends the RESULT_DROP_REASON and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import structlog
import trio

from gateway.nnrp import RefusalReason, SubmitRefused
from gateway.observe import build_record
from gateway.profile import (
    CAPABILITIES_OPERATION,
    CHAT_COMPLETIONS,
    ProfileError,
    check_typed_body,
    parse_envelope,
)
from gateway.profile import events as ev
from gateway.upstream import (
    SSEDecoder,
    SSEError,
    UpstreamError,
    UpstreamMalformed,
    UpstreamTimeout,
    VllmClient,
    VllmInfo,
    to_profile_error,
)

from ._chunks import parse_chunk, parse_completion
from ._request import UpstreamRequest, build_request
from ._translate import Translator

if TYPE_CHECKING:
    from gateway.server import OperationContext

MAX_COMPLETION_BODY = 64 * 1024 * 1024
log = structlog.get_logger("gateway.pipeline")


@attrs.frozen
class PipelineLimits:
    first_chunk_timeout: float = 120.0
    idle_timeout: float = 60.0
    total_timeout: float | None = None
    max_envelope_bytes: int = 4 << 20
    max_event_bytes: int = 4 << 20


@attrs.define
class OperationNotes:
    """What the pipeline learned about one operation (feeds the observation record)."""

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
    error_code: str | None = None
    diagnostics: bool = False
    backend: dict[str, str] | None = None


class ChatPipeline:
    """The operation handler for openai-compatible/1 over vLLM."""

    def __init__(self, client: VllmClient, info: Callable[[], VllmInfo | None],
                 capabilities: Callable[[], dict[str, Any]],
                 limits: PipelineLimits | None = None) -> None:
        self.client = client
        self.info = info
        self.capabilities = capabilities
        self.limits = limits or PipelineLimits()
        self.operations = frozenset({CHAT_COMPLETIONS, CAPABILITIES_OPERATION})

    async def __call__(self, op: OperationContext) -> None:
        notes = OperationNotes()
        op.notes = notes
        translator: Translator | None = None
        try:
            payload = check_typed_body(op.typed_body, op.body_error)
            envelope = parse_envelope(payload, max_bytes=self.limits.max_envelope_bytes,
                                      operations=self.operations)
            notes.operation, notes.model = envelope.operation, envelope.model or None
            if envelope.operation == CAPABILITIES_OPERATION:
                await self._finish(op, ev.completed(self.capabilities()))
                return
            info = self.info()
            if info is None:
                raise ProfileError("backend_unavailable",
                                   "vLLM is not ready (start-up probe has not succeeded)")
            request = build_request(envelope, session_id=op.session_id,
                                    operation_id=op.operation_id,
                                    connection_id=op.connection_id, trace=op.trace)
            notes.request_id, notes.stream = request.request_id, request.stream
            notes.traceparent = request.headers.get("traceparent")  # frozen at dispatch
            notes.diagnostics = envelope.policy.diagnostics
            notes.backend = {"backend_family": info.binding.family,
                             "vllm_version": info.version}
            structlog.contextvars.bind_contextvars(request_id=request.request_id,
                                                   session_id=op.session_id,
                                                   operation_id=op.operation_id)
            total = self.limits.total_timeout
            if envelope.policy.timeout_ms is not None:
                policy_total = envelope.policy.timeout_ms / 1000
                total = policy_total if total is None else min(total, policy_total)
            translator = Translator(info.binding, usage_requested=request.usage_requested,
                                    include_openai_chunk=envelope.policy.include_openai_chunk)
            with trio.move_on_after(total if total is not None else math.inf) as total_scope:
                if request.stream:
                    await self._stream(op, request, translator, notes)
                else:
                    await self._unary(op, request, info, notes)
            if total_scope.cancelled_caught:
                raise UpstreamTimeout("total", total or 0.0)
        except ProfileError as error:
            await self._fail(op, error, notes)
        except UpstreamError as error:
            if translator is not None:
                for event in translator.abort(str(error)):
                    await op.emit(ev.encode_event(event))
            await self._fail(op, to_profile_error(error), notes)
        except Exception as exc:  # a bug or an input we did not foresee: say so, once
            log.exception("pipeline failed", operation_id=op.operation_id)
            if not op.is_terminal:
                await self._fail(op, ProfileError(
                    "adapter_runtime_error", f"the gateway failed: {type(exc).__name__}"),
                    notes)

    # ------------------------------------------------------------------ streaming

    async def _stream(self, op: OperationContext, request: UpstreamRequest,
                      translator: Translator, notes: OperationNotes) -> None:
        limits = self.limits
        decoder = SSEDecoder(max_event=limits.max_event_bytes)
        clock = trio.CancelScope(deadline=trio.current_time() + limits.first_chunk_timeout)
        done = False
        got_bytes = False
        notes.upstream_started = trio.current_time()
        try:
            with clock:
                async with self.client.stream_chat(request.body, request.headers) as chunks:
                    notes.upstream_status = 200
                    async for raw in chunks:
                        if not got_bytes:
                            got_bytes = True
                            notes.upstream_first_byte = trio.current_time()
                        try:
                            sse_events = decoder.feed(raw)
                        except SSEError as exc:
                            raise UpstreamMalformed(str(exc)) from exc
                        clock.deadline = math.inf  # our own backpressure is not vLLM idling
                        for sse in sse_events:
                            if sse.is_done:
                                done = True
                                break
                            for event in translator.feed(parse_chunk(sse.data)):
                                await op.emit(ev.encode_event(event))
                        if done:
                            # The answer is complete: the client gets its terminal now, and
                            # only then is the connection's trailer read, so it is reused.
                            notes.upstream_closed = trio.current_time()
                            notes.usage = translator.usage
                            for event in translator.finish():
                                await op.emit(ev.encode_event(event))
                            await self._finish(op, ev.completed(translator.completed_body()))
                            await chunks.read_trailer()
                            break
                        clock.deadline = trio.current_time() + limits.idle_timeout
        finally:
            if notes.upstream_closed is None:
                notes.upstream_closed = trio.current_time()
                notes.usage = translator.usage
        if clock.cancelled_caught:
            kind = "idle" if got_bytes else "first_chunk"
            seconds = limits.idle_timeout if got_bytes else limits.first_chunk_timeout
            raise UpstreamTimeout(kind, seconds)
        if not done:
            raise UpstreamMalformed("vLLM's stream ended before data: [DONE]")

    # ------------------------------------------------------------------ non-streaming

    async def _unary(self, op: OperationContext, request: UpstreamRequest, info: VllmInfo,
                     notes: OperationNotes) -> None:
        clock = trio.CancelScope(deadline=trio.current_time() + self.limits.first_chunk_timeout)
        data = bytearray()
        notes.upstream_started = trio.current_time()
        try:
            with clock:
                async with self.client.stream_chat(request.body, request.headers) as chunks:
                    notes.upstream_status = 200
                    async for raw in chunks:
                        data += raw
                        if len(data) > MAX_COMPLETION_BODY:
                            raise UpstreamMalformed("completion body exceeds 64 MiB")
        finally:
            notes.upstream_closed = trio.current_time()
        if clock.cancelled_caught:
            raise UpstreamTimeout("first_chunk", self.limits.first_chunk_timeout)
        body = info.binding.normalize_body(parse_completion(bytes(data)))
        notes.usage = body.get("usage")
        await self._finish(op, ev.completed(body))

    # ------------------------------------------------------------------ terminals

    async def _finish(self, op: OperationContext, event: dict[str, Any]) -> None:
        await self._diagnostics(op, "ok")
        await op.finish(200, ev.encode_event(event), outcome="ok")

    async def _diagnostics(self, op: OperationContext, outcome: str) -> None:
        """``response.diagnostics`` (extension vllm.diagnostics), built from the same
        observation record as the log line and the metrics, just before the terminal."""
        notes = op.notes
        if not isinstance(notes, OperationNotes) or not notes.diagnostics:
            return
        record = attrs.evolve(build_record(op), outcome=outcome).as_dict()
        record["selected_model"] = record.pop("model", None)
        await op.emit(ev.encode_event(ev.diagnostics({**record, **(notes.backend or {})})))

    async def _fail(self, op: OperationContext, error: ProfileError,
                    notes: OperationNotes) -> None:
        notes.error_code = error.code
        await self._diagnostics(op, error.spec.outcome)
        backend_status = error.diagnostics.get("backend_status")
        if isinstance(backend_status, int):
            notes.upstream_status = backend_status
        await op.finish(error.spec.status, ev.encode_event(ev.error_event(error)),
                        outcome=error.spec.outcome)


_REFUSAL_CODES = {
    RefusalReason.DUPLICATE_OPERATION_ID: "duplicate_operation_id",
    RefusalReason.OPERATION_LIMIT: "adapter_operation_limit",
    RefusalReason.SESSION_CLOSING: "session_closing",
}


def profile_refusal(refusal: SubmitRefused) -> tuple[int, bytes]:
    """The profile's answer to a submit refused before it became an operation."""
    error = ProfileError(_REFUSAL_CODES[refusal.reason], refusal.message)
    return error.spec.status, ev.encode_event(ev.error_event(error))
