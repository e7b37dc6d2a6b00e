"""The chat pipeline: one NNRP operation -> one vLLM request -> profile events.

    typed body ─▶ envelope ─▶ upstream request ─▶ checked chunks (gateway.upstream)
        ─▶ translate ─▶ PARTIAL_RESULT per event ─▶ one terminal RESULT_PUSH

Each stage is a pure function or a small class (``parse_envelope``, ``build_request``,
``Translator``); this module only strings them together and owns the clocks the stages
do not: the total timeout (``nnrp.timeout_ms`` or the configured total) is a cancel
scope around the upstream exchange. The first-chunk and idle clocks belong to the
upstream stream, which times its reads only, so a slow NNRP reader never looks like a
stalled vLLM.

The terminal goes out after the upstream exchange has closed (the connection is back in
its slot). An NNRP cancel or deadline cancels the operation's scope from outside: the
upstream stream is left, its socket closes, vLLM aborts the request, and the operation
sends its own drop (gateway.server).

Runtime controls taken at dispatch: a PRIORITY_UPDATE (or the session's priority class)
becomes vLLM's priority when vLLM schedules by priority: the ``X-Vllm-Priority`` header
where the bound vLLM line reads it (0.32+, which prefers it over the body's field:
``OpenAIServing._get_priority``), so the request body stays the client's; older lines
get the body's ``priority`` field. A token budget caps
``max_tokens``. While streaming, each chunk's tokens are spent from the budget before its
events go out, so a budget lowered mid-stream ends the operation (budget_exceeded) with
no token past it. Stage transitions (PROGRESS) are marked where they happen.

Load: with load-aware admission on (``load``, a ``LoadMonitor``), an operation is refused
before vLLM is called while vLLM's published load is past the thresholds
(scheduler_rejected, recoverable, with the monitor's retry time). vLLM's own refusals
(``gateway.upstream._errors``' table) end as backend_overload with the same retry rule
(from vLLM's queue when sampled, else ``overload_retry_after_ms``); a dead engine's
500 tells the gateway (``engine_dead``), which stops calling vLLM ready until ``/health``
recovers; the same message mid-stream only wakes the health check. vLLM's per-request
``metrics`` (final chunk, or the body) go into the operation's notes (``RecordNotes``:
what the pipeline learns, for the observation record), and so into the record.

A submit in NNRP's token profile (TOKEN_CHUNK frames, profile 2) is no envelope: it takes
the text-completion path (``_token_completion``, rules in ``gateway.profile._token``).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import structlog
import trio

from gateway.nnrp import TOKEN_TEXT_FRAME, Stage
from gateway.observe import Tracer, build_record, notes_of
from gateway.profile import (
    CAPABILITIES_OPERATION,
    CHAT_COMPLETIONS,
    DEFAULT_MAX_ENVELOPE_BYTES,
    DEFAULT_MAX_MEDIA_BYTES,
    TOKEN_COMPLETION,
    EndCause,
    ProfileError,
    events as ev,
    is_token_request,
    plan_media,
    read_envelope_steps,
    read_typed_body,
    token_prompt,
)
from gateway.upstream import (
    CHAT_PATH,
    PRIORITY_HEADER,
    TEXT_COMPLETION_PATH,
    Completion,
    LoadMonitor,
    RequestBody,
    RequestFieldError,
    Standing,
    UpstreamError,
    UpstreamOverloaded,
    UpstreamStatus,
    UpstreamTimeout,
    VllmClient,
    VllmInfo,
    engine_dead,
    lax_int,
    output_token_limit,
    refusal_of,
    to_profile_error,
)

from ._media import MediaDelivery, stepped
from ._plain_delta import PlainDelta, plain_blocks_of, plain_delta_mode
from ._request import (
    UpstreamRequest,
    build_request,
    upstream_headers,
    upstream_traceparent,
    vllm_priority,
)
from ._translate import Translator, forces_tool_choice, token_count

if TYPE_CHECKING:
    from gateway.nnrp import SubmitRefused
    from gateway.server import Operation

log = structlog.get_logger("gateway.pipeline")


@attrs.frozen
class PipelineLimits:
    first_chunk_timeout: float = 120.0
    idle_timeout: float = 60.0
    total_timeout: float | None = None
    max_envelope_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
    #: A submit's media frames together (``gateway.profile._media`` rule M1).
    max_media_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    max_event_bytes: int = 4 << 20
    #: vLLM runs with ``--scheduling-policy priority`` (declared: vLLM cannot be asked).
    priority_scheduling: bool = False
    #: The retry time told with backend_unavailable while vLLM is not ready.
    unavailable_retry_after_ms: int = 1000
    #: The output cap of a token-profile request (its prompt carries no parameters).
    token_profile_max_tokens: int = 64
    #: The retry time told with vLLM's own refusals when its queue is not sampled.
    overload_retry_after_ms: int = 1000
    #: Each upstream request carries its NNRP session's opaque id as ``X-Session-ID``
    #: (``_request``): a router in front of data-parallel engines keeps the session on one.
    session_header: bool = True


class ChatPipeline:
    """The operation handler for openai-compatible/1 over vLLM."""

    def __init__(self, client: VllmClient, info: Callable[[], VllmInfo | None],
                 capabilities: Callable[[], dict[str, Any]],
                 limits: PipelineLimits | None = None, *,
                 load: LoadMonitor | None = None, admission: bool = False,
                 on_engine_dead: Callable[[], None] | None = None,
                 tracer: Tracer | None = None,
                 media: MediaDelivery | None = None) -> None:
        self.client = client
        self.info = info
        self.capabilities = capabilities
        self.limits = limits or PipelineLimits()
        self.operations = frozenset({CHAT_COMPLETIONS, CAPABILITIES_OPERATION})
        #: vLLM's sampled load: retry times, and (``admission``) refusals before dispatch.
        self.load = load
        self.admission = admission and load is not None
        self.on_engine_dead = on_engine_dead
        #: Tracing: the gateway's span is decided here, with the upstream
        #: request, so the traceparent vLLM gets and the exported span agree.
        self.tracer = tracer
        #: How a request's media frames reach vLLM (``_media``: data URIs by default).
        self.media = media or MediaDelivery()
        #: What reads the plain text delta fused (``_plain_delta`` rule 7: the C
        #: function or the pure one; None: every read the general way), from
        #: ``NNRP_GATEWAY_PLAIN_DELTA``.
        self.plain_blocks = plain_blocks_of(plain_delta_mode())

    async def __call__(self, op: Operation) -> None:
        notes = notes_of(op)
        translator: Translator | None = None
        try:
            if is_token_request(op.typed_body):
                await self._token_completion(op)
                return
            submit = read_typed_body(op.typed_body, op.body_error,
                                     max_media_bytes=self.limits.max_media_bytes)
            nonce = secrets.token_hex(8)  # the request's placeholders (_media M7, _literals L2)
            envelope, cuts = await stepped(read_envelope_steps(
                submit.envelope, nonce=nonce, max_bytes=self.limits.max_envelope_bytes,
                operations=self.operations))
            media = plan_media(envelope.body, submit.media, nonce=nonce,
                               objects=op.read_object, cached=op.read_cached,
                               max_bytes=self.limits.max_media_bytes)
            notes.operation, notes.model = envelope.operation, envelope.model or None
            if envelope.policy.progress:
                op.enable_progress()
            op.stage(Stage.PREPROCESSING)
            if envelope.operation == CAPABILITIES_OPERATION:
                await self._complete(op, ev.encode_event(ev.completed(self.capabilities())))
                return
            info = self.info()
            if info is None:
                raise ProfileError(EndCause.BACKEND_UNAVAILABLE,
                                   "vLLM is not ready (start-up probe has not succeeded)",
                                   retry_after_ms=self.limits.unavailable_retry_after_ms)
            self._admit(op)
            self._decide_span(op)
            request = build_request(envelope, session_id=op.session_id,
                                    operation_id=op.operation_id,
                                    connection_id=op.connection_id, trace=op.trace,
                                    span=notes.span, session_uid=self._session_uid(op))
            self._apply_controls(op, request.body, request.headers, info)
            notes.request_id, notes.stream = request.request_id, request.stream
            notes.traceparent = request.headers.get("traceparent")  # frozen at dispatch
            notes.diagnostics = envelope.policy.diagnostics
            notes.backend = {"backend_family": info.binding.family,
                             "vllm_version": info.version}
            structlog.contextvars.bind_contextvars(request_id=request.request_id,
                                                   session_id=op.session_id,
                                                   operation_id=op.operation_id)
            total = self._total_timeout(envelope.policy.timeout_ms)
            completed: bytes | None = None
            with trio.move_on_after(total):
                # The request's media (if any) reach vLLM inside the body or as files
                # that live as long as this exchange (``_media``).
                async with self.media.deliver(media, request.body, cuts) as content:
                    if request.stream:
                        translator = Translator(
                            info.binding, usage_requested=request.usage_requested,
                            include_openai_chunk=envelope.policy.include_openai_chunk,
                            forced_tool_choice=forces_tool_choice(request.body))
                        body = await self._stream(op, request, translator, content)
                        _note_response(op, body)
                        completed = ev.encode_event(ev.completed(body))
                    else:
                        # vLLM's body as vLLM sent it: decoded once to be checked and
                        # read (usage, metrics, the span's names), never encoded again.
                        answer = await self._unary(op, request.body, request.headers,
                                                   content=content)
                        _note_response(op, answer.body)
                        completed = ev.completed_text(answer.text)
            if completed is None:
                raise UpstreamTimeout("total", total)
            await self._complete(op, completed)
        except ProfileError as error:
            await self._fail(op, error)
        except UpstreamError as failure:  # not error, a ProfileError (compiled.py 4)
            if translator is not None:
                for event in translator.abort(str(failure)):
                    await op.emit(ev.encode_event(event))
            await self._fail(op, self._upstream_failure(op, failure))
        except Exception as exc:  # a bug or an input we did not foresee: say so, once
            log.exception("pipeline failed", operation_id=op.operation_id)
            if not op.is_terminal:
                await self._fail(op, ProfileError(
                    EndCause.ADAPTER_RUNTIME_ERROR, f"the gateway failed: {type(exc).__name__}"))

    def _session_uid(self, op: Operation) -> str | None:
        """The id the request's ``X-Session-ID`` carries; None: no such header."""
        return op.session_uid if self.limits.session_header else None

    def _decide_span(self, op: Operation) -> None:
        """The gateway's span for this operation, once (``gateway.observe._spans`` rule 3)."""
        notes = notes_of(op)
        if self.tracer is not None and notes.span is None:
            notes.span = self.tracer.decide(op.trace)

    def _admit(self, op: Operation) -> None:
        """Load-aware admission (``gateway.upstream._load``'s table): refused before
        vLLM is called while its sampled load is past a threshold."""
        if not self.admission:
            return
        assert self.load is not None
        decision = self.load.decision()
        if not decision.refused:
            return
        assert decision.reason is not None
        notes = notes_of(op)
        notes.refusal_source, notes.refusal_reason = "gateway", str(decision.reason)
        raise ProfileError(EndCause.SCHEDULER_REJECTED,
                           f"vLLM is loaded past this gateway's threshold "
                           f"({decision.reason}); retry later or elsewhere",
                           diagnostics={"admission_reason": str(decision.reason)},
                           retry_after_ms=decision.retry_after_ms)

    def _upstream_failure(self, op: Operation, error: UpstreamError) -> ProfileError:
        """The profile error of a vLLM failure, with what the gateway learns from it:
        a refusal's reason and retry time, a dead engine."""
        refusal = refusal_of(error)
        retry_after_ms = None
        if refusal is not None or isinstance(error, UpstreamOverloaded):
            retry_after_ms = (self.load.retry_after_ms() if self.load is not None
                              else self.limits.overload_retry_after_ms)
        if refusal is not None:
            notes = notes_of(op)
            notes.refusal_source, notes.refusal_reason = "vllm", str(refusal)
        if engine_dead(error):
            if isinstance(error, UpstreamStatus) and self.on_engine_dead is not None:
                self.on_engine_dead()  # vLLM refused the request for it: not ready now
            else:
                # Said mid-stream (an engine failing inside one request may yet recover):
                # /health decides, asked now rather than at the next interval.
                self.client.recheck()
        return to_profile_error(error, retry_after_ms=retry_after_ms)

    def _apply_controls(self, op: Operation, body: dict[str, Any], headers: dict[str, str],
                        info: VllmInfo) -> None:
        """What runtime controls decided before dispatch, into the request; from here on
        the request is vLLM's and live updates come too late (``dispatched_at``)."""
        if self.limits.priority_scheduling:
            priority = vllm_priority(op.priority_class, op.priority_delta)
            value: int | None = None
            if op.priority_requested:
                value = priority or 0
            elif priority is not None and "priority" not in body:
                value = priority
            if value is not None and info.binding.priority_header:
                headers[PRIORITY_HEADER] = str(value)  # 0.32+: read before the body's
            elif value is not None:
                body["priority"] = value
        budget = op.token_budget
        if budget is not None:
            # The field vLLM obeys (max_completion_tokens wins), read as vLLM reads it. It
            # limits each choice, while the budget counts them all: n shares it.
            try:
                limit = output_token_limit(body)
                choices = lax_int(body.get("n"), "n") or 1
            except RequestFieldError as error:
                raise ProfileError(EndCause.INVALID_BODY, str(error),
                                   param=error.field) from None
            per_choice = max(1, budget // max(choices, 1))
            field, value = limit if limit is not None else ("max_tokens", per_choice)
            body[field] = min(value, per_choice)
        op.dispatched_at = trio.current_time()

    async def _token_completion(self, op: Operation) -> None:
        """NNRP's token profile as vLLM's text completion (``profile._token``). Failures
        propagate to ``__call__``, which ends the operation as for chat."""
        assert op.typed_body is not None
        notes = notes_of(op)
        notes.operation = TOKEN_COMPLETION
        prompt = token_prompt(op.typed_body)
        op.stage(Stage.PREPROCESSING)
        info = self.info()
        if info is None or not info.models:
            raise ProfileError(EndCause.BACKEND_UNAVAILABLE,
                               "vLLM is not ready (start-up probe has not succeeded)",
                               retry_after_ms=self.limits.unavailable_retry_after_ms)
        notes.model = info.models[0]
        self._admit(op)
        body: dict[str, Any] = {"model": info.models[0], "prompt": prompt,
                                "max_tokens": self.limits.token_profile_max_tokens}
        request_id = f"nnrp-{op.connection_id}-{op.session_id}-{op.operation_id}"
        headers = upstream_headers(request_id, self._session_uid(op))
        self._apply_controls(op, body, headers, info)
        self._decide_span(op)
        parent = upstream_traceparent(op.trace, notes.span)
        if parent is not None:
            headers["traceparent"] = parent
        notes.request_id, notes.stream, notes.traceparent = request_id, False, parent
        answer = (await self._unary(op, body, headers, path=TEXT_COMPLETION_PATH)).body
        _note_response(op, answer)
        text = "".join(choice.get("text") or "" for choice in answer["choices"]
                       if isinstance(choice, dict))
        await op.close(EndCause.COMPLETED, text.encode("utf-8"), frame=TOKEN_TEXT_FRAME)

    def _total_timeout(self, policy_ms: int | None) -> float:
        total = self.limits.total_timeout
        if policy_ms is not None:
            total = policy_ms / 1000 if total is None else min(total, policy_ms / 1000)
        return math.inf if total is None else total

    # ------------------------------------------------------------------ upstream

    async def _stream(self, op: Operation, request: UpstreamRequest, translator: Translator,
                      content: RequestBody | None = None) -> dict[str, Any]:
        """Events as the chunks arrive; the completed body rebuilt once vLLM is done."""
        limits, notes = self.limits, notes_of(op)
        notes.upstream_started = trio.current_time()
        op.stage(Stage.EXECUTING)
        op.may_give_way = self.client.make_room
        try:
            async with self.client.chunks(request.body, request.headers,
                                          first_chunk=limits.first_chunk_timeout,
                                          idle=limits.idle_timeout,
                                          max_event=limits.max_event_bytes,
                                          holder=SlotHolding(op), content=content) as stream:
                notes.upstream_status = 200
                blocks = self.plain_blocks
                reads = (stream.fused(PlainDelta(translator, blocks)) if blocks is not None
                         else stream)
                with op.aborts_upstream(stream.abort):
                    async for batch in reads:
                        if notes.upstream_first_byte is None:
                            notes.upstream_first_byte = stream.first_byte_at
                        # The events of one upstream read (or of one piece of it:
                        # upstream._stream's splitting rules) leave in one write.
                        try:
                            # An else, not a continue: no jump may leave a try with a
                            # finally in a compiled module (gateway/compiled.py rule 6).
                            if isinstance(batch, tuple):  # PlainEvents: as below, fused
                                for body in batch:
                                    if not op.spend_tokens(0 if body is None else 1):
                                        await trio.lowlevel.checkpoint()
                                    if body is not None:
                                        await op.emit(body, flush=False)
                            else:
                                for chunk in batch:
                                    if not op.spend_tokens(token_count(chunk)):
                                        await trio.lowlevel.checkpoint()  # budget spent
                                    for encoded in translator.feed_encoded(chunk):
                                        await op.emit(encoded, flush=False)
                        finally:
                            op.flush()
        finally:
            notes.upstream_closed = trio.current_time()
            notes.usage = translator.usage
            metrics = translator.extra.get("metrics")  # 0.32+: on the final usage chunk
            notes.backend_metrics = metrics if isinstance(metrics, dict) else None
        op.stage(Stage.FINALIZING)
        for event in translator.finish():
            await op.emit(ev.encode_event(event))
        return translator.completed_body()

    async def _unary(self, op: Operation, body: dict[str, Any], headers: dict[str, str], *,
                     path: str = CHAT_PATH, content: RequestBody | None = None) -> Completion:
        """A non-streaming exchange (chat, or the token profile's text completion):
        vLLM's checked answer, its bytes as vLLM sent them and their decoded value."""
        notes = notes_of(op)
        notes.upstream_started = trio.current_time()
        op.stage(Stage.EXECUTING)
        answer: Completion | None = None
        try:
            # vLLM answers a non-streaming request only when it has finished: the
            # first-chunk clock bounds the whole exchange.
            with trio.move_on_after(self.limits.first_chunk_timeout):
                answer = await self.client.completion(body, headers, path=path,
                                                      holder=SlotHolding(op), content=content)
        finally:
            notes.upstream_closed = trio.current_time()
        if answer is None:
            raise UpstreamTimeout("first_chunk", self.limits.first_chunk_timeout)
        notes.upstream_status = 200
        usage = answer.body.get("usage")
        notes.usage = usage if isinstance(usage, dict) else None
        metrics = answer.body.get("metrics")  # 0.32+, --enable-per-request-metrics
        notes.backend_metrics = metrics if isinstance(metrics, dict) else None
        op.stage(Stage.FINALIZING)
        return answer

    # ------------------------------------------------------------------ terminals

    async def _complete(self, op: Operation, completed: bytes) -> None:
        """The encoded ``response.completed`` event as the terminal."""
        await self._diagnostics(op, EndCause.COMPLETED)
        await op.close(EndCause.COMPLETED, completed)

    async def _fail(self, op: Operation, error: ProfileError) -> None:
        backend_status = error.diagnostics.get("backend_status")
        if isinstance(backend_status, int):
            notes_of(op).upstream_status = backend_status
        await self._diagnostics(op, error.code)
        await op.close(error.code, ev.encode_event(ev.error_event(error)),
                       retry_after_ms=error.retry_after_ms)

    async def _diagnostics(self, op: Operation, cause: EndCause) -> None:
        """``response.diagnostics`` (extension vllm.diagnostics), built from the same
        observation record as the log line and the metrics, just before the terminal."""
        notes = notes_of(op)
        if not notes.diagnostics:
            return
        record = build_record(op, cause).as_dict()
        record["selected_model"] = record.pop("model", None)
        await op.emit(ev.encode_event(ev.diagnostics({**record, **(notes.backend or {})})))


def _note_response(op: Operation, body: dict[str, Any]) -> None:
    """What vLLM's answer names, for the trace span's GenAI attributes: the model, the
    response id, each choice's finish reason (never its content)."""
    notes = notes_of(op)
    model, response_id = body.get("model"), body.get("id")
    notes.response_model = model if isinstance(model, str) else None
    notes.response_id = response_id if isinstance(response_id, str) else None
    choices = body.get("choices")
    reasons = tuple(choice["finish_reason"] for choice in choices or ()
                    if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str)
                    ) if isinstance(choices, list) else ()
    notes.finish_reasons = reasons or None


def profile_refusal(refusal: SubmitRefused) -> tuple[int, bytes]:
    """The profile's answer to a submit refused before it became an operation (the
    refusal reasons are end causes; END_TABLE gives their status)."""
    error = ProfileError(EndCause(refusal.reason.value), refusal.message)
    return error.status, ev.encode_event(ev.error_event(error))


class SlotHolding:
    """An operation as the upstream slots see it (``upstream._slots`` rule 2): it gives
    its slot up first when its client is away, and at once when it is paused at its
    journal's bound; giving way ends it (``resume_preempted``)."""

    __slots__ = ("_operation",)

    def __init__(self, operation: Operation) -> None:
        self._operation = operation

    def standing(self) -> Standing:
        operation = self._operation
        if not operation.unattended:
            return Standing.LIVE
        return Standing.PAUSED if operation.held_at_bound else Standing.DETACHED

    def give_way(self) -> None:
        self._operation.cancel(EndCause.RESUME_PREEMPTED)
