"""Hypothesis strategies for every NNRP message: valid metadata, matching bodies, headers."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import strategies as st

from gateway import nnrp
from gateway.nnrp._messages import MESSAGE_CLASSES

_MAX = {"B": 0xFF, "H": 0xFFFF, "I": 0xFFFFFFFF, "Q": 0xFFFFFFFFFFFFFFFF}

#: Fields with rules beyond their declared registry or mask.
_FIELD_OVERRIDES: dict[str, st.SearchStrategy[int]] = {
    "min_version": st.just(1),
    "max_version": st.integers(1, 3),
    "stage": st.sampled_from([int(s) for s in nnrp.Stage] + [0x8000, 0xFFFF]),
    "percent_x100": st.one_of(st.integers(0, 10000), st.just(0xFFFF)),
    "deadline_unix_ms": st.integers(1, _MAX["Q"]),
    "operation_id": st.integers(1, _MAX["Q"]),
}
_CLASS_OVERRIDES: dict[tuple[type[Any], str], st.SearchStrategy[int]] = {
    (nnrp.FlowUpdate, "operation_id"): st.integers(0, _MAX["Q"]),
    (nnrp.PriorityUpdate, "priority_class"): st.integers(0, 2),
}
#: Fields that announce a body length: kept small (the body is drawn to match).
_BODY_LENGTH_FIELDS = {"diagnostic_bytes", "body_bytes", "payload_bytes", "auth_bytes",
                       "control_extension_bytes", "resume_token_bytes",
                       "session_extension_bytes", "metadata_bytes", "object_bytes",
                       "delta_bytes", "profile_patch_bytes", "profile_patch_ack_bytes"}


def _field_strategy(cls: type[Any], name: str, spec: Any) -> st.SearchStrategy[int]:
    """Values the field's own declaration allows (registry or mask), else its full range."""
    if (cls, name) in _CLASS_OVERRIDES:
        return _CLASS_OVERRIDES[(cls, name)]
    if name in _BODY_LENGTH_FIELDS:
        return st.integers(0, 48)
    if name in _FIELD_OVERRIDES:
        return _FIELD_OVERRIDES[name]
    if spec.allowed is not None:
        return st.sampled_from(sorted(spec.allowed))
    if spec.mask is not None:
        return st.integers(0, spec.mask).map(lambda value, mask=spec.mask: value & mask)
    if spec.code == "h":
        return st.integers(-0x8000, 0x7FFF)
    return st.integers(0, _MAX[spec.code])


def _valid(message: Any) -> bool:
    try:
        message.validate()
    except nnrp.RemoteProtocolError:
        return False
    return True


_TENSOR_SUBMIT = ("src_width", "src_height", "tile_width", "tile_height", "tile_count",
                  "section_count", "input_profile", "tile_base_id", "camera_bytes",
                  "tile_index_bytes")
_TENSOR_RESULT = ("section_count", "tile_count", "tile_base_id", "tile_index_bytes",
                  "covered_tiles", "dropped_tiles")


def _repair(message: Any) -> Any:
    """Bring cross-field rules in line, so few drawn examples are filtered out."""
    if isinstance(message, nnrp.FrameSubmit | nnrp.ResultPush):
        tensor = bool(message.payload_kind_bitmap & nnrp.PayloadKind.TENSOR)
        names = _TENSOR_SUBMIT if isinstance(message, nnrp.FrameSubmit) else _TENSOR_RESULT
        if not tensor:
            message = attrs.evolve(message, **dict.fromkeys(names, 0))
    if isinstance(message, nnrp.ResultPush):
        stale = message.result_class == 2 or bool(message.result_flags & 1)
        message = attrs.evolve(message, reused_frame_id=(message.reused_frame_id or 1) if stale
                               else 0)
        if message.payload_kind_bitmap & nnrp.PayloadKind.TENSOR:
            dropped = max(message.dropped_tiles % 100, 1)
            covered = message.covered_tiles % 100
            message = attrs.evolve(message, dropped_tiles=dropped, covered_tiles=covered,
                                   tile_count=dropped + covered)
    if isinstance(message, nnrp.CacheInvalidate):
        scope = message.scope
        message = attrs.evolve(
            message, cache_namespace=message.cache_namespace if scope else 0,
            cache_key_hi=(message.cache_key_hi if scope == 3 else
                          message.cache_key_hi & 0xFFFFFFFF if scope == 2 else 0),
            cache_key_lo=message.cache_key_lo if scope == 3 else 0)
    if isinstance(message, nnrp.FlowUpdate):
        keep = {0: "connection_credit", 1: "session_credit", 2: "operation_credit"}[message.scope]
        cleared = {name: 0 for name in ("connection_credit", "session_credit",
                                        "operation_credit") if name != keep}
        if message.scope != 2:
            cleared["operation_id"] = 0
        elif not message.operation_id:
            cleared["operation_id"] = 1
        message = attrs.evolve(message, **cleared)
    return message


def messages(cls: type[Any]) -> st.SearchStrategy[Any]:
    """Valid metadata objects of one message class."""
    fields = {name: _field_strategy(cls, name, spec)
              for name, spec in cls.LAYOUT.fields if not spec.is_reserved}
    return st.builds(cls, **fields).map(_repair).filter(_valid)


@st.composite
def packets(draw: st.DrawFn, cls: type[Any] | None = None) -> nnrp.Packet:
    """A valid packet of ``cls`` (or any class) with a body its metadata agrees with."""
    if cls is None:
        cls = draw(st.sampled_from(sorted(MESSAGE_CLASSES.values(), key=lambda c: c.MSG_TYPE)))
    message = draw(messages(cls))
    expected = message.expected_body_len()
    size = expected if expected is not None else draw(st.integers(0, 96))
    body = draw(st.binary(min_size=size, max_size=size))
    return nnrp.Packet(
        message,
        session_id=draw(st.integers(0, _MAX["I"])),
        frame_id=draw(st.integers(0, _MAX["I"])),
        body=body,
        flags=draw(st.integers(0, 0x3F)),
        view_id=draw(st.integers(0, _MAX["H"])),
        route_id=draw(st.integers(0, _MAX["H"])),
        trace_id=draw(st.integers(0, _MAX["Q"])),
    )


ALL_CLASSES = sorted(MESSAGE_CLASSES.values(), key=lambda c: c.MSG_TYPE)
