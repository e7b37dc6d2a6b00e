"""Build the seed corpus from the golden vectors and the recorded transcripts."""

from __future__ import annotations

import json
from pathlib import Path

from gateway import nnrp
from gateway.tools.replay import bundled_transcripts

HERE = Path(__file__).parent / "corpus"


def main() -> None:
    folders = {name: HERE / name for name in ("nnrp_decoder", "typed_body", "envelope", "sse")}
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
    for name, transcript in bundled_transcripts().items():
        if transcript.streaming:
            (folders["sse"] / f"{name}.sse").write_bytes(transcript.body)
        elif transcript.body:
            (folders["envelope"] / f"{name}.json").write_bytes(transcript.body)


if __name__ == "__main__":
    main()
