"""atheris harnesses for the parsers and the state machine that take untrusted bytes.

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
    from gateway.upstream import SSEDecoder, SSEError, UpstreamMalformed, parse_chunk


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


#: Every preview4 message type, in a fixed order (a byte of input picks one).
_TYPES = sorted(int(t) for t in nnrp.MsgType)


def _packet(data: bytes, at: int) -> tuple[bytes, int]:
    """One well-framed packet from ``data[at:]``: the header is built so that framing
    passes and the message's own rules (metadata fields, body length) meet the input.
    Layout per record: type, session (0-2), frame (0-3), metadata-length mode, body
    length; then the metadata bytes and the body bytes."""
    head = data[at:at + 5].ljust(5, b"\0")
    cls = nnrp.MESSAGE_CLASSES[_TYPES[head[0] % len(_TYPES)]]
    size = cls.LAYOUT.size
    meta_len = size if head[3] % 8 else head[3] % 64  # mostly exact, sometimes wrong
    body_len = head[4] % 24
    at += 5
    meta = data[at:at + meta_len].ljust(meta_len, b"\0")
    at += meta_len
    body = data[at:at + body_len].ljust(body_len, b"\0")
    at += body_len
    header = nnrp.Header(cls.MSG_TYPE, meta_len=meta_len, body_len=body_len,
                         session_id=head[1] % 3, frame_id=head[2] % 4)
    return header.pack() + meta + body, at


def controls(data: bytes) -> None:
    """Every message class's decoder on well-framed input: a packet that re-encodes to the
    same bytes, or RemoteProtocolError."""
    packet_bytes, _ = _packet(data, 0)
    try:
        packet = nnrp.decode_packet(packet_bytes)
    except nnrp.RemoteProtocolError:
        return
    assert nnrp.decode_packet(nnrp.encode(packet)) == packet


def server_session(data: bytes) -> None:
    """The server state machine under a stream of well-framed frames (and the adapter's
    sends in between, as records with a first byte >= 0xF0), after a real hello and two
    open sessions. receive_data never raises; every byte it asks to send decodes; no
    output holds two terminals for one operation; an adapter send the rules forbid raises
    LocalProtocolError and writes nothing."""
    clock = [100.0]
    connection = nnrp.ServerConnection(nnrp.ServerConfig(
        max_in_flight=3, runtime_tokens=frozenset({"control.cancel_abort",
                                                   "control.credit_backpressure",
                                                   "control.progress_partial"})),
        clock=lambda: clock[0])
    session_open = nnrp.encode(nnrp.Packet(nnrp.SessionOpen(
        profile_id=2, schema_id=nnrp.TOKEN_SCHEMA_ID,
        schema_version=nnrp.TOKEN_SCHEMA_VERSION, max_in_flight=3)))
    setup = nnrp.encode(nnrp.Packet(nnrp.ClientHello(profile_bitmap=0b11))) + session_open * 2
    _check_output(connection.receive_data(setup))
    at = 0
    while at < len(data):
        if data[at] >= 0xF0:
            _adapter_send(connection, data[at:at + 4].ljust(4, b"\0"))
            at += 4
            continue
        packet, at = _packet(data, at)
        _check_output(connection.receive_data(packet))
        clock[0] += 0.25
        if connection.is_closed:
            return


def _adapter_send(connection: nnrp.ServerConnection, record: bytes) -> None:
    session_id, operation_id = record[1] % 3, record[2] % 4
    sends = (lambda: [connection.send_partial(session_id, operation_id, b"{}")],
             lambda: connection.send_result(session_id, operation_id, 200, b"{}"),
             lambda: connection.send_drop(session_id, operation_id,
                                          nnrp.DropReason.PEER_CANCELLED, b""),
             lambda: [connection.send_progress(session_id, operation_id,
                                               nnrp.Stage.EXECUTING)])
    try:
        _decode_all(sends[record[3] % len(sends)]())
    except nnrp.LocalProtocolError:
        pass


def _decode_all(chunks: list[bytes]) -> list[nnrp.Packet]:
    decoder = nnrp.Decoder()
    packets = [p for chunk in chunks for p in decoder.feed(chunk)]
    assert not decoder.buffered
    return packets


def _check_output(events: list[object]) -> None:
    sent = [e.data for e in events if isinstance(e, nnrp.SendBytes)]
    terminals = [(p.session_id, p.frame_id) for p in _decode_all(sent)
                 if p.msg_type in (nnrp.MsgType.RESULT_PUSH, nnrp.MsgType.RESULT_DROP_REASON)]
    assert len(terminals) == len(set(terminals)), terminals


TARGETS = {"nnrp_decoder": nnrp_decoder, "typed_body": typed_body, "envelope": envelope,
           "sse": sse, "controls": controls, "server_session": server_session}

if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
    json.dumps({})  # keep the import used for harness authors adding JSON-shaped seeds
