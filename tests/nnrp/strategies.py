"""Hypothesis strategies for every NNRP message: valid metadata, matching bodies, headers."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import strategies as st

from gateway import nnrp
from gateway.nnrp._messages import MESSAGE_CLASSES

_MAX = {"B": 0xFF, "H": 0xFFFF, "I": 0xFFFFFFFF, "Q": 0xFFFFFFFFFFFFFFFF}
_STAGES = [int(s) for s in nnrp.Stage] + [0x8000, 0xFFFF]

#: Registries and masks, by field name (the names are unique enough across messages).
_FIELD_OVERRIDES: dict[str, st.SearchStrategy[int]] = {
    "min_version": st.just(1),
    "max_version": st.integers(1, 3),
    "priority_class": st.integers(0, 2),
    "in_flight_policy": st.integers(0, 1),
    "status": st.integers(0, 3),
    "source_role": st.integers(0, 7),
    "role": st.integers(0, 7),
    "drop_reason": st.integers(0, 9),
    "scope": st.integers(0, 2),
    "backpressure": st.integers(0, 2),
    "level": st.integers(0, 3),
    "code": st.integers(1, 12),
    "is_fatal": st.integers(0, 1),
    "submit_mode": st.integers(0, 2),
    "budget_policy": st.integers(0, 4),
    "applied_budget": st.integers(0, 15),
    "loss_tolerance": st.sampled_from([0, 1, 2, 3, 0xFF]),
    "tile_index_mode": st.integers(0, 3),
    "result_class": st.integers(0, 3),
    "result_flags": st.integers(0, 7),
    "congestion": st.integers(0, 3),
    "input_profile": st.integers(0, 2),
    "stage": st.sampled_from(_STAGES),
    "percent_x100": st.one_of(st.integers(0, 10000), st.just(0xFFFF)),
    "session_flags": st.integers(0, 0x0F),
    "session_flags_ack": st.integers(0, 0x1F),
    "trace_flags": st.integers(0, 3),
    "payload_kind_bitmap": st.integers(0, 0x7F),
    "deadline_unix_ms": st.integers(1, _MAX["Q"]),
    "operation_id": st.integers(1, _MAX["Q"]),
}
#: Fields whose registry differs per message.
_CLASS_OVERRIDES: dict[tuple[type[Any], str], st.SearchStrategy[int]] = {
    (nnrp.SessionClose, "reason"): st.integers(0, 5),
    (nnrp.Cancel, "reason"): st.integers(0, 8),
    (nnrp.Abort, "reason"): st.integers(0, 8),
    (nnrp.FlowUpdate, "reason"): st.integers(0, 4),
    (nnrp.ResultHint, "reason"): st.integers(0, 4),
    (nnrp.FlowUpdate, "flags"): st.integers(0, 0x0F),
    (nnrp.Supersede, "flags"): st.integers(0, 1),
    (nnrp.FlowUpdate, "operation_id"): st.integers(0, _MAX["Q"]),
}
_BODY_LENGTH_FIELDS = {"diagnostic_bytes", "body_bytes", "payload_bytes", "auth_bytes",
                       "control_extension_bytes", "resume_token_bytes",
                       "session_extension_bytes"}


def _field_strategy(cls: type[Any], name: str, code: str) -> st.SearchStrategy[int]:
    if (cls, name) in _CLASS_OVERRIDES:
        return _CLASS_OVERRIDES[(cls, name)]
    if name in _BODY_LENGTH_FIELDS:
        return st.integers(0, 48)
    if name in _FIELD_OVERRIDES:
        return _FIELD_OVERRIDES[name]
    if name == "flags":
        return st.integers(0, 3)
    if code == "h":
        return st.integers(-0x8000, 0x7FFF)
    return st.integers(0, _MAX[code])


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
    fields = {name: _field_strategy(cls, name, code)
              for name, code in cls.LAYOUT.fields if name is not None}
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
