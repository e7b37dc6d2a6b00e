"""Build the seed corpus from the golden vectors and the recorded transcripts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway import nnrp
from gateway.tools.replay import bundled_transcripts

HERE = Path(__file__).parent / "corpus"


def main() -> None:
    folders = {name: HERE / name for name in ("nnrp_decoder", "typed_body", "envelope", "sse",
                                              "controls", "server_session", "quic_datagram",
                                              "http1", "resume", "plain_blocks")}
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
    quic_seeds(folders["quic_datagram"])
    plain_blocks_seeds(folders["plain_blocks"])
    resume_seeds(folders["resume"])
    (folders["http1"] / "length.http").write_bytes(
        b"\x03HTTP/1.1 400 Bad Request\r\ncontent-length: 11\r\n\r\n{\"error\":1}")
    (folders["http1"] / "close.http").write_bytes(
        b"\x00HTTP/1.0 200 OK\r\nconnection: close\r\n\r\nuntil the end")
    (folders["http1"] / "interim-and-trailer.http").write_bytes(
        b"\x01HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n0\r\nx-t: 1\r\n\r\n")
    for name, transcript in bundled_transcripts().items():
        if transcript.streaming:
            (folders["sse"] / f"{name}.sse").write_bytes(transcript.body)
            # As vLLM frames it on the wire: one chunk per write (a first byte picks the
            # harness's split size).
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(line), line)
                              for line in transcript.body.split(b"\n\n") if line)
            (folders["http1"] / f"{name}.http").write_bytes(
                b"\x07HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
        elif transcript.body:
            (folders["envelope"] / f"{name}.json").write_bytes(transcript.body)


def resume_seeds(folder: Path) -> None:
    """Records for tests/support/resume.py ``exercise`` (kind, two argument bytes): an
    open asking for resume, the connection's end, a resume with its live token, a
    resubmission; and a migration with the live token after another end."""
    open_resumable, cut = bytes([0, 0, 1]), bytes([4, 0, 0])
    resume_live, submit = bytes([1, 0, 1]), bytes([3, 0, 1])
    migrate_live = bytes([2, 0, 0x09])  # old transport 2 (tcp), new 3 (ipc), live token
    (folder / "resume.bin").write_bytes(open_resumable + submit + cut + resume_live + submit)
    (folder / "migrate.bin").write_bytes(open_resumable + cut + migrate_live + submit)


def plain_blocks_seeds(folder: Path) -> None:
    """Reads of recorded streams with the kept bytes they were offered with (the fuzz
    target ``plain_blocks``'s layout), the ones the fused path takes and the first few
    it declines, and the same texts as blocks (flag 1)."""
    from gateway.pipeline._plain_delta import plain_blocks
    from tests.pipeline.test_plain_delta import reads_taken, streams

    offered: list[tuple[bytes, bytes, bytes, int, bytes]] = []

    def record(*args: Any) -> Any:
        offered.append(args)
        return plain_blocks(*args)

    for transcript in streams("0.32").values():
        if transcript.status == 200 and len(offered) < 400:
            reads_taken(transcript, record)
    taken = [args for args in offered if plain_blocks(*args) is not None][:24]
    declined = [args for args in offered if plain_blocks(*args) is None][:8]
    for number, (raw, prefix, suffix, longest, tail) in enumerate(taken + declined):
        head = (len(prefix).to_bytes(2, "big") + bytes([len(suffix), len(tail)])
                + min(longest + 16, 0xFFFF).to_bytes(2, "big"))
        (folder / f"read-{number}.bin").write_bytes(head + b"\x00" + prefix + suffix + tail + raw)
        texts = raw.removeprefix(prefix).removesuffix(suffix).split(suffix + prefix)
        (folder / f"blocks-{number}.bin").write_bytes(
            head + b"\x01" + prefix + suffix + tail + b"\xfe".join(texts))


def quic_seeds(folder: Path) -> None:
    """A client Initial alone (mode 0), after the harness's own (modes 1 and 3, so the
    second datagram is a duplicate routed to the new connection), and small packets."""
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection

    client = QuicConnection(configuration=QuicConfiguration(is_client=True,
                                                            server_name="localhost"))
    client.connect(("192.0.2.1", 4433), now=0.0)
    initial = client.datagrams_to_send(0.0)[0][0]
    (folder / "initial.bin").write_bytes(b"\x00" + initial)
    (folder / "initial-then-dup.bin").write_bytes(
        b"\x03" + len(initial).to_bytes(2, "big") + initial)
    (folder / "short-header.bin").write_bytes(b"\x00\x40" + bytes(range(40)))
    (folder / "version-negotiation.bin").write_bytes(b"\x00\x80\x00\x00\x00\x00\x08"
                                                     + bytes(8) + b"\x08" + bytes(8))


if __name__ == "__main__":
    main()
