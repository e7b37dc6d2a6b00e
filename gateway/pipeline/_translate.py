"""Chunk -> profile events, and vLLM's non-streaming body rebuilt from the chunks.

A pure class fed one checked chunk at a time (docs/reference/original-plan.md rule 2). The rule it
keeps:
**every field vLLM sends reaches the client**, in a profile event, in a declared
non-critical extension field, or at least in the rebuilt ``response.completed`` body.

Events, per choice (kept apart by ``index``, so ``n > 1`` works):

1. ``delta.content`` -> ``response.output_text.delta`` {index, delta}; empty strings make
   no event of their own (vLLM's detokenizer sends ``""`` while it holds back partial
   UTF-8).
2. ``delta.reasoning`` (or the older ``reasoning_content``) ->
   ``response.reasoning_text.delta``: the declared extension ``vllm.reasoning``.
3. ``delta.tool_calls`` -> the contract's lifecycle per call: ``started`` (on the first
   fragment, which carries vLLM's id and the function name) -> ``delta``* (each arguments
   fragment) -> exactly one ``completed`` with the concatenated arguments when the choice
   finishes or the stream ends; ``error`` instead when the stream breaks mid-call
   (``abort``). Calls of a choice are keyed by their ``index``, so parallel calls may
   interleave. ``tool_calls: []`` noise (0.18/0.22) is dropped by the binding.
4. The choice's ``logprobs`` and ``token_ids`` (extension ``vllm.logprobs``) ride on the
   first event the choice produced from that chunk. A chunk that carries them but no
   text (a token that adds none, common with logprobs or return_token_ids) becomes a
   text delta with ``"delta": ""``, so a streaming client sees every token's data in order.
5. ``usage`` -> recorded always; ``response.usage`` is emitted (once, from the final
   usage chunk) only when the client asked for usage.
6. ``include_openai_chunk``: every event carries its chunk, and a chunk that produced no
   event is conveyed as ``response.openai_chunk`` (extension ``vllm.openai_chunk``).

``feed_encoded`` is ``feed`` with each event encoded (``events.encode_event``), the same
bytes; it takes a shorter way for the plain text delta (one choice already seen, a
``content`` string and nothing else, null logprobs, finish_reason and token_ids, no
``include_openai_chunk``), whose only effect on the state is the text kept for the
completed body. ``tests/pipeline/test_translate_fast_path.py`` proves it against
``feed`` over every recorded transcript and hypothesis-generated chunks.

The completed body (``completed_body``) is the ``chat.completion`` vLLM would have sent
for the same request without streaming, field by field; the binding's ``ResponseShape``
names the fields a stream never carries (null then):

* top level: id, created, model from the first chunk; ``object`` chat.completion; every
  other chunk field (prompt_token_ids, prompt_text, system_fingerprint, fields a future
  vLLM adds): its last non-null value; ``usage``: the last one, detail fields as null;
* per choice: ``message`` from the deltas (content joined, null when a tool call came
  and no text; reasoning joined; tool calls; any other delta field: strings joined, other
  values the last non-null one); ``logprobs`` as ``{"content": [every entry in order]}``;
  ``token_ids`` concatenated; finish_reason and stop_reason from the finish chunk; any
  other choice field: its last non-null value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from gateway.profile import events as ev
from gateway.upstream import Binding, UpstreamMalformed

#: Field factories typed Any: compiled, a typed class-body default fails its check
#: (gateway/compiled.py rule 3).
_new_list: Callable[[], Any] = list
_new_dict: Callable[[], Any] = dict

#: Chunk fields with a rule of their own; any other is carried over as it comes.
_CHUNK_OWN = frozenset({"id", "object", "created", "model", "choices", "usage"})
_CHOICE_OWN = frozenset({"index", "delta", "logprobs", "finish_reason", "stop_reason",
                         "token_ids"})
_DELTA_OWN = frozenset({"role", "content", "reasoning", "reasoning_content", "tool_calls"})
#: The plain text delta's keys (``feed_encoded``): vLLM 0.18-0.33 send token_ids null.
_PLAIN_CHUNK_KEYS = frozenset({"id", "object", "created", "model", "choices"})
_PLAIN_CHOICE_KEYS = (frozenset({"index", "delta", "logprobs", "finish_reason", "token_ids"}),
                      frozenset({"index", "delta", "logprobs", "finish_reason"}))
_CONTENT_ONLY = frozenset({"content"})


@attrs.define
class _ToolCall:
    choice: int
    index: int
    call_id: str
    name: str
    arguments: list[str] = attrs.field(factory=_new_list)
    done: bool = False

    @property
    def item_id(self) -> str:
        return f"tool-call-{self.choice}-{self.index}"


@attrs.define
class _Choice:
    index: int
    role: str = "assistant"
    content: list[str] | None = None  # None until a delta carries a content string
    reasoning: list[str] = attrs.field(factory=_new_list)
    tool_calls: dict[int, _ToolCall] = attrs.field(factory=_new_dict)
    finish_reason: str | None = None
    stop_reason: Any = None
    logprobs: list[Any] | None = None
    token_ids: list[Any] | None = None
    #: Delta and choice fields without a rule of their own, as rule 8 carries them.
    message_extra: dict[str, Any] = attrs.field(factory=_new_dict)
    choice_extra: dict[str, Any] = attrs.field(factory=_new_dict)


def _carry(into: dict[str, Any], key: str, value: Any, *, join_strings: bool) -> None:
    """A field without a rule of its own: strings joined (delta fields stream text), else
    the last non-null value; a field only ever null stays null."""
    if value is None:
        into.setdefault(key, None)
    elif join_strings and isinstance(value, str) and isinstance(into.get(key), str):
        into[key] += value
    else:
        into[key] = value


def token_count(chunk: dict[str, Any]) -> int:
    """Completion tokens a checked chunk carries, for token budgets: its token ids or
    logprobs entries when vLLM sent them (exact), else one per choice whose delta carries
    text, reasoning or a tool call (vLLM sends one token per chunk unless it runs with
    ``--stream-interval`` above 1, when this undercounts)."""
    total = 0
    for choice in chunk["choices"]:
        token_ids = choice.get("token_ids")
        if isinstance(token_ids, list):
            total += len(token_ids)
            continue
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


def forces_tool_choice(body: dict[str, Any]) -> bool:
    """Whether a chat request forces a tool call: ``tool_choice`` ``"required"`` or a
    named function (an object), with tools to call."""
    choice = body.get("tool_choice")
    return bool(body.get("tools")) and (choice == "required" or isinstance(choice, dict))


class Translator:
    def __init__(self, binding: Binding, *, usage_requested: bool,
                 include_openai_chunk: bool = False, forced_tool_choice: bool = False
                 ) -> None:
        """``forced_tool_choice``: the request named a function or ``"required"``
        (``forces_tool_choice``)."""
        self.binding = binding
        self.forced_tool_choice = forced_tool_choice
        self.usage_requested = usage_requested
        self.include_openai_chunk = include_openai_chunk
        self.id: str | None = None
        self.created: int | None = None
        self.model: str | None = None
        self.usage: dict[str, Any] | None = None
        self.choices: dict[int, _Choice] = {}
        #: Top-level chunk fields without a rule of their own (system_fingerprint, ...).
        self.extra: dict[str, Any] = {}
        self.chunks = 0

    # ------------------------------------------------------------------ feeding

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """Events for one checked chunk, in the order the chunk implies."""
        self.chunks += 1
        if self.id is None:
            self.id, self.created, self.model = chunk["id"], chunk["created"], chunk["model"]
        for key, value in chunk.items():
            if key not in _CHUNK_OWN:
                _carry(self.extra, key, value, join_strings=False)
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
            if not events:
                events.append(ev.openai_chunk(chunk))
        return events

    def feed_encoded(self, chunk: dict[str, Any]) -> list[bytes]:
        """``feed``, each event encoded: the same state and the same bytes (module
        docstring), the plain text delta without building its event."""
        if chunk.keys() == _PLAIN_CHUNK_KEYS and not self.include_openai_chunk:
            choices = chunk["choices"]
            if len(choices) == 1:
                data = choices[0]
                delta = data["delta"]
                choice = self.choices.get(data["index"])
                if (choice is not None and data.keys() in _PLAIN_CHOICE_KEYS
                        and type(delta) is dict and delta.keys() == _CONTENT_ONLY
                        and data["logprobs"] is None and data["finish_reason"] is None
                        and data.get("token_ids") is None
                        and type(content := delta["content"]) is str):
                    self.chunks += 1
                    if choice.content is None:
                        choice.content = []
                    if not content:
                        return []
                    choice.content.append(content)
                    return [ev.encode_text_delta(choice.index, content)]
        return [ev.encode_event(event) for event in self.feed(chunk)]

    def take_plain(self, index: int, texts: list[str]) -> bool:
        """``feed_encoded``'s short way for plain text deltas of choice ``index``, one
        per text, without their events (``_plain_delta`` rule 2): the same state; False,
        and nothing done, where that way does not apply."""
        choice = self.choices.get(index)
        if choice is None or self.include_openai_chunk:
            return False
        self.chunks += len(texts)
        content = choice.content
        if content is None:
            content = choice.content = []
        for text in texts:
            if text:
                content.append(text)
        return True

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
        if isinstance(content, str):
            if choice.content is None:
                choice.content = []
            if content:
                choice.content.append(content)
                events.append(ev.text_delta(index, content))
        for call in delta.get("tool_calls") or ():
            events += self._tool_call(choice, call)
        for key, value in delta.items():
            if key not in _DELTA_OWN:
                _carry(choice.message_extra, key, value, join_strings=True)
        for key, value in data.items():
            if key not in _CHOICE_OWN:
                _carry(choice.choice_extra, key, value, join_strings=False)
        extension = self._token_data(choice, data)
        if extension:
            if not events:  # rule 4: a token without text still reaches the client
                events.append(ev.text_delta(index, ""))
            events[0].update(extension)
        if data.get("finish_reason") is not None:
            choice.finish_reason = data["finish_reason"]
            choice.stop_reason = data.get("stop_reason")
            events += self._complete_tools(choice)
        return events

    @staticmethod
    def _token_data(choice: _Choice, data: dict[str, Any]) -> dict[str, Any]:
        """The chunk's logprobs and token ids for this choice (rule 4), also kept for the
        completed body."""
        extension: dict[str, Any] = {}
        logprobs = data.get("logprobs")
        if logprobs is not None:
            extension["logprobs"] = logprobs
            entries = logprobs.get("content") if isinstance(logprobs, dict) else None
            if choice.logprobs is None:
                choice.logprobs = []
            if isinstance(entries, list):
                choice.logprobs.extend(entries)
        token_ids = data.get("token_ids")
        if token_ids is not None:
            extension["token_ids"] = token_ids
            if choice.token_ids is None:
                choice.token_ids = []
            if isinstance(token_ids, list):
                choice.token_ids.extend(token_ids)
        return extension

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
        """vLLM's non-streaming ``chat.completion`` for this stream (module docstring)."""
        shape = self.binding.shape
        choices = [self._completed_choice(self.choices[index]) for index in sorted(self.choices)]
        body: dict[str, Any] = {"id": self.id, "object": "chat.completion",
                                "created": self.created, "model": self.model,
                                "choices": choices}
        usage = None
        if self.usage is not None:
            usage = dict(self.usage)
            for field in shape.usage:
                usage.setdefault(field, None)
        for field in shape.body:
            body[field] = usage if field == "usage" else self.extra.get(field)
        for field, value in self.extra.items():
            body.setdefault(field, value)
        body.setdefault("usage", usage)
        return body

    def _completed_choice(self, choice: _Choice) -> dict[str, Any]:
        shape = self.binding.shape
        text = "".join(choice.content) if choice.content is not None else None
        if choice.tool_calls and not text:
            # vLLM's parser reports a tool call without text as content null; 0.32 writes
            # "" for a forced tool choice (Binding.forced_tool_content_empty).
            forced = self.forced_tool_choice and self.binding.forced_tool_content_empty
            text = "" if forced else None
        message: dict[str, Any] = {"role": choice.role, "content": text}
        for field in shape.message:
            message[field] = None
        if choice.reasoning:
            message["reasoning"] = "".join(choice.reasoning)
        if choice.tool_calls or shape.empty_tool_calls_kept:
            message["tool_calls"] = [
                {"id": call.call_id, "type": "function",
                 "function": {"name": call.name, "arguments": "".join(call.arguments)}}
                for _, call in sorted(choice.tool_calls.items())]
        for field, value in choice.message_extra.items():
            if message.get(field) is None:
                message[field] = value
        entry: dict[str, Any] = {"index": choice.index, "message": message}
        for field in shape.choice:
            entry[field] = None
        entry.update(logprobs=None if choice.logprobs is None else {"content": choice.logprobs},
                     finish_reason=choice.finish_reason, stop_reason=choice.stop_reason,
                     token_ids=choice.token_ids)
        for field, value in choice.choice_extra.items():
            if entry.get(field) is None:
                entry[field] = value
        return entry
