"""Requests with media frames (gateway/profile/_media.py): the typed body, the submit's
metadata, and small real-format samples."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from gateway import nnrp

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4
WAV = b"RIFF\x24\x08\x00\x00WAVEfmt \x10\x00\x00\x00" + bytes(255 - b % 256 for b in range(2000))
OPAQUE, AUDIO, VIDEO = (int(nnrp.PayloadKind.OPAQUE), int(nnrp.PayloadKind.AUDIO),
                        int(nnrp.PayloadKind.VIDEO))


def media_body(envelope: bytes, frames: Sequence[tuple[int, bytes]]) -> bytes:
    """The typed body: the envelope, then each (kind, bytes) as a whole media frame."""
    media = [(nnrp.TypedDescriptor(payload_kind=kind, stream_semantics=0), data)
             for kind, data in frames]
    return nnrp.pack_typed_body([(nnrp.TypedDescriptor(), envelope), *media])


def media_submit(operation_id: int, envelope: bytes, frames: Sequence[tuple[int, bytes]]
                 ) -> tuple[nnrp.FrameSubmit, bytes]:
    """FRAME_SUBMIT metadata and typed body for our client's ``submit_frame``."""
    bitmap = int(nnrp.PayloadKind.STRUCTURED_EVENT)
    for kind, _ in frames:
        bitmap |= kind
    meta = nnrp.FrameSubmit(operation_id=operation_id, payload_kind_bitmap=bitmap,
                            payload_frame_count=1 + len(frames))
    return meta, media_body(envelope, frames)


def image_part(reference: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": reference}}


def with_parts(body: dict[str, Any], *parts: dict[str, Any]) -> dict[str, Any]:
    """``body`` whose last message's content is its text and then ``parts``."""
    messages = [dict(message) for message in body["messages"]]
    text = messages[-1]["content"]
    messages[-1]["content"] = [{"type": "text", "text": text}, *parts]
    return {**body, "messages": messages}


def data_uri_bytes(uri: str) -> tuple[str, bytes]:
    """A data URI's media type and decoded bytes."""
    head, _, data = uri.partition(",")
    assert head.startswith("data:") and head.endswith(";base64"), head
    return head[5:-7], base64.b64decode(data, validate=True)


def sent_content(request: Any) -> list[dict[str, Any]]:
    """The last message's content parts of a request the replay vLLM recorded."""
    content: list[dict[str, Any]] = json.loads(request.body)["messages"][-1]["content"]
    return content
