"""The sans-IO server and client state machines, driven as pure data (no sockets)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway import nnrp
from tests.support.wire import of, pk, replies, submit, unpacked

HELLO = nnrp.ClientHello(profile_bitmap=0b11, payload_kind_bitmap=0x73, latency_budget_ms=500)
OPEN = nnrp.SessionOpen(profile_id=2, priority_class=1, schema_id=0x1001, schema_version=3,
                        max_in_flight=4)












@pytest.fixture
def server() -> nnrp.ServerConnection:
    conn = nnrp.ServerConnection(nnrp.ServerConfig(max_sessions=3, max_in_flight=2))
    events = conn.receive_data(pk(HELLO))
    assert of(events, nnrp.HandshakeCompleted)
    events = conn.receive_data(pk(OPEN))
    assert of(events, nnrp.SessionOpened)[0].session_id == 1
    return conn


# --------------------------------------------------------------------------- handshake


def test_hello_ack_matches_the_reference_server() -> None:
    conn = nnrp.ServerConnection()
    probe = pk(nnrp.TransportProbe(probe_id=9, timestamp_us=77))
    events = conn.receive_data(probe + pk(HELLO))
    ack_probe, ack = replies(events)
    assert ack_probe.message == nnrp.TransportProbeAck(probe_id=9, timestamp_us=77)
    assert isinstance(ack.message, nnrp.ServerHelloAck)
    # section 1 step 3: bitmap AND, bit (profile_id - 1); token profile only here.
    assert ack.message.accepted_profile_bitmap == 0b10
    assert ack.message.accepted_payload_kind_bitmap == 0x73
    assert ack.session_id == 0
    assert conn.state is nnrp.ConnState.READY


@pytest.mark.parametrize("first", [
    b"GET / HTTP/1.1\r\n\r\n" + b"\0" * 30,
    pk(OPEN),
    pk(nnrp.Ping()),
    pk(nnrp.ClientHello(profile_bitmap=0b100)),  # no common profile
    pk(nnrp.ClientHello(profile_bitmap=2, auth_bytes=2), body=b"xx"),  # hello body
])
def test_anything_but_hello_first_closes_silently(first: bytes) -> None:
    conn = nnrp.ServerConnection()
    (failure,) = conn.receive_data(first)
    assert isinstance(failure, nnrp.ConnectionFailed)
    assert failure.replies == ()
    assert conn.state is nnrp.ConnState.CLOSED
    assert conn.receive_data(pk(HELLO)) == []


def test_framing_error_in_session_sends_fatal_error(server: nnrp.ServerConnection) -> None:
    bad = bytearray(pk(nnrp.Ping()))
    bad[12] = 4  # meta_len
    (failure,) = server.receive_data(bytes(bad))
    assert isinstance(failure, nnrp.ConnectionFailed)
    (error,) = nnrp.Decoder().feed(b"".join(failure.replies))
    assert error.message.code == nnrp.ErrorCode.MALFORMED_HEADER
    assert error.message.is_fatal == 1
    assert b"meta_len" in error.body


def test_a_fatal_error_drops_every_session_operation_first(
        server: nnrp.ServerConnection) -> None:
    """Issue 12: the other sessions' operations end with their drop, never silently."""
    server.receive_data(pk(OPEN))
    server.receive_data(submit(1, 1, 1) + submit(2, 2, 7))
    server.send_partial(2, 2, b"x")
    bad = bytearray(pk(nnrp.Ping()))
    bad[7] = 0xEE  # an unknown msg_type
    (failure,) = server.receive_data(bytes(bad))
    assert isinstance(failure, nnrp.ConnectionFailed)
    packets = [nnrp.decode_packet(p) for p in failure.replies]  # one packet each
    drops = [(p.session_id, p.frame_id, p.message.drop_reason, p.message.result_sequence)
             for p in packets[:-1]]
    assert sorted(drops) == [(1, 1, nnrp.DropReason.TRANSPORT_CLOSED, 1),
                             (2, 7, nnrp.DropReason.TRANSPORT_CLOSED, 2)]
    assert packets[-1].message.is_fatal == 1


def test_frames_before_any_session_open_are_refused_not_fatal() -> None:
    conn = nnrp.ServerConnection()
    conn.receive_data(pk(HELLO))
    for frame in (pk(nnrp.Cancel(operation_id=1), session_id=1),
                  pk(nnrp.Deadline(operation_id=1, deadline_unix_ms=5), session_id=1),
                  pk(nnrp.CapabilityNegotiation(), session_id=0),
                  pk(nnrp.CreditUpdate(scope_id=1, credit_window=3), session_id=0)):
        events = conn.receive_data(frame)
        assert not conn.is_closed
        (error,) = [p for e in events if isinstance(e, nnrp.SendBytes)
                    for p in nnrp.Decoder().feed(e.data)]
        assert error.session_id == 0 and error.message.is_fatal == 0
    # Connection-wide flow control needs no session.
    assert conn.receive_data(pk(nnrp.CreditUpdate(credit_window=3, flags=1))) == [
        nnrp.FlowChanged()]


def test_a_control_naming_another_sessions_operation(server: nnrp.ServerConnection) -> None:
    server.receive_data(pk(OPEN))
    server.receive_data(submit(2, 7, 1))
    (refused,) = [p for e in server.receive_data(pk(nnrp.Cancel(operation_id=7),
                                                     session_id=1))
                  for p in nnrp.Decoder().feed(e.data)]
    assert isinstance(refused.message, nnrp.ErrorRecoverable)
    assert b"never submitted" in refused.body
    assert server.operation_state(2, 7) is nnrp.OpState.ACTIVE


@pytest.mark.parametrize("message", [nnrp.ServerHelloAck(), nnrp.SessionOpenAck(),
                                     nnrp.PartialResult(operation_id=1), nnrp.ResultPush()])
def test_server_only_messages_from_a_client_are_noted_and_ignored(
        server: nnrp.ServerConnection, message: Any) -> None:
    # Well-formed frames are never a reason to close (rule 2): noted, counted, ignored.
    (ignored,) = server.receive_data(pk(message, session_id=1))
    assert isinstance(ignored, nnrp.FrameIgnored) and ignored.session_id == 1
    assert server.state is nnrp.ConnState.READY


def test_a_frame_for_a_session_that_is_not_open_is_refused_not_fatal(
        server: nnrp.ServerConnection) -> None:
    (error,) = replies(server.receive_data(submit(9, 1, 1)))
    # Header session 0 (no client takes it for one of its sessions), the session named.
    assert isinstance(error.message, nnrp.Error) and error.session_id == 0
    assert (error.message.is_fatal, error.message.related_session_id) == (0, 9)
    assert b"session 9" in error.body
    assert server.state is nnrp.ConnState.READY
    assert of(server.receive_data(submit(1, 1, 1)), nnrp.OperationSubmitted)


# --------------------------------------------------------------------------- sessions


def test_sessions_get_lowest_free_id_and_honour_requests(server: nnrp.ServerConnection) -> None:
    events = server.receive_data(pk(nnrp.SessionOpen(profile_id=2, schema_id=0x1001,
                                                     schema_version=3,
                                                     requested_session_id=7)))
    assert of(events, nnrp.SessionOpened)[0].session_id == 7
    (ack,) = replies(events)
    assert ack.session_id == 7 and ack.message.session_id == 7
    events = server.receive_data(pk(OPEN))
    assert of(events, nnrp.SessionOpened)[0].session_id == 2


@pytest.mark.parametrize(("request_", "code"), [
    (nnrp.SessionOpen(profile_id=5), nnrp.SessionError.PROFILE_UNSUPPORTED),
    (nnrp.SessionOpen(profile_id=2, schema_id=0x2002, schema_version=1),
     nnrp.SessionError.SCHEMA_UNSUPPORTED),
    (nnrp.SessionOpen(profile_id=2, resume_token_bytes=4), nnrp.SessionError.RESUME_REJECTED),
])
def test_session_refusals_are_typed(server: nnrp.ServerConnection, request_: Any,
                                    code: nnrp.SessionError) -> None:
    body = b"tokn" if request_.resume_token_bytes else b""
    events = server.receive_data(pk(request_, body=body))
    (ack,) = replies(events)
    assert ack.message.status == nnrp.SessionOpenStatus.REJECTED
    assert ack.message.session_error_code == code
    assert ack.body  # UTF-8 diagnostic
    assert of(events, nnrp.SessionOpenRefused)


def test_session_limit(server: nnrp.ServerConnection) -> None:
    server.receive_data(pk(OPEN) + pk(OPEN))
    (ack,) = replies(server.receive_data(pk(OPEN)))
    assert ack.message.session_error_code == nnrp.SessionError.LIMIT_REACHED


def test_auth_hook_refuses_bad_tokens() -> None:
    conn = nnrp.ServerConnection(nnrp.ServerConfig(authenticate=lambda token: token == b"s3cret"))
    conn.receive_data(pk(HELLO))
    open_with = lambda token: pk(nnrp.SessionOpen(profile_id=2, auth_bytes=len(token)),  # noqa: E731
                                 body=token)
    (ack,) = replies(conn.receive_data(open_with(b"wrong!")))
    assert ack.message.session_error_code == nnrp.SessionError.AUTH_FAILED
    assert b"s3cret" not in ack.body and b"wrong" not in ack.body
    assert of(conn.receive_data(open_with(b"s3cret")), nnrp.SessionOpened)


# --------------------------------------------------------------------------- operations


def test_submit_partials_and_terminal(server: nnrp.ServerConnection) -> None:
    (event,) = server.receive_data(submit(1, 0x65, 1, b'{"a":1}', trace_id=0xABC))
    assert isinstance(event, nnrp.OperationSubmitted)
    assert event.typed_body is not None and event.typed_body.frames[0].payload == b'{"a":1}'
    assert event.header_trace_id == 0xABC
    first = nnrp.decode_packet(server.send_partial(1, 0x65, b"x"))
    second = nnrp.decode_packet(server.send_partial(1, 0x65, b"y"))
    assert [first.message.result_sequence, second.message.result_sequence] == [1, 2]
    assert second.message.delta_sequence == 2 and second.frame_id == 1
    final = unpacked(server.send_result(1, 0x65, 200, b"{}"))[0]
    assert final.message.payload_kind_bitmap == 0x10 and final.message.payload_frame_count == 1
    # Rule 8: nothing after the terminal.
    with pytest.raises(nnrp.LocalProtocolError):
        server.send_partial(1, 0x65, b"late")
    with pytest.raises(nnrp.LocalProtocolError):
        server.send_result(1, 0x65, 200, b"{}")


def test_bad_typed_body_still_becomes_an_operation(server: nnrp.ServerConnection) -> None:
    raw = pk(nnrp.FrameSubmit(operation_id=3, payload_kind_bitmap=0x10, payload_frame_count=1),
             session_id=1, frame_id=4, body=b"\x01" * 40)
    (event,) = server.receive_data(raw)
    assert event.typed_body is None
    assert event.body_error == "prelude body_flags and reserved must be 0"
    assert server.operation_state(1, 3) is nnrp.OpState.ACTIVE


def test_duplicate_operation_id_and_frame_id(server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(1, 5, 1))
    (refused,) = server.receive_data(submit(1, 5, 2))
    assert isinstance(refused, nnrp.SubmitRefused)
    assert refused.reason is nnrp.RefusalReason.DUPLICATE_OPERATION_ID and refused.frame_id == 2
    (error,) = replies(server.receive_data(submit(1, 6, 1)))
    assert isinstance(error.message, nnrp.ErrorRecoverable)
    assert error.message.error_code == nnrp.ErrorCode.INVALID_STATE
    assert server.state is nnrp.ConnState.READY


def test_in_flight_limit_refuses(server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(1, 1, 1) + submit(1, 2, 2))
    (refused,) = server.receive_data(submit(1, 3, 3))
    assert refused.reason is nnrp.RefusalReason.OPERATION_LIMIT
    server.send_result(1, 1, 200, b"{}")
    assert of(server.receive_data(submit(1, 4, 4)), nnrp.OperationSubmitted)


@pytest.mark.parametrize("how", ["frame_cancel", "cancel", "abort", "session"])
def test_cancellation_forms(server: nnrp.ServerConnection, how: str) -> None:
    server.receive_data(submit(1, 0x65, 1))
    raw = {
        "frame_cancel": pk(nnrp.FrameCancel(), session_id=1, frame_id=1),
        "cancel": pk(nnrp.Cancel(operation_id=0x65, reason=1, source_role=1), session_id=1,
                     frame_id=1),
        "abort": pk(nnrp.Abort(operation_id=0x65, reason=7), session_id=1),
        "session": pk(nnrp.Cancel(operation_id=0), session_id=1),
    }[how]
    (cancelled,) = server.receive_data(raw)
    assert isinstance(cancelled, nnrp.OperationCancelled)
    assert cancelled.operation_id == 0x65 and cancelled.frame_id == 1
    assert server.operation_state(1, 0x65) is nnrp.OpState.CANCELLING
    with pytest.raises(nnrp.LocalProtocolError):
        server.send_partial(1, 0x65, b"x")
    with pytest.raises(nnrp.LocalProtocolError):
        server.send_result(1, 0x65, 200, b"{}")
    trace, drop = unpacked(server.send_drop(1, 0x65, nnrp.DropReason.PEER_CANCELLED,
                                                       b"peer_cancelled"))
    # Wire case cancel-abort: TRACE_CONTEXT with header.frame_id 0, then the drop.
    assert isinstance(trace.message, nnrp.TraceContext) and trace.frame_id == 0
    assert (trace.message.trace_id, trace.message.span_id) == (0x65, 1)
    assert drop.message.drop_reason == 3 and drop.body == b"peer_cancelled"
    assert drop.message.result_sequence == 1 and drop.frame_id == 1
    # A second cancel of an ended operation is a harmless race.
    assert server.receive_data(raw) == []


def test_cancel_with_mismatched_frame_or_unknown_operation(server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(1, 0x65, 1))
    (error,) = replies(server.receive_data(
        pk(nnrp.Cancel(operation_id=0x65), session_id=1, frame_id=2)))
    assert isinstance(error.message, nnrp.ErrorRecoverable)
    assert b"bound to frame 1" in error.body
    assert server.operation_state(1, 0x65) is nnrp.OpState.ACTIVE
    (error,) = replies(server.receive_data(pk(nnrp.Cancel(operation_id=99), session_id=1)))
    assert b"operation 99, which this session never submitted" in error.body


def test_deadline_before_submit_is_held_then_applied(server: nnrp.ServerConnection) -> None:
    assert server.receive_data(pk(nnrp.Deadline(operation_id=151, deadline_unix_ms=5000),
                                  session_id=1, frame_id=1)) == []
    (event,) = server.receive_data(submit(1, 151, 1))
    assert event.deadline_unix_ms == 5000
    assert event.deadline_drop_reason == nnrp.DropReason.DEADLINE_EXPIRED
    (update,) = server.receive_data(pk(nnrp.ExpireAt(operation_id=151, deadline_unix_ms=1),
                                       session_id=1))
    assert isinstance(update, nnrp.DeadlineUpdated)
    assert update.drop_reason == nnrp.DropReason.SUPERSEDED


FUTURE = 4_000_000_000_000  # unix ms, in 2096


def test_pending_deadlines_are_bounded() -> None:
    conn = nnrp.ServerConnection(nnrp.ServerConfig(max_pending_deadlines=2))
    conn.receive_data(pk(HELLO) + pk(OPEN))
    for op in (1, 2):
        conn.receive_data(pk(nnrp.Deadline(operation_id=op, deadline_unix_ms=FUTURE),
                             session_id=1))
    (error,) = replies(conn.receive_data(pk(nnrp.Deadline(operation_id=3,
                                                          deadline_unix_ms=FUTURE),
                                            session_id=1)))
    assert error.message.error_code == nnrp.ErrorCode.LIMIT_EXCEEDED


def test_trace_context_scoping(server: nnrp.ServerConnection) -> None:
    (session_scoped,) = server.receive_data(
        pk(nnrp.TraceContext(trace_id=7, span_id=8, trace_flags=1, body_bytes=3), session_id=1,
           body=b"k=v"))
    assert session_scoped.operation_id is None and session_scoped.trace.attribute_bytes == 3
    (event,) = server.receive_data(submit(1, 1, 1))
    assert event.trace == session_scoped.trace
    (op_scoped,) = server.receive_data(pk(nnrp.TraceContext(trace_id=9, span_id=10),
                                          session_id=1, frame_id=1))
    assert op_scoped.operation_id == 1
    (error,) = replies(server.receive_data(pk(nnrp.TraceContext(trace_id=9, span_id=1),
                                              session_id=1, frame_id=42)))
    assert b"names no active operation" in error.body
    (error,) = replies(server.receive_data(pk(nnrp.TraceContext(trace_id=9, span_id=1),
                                              session_id=1, trace_id=5)))
    assert b"differs" in error.body


def test_ping_is_answered_with_pong(server: nnrp.ServerConnection) -> None:
    (pong,) = replies(server.receive_data(pk(nnrp.Ping(), trace_id=4)))
    assert isinstance(pong.message, nnrp.Pong) and pong.trace_id == 4
    (pong,) = replies(server.receive_data(pk(nnrp.Ping(), session_id=1)))
    assert pong.session_id == 1


def test_session_close_drain_and_abort(server: nnrp.ServerConnection) -> None:
    server.receive_data(submit(1, 1, 1))
    (request,) = server.receive_data(pk(nnrp.SessionClose(in_flight_policy=0), session_id=1))
    assert isinstance(request, nnrp.SessionCloseRequested) and not request.abort
    (refused,) = server.receive_data(submit(1, 2, 2))
    assert refused.reason is nnrp.RefusalReason.SESSION_CLOSING
    with pytest.raises(nnrp.LocalProtocolError, match="in flight"):
        server.send_session_close_ack(1)
    server.send_result(1, 1, 200, b"{}")
    ack = nnrp.decode_packet(server.send_session_close_ack(1))
    assert ack.message == nnrp.SessionCloseAck(status=2, last_operation_id=1)
    # Abort policy cancels every operation first.
    server.receive_data(pk(OPEN))
    server.receive_data(submit(1, 7, 1))
    events = server.receive_data(pk(nnrp.SessionClose(in_flight_policy=1), session_id=1))
    assert of(events, nnrp.OperationCancelled)[0].source is nnrp.CancelSource.SESSION_CLOSE
    assert of(events, nnrp.SessionCloseRequested)[0].abort


def test_peer_close_and_peer_error(server: nnrp.ServerConnection) -> None:
    (event,) = server.receive_data(pk(nnrp.Error(code=5, is_fatal=0)))
    assert isinstance(event, nnrp.PeerError) and not event.fatal
    assert isinstance(server.receive_data(pk(nnrp.Close()))[0], nnrp.PeerClosed)
    assert server.state is nnrp.ConnState.CLOSED


# --------------------------------------------------------------------------- client role


def test_client_server_pair_over_a_fake_wire() -> None:
    client, server = nnrp.ClientConnection(), nnrp.ServerConnection()

    def to_server(data: bytes) -> list[Any]:
        events = server.receive_data(data)
        for event in of(events, nnrp.SendBytes):
            client_events.extend(client.receive_data(event.data))
        return events

    client_events: list[Any] = []
    to_server(client.hello())
    assert isinstance(client_events.pop(), nnrp.HelloAcked)
    to_server(client.open_session())
    opened = client_events.pop()
    assert opened.opened and opened.session_id == 1
    (submitted,) = to_server(client.submit(1, 10, 1, b"{}"))
    assert isinstance(submitted, nnrp.OperationSubmitted)
    client_events += client.receive_data(server.send_partial(1, 10, b"a"))
    client_events += client.receive_data(b"".join(server.send_result(1, 10, 200, b"done")))
    partial, result = client_events
    assert partial.sequence == 1 and result.typed_body.frames[0].payload == b"done"
    # The client refuses frames that break ordering: a result for an ended operation.
    with pytest.raises(nnrp.RemoteProtocolError, match="no operation in flight"):
        client.receive_data(nnrp.encode(nnrp.Packet(
            nnrp.ResultPush(), session_id=1, frame_id=1)))


def test_client_detects_sequence_gaps() -> None:
    client = nnrp.ClientConnection()
    client.hello()
    client.receive_data(pk(nnrp.ServerHelloAck(accepted_profile_bitmap=2)))
    client.open_session()
    client.receive_data(pk(nnrp.SessionOpenAck(session_id=1), session_id=1))
    client.submit(1, 5, 1, b"{}")
    gap = nnrp.encode_partial_result(1, 1, 5, 2, b"x")
    with pytest.raises(nnrp.RemoteProtocolError, match="sequence 2, expected 1"):
        client.receive_data(gap)


@pytest.mark.parametrize("reads", [
    [b"HTTP/1.1 400 Bad Request\r\nserver: uvicorn\r\n"],  # vLLM's own port
    [b"HT", b"TP/1.1 400 Bad Request\r\n"],  # the prefix across two reads
    [b"HTTP/1.0 404"],  # shorter than a header: no bad magic would ever be seen
])
def test_an_http_answer_to_the_hello_is_named_at_once(reads: list[bytes]) -> None:
    """Issue 37 (client rule 7): `chat` at vLLM's HTTP port waited 11 s before it gave
    up; the answer's first five bytes say it is HTTP."""
    client = nnrp.ClientConnection()
    client.hello()
    for data in reads[:-1]:
        assert client.receive_data(data) == []
    with pytest.raises(nnrp.HttpAnswerError) as raised:
        client.receive_data(reads[-1])
    assert raised.value.status_line == (b"".join(reads).split(b"\r\n")[0]).decode()
    assert client.state is nnrp.ClientState.CLOSED


def test_a_server_hello_ack_in_small_reads_is_not_taken_for_http() -> None:
    client = nnrp.ClientConnection()
    client.hello()
    ack = pk(nnrp.ServerHelloAck(accepted_profile_bitmap=2))
    events = [event for byte in range(len(ack))
              for event in client.receive_data(ack[byte:byte + 1])]
    assert [type(event) for event in events] == [nnrp.HelloAcked]


def test_bad_packet_after_good_ones_in_one_read_still_fails(server: nnrp.ServerConnection) -> None:
    bad = bytearray(pk(nnrp.Ping()))
    bad[8] = 0x80  # reserved header flag
    events = server.receive_data(pk(nnrp.Ping()) + submit(1, 1, 1) + bytes(bad))
    assert isinstance(replies(events[:1])[0].message, nnrp.Pong)
    assert isinstance(events[1], nnrp.OperationSubmitted)
    assert isinstance(events[-1], nnrp.ConnectionFailed)
    drop, error = (nnrp.decode_packet(p) for p in events[-1].replies)
    assert drop.message.drop_reason == nnrp.DropReason.TRANSPORT_CLOSED  # operation 1
    assert error.message.code == nnrp.ErrorCode.MALFORMED_HEADER
