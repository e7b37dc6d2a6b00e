"""Build the seed corpus from the golden vectors and the recorded transcripts."""

from __future__ import annotations

import json
from pathlib import Path

from gateway import nnrp
from gateway.tools.replay import bundled_transcripts

HERE = Path(__file__).parent / "corpus"


def main() -> None:
    folders = {name: HERE / name for name in ("nnrp_decoder", "typed_body", "envelope", "sse",
                                              "controls", "server_session")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    vectors = Path(__file__).parents[1] / "nnrp" / "vectors"
    for case_file in vectors.glob("*-core.json"):
        for case in json.loads(case_file.read_text())["cases"]:
            for value in (case.get("parameters") or {}).values():
                if isinstance(value, str) and len(value) % 2 == 0:
                    data = bytes.fromhex(value)
                    (folders["nnrp_decoder"] / f"{case['id']}.bin").write_bytes(data)
    client = nnrp.ClientConnection()
    hello = client.hello()
    envelope = json.dumps({"schema_version": "openai-compatible/1",
                           "operation": "chat.completions.create", "request_id": "r1",
                           "body": {"model": "m", "stream": True,
                                    "messages": [{"role": "user", "content": "hi"}]},
                           "nnrp": {"timeout_ms": 5, "diagnostics": True}}).encode()
    submit = nnrp.encode_openai_submit(1, 1, 1, envelope)
    (folders["nnrp_decoder"] / "session.bin").write_bytes(
        hello + nnrp.encode(nnrp.Packet(nnrp.SessionOpen(profile_id=2))) + submit)
    (folders["typed_body"] / "openai.bin").write_bytes(b"\x01\x10" + nnrp.pack_single_frame(envelope))
    (folders["envelope"] / "chat.json").write_bytes(envelope)
    # controls / server_session records: type index, session, frame, meta mode, body length,
    # then metadata and body (fuzz_targets._packet); one seed per message type.
    types = sorted(int(t) for t in nnrp.MsgType)
    session_seed = bytearray()
    for index, msg_type in enumerate(types):
        size = nnrp.MESSAGE_CLASSES[msg_type].LAYOUT.size
        record = bytes([index, 1, 1, 1, 0]) + bytes(size)
        (folders["controls"] / f"{nnrp.MsgType(msg_type).name.lower()}.bin").write_bytes(record)
        session_seed += record
    submit_index = types.index(int(nnrp.MsgType.FRAME_SUBMIT))
    meta = nnrp.encode_openai_submit(1, 1, 1, envelope)[40:40 + 72]
    body = nnrp.pack_single_frame(envelope)
    opening = bytes([submit_index, 1, 1, 1, 0]) + meta  # a submit with an empty body
    (folders["server_session"] / "all_types.bin").write_bytes(opening + bytes(session_seed))
    (folders["server_session"] / "submit_then_sends.bin").write_bytes(
        opening + bytes([0xF0, 1, 1, 0, 0xF0, 1, 1, 1, 0xF0, 1, 1, 2]) + body[:8])
    for name, transcript in bundled_transcripts().items():
        if transcript.streaming:
            (folders["sse"] / f"{name}.sse").write_bytes(transcript.body)
        elif transcript.body:
            (folders["envelope"] / f"{name}.json").write_bytes(transcript.body)


if __name__ == "__main__":
    main()
