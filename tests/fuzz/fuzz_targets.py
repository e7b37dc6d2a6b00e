"""atheris harnesses for the parsers, the state machine and the QUIC endpoint that take
untrusted bytes.

    python tests/fuzz/fuzz_targets.py TARGET [libFuzzer args...]     # TARGET: see TARGETS

Each harness asserts the parser's contract: it returns a value or raises its own
documented error type; anything else (an IndexError, a struct.error, a hang) is a
finding. ``make fuzz`` runs each for FUZZ_SECONDS with the seed corpus in
tests/fuzz/corpus/<target> (golden vectors and recorded transcripts).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

# The checkout last, for its tests/ package: an installed gateway (the compiled build's,
# for ``plain_blocks``: make fuzz-native) is imported before the checkout's sources.
sys.path.append(str(Path(__file__).resolve().parents[2]))

import atheris

with atheris.instrument_imports():
    from gateway import nnrp
    from gateway.profile import ProfileError, parse_envelope, read_typed_body
    from gateway.transport import quic as _quic
    from gateway.upstream import SSEDecoder, SSEError, UpstreamMalformed, parse_chunk
    from gateway.pipeline._plain_delta import NATIVE_BLOCKS
    from gateway.upstream._http1 import ProtocolError
    from tests.support.http1 import read_in_parts
    from tests.support.resume import exercise as resume


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
        read_typed_body(body, None)
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


def http1(data: bytes) -> None:
    """vLLM's response bytes into the upstream's HTTP/1.1 reader: only ProtocolError may
    escape, and how the bytes are split never changes the answer."""
    step = 1 + (data[0] % 16 if data else 0)
    answers = {_http1_read(data[1:], size) for size in (step, len(data) or 1)}
    assert len(answers) == 1, answers


def _http1_read(data: bytes, size: int) -> tuple[object, ...]:
    try:
        body, decoder = read_in_parts(data[start:start + size]
                                      for start in range(0, len(data), size))
        if decoder is None:
            return ("no head",)
        decoder.end_of_stream()
        return (body, decoder.done, decoder.extra, decoder.reusable)
    except ProtocolError as exc:
        return ("error", str(exc).split(" ")[0])


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
    sends = (lambda: [packet for packet in [connection.send_partial(session_id, operation_id,
                                                                    b"{}")] if packet],
             lambda: connection.send_result(session_id, operation_id, 200, b"{}"),
             lambda: connection.send_drop(session_id, operation_id,
                                          nnrp.DropReason.PEER_CANCELLED, b""),
             lambda: [packet for packet in [connection.send_progress(
                 session_id, operation_id, nnrp.Stage.EXECUTING)] if packet])
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


def _quic_fixture() -> tuple[object, object, bytes]:
    """Settings, a loaded server configuration and one real client Initial (built once)."""
    import datetime
    import tempfile
    from pathlib import Path

    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from gateway.transport import QuicSettings, TlsConfig

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    folder = Path(tempfile.mkdtemp(prefix="fuzz-quic-"))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    settings = QuicSettings(TlsConfig(folder / "cert.pem", folder / "key.pem"),
                            max_connections=4, retry_threshold=2)
    client = QuicConnection(configuration=QuicConfiguration(is_client=True,
                                                            server_name="localhost"))
    client.connect(("192.0.2.1", 4433), now=0.0)
    initial = client.datagrams_to_send(0.0)[0][0]
    return settings, _quic.server_configuration(settings), initial


_QUIC: tuple[object, object, bytes] | None = None


def quic_datagram(data: bytes) -> None:
    """Datagrams into a fresh QuicEndpoint (routing, admission, Retry, aioquic's
    QuicConnection): nothing may raise, state stays within its caps, and the server never
    sends more than three times what it received (RFC 9000 section 8.1).

    data[0] & 1: 0 = the rest is one datagram; 1 = a real client Initial first, then the
    rest cut into datagrams by a 2-byte length prefix each, sent to the Initial's
    destination connection ID when bit 1 of data[0] is set (so they reach its connection).
    """
    global _QUIC
    if _QUIC is None:
        _QUIC = _quic_fixture()
    settings, configuration, initial = _QUIC
    endpoint = _quic.QuicEndpoint(settings, configuration)  # type: ignore[arg-type]
    mode = data[0] if data else 0
    datagrams = [data[1:]]
    if mode & 1:
        datagrams = [initial]
        rest = data[1:]
        while len(rest) >= 2:
            size = int.from_bytes(rest[:2], "big") % 1600
            chunk, rest = rest[2:2 + size], rest[2 + size:]
            if mode & 2 and len(chunk) > 14:
                chunk = chunk[:6] + initial[6:14] + chunk[14:]  # long header: same DCID
            datagrams.append(chunk)
    received = sent = 0
    now = 1000.0
    for index, datagram in enumerate(datagrams):
        received += len(datagram)
        addr = ("192.0.2.7", 40000 + (index if mode & 4 else 0))
        sent += sum(map(len, _quic.feed_datagram(endpoint, datagram, now, addr)))
        now += 0.01
        assert len(endpoint.routes) <= settings.max_connections  # type: ignore[attr-defined]
        assert endpoint.handshakes_in_progress >= 0
    assert sent <= 3 * received, (sent, received)


def _pure_plain_delta() -> Any:
    """``_plain_delta`` from the checkout's source, interpreted and instrumented for
    coverage (the installed one is mypyc's where the C one is built: no bytecode).
    Loaded outside its package, it finds no C function of its own."""
    path = Path(__file__).resolve().parents[2] / "gateway" / "pipeline" / "_plain_delta.py"
    spec = importlib.util.spec_from_file_location("plain_delta_source", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.NATIVE_BLOCKS is None
    module._several = atheris.instrument_func(module._several)
    module.plain_blocks = atheris.instrument_func(module.plain_blocks)
    return module


_PURE = _pure_plain_delta()


def _blocks_answer(blocks: object, *args: object) -> object:
    try:
        return blocks(*args)  # type: ignore[operator]
    except ValueError as error:  # an empty suffix where the read is split: both raise it
        return ValueError, str(error)


def plain_blocks(data: bytes) -> None:
    """The plain text delta's C function against the pure one (``_plain_delta`` rule 7):
    the same answer for any read. The input: the prefix's size (2 bytes), the suffix's
    and the event tail's (1 each), the length cap plus 16 (2), a flag byte (bit 0: the
    rest is texts split at 0xFE, each made a block), then the prefix, the suffix, the
    tail and the rest (tests/fuzz/make_corpus.py: recorded reads)."""
    if len(data) < 7:
        return
    prefix_end = 7 + int.from_bytes(data[0:2], "big")
    suffix_end = prefix_end + data[2]
    tail_end = suffix_end + data[3]
    prefix, suffix, tail = data[7:prefix_end], data[prefix_end:suffix_end], data[suffix_end:tail_end]
    longest = int.from_bytes(data[4:6], "big") - 16
    raw = data[tail_end:]
    if data[6] & 1:
        raw = b"".join(prefix + text + suffix for text in raw.split(b"\xfe"))
    expected = _blocks_answer(_PURE.plain_blocks, raw, prefix, suffix, longest, tail)
    got = _blocks_answer(NATIVE_BLOCKS, raw, prefix, suffix, longest, tail)
    assert got == expected, (raw, prefix, suffix, longest, tail, got, expected)
    if expected is not None and not isinstance(expected[0], type):
        assert [type(text) for text in got[0]] == [str] * len(expected[0])


TARGETS = {"nnrp_decoder": nnrp_decoder, "typed_body": typed_body, "envelope": envelope,
           "sse": sse, "controls": controls, "server_session": server_session,
           "quic_datagram": quic_datagram, "http1": http1,
           # Resume and migration: arbitrary tokens and bodies over connections that come
           # and go (tests/support/resume.py, ``exercise``).
           "resume": resume,
           # The C plain text delta against the pure one, on the compiled build only.
           "plain_blocks": plain_blocks}

if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    if target is plain_blocks and NATIVE_BLOCKS is None:
        sys.exit("plain_blocks: the C plain text delta is built by the compiled build only "
                 "(make compiled, then make fuzz-native)")
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
    json.dumps({})  # keep the import used for harness authors adding JSON-shaped seeds
