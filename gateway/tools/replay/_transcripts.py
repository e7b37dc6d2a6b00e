"""Recorded vLLM HTTP exchanges, and the per-version variants derived from them.

Format (JSONL, as the vLLM captures it was recorded from): line 1 is a header
``{scenario, vllm_version, method, path, request_headers, request_body, status,
response_headers, ...}``; each further line is one HTTP body chunk as the client
received it: ``{"t_ms": ms since the request was sent, "b64": base64 bytes}``.

Variants: a transcript (recorded on 0.32, or written for 0.26) is rewritten into each
family's shape (docs/reference/vllm-http.md sections 1-2; ``family_transcripts``: from 0.32 on, a
scenario's 0.32 recording ``<scenario>_032`` replaces its hand-written 0.26 original):
non-streaming bodies get exactly the family's declared fields (the gateway's
``ResponseShape`` tables, read from each release's models: 0.22 adds ``prompt_text``
and ``routed_experts``, 0.26 ``metrics`` and ``ec_transfer_params``, 0.32
``usage.completion_tokens_details``); 0.18 streams have no ``prompt_text`` and no
``system_fingerprint``; 0.18 and 0.22 leak ``"tool_calls":[]`` into content deltas of
tool streams and keep it in non-streaming messages.
"""

from __future__ import annotations

import ast
import base64
import json
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from gateway.upstream import ResponseShape, select_binding

FAMILIES = ("0.18", "0.22", "0.26", "0.32", "0.33")
#: 0.33 is served by the 0.32 binding; its own transcripts (``*_033``) are synthesized
#: from 0.32 recordings plus 0.33's additions (each says so in its note).
VERSIONS = {"0.18": "0.18.1", "0.22": "0.22.1", "0.26": "0.26.0", "0.32": "0.32.0",
            "0.33": "0.33.0"}
_USAGE_COUNTS = ("prompt_tokens", "total_tokens", "completion_tokens")


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


#: ``<scenario>_032`` is ``<scenario>`` recorded live from vLLM 0.32 (``_record``'s
#: ``record_forced``), where the bundled ``<scenario>`` is written by hand in 0.26's shape
#: (``_synthesize``): the families from 0.32 on play the recording, older ones the 0.26
#: shape.
RECORDED_032 = "_032"
_FROM_032 = ("0.32", "0.33")


def load_transcript(path: Path) -> Transcript:
    return parse_transcript(path.read_text())


def bundled_transcripts() -> dict[str, Transcript]:
    """The transcripts shipped in the package, by scenario: recorded on vLLM 0.32.0, or
    synthesized (0.26-shaped, or 0.33's own); each note says which, and why."""
    out = {}
    folder = resources.files("gateway.tools.replay").joinpath("transcripts")
    for entry in folder.iterdir():
        if entry.name.endswith(".jsonl"):
            transcript = parse_transcript(entry.read_text())
            out[transcript.scenario] = transcript
    return out


def family_transcripts(family: str) -> dict[str, Transcript]:
    """Every bundled scenario as the replay server plays it for ``family``: the
    transcript derived to the family's shape, a 0.32 recording (``RECORDED_032``) taking
    its scenario's place from 0.32 on. The recordings keep their own names too."""
    bundled = bundled_transcripts()
    out = {name: derive(transcript, family) for name, transcript in bundled.items()}
    if family in _FROM_032:
        for name in bundled:
            scenario = name.removesuffix(RECORDED_032)
            if scenario != name and scenario in bundled:
                out[scenario] = attrs.evolve(out[name], scenario=scenario)
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


def _shape(family: str) -> ResponseShape:
    return select_binding(VERSIONS[family], allow_untested=True)[0].shape


def _conform_usage(usage: Any, shape: ResponseShape, *, stream: bool) -> Any:
    """UsageInfo as the family declares it (a stream's usage chunk omits nulls)."""
    if not isinstance(usage, dict):
        return usage
    out = {k: usage[k] for k in _USAGE_COUNTS if k in usage}
    for field in shape.usage:
        if field in usage or not stream:
            out[field] = usage.get(field)
    return out


def conform_body(body: dict[str, Any], shape: ResponseShape) -> dict[str, Any]:
    """A non-streaming body with exactly the family's declared fields (``model_dump``):
    missing ones as null, ones the family does not have dropped."""
    out = {k: body.get(k) for k in ("id", "object", "created", "model")}
    out["choices"] = [_conform_choice(c, shape) for c in body.get("choices") or []]
    for field in shape.body:
        out[field] = (_conform_usage(body.get("usage"), shape, stream=False)
                      if field == "usage" else body.get(field))
    return out


def _conform_choice(choice: dict[str, Any], shape: ResponseShape) -> dict[str, Any]:
    message = choice.get("message") or {}
    conformed = {"role": message.get("role"), "content": message.get("content")}
    for field in shape.message:
        conformed[field] = message.get(field)
    calls = message.get("tool_calls") or []
    if calls or shape.empty_tool_calls_kept:
        conformed["tool_calls"] = calls
    out = {"index": choice.get("index"), "message": conformed}
    for field in shape.choice:
        out[field] = choice.get(field)
    return out


def derive(transcript: Transcript, family: str) -> Transcript:
    """The transcript as a vLLM of ``family`` would have sent it: bodies carry exactly the
    family's declared fields (``gateway.upstream``'s ``ResponseShape``, read from each
    release), and the stream differences of docs/reference/vllm-http.md section 1."""
    if family not in FAMILIES:
        raise ValueError(f"unknown vLLM family {family!r}")
    if family == "0.33" and transcript.vllm_version == VERSIONS[family]:
        return transcript  # 0.33's own (synthesized), written in its shape already
    shape = _shape(family)
    tools = bool(transcript.request_body.get("tools"))

    def chunk_transform(chunk: dict[str, Any]) -> dict[str, Any]:
        if family == "0.18":
            chunk.pop("prompt_text", None)
            chunk.pop("system_fingerprint", None)
        if "usage" in chunk:
            chunk["usage"] = _conform_usage(chunk["usage"], shape, stream=True)
        if tools and shape.empty_tool_calls_kept:
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                if "content" in delta and "tool_calls" not in delta and "role" not in delta:
                    delta["tool_calls"] = []
        return chunk

    def body_transform(body: dict[str, Any]) -> dict[str, Any]:
        body = conform_body(body, shape)
        if family == "0.18":
            body["system_fingerprint"] = None  # 0.18 writes no fingerprint
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
