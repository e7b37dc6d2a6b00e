"""The request fields the gateway reads itself, read the way vLLM's request model reads them.

vLLM validates the JSON body with pydantic in lax mode (docs/reference/vllm-http.md; measured on
0.32 and
checked against pydantic 2.14 offline). The gateway decides the wire mode, the usage event
and a budget's token cap from some of the same fields, so it must reach vLLM's decision or
refuse the request before vLLM is called: never generate and then fail.

* ``stream``: a bool; 0/1 and 0.0/1.0; the strings t/f, true/false, y/n, yes/no, on/off,
  1/0 in any case; null is false. Refused: anything else (2, 1.5, "", "maybe", " true",
  lists, objects).
* ``stream_options``: null or an object; ``stream_options.include_usage`` as ``stream``.
* ``max_tokens``, ``max_completion_tokens`` and ``n`` (read only under a token budget,
  which caps the first per choice): an int
  (true is 1), a float without a fraction, a decimal string with an optional sign and
  surrounding spaces; null. Other forms pydantic may still take ("1_000", "2.0") are
  refused rather than guessed.

``max_completion_tokens`` wins over ``max_tokens`` when it is not null (vLLM's serving code).
Every other field travels exactly as the client wrote it; vLLM alone judges it. vLLM's
raw-truthiness checks (``stream_options`` with a falsy ``stream``) are left to vLLM too:
the gateway adds ``stream_options`` only to a request it reads as streaming.
"""

from __future__ import annotations

import math
import re
from typing import Any

#: pydantic's lax string booleans (case-insensitive, no surrounding spaces).
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_DECIMAL = re.compile(r"\s*[+-]?\d+\s*")


class RequestFieldError(ValueError):
    """A field the gateway reads holds a value vLLM would not read either."""

    def __init__(self, field: str, value: Any, expected: str) -> None:
        super().__init__(f"{field} must be {expected}, got {value!r}")
        self.field = field


def lax_bool(value: Any, field: str) -> bool | None:
    """A ``bool | None`` field as pydantic's lax mode reads it."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise RequestFieldError(field, value, "a boolean")


def lax_int(value: Any, field: str) -> int | None:
    """An ``int | None`` field as pydantic's lax mode reads it (the plain forms)."""
    if value is None or isinstance(value, int):  # bool included: true is 1
        return None if value is None else int(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value)
    raise RequestFieldError(field, value, "an integer")


def is_streaming(body: dict[str, Any]) -> bool:
    return lax_bool(body.get("stream"), "stream") is True


def stream_options(body: dict[str, Any]) -> dict[str, Any] | None:
    options = body.get("stream_options")
    if options is None or isinstance(options, dict):
        return options
    raise RequestFieldError("stream_options", options, "an object")


def usage_requested(body: dict[str, Any]) -> bool:
    """Whether a streaming request asked for the usage chunk."""
    options = stream_options(body)
    if options is None:
        return False
    return lax_bool(options.get("include_usage"), "stream_options.include_usage") is True


def output_token_limit(body: dict[str, Any]) -> tuple[str, int] | None:
    """The field that limits output tokens and its value (``max_completion_tokens`` wins)."""
    for field in ("max_completion_tokens", "max_tokens"):
        value = lax_int(body.get(field), field)
        if value is not None:
            return field, value
    return None
