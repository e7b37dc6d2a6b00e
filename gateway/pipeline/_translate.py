"""Chunk -> profile events, and the completed body rebuilt from the deltas.

A pure class fed one checked chunk at a time (architecture.md rule 2). For each choice
(kept apart by ``index``, so ``n > 1`` works):

* ``delta.content`` -> ``response.output_text.delta`` {index, delta}; empty strings are
  skipped (vLLM's detokenizer sends ``""`` while it holds back partial UTF-8).
* ``delta.reasoning`` (or the older ``reasoning_content``) ->
  ``response.reasoning_text.delta``: the declared non-critical extension ``vllm.reasoning``.
* ``delta.tool_calls`` -> the contract's lifecycle per call: ``started`` (on the first
  fragment, which carries vLLM's id and the function name) -> ``delta``* (each arguments
  fragment) -> exactly one ``completed`` with the concatenated arguments when the choice
  finishes or the stream ends; ``error`` instead when the stream breaks mid-call
  (``abort``). Calls of a choice are keyed by their ``index``, so parallel calls may
  interleave. ``tool_calls: []`` noise (0.18/0.22) is dropped by the binding.
* ``usage`` -> recorded always; ``response.usage`` is emitted (once, from the final
  usage chunk) only when the client asked for usage.
"""

from __future__ import annotations

from typing import Any

import attrs

from gateway.profile import events as ev
from gateway.upstream import Binding, UpstreamMalformed


@attrs.define
class _ToolCall:
    choice: int
    index: int
    call_id: str
    name: str
    arguments: list[str] = attrs.field(factory=list)
    done: bool = False

    @property
    def item_id(self) -> str:
        return f"tool-call-{self.choice}-{self.index}"


@attrs.define
class _Choice:
    index: int
    role: str = "assistant"
    content: list[str] = attrs.field(factory=list)
    reasoning: list[str] = attrs.field(factory=list)
    tool_calls: dict[int, _ToolCall] = attrs.field(factory=dict)
    finish_reason: str | None = None
    stop_reason: Any = None


def token_count(chunk: dict[str, Any]) -> int:
    """Completion tokens a checked chunk carries, for token budgets: the logprobs entries
    when vLLM sent them (one per token, exactly), else one per choice whose delta carries
    text, reasoning or a tool call (vLLM sends one token per chunk unless it runs with
    ``--stream-interval`` above 1, when this undercounts)."""
    total = 0
    for choice in chunk["choices"]:
        logprobs = choice.get("logprobs")
        entries = logprobs.get("content") if isinstance(logprobs, dict) else None
        if isinstance(entries, list) and entries:
            total += len(entries)
            continue
        delta = choice["delta"]
        if (delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content")
                or delta.get("tool_calls")):
            total += 1
    return total


class Translator:
    def __init__(self, binding: Binding, *, usage_requested: bool,
                 include_openai_chunk: bool = False) -> None:
        self.binding = binding
        self.usage_requested = usage_requested
        self.include_openai_chunk = include_openai_chunk
        self.id: str | None = None
        self.created: int | None = None
        self.model: str | None = None
        self.system_fingerprint: str | None = None
        self.usage: dict[str, Any] | None = None
        self.choices: dict[int, _Choice] = {}
        self.chunks = 0

    # ------------------------------------------------------------------ feeding

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """Events for one checked chunk, in the order the chunk implies."""
        self.chunks += 1
        if self.id is None:
            self.id, self.created, self.model = chunk["id"], chunk["created"], chunk["model"]
        if chunk.get("system_fingerprint"):
            self.system_fingerprint = chunk["system_fingerprint"]
        events: list[dict[str, Any]] = []
        for choice_data in chunk["choices"]:
            events += self._choice(choice_data)
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = usage
            if self.usage_requested and not chunk["choices"]:
                events.append(ev.usage(usage))
        if self.include_openai_chunk:
            for event in events:
                event["openai_chunk"] = chunk
        return events

    def _choice(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        index = data["index"]
        choice = self.choices.get(index)
        if choice is None:
            choice = self.choices[index] = _Choice(index)
        delta = self.binding.clean_delta(data["delta"])
        events: list[dict[str, Any]] = []
        if delta.get("role"):
            choice.role = delta["role"]
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if reasoning:
            choice.reasoning.append(reasoning)
            events.append(ev.reasoning_delta(index, reasoning))
        content = delta.get("content")
        if content:
            choice.content.append(content)
            events.append(ev.text_delta(index, content))
        for call in delta.get("tool_calls") or ():
            events += self._tool_call(choice, call)
        if data.get("finish_reason") is not None:
            choice.finish_reason = data["finish_reason"]
            choice.stop_reason = data.get("stop_reason")
            events += self._complete_tools(choice)
        return events

    def _tool_call(self, choice: _Choice, call: dict[str, Any]) -> list[dict[str, Any]]:
        function = call.get("function") or {}
        state = choice.tool_calls.get(call["index"])
        events: list[dict[str, Any]] = []
        if state is None:
            call_id, name = call.get("id"), function.get("name")
            if not call_id or not name:
                raise UpstreamMalformed(
                    f"choice {choice.index}: tool call {call['index']} starts without "
                    "an id and a function name", kind="invalid_tool_call_stream")
            state = choice.tool_calls[call["index"]] = _ToolCall(choice.index, call["index"],
                                                                 call_id, name)
            events.append(ev.tool_call_started(state.index, state.item_id, state.call_id,
                                               state.name, choice.index))
        elif state.done:
            raise UpstreamMalformed(f"choice {choice.index}: tool call {call['index']} "
                                    "continues after it completed",
                                    kind="invalid_tool_call_stream")
        fragment = function.get("arguments")
        if fragment:
            state.arguments.append(fragment)
            events.append(ev.tool_call_delta(state.index, state.item_id, state.call_id,
                                             fragment, choice.index))
        return events

    def _complete_tools(self, choice: _Choice) -> list[dict[str, Any]]:
        events = []
        for state in choice.tool_calls.values():
            if not state.done:
                state.done = True
                events.append(ev.tool_call_completed(
                    state.index, state.item_id, state.call_id, state.name,
                    "".join(state.arguments), choice.index))
        return events

    # ------------------------------------------------------------------ endings

    def finish(self) -> list[dict[str, Any]]:
        """At ``[DONE]``: complete any tool call whose choice never sent finish_reason."""
        events: list[dict[str, Any]] = []
        for choice in self.choices.values():
            events += self._complete_tools(choice)
        return events

    def abort(self, message: str) -> list[dict[str, Any]]:
        """The stream broke: every open tool call ends with ``response.tool_call.error``."""
        events = []
        for choice in self.choices.values():
            for state in choice.tool_calls.values():
                if not state.done:
                    state.done = True
                    events.append(ev.tool_call_error(
                        state.index, state.item_id, state.call_id,
                        "tool_call_stream_interrupted", message, choice.index))
        return events

    def completed_body(self) -> dict[str, Any]:
        """A ``chat.completion`` rebuilt from everything streamed."""
        choices = []
        for index in sorted(self.choices):
            choice = self.choices[index]
            message: dict[str, Any] = {"role": choice.role,
                                       "content": "".join(choice.content) or None}
            if choice.reasoning:
                message["reasoning"] = "".join(choice.reasoning)
            if choice.tool_calls:
                message["tool_calls"] = [
                    {"id": call.call_id, "type": "function",
                     "function": {"name": call.name, "arguments": "".join(call.arguments)}}
                    for _, call in sorted(choice.tool_calls.items())]
            entry: dict[str, Any] = {"index": index, "message": message,
                                     "finish_reason": choice.finish_reason}
            if choice.stop_reason is not None:
                entry["stop_reason"] = choice.stop_reason
            choices.append(entry)
        body: dict[str, Any] = {"id": self.id, "object": "chat.completion",
                                "created": self.created, "model": self.model,
                                "choices": choices, "usage": self.usage}
        if self.system_fingerprint:
            body["system_fingerprint"] = self.system_fingerprint
        return body
