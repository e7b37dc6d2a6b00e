"""Building and reading NNRP packets in the sans-IO tests (no sockets)."""

from __future__ import annotations

from typing import Any

from gateway import nnrp


def pk(message: Any, **kw: Any) -> bytes:
    return nnrp.encode(nnrp.Packet(message, **kw))


def submit(session_id: int, operation_id: int, frame_id: int, payload: bytes = b"{}",
           **kw: Any) -> bytes:
    """An openai-compatible FRAME_SUBMIT carrying ``payload`` as its one typed frame."""
    return pk(nnrp.FrameSubmit(operation_id=operation_id, payload_kind_bitmap=0x10,
                               payload_frame_count=1),
              session_id=session_id, frame_id=frame_id, body=nnrp.pack_single_frame(payload),
              **kw)


def unpacked(packets: list[bytes]) -> list[nnrp.Packet]:
    """A multi-packet output, decoded (each element is exactly one packet)."""
    return [nnrp.decode_packet(packet) for packet in packets]


def of(events: list[Any], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def replies(events: list[Any]) -> list[nnrp.Packet]:
    """Every packet the events send, decoded."""
    out: list[nnrp.Packet] = []
    for event in of(events, nnrp.SendBytes):
        out += nnrp.Decoder().feed(event.data)
    return out
