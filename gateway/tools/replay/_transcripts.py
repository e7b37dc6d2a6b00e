"""Recorded vLLM HTTP exchanges, and the per-version variants derived from them.

Format (JSONL, the same as ../shared/vllm-captures): line 1 is a header
``{scenario, vllm_version, method, path, request_headers, request_body, status,
response_headers, ...}``; each further line is one HTTP body chunk as the client
received it: ``{"t_ms": ms since the request was sent, "b64": base64 bytes}``.

Variants: a transcript recorded on the newest frontend (0.26-shaped) is rewritten into
the 0.18 and 0.22 shapes by the documented differences (vllm-http.md sections 1-2):
0.18 has no ``prompt_text`` and no ``system_fingerprint``; 0.18 and 0.22 leak
``"tool_calls":[]`` into content deltas of tool streams and keep ``"tool_calls":[]`` in
non-streaming messages; 0.22 adds ``routed_experts`` and 0.26 ``metrics`` /
``ec_transfer_params`` to non-streaming bodies.
"""

from __future__ import annotations

import ast
import base64
import json
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

FAMILIES = ("0.18", "0.22", "0.26")
VERSIONS = {"0.18": "0.18.1", "0.22": "0.22.1", "0.26": "0.26.0"}


@attrs.frozen
class Transcript:
    scenario: str
    vllm_version: str
    status: int
    response_headers: tuple[tuple[str, str], ...]
    chunks: tuple[tuple[float, bytes], ...]
    request_body: dict[str, Any] = attrs.field(factory=dict)
    request_headers: tuple[tuple[str, str], ...] = ()
    note: str = ""

    @property
    def body(self) -> bytes:
        return b"".join(data for _, data in self.chunks)

    @property
    def streaming(self) -> bool:
        return any(v.startswith("text/event-stream") for k, v in self.response_headers
                   if k == "content-type")

    def to_jsonl(self) -> str:
        header = {"scenario": self.scenario, "vllm_version": self.vllm_version,
                  "method": "POST", "path": "/v1/chat/completions",
                  "request_headers": dict(self.request_headers),
                  "request_body": self.request_body, "status": self.status,
                  "response_headers": dict(self.response_headers), "note": self.note}
        lines = [json.dumps(header)]
        lines += [json.dumps({"t_ms": round(t, 3), "b64": base64.b64encode(data).decode()})
                  for t, data in self.chunks]
        return "\n".join(lines) + "\n"


def parse_transcript(text: str) -> Transcript:
    lines = [line for line in text.splitlines() if line.strip()]
    header = json.loads(lines[0])
    body = header.get("request_body") or {}
    if isinstance(body, str):  # the raw captures store the request as a Python literal
        try:
            body = ast.literal_eval(body)
        except (SyntaxError, ValueError):
            body = {"raw": body}  # a deliberately broken request (error_400_bad_json)
    chunks = []
    for line in lines[1:]:
        entry = json.loads(line)
        data = base64.b64decode(entry["b64"]) if "b64" in entry else entry["b"].encode()
        chunks.append((float(entry["t_ms"]), data))
    headers = tuple((str(k).lower(), str(v)) for k, v in
                    (header.get("response_headers") or {}).items())
    return Transcript(header["scenario"], str(header.get("vllm_version", "")),
                      int(header["status"]), headers, tuple(chunks), body,
                      tuple((str(k).lower(), str(v)) for k, v in
                            (header.get("request_headers") or {}).items()),
                      str(header.get("note", "")))


def load_transcript(path: Path) -> Transcript:
    return parse_transcript(path.read_text())


def bundled_transcripts() -> dict[str, Transcript]:
    """The transcripts shipped in the package (recorded on vLLM 0.32.0, 0.26-shaped)."""
    out = {}
    folder = resources.files("gateway.tools.replay").joinpath("transcripts")
    for entry in folder.iterdir():
        if entry.name.endswith(".jsonl"):
            transcript = parse_transcript(entry.read_text())
            out[transcript.scenario] = transcript
    return out


# --------------------------------------------------------------------------- variants


def _dump(value: Any) -> bytes:
    """vLLM's compact encoding (pydantic model_dump_json: no spaces, UTF-8 as is). A lone
    surrogate cannot be written as UTF-8; it stays escaped, as the recorded bytes had it."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode("ascii")


def _rewrite_sse(data: bytes, transform: Any) -> bytes:
    out = []
    for event in data.split(b"\n\n"):
        if event.startswith(b"data: {") and not event.startswith(b'data: {"error"'):
            chunk = json.loads(event[6:])
            event = b"data: " + _dump(transform(chunk))
        out.append(event)
    return b"\n\n".join(out)


def derive(transcript: Transcript, family: str) -> Transcript:
    """The transcript as a vLLM of ``family`` would have sent it."""
    if family not in FAMILIES:
        raise ValueError(f"unknown vLLM family {family!r}")
    if family == "0.26":
        return attrs.evolve(transcript, vllm_version=VERSIONS[family])
    tools = bool(transcript.request_body.get("tools"))

    def chunk_transform(chunk: dict[str, Any]) -> dict[str, Any]:
        if family == "0.18":
            chunk.pop("prompt_text", None)
            chunk.pop("system_fingerprint", None)
        if tools:
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                if "content" in delta and "tool_calls" not in delta and "role" not in delta:
                    delta["tool_calls"] = []
        return chunk

    def body_transform(body: dict[str, Any]) -> dict[str, Any]:
        for field in ("metrics", "ec_transfer_params"):
            body.pop(field, None)
        if family == "0.18":
            body.pop("prompt_text", None)
            body.pop("routed_experts", None)
            body["system_fingerprint"] = None
        else:
            body.setdefault("routed_experts", None)
        for choice in body.get("choices", []):
            message = choice.get("message", {})
            if not message.get("tool_calls"):
                message["tool_calls"] = []
        return body

    chunks = []
    for t, data in transcript.chunks:
        if transcript.status == 200 and transcript.streaming:
            data = _rewrite_sse(data, chunk_transform)
        elif transcript.status == 200:
            data = _dump(body_transform(json.loads(data)))
        chunks.append((t, data))
    headers = tuple((k, str(len(b"".join(d for _, d in chunks))) if k == "content-length" else v)
                    for k, v in transcript.response_headers)
    return attrs.evolve(transcript, vllm_version=VERSIONS[family], chunks=tuple(chunks),
                        response_headers=headers)
