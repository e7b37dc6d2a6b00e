"""Chunk checks: a vLLM stream chunk is forwarded only if it is what vLLM promises.

Every chunk needs a non-empty ``id`` and ``model``, an integer ``created`` >= 0,
``object`` exactly ``chat.completion.chunk`` and a structurally valid ``choices``
list. ``{"error": {...}}`` is vLLM's in-stream error event (docs/reference/vllm-http.md section 1).
Text must be Unicode: JSON may escape a lone surrogate (``"\\ud800"``), which no UTF-8
frame can carry. A violation raises ``UpstreamMalformed`` naming what was wrong, so the
operation ends with ``backend_error`` instead of forwarding garbage.

The plain text delta (most chunks of a stream) is read by one pattern rather than by
``json.loads`` and the checks, under these rules (measured in
docs/benchmarks.md):

1. The pattern (``_PLAIN_TEXT_CHUNK``) matches only vLLM's exact compact bytes of a
   one-choice content chunk with null logprobs, finish_reason and token_ids; any other
   byte (a space, another key, another order, a value of another shape) and the chunk
   goes the general way. A miss costs one failed match, nothing else.
2. What it accepts is what the general path accepts, and it builds the same dict, key
   for key and in the same order: ``id`` and ``model`` are non-empty and hold no escape
   or control character (so their bytes are their text), ``created`` and ``index`` are
   JSON integers >= 0 (no sign, no leading zero, at most 18 digits: a longer one goes
   the general way, which refuses one past Python's digit limit), ``object`` is the
   literal.
3. The content string is decoded by the json module's own string scanner (the one
   ``json.loads`` uses, strict: a raw control character is refused) and any text that
   could hold a lone surrogate (a ``\\uD8..``-``\\uDF..`` escape) goes the general way,
   which checks it. A scanner refusal goes the general way too, which words the error.

4. Within one stream (``ChunkParser``), every plain text delta has the same bytes around
   its content: vLLM repeats the chunk's id, created and model, and the choice's index
   and null fields. Once the pattern has matched a chunk, the bytes before its content
   (the head, ``{"id":...,"delta":{"content":"``) and after it (one of two tails) are
   kept, and a later chunk that begins with that head, ends with that tail and holds
   neither a quote, a backslash nor a control character in between is the same shape
   with that text as its content: exactly what the pattern would match, with the same
   groups (each group of the head ends at a delimiter it cannot contain, so the head
   parses one way only). Anything else goes to the pattern, which keeps the new head.

``tests/upstream/test_chunk_fast_path.py`` holds the differential proof: every chunk
of every recorded transcript and hypothesis-generated chunks give the same dict or the
same error either way.
"""

from __future__ import annotations

import json
import json.decoder
import re
from collections.abc import Callable
from typing import Any

from ._errors import UpstreamMalformed

#: A surrogate can only come out of JSON text as a \u escape (strict UTF-8 decoding,
#: as the SSE decoder's and ``parse_completion``'s, rejects one encoded as UTF-8): no
#: such escape, no walk of the decoded value.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")
#: In decoded text (a pair decodes to one); built with chr(): mypyc refuses a lone
#: surrogate in a literal (gateway/compiled.py rule 2).
_SURROGATE = re.compile(f"[{chr(0xD800)}-{chr(0xDFFF)}]")

#: The string scanner json.loads itself uses (C where built), for rule 3 below: the
#: same decoding and the same refusals. Not in typeshed's stub, hence the annotation.
_scanstring: Callable[[str, int, bool], tuple[str, int]] = (
    json.decoder.scanstring)  # type: ignore[attr-defined]


#: Rule 1: vLLM's plain text delta, byte for byte; groups: id, created, model, index,
#: the content's JSON text (between its quotes), and whether token_ids is there.
_PLAIN_TEXT_CHUNK = re.compile(
    r'\{"id":"([^"\\\x00-\x1f]+)","object":"chat\.completion\.chunk",'
    r'"created":(0|[1-9][0-9]{0,17}),"model":"([^"\\\x00-\x1f]+)",'
    r'"choices":\[\{"index":(0|[1-9][0-9]{0,17}),"delta":\{"content":"([^"\\]*(?:\\.[^"\\]*)*)"\},'
    r'"logprobs":null,"finish_reason":null(,"token_ids":null)?\}\]\}')


def _plain_text_chunk(data: str) -> dict[str, Any] | None:
    """Rules 1-3: the plain text delta's dict, or None for the general path."""
    match = _PLAIN_TEXT_CHUNK.fullmatch(data)
    return None if match is None else _plain_from_match(match)


def _plain_from_match(match: re.Match[str]) -> dict[str, Any] | None:
    chunk_id, created, model, index, text, token_ids = match.groups()
    if "\\" in text:
        if "\\u" in text and _SURROGATE_ESCAPE.search(text):
            return None  # rule 3: the general path checks for a lone surrogate
        try:
            text = _scanstring(text + '"', 0, True)[0]
        except ValueError:
            return None  # rule 3: the general path says what is wrong
    elif _CONTROL.search(text):
        return None  # a raw control character: not JSON (rule 3)
    choice: dict[str, Any] = {"index": int(index), "delta": {"content": text},
                              "logprobs": None, "finish_reason": None}
    if token_ids:
        choice["token_ids"] = None
    return {"id": chunk_id, "object": "chat.completion.chunk", "created": int(created),
            "model": model, "choices": [choice]}


#: JSON text may not hold a raw control character (RFC 8259 section 7).
_CONTROL = re.compile("[\x00-\x1f]")


def parse_chunk(data: str) -> dict[str, Any]:
    """JSON-decode one SSE ``data`` payload and check it (or raise)."""
    plain = _plain_text_chunk(data)
    return plain if plain is not None else _parse_in_general(data)


#: The two ways a plain text delta ends after its content (rule 1: ``token_ids`` or not).
_TAIL = '"},"logprobs":null,"finish_reason":null}]}'
_TAIL_WITH_IDS = '"},"logprobs":null,"finish_reason":null,"token_ids":null}]}'
#: What the content of a chunk read by its kept head may not hold (rule 4): a quote or a
#: backslash (the text would not be its own JSON) or a raw control character (not JSON).
_NOT_BARE = re.compile(r'["\\\x00-\x1f]')


class ChunkParser:
    """``parse_chunk`` for the chunks of one stream, in order: the same answer for every
    input, with the plain text delta's head and tail kept from the last one the pattern
    read (rule 4), so most chunks cost two comparisons and one search. What it keeps is a
    cache: its answer depends on its input alone, as ``parse_chunk``'s does."""

    __slots__ = ("_fields", "_head", "_ids", "_kept", "_tail")

    def __init__(self) -> None:
        self._head: str | None = None
        self._tail = _TAIL
        #: The kept chunk's id, created, model and index, as the dict holds them.
        self._fields: tuple[str, int, str, int] = ("", 0, "", 0)
        self._ids = False
        self._kept: tuple[str, str, int] | None = None

    @property
    def kept(self) -> tuple[str, str, int] | None:
        """Rule 4's kept head and tail and the choice index the head names (None: none
        kept yet), for a reader of whole reads that applies the same rule
        (``gateway.pipeline._plain_delta``): a new tuple each time a head is kept."""
        return self._kept

    def __call__(self, data: str) -> dict[str, Any]:
        head, tail = self._head, self._tail
        # (Long enough for both: a head and a tail that overlap are no chunk.)
        if (head is not None and len(data) >= len(head) + len(tail)
                and data.startswith(head) and data.endswith(tail)):
            text = data[len(head):len(data) - len(tail)]
            if not _NOT_BARE.search(text):
                chunk_id, created, model, index = self._fields
                choice: dict[str, Any] = {"index": index, "delta": {"content": text},
                                          "logprobs": None, "finish_reason": None}
                if self._ids:
                    choice["token_ids"] = None
                return {"id": chunk_id, "object": "chat.completion.chunk",
                        "created": created, "model": model, "choices": [choice]}
        match = _PLAIN_TEXT_CHUNK.fullmatch(data)
        plain = None if match is None else _plain_from_match(match)
        if plain is None:
            return _parse_in_general(data)
        assert match is not None
        self._head = data[:match.start(5)]
        self._ids = match.group(6) is not None
        self._tail = _TAIL_WITH_IDS if self._ids else _TAIL
        self._fields = (plain["id"], plain["created"], plain["model"],
                        plain["choices"][0]["index"])
        self._kept = (self._head, self._tail, self._fields[3])
        return plain


def _parse_in_general(data: str) -> dict[str, Any]:
    """Any chunk: ``json.loads`` and every check."""
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError as exc:
        raise UpstreamMalformed(f"stream chunk is not JSON: {exc.msg} at {exc.pos}") from exc
    except ValueError as unreadable:  # a number past Python's digit limit (int() in
        # json.loads); its own name: compiled, ``exc`` is a JSONDecodeError (compiled.py 4)
        raise UpstreamMalformed(f"stream chunk holds a number that cannot be read: "
                                f"{unreadable}") from unreadable
    if not isinstance(chunk, dict):
        raise UpstreamMalformed("stream chunk is not a JSON object")
    if "\\u" in data and _SURROGATE_ESCAPE.search(data) and _has_lone_surrogate(chunk):
        raise UpstreamMalformed("stream chunk holds text that is not Unicode (a lone "
                                "surrogate): it cannot be carried as UTF-8")
    error = chunk.get("error")
    if error is not None:
        if isinstance(error, dict):
            code = error.get("code")
            raise UpstreamMalformed(
                f"vLLM reported an error mid-stream: {error.get('message', 'no message')}",
                kind="in_stream_error", error_type=_opt_str(error.get("type")),
                status=code if isinstance(code, int) else None,
                param=_opt_str(error.get("param")),
                backend_message=_opt_str(error.get("message")))
        raise UpstreamMalformed(f"vLLM reported an error mid-stream: {error}",
                                kind="in_stream_error")
    check_chunk(chunk)
    return chunk


def _has_lone_surrogate(value: Any) -> bool:
    """A surrogate left unpaired by JSON decoding (a valid pair decodes to one character)."""
    if isinstance(value, str):
        return not value.isascii() and _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(item) for item in value)
    return False


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


_PLAIN_DELTA_KEYS = frozenset({"role", "content"})


def check_chunk(chunk: dict[str, Any]) -> None:
    """Check a chunk's structure; the common shape (a few choices with role/content
    deltas) is checked in one pass, anything else by ``_check_in_detail``, which also
    produces the precise error message."""
    chunk_id, model, created = chunk.get("id"), chunk.get("model"), chunk.get("created")
    choices = chunk.get("choices")
    if (type(chunk_id) is str and chunk_id and type(model) is str and model
            and type(created) is int and created >= 0
            and chunk.get("object") == "chat.completion.chunk" and type(choices) is list
            and type(chunk.get("usage", {})) in (dict, type(None))):
        for choice in choices:
            if type(choice) is not dict:
                break
            index, delta = choice.get("index"), choice.get("delta")
            if (type(index) is not int or index < 0 or type(delta) is not dict
                    or not delta.keys() <= _PLAIN_DELTA_KEYS
                    or type(delta.get("content", "")) not in (str, type(None))):
                break
        else:
            return
    _check_in_detail(chunk)


def _check_in_detail(chunk: dict[str, Any]) -> None:
    for field in ("id", "model"):
        value = chunk.get(field)
        if not isinstance(value, str) or not value:
            raise UpstreamMalformed(f"stream chunk has no non-empty string {field!r}")
    created = chunk.get("created")
    if isinstance(created, bool) or not isinstance(created, int) or created < 0:
        raise UpstreamMalformed(f"stream chunk 'created' is {created!r}, not an integer >= 0")
    if chunk.get("object") != "chat.completion.chunk":
        raise UpstreamMalformed(
            f"stream chunk 'object' is {chunk.get('object')!r}, not 'chat.completion.chunk'")
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        raise UpstreamMalformed("stream chunk 'choices' is not a list")
    for choice in choices:
        if not isinstance(choice, dict):
            raise UpstreamMalformed("stream chunk choice is not an object")
        index = choice.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise UpstreamMalformed(f"stream chunk choice index is {index!r}")
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            raise UpstreamMalformed(f"choice {index}: 'delta' is not an object")
        for text_field in ("content", "reasoning", "reasoning_content"):
            if delta.get(text_field) is not None and not isinstance(delta[text_field], str):
                raise UpstreamMalformed(f"choice {index}: delta.{text_field} is not a string")
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None:
            _check_tool_calls(index, tool_calls)
    usage = chunk.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise UpstreamMalformed("stream chunk 'usage' is not an object")


def _check_tool_calls(choice: int, tool_calls: Any) -> None:
    if not isinstance(tool_calls, list):
        raise UpstreamMalformed(f"choice {choice}: delta.tool_calls is not a list")
    for call in tool_calls:
        if not isinstance(call, dict):
            raise UpstreamMalformed(f"choice {choice}: a tool call delta is not an object")
        index = call.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise UpstreamMalformed(f"choice {choice}: tool call index is {index!r}")
        function = call.get("function", {})
        if not isinstance(function, dict):
            raise UpstreamMalformed(f"choice {choice}: tool call function is not an object")
        for field in ("name", "arguments"):
            if function.get(field) is not None and not isinstance(function[field], str):
                raise UpstreamMalformed(f"choice {choice}: tool call function.{field} "
                                        "is not a string")


def parse_completion(data: bytes, kind: str = "chat.completion") -> dict[str, Any]:
    """A non-streaming completion body of ``kind`` (``chat.completion``, or
    ``text_completion`` for ``/v1/completions``), checked like a chunk, lightly."""
    try:
        # Decoded strictly first: json.loads(bytes) lets a UTF-8-encoded surrogate
        # through ('surrogatepass'), which no escape check would see.
        text = data.decode("utf-8")
    except UnicodeDecodeError as undecodable:  # not exc, a JSONDecodeError below (rule 4
        # of gateway/compiled.py)
        raise UpstreamMalformed(f"completion body is not UTF-8 text: {undecodable}"
                                ) from undecodable
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UpstreamMalformed(f"completion body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise UpstreamMalformed("completion body is not a JSON object")
    if b"\\u" in data and _SURROGATE_ESCAPE_BYTES.search(data) and _has_lone_surrogate(body):
        raise UpstreamMalformed("completion body holds text that is not Unicode (a lone "
                                "surrogate): it cannot be carried as UTF-8")
    if body.get("object") != kind:
        raise UpstreamMalformed(f"completion 'object' is {body.get('object')!r}, not {kind!r}")
    if not isinstance(body.get("id"), str) or not isinstance(body.get("choices"), list):
        raise UpstreamMalformed("completion body lacks 'id' or 'choices'")
    return body
