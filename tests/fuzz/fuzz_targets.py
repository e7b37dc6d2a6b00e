"""atheris harnesses for the four parsers that take untrusted bytes.

    python tests/fuzz/fuzz_targets.py TARGET [libFuzzer args...]     # TARGET: see TARGETS

Each harness asserts the parser's contract: it returns a value or raises its own
documented error type; anything else (an IndexError, a struct.error, a hang) is a
finding. ``make fuzz`` runs each for FUZZ_SECONDS with the seed corpus in
tests/fuzz/corpus/<target> (golden vectors and recorded transcripts).
"""

from __future__ import annotations

import json
import sys

import atheris

with atheris.instrument_imports():
    from gateway import nnrp
    from gateway.profile import ProfileError, check_typed_body, parse_envelope
    from gateway.upstream import SSEDecoder, SSEError, UpstreamMalformed

    from gateway.pipeline import parse_chunk


def nnrp_decoder(data: bytes) -> None:
    """Stream decoder: any chunking; only RemoteProtocolError may escape."""
    decoder = nnrp.Decoder(max_packet=1 << 16)
    split = data[0] % 7 + 1 if data else 1
    try:
        for start in range(0, len(data), split):
            for packet in decoder.feed(data[start:start + split]):
                assert nnrp.decode_packet(nnrp.encode(packet)) == packet  # round trip
    except nnrp.RemoteProtocolError:
        pass
    connection = nnrp.ServerConnection()
    for event in connection.receive_data(data):  # the state machine never raises
        assert event is not None


def typed_body(data: bytes) -> None:
    count = data[0] % 4 if data else 0
    bitmap = data[1] & 0x7F if len(data) > 1 else 0x10
    try:
        body = nnrp.parse_typed_body(data[2:], payload_kind_bitmap=bitmap,
                                     payload_frame_count=count)
    except nnrp.TypedBodyError:
        return
    try:
        check_typed_body(body, None)
    except ProfileError as error:
        assert error.code == "invalid_submit_body"


def envelope(data: bytes) -> None:
    try:
        parsed = parse_envelope(data, max_bytes=1 << 16)
    except ProfileError as error:
        assert error.code in {"invalid_body", "unsupported_schema_version",
                              "unsupported_operation", "missing_model", "missing_messages",
                              "invalid_request_id", "invalid_nnrp_policy"}
        return
    # The body is forwarded exactly as the client wrote it (an "nnrp" key *inside* body is an
    # OpenAI field and travels on); the top-level nnrp policy object never joins it.
    document = json.loads(data.decode("utf-8"))
    assert parsed.body == document["body"]


def sse(data: bytes) -> None:
    decoder = SSEDecoder(max_line=4096, max_event=8192)
    try:
        for start in range(0, len(data), 5):
            for event in decoder.feed(data[start:start + 5]):
                if not event.is_done:
                    try:
                        parse_chunk(event.data)
                    except UpstreamMalformed:
                        pass
    except SSEError:
        pass


TARGETS = {"nnrp_decoder": nnrp_decoder, "typed_body": typed_body, "envelope": envelope,
           "sse": sse}

if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
    json.dumps({})  # keep the import used for harness authors adding JSON-shaped seeds
