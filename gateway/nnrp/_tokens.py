"""Runtime capability tokens: the body of CAPABILITY_NEGOTIATION and DEGRADE_PROFILE.

    body = capability_count * (u16 LE length ‖ ASCII token), unique and byte-sorted

The format is the reference adapter's and what nnrp-py's native library enforces on both
sides: a body that is not such a canonical list, or names a token it does not know, is a
protocol error to the native client (the research notes in docs/runtime-controls.md).
So a server may only ever reply with tokens from ``KNOWN_TOKENS``.
"""

from __future__ import annotations

import struct

_LENGTH = struct.Struct("<H")

#: Every token the preview4 native library knows (13 control, 4 object, 1 cache).
KNOWN_TOKENS = frozenset({
    "control.cancel_abort", "control.supersede", "control.priority_update",
    "control.deadline_expire", "control.progress_partial", "control.credit_backpressure",
    "control.capability_costs", "control.route_execution_hint", "control.trace_context",
    "control.result_drop_reason", "control.degrade_profile", "control.budget_update",
    "control.recoverable_error",
    "object.lifecycle", "object.delta", "object.cost", "object.ownership",
    "cache.reference",
})


def parse_tokens(body: bytes, count: int) -> tuple[str, ...] | None:
    """The tokens of a canonical list of ``count`` entries; None for anything else (an
    opaque body such as the Rust runner's ``cap!``, unsorted or repeated tokens, non-ASCII)."""
    tokens: list[str] = []
    offset = 0
    while offset < len(body):
        if offset + 2 > len(body):
            return None
        (length,) = _LENGTH.unpack_from(body, offset)
        raw = body[offset + 2:offset + 2 + length]
        if length == 0 or len(raw) != length or not raw.isascii():
            return None
        tokens.append(raw.decode("ascii"))
        offset += 2 + length
    if len(tokens) != count or tokens != sorted(set(tokens)):
        return None
    return tuple(tokens)


def pack_tokens(tokens: frozenset[str] | tuple[str, ...]) -> bytes:
    """A canonical list (unique, byte-sorted) of ``tokens``."""
    return b"".join(_LENGTH.pack(len(token)) + token.encode("ascii")
                    for token in sorted(set(tokens)))
